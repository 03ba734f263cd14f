"""What the sweep shows while it runs: a live table in the terminal (trial, state, swept values,
validation loss), and a progress line each time a trial ends and every HEARTBEAT_S seconds while
none does: `progress: 3/8 done, 2 running (at 40%, 15%), 0 failed; ETA 4 min (mean trial 1.9 min, 2 at a time)`,
the ETA worked out from the measured times of this run's trials (Tally), each trial left
weighted by its training FLOPs where the sweep's trials differ in size or budget."""

from __future__ import annotations

import heapq
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import tune
from rich.console import Console
from rich.live import Live
from rich.table import Table

from smallinit.core.errors import first_line
from smallinit.trainer.config import flops_per_token

HEARTBEAT_S = 60.0  # a progress line at least this often while trials run and none ends


class Tally:
    """The sweep's trials counted as they start and end, and an ETA from how long this run's
    ended trials took (each from its start to its end, on the driver's clock). `skipped` ended
    before this run (the plan's `already done`); `total` is the sweep's, skipped included.

    A trial resumed from a checkpoint trains only its last steps in this run: its start-to-end
    time is not a trial's time. Where a trial reported its step twice or more (report), its step
    rate says how many steps it had before this run began, and those are added back at that
    rate; a running trial's time left is its steps left at its rate.

    Trials of one sweep may differ several times over in size or budget (d = 96 and 192 in one
    grid): `costs`, each trial's training FLOPs in the order this run starts them (trial_cost),
    make the time of a trial not ended yet the ended trials' mean overhead (set-up, the last
    evaluation: a trial's time less its steps at its step rate) plus their training seconds per
    FLOP times its own FLOPs. Without costs every trial weighs the same: the mean trial time."""

    def __init__(self, total: int, skipped: int = 0, clock: Callable[[], float] = time.monotonic,
                 costs: list[float | None] | None = None):
        self.total, self.skipped, self.clock = total, skipped, clock
        self.running: dict[str, float] = {}  # trial -> when it started
        self.reports: dict[str, dict] = {}  # trial -> its first and last (time, step) and total steps
        self.durations: list[float] = []  # of the trials of this run that completed or were pruned
        self.ended_costs: list[float] = []  # their costs, in the same order
        self.overheads: list[float] = []  # their time outside training steps, in the same order
        known = [c for c in costs or [] if c]
        self.unit = sum(known) / len(known) if known else 1.0  # the cost of a trial whose own is unknown
        self.to_start = [c or self.unit for c in costs or []]  # costs of the planned trials not started yet
        self.cost: dict[str, float] = {}  # running trial -> its cost
        self.done = self.failed = self.at_once = 0
        self.t0 = self.last_line = clock()

    def start(self, key: str, cost: float | None = None) -> None:
        if key not in self.running:  # a retried trial keeps its first start
            self.running[key] = self.clock()
            self.at_once = max(self.at_once, len(self.running))
            planned = next((i for i, c in enumerate(self.to_start) if cost is None or math.isclose(c, cost)), None)
            if planned is not None:  # a new search sample was never planned: nothing to take off
                cost = cost or self.to_start[planned]
                del self.to_start[planned]
            self.cost[key] = cost or self.unit

    def report(self, key: str, step: int, total_steps: int) -> None:
        """A trial's result row at `step` of `total_steps` (Tune's on_trial_result)."""
        r = self.reports.setdefault(key, {"first": (self.clock(), step), "total": total_steps})
        if step > r.get("last", r["first"])[1]:  # budget branches' rows may step back: progress is the furthest
            r["last"] = (self.clock(), step)

    def _rate(self, key: str) -> float | None:
        r = self.reports.get(key, {})
        if "last" not in r:
            return None
        (t1, s1), (t2, s2) = r["first"], r["last"]
        return (s2 - s1) / (t2 - t1) if t2 > t1 else None

    def _trial_time(self, key: str, started: float, now: float) -> float:
        """This run's time for the trial, plus the steps it had before this run at its rate."""
        rate = self._rate(key)
        if rate is None:
            return now - started
        t1, s1 = self.reports[key]["first"]
        before = max(0.0, s1 - rate * (t1 - started))  # 0 for a fresh start (set-up makes it negative)
        return now - started + before / rate

    def end(self, key: str, failed: bool) -> bool:
        """Count a trial's end; False if it was not running (an end already counted)."""
        started = self.running.pop(key, None)
        if started is None:
            return False
        if failed:  # a failure's time says nothing about how long a trial takes
            self.failed += 1
        else:
            self.done += 1
            duration, rate = self._trial_time(key, started, self.clock()), self._rate(key)
            self.durations.append(duration)
            self.ended_costs.append(self.cost.get(key, self.unit))
            steps = self.reports[key]["total"] if rate else 0
            self.overheads.append(min(duration, max(0.0, duration - steps / rate)) if rate and steps else 0.0)
        self.reports.pop(key, None)
        self.cost.pop(key, None)
        return True

    def _seconds(self, cost: float) -> float:
        """How long a trial of this cost takes: the mean overhead, and its training at the seconds
        per unit of cost measured so far."""
        overhead = sum(self.overheads) / len(self.overheads)
        return overhead + (sum(self.durations) - sum(self.overheads)) / sum(self.ended_costs) * cost

    def _time_left(self, key: str, started: float, now: float) -> float:
        rate = self._rate(key)
        if rate is None:
            return max(0.0, self._seconds(self.cost.get(key, self.unit)) - (now - started))
        t2, s2 = self.reports[key]["last"]
        return max(0.0, (self.reports[key]["total"] - s2) / rate - (now - t2))

    def _waiting_costs(self) -> list[float]:
        """The costs of the trials not started yet, in the order they start (unplanned ones, new
        search samples, at the planned trials' mean)."""
        return (self.to_start + [self.unit] * self.waiting)[:self.waiting]

    def eta_s(self) -> float | None:
        """Seconds until the last trial ends: the running ones finish at their step rate (their
        expected time before they report twice) and the ones not started yet follow, as many at a
        time as ran at once. Before any trial of this run ends, only the trials running now (the
        last of a resumed sweep, each at its step rate) can be timed."""
        now = self.clock()
        if not self.durations:
            return self._running_left(now)
        slots = [self._time_left(k, t0, now) for k, t0 in self.running.items()]
        slots += [0.0] * max(0, max(1, self.at_once) - len(slots))
        heapq.heapify(slots)
        for cost in self._waiting_costs():
            heapq.heappush(slots, heapq.heappop(slots) + self._seconds(cost))
        return max(slots)

    def _running_left(self, now: float) -> float | None:
        """Seconds until the running trials end, where they are all that is left and each has a
        step rate; else None."""
        if self.waiting or not self.running or any(self._rate(k) is None for k in self.running):
            return None
        return max(self._time_left(k, t0, now) for k, t0 in self.running.items())

    @property
    def waiting(self) -> int:
        """Trials not started yet."""
        return max(0, self.total - self.skipped - self.done - self.failed - len(self.running))

    def line(self) -> str:
        self.last_line = self.clock()
        text = (f"progress: {self.skipped + self.done}/{self.total} done, {len(self.running)} running"
                f"{self._how_far()}, {self.failed} failed")
        if not self.running and not self.waiting:
            return text
        eta = self.eta_s()
        if eta is None:
            return f"{text}; ETA once a trial ends ({_minutes(self.clock() - self.t0)} in)"
        if not self.durations:
            return f"{text}; ETA {_minutes(eta)} (the running trials at their step rates)"
        mean = sum(self.durations) / len(self.durations)
        left = [*self.cost.values(), *self._waiting_costs()]
        ended = sum(self.ended_costs) / len(self.ended_costs)
        weighted = (", trials left weighted by their FLOPs"
                    if left and not math.isclose(sum(left) / len(left), ended, rel_tol=0.1) else "")
        return f"{text}; ETA {_minutes(eta)} (mean trial {_minutes(mean, 1)}{weighted}, {max(1, self.at_once)} at a time)"

    def _how_far(self) -> str:
        """' (at 21%, 5%)': the running trials' furthest reported step of their total, so a
        heartbeat during hour-long trials says they move; '' before any has reported."""
        at = [r.get("last", r["first"])[1] / r["total"] for k, r in self.reports.items()
              if k in self.running and r["total"]]
        return f" (at {', '.join(f'{x:.0%}' for x in sorted(at, reverse=True)[:4])})" if at else ""

    def heartbeat_due(self) -> bool:
        return bool(self.running) and self.clock() - self.last_line >= HEARTBEAT_S


def _minutes(seconds: float, digits: int = 0) -> str:
    """`40 s`, `4 min` (`1.9 min` with digits=1), `2.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.{digits if seconds < 600 else 0}f} min"
    return f"{seconds / 3600:.1f} h"


def trial_cost(spec) -> float:
    """A trial's training FLOPs per worker (its planned tokens at trainer.config.flops_per_token):
    what the ETA weighs trials by. Evaluation is left out; on one machine time follows it closely
    enough to tell a d = 192 trial from a d = 96 one."""
    train = spec.trial.train
    return flops_per_token(spec.trial) * train.total_steps * train.tokens_per_step / max(1, spec.workers)


class ProgressTable(tune.Callback):
    """Driven by Tune's callbacks on the driver. On a non-terminal (CI logs, pipes) it
    prints one line per state change instead of redrawing. `costs`: the planned trials' costs
    (trial_cost) in the order they start."""

    def __init__(self, swept_keys: list[str], total: int, skipped: int = 0, costs: list[float] | None = None):
        self.swept_keys, self.total, self.skipped, self.costs = swept_keys, total, skipped, costs
        self.rows: dict[str, dict[str, Any]] = {}
        self.console = Console(file=sys.stdout)
        self.live: Live | None = None
        self.t0 = time.time()
        self.tally = Tally(total, skipped, costs=costs)
        self.cost_of: Callable[[Any], float | None] = trial_cost

    def _row(self, trial) -> dict[str, Any]:
        if trial.trial_id not in self.rows:
            spec = trial.config["spec"]
            self.rows[trial.trial_id] = {"number": trial.config["number"], "params": spec.params, "state": "PENDING",
                                         "step": "", "total": spec.trial.train.total_steps, "val": None}
        return self.rows[trial.trial_id]

    def _render(self) -> Table:
        done = sum(r["state"] in ("COMPLETE", "FAIL", "PRUNED") for r in self.rows.values())
        eta = self.tally.eta_s()
        table = Table(title=f"sweep: {done + self.skipped}/{self.total} done ({self.skipped} from before), "
                            f"{time.time() - self.t0:.0f} s" + (f", ETA {_minutes(eta)}" if eta is not None else ""),
                      title_justify="left")
        for col in ("trial", "state", *self.swept_keys, "step", "val loss"):
            table.add_column(col, justify="right" if col in ("trial", "step", "val loss") else "left")
        for r in sorted(self.rows.values(), key=lambda r: r["number"]):
            val = f"{r['val']:.4f}" if isinstance(r["val"], float) else ""
            table.add_row(str(r["number"]), r["state"], *(str(r["params"].get(k, "")) for k in self.swept_keys),
                          f"{r['step']}/{r['total']}" if r["step"] != "" else "", val)
        return table

    def _update(self, trial, state: str | None = None, result: dict | None = None) -> None:
        row = self._row(trial)
        changed = state is not None and state != row["state"]
        if state:
            row["state"] = state
        if result:
            if result.get("val_loss") is not None:
                row["val"] = float(result["val_loss"])
            if "step" in result:
                row["step"] = int(result["step"])
        if self.console.is_terminal:
            if self.live is None:
                self.live = Live(self._render(), console=self.console, refresh_per_second=2)
                self.live.start()
            self.live.update(self._render())
        elif changed:
            val = f" val_loss={row['val']:.4f}" if isinstance(row["val"], float) else ""
            params = " ".join(f"{k}={v}" for k, v in row["params"].items())
            self.console.print(f"trial {row['number']} {row['state']} {params}{val}", highlight=False, soft_wrap=True)

    def __getstate__(self) -> dict:  # Tune pickles callbacks at start; the console does not pickle
        return {"swept_keys": self.swept_keys, "total": self.total, "skipped": self.skipped, "costs": self.costs}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.tally.start(trial.trial_id, self.cost_of(trial.config["spec"]))
        self._update(trial, "RUNNING")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if isinstance(result.get("step"), int | float):
            self.tally.report(trial.trial_id, int(result["step"]), self._row(trial)["total"])
        self._update(trial, None, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        state = "FAIL" if result.get("failed") else ("COMPLETE" if result.get("done_training") else "PRUNED")
        self._update(trial, state, result)
        self._ended(trial, state == "FAIL")

    def on_trial_recover(self, iteration, trials, trial, **info):
        # Tune's own report of a failed trial task is a Ray traceback (off: tuner.py sets
        # TUNE_PRINT_ALL_TRIAL_ERRORS=0); a retried trial needs one line, not an alarm.
        self._say(trial, f"{_what_failed(trial)}; retrying from its last checkpoint "
                         f"(retry {trial.run_metadata.num_failures} of {trial.max_failures})")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._say(trial, f"{_what_failed(trial)} and its retries (hydra.sweeper.max_retries={trial.max_failures}) "
                         f"are used up: recorded as failed; its error is in {_error_file(trial)}")
        self._update(trial, "FAIL")
        self._ended(trial, True)

    def on_step_end(self, iteration, trials, **info):
        if self.tally.heartbeat_due():  # long trials: never silent for more than HEARTBEAT_S
            self._print(self.tally.line())

    def _ended(self, trial, failed: bool) -> None:
        if self.tally.end(trial.trial_id, failed):
            self._print(self.tally.line())

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def _say(self, trial, text: str) -> None:
        # On a terminal Live draws it above the table; soft_wrap: one line however long in a log.
        self.console.print(f"trial {self._row(trial)['number']}: {text}", highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _what_failed(trial) -> str:
    """'its Ray worker died (ActorDiedError)': the error Tune recorded for the trial's task
    (Trial.handle_error pickles it to the driver's staging folder before the callbacks run)."""
    from ray import cloudpickle
    from ray.exceptions import RayActorError

    try:
        with open(trial.pickled_error_file, "rb") as f:
            err = cloudpickle.load(f)
    except Exception:  # noqa: BLE001 - no file, or one that does not unpickle: a display line must not stop the sweep
        return "its Ray worker died or its task failed"
    if isinstance(err, RayActorError):  # killed, out of memory, its node lost
        return f"its Ray worker died ({type(err).__name__})"
    return f"its Ray task failed ({type(err).__name__}: {first_line(err)})"


def _error_file(trial) -> str:
    """Where Tune keeps the error: error.txt in the trial's folder under the sweep's ray/tune/."""
    return str(Path(trial.path, Path(trial.error_file).name)) if trial.error_file else str(trial.path)
