"""A live table of the sweep in the terminal: trial, state, swept values, validation loss."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ray import tune
from rich.console import Console
from rich.live import Live
from rich.table import Table

from core.errors import first_line


class ProgressTable(tune.Callback):
    """Driven by Tune's callbacks on the driver. On a non-terminal (CI logs, pipes) it
    prints one line per state change instead of redrawing."""

    def __init__(self, swept_keys: list[str], total: int, skipped: int = 0):
        self.swept_keys, self.total, self.skipped = swept_keys, total, skipped
        self.rows: dict[str, dict[str, Any]] = {}
        self.console = Console(file=sys.stdout)
        self.live: Live | None = None
        self.t0 = time.time()

    def _row(self, trial) -> dict[str, Any]:
        if trial.trial_id not in self.rows:
            spec = trial.config["spec"]
            self.rows[trial.trial_id] = {"number": trial.config["number"], "params": spec.params, "state": "PENDING",
                                         "step": "", "total": spec.trial.train.total_steps, "val": None}
        return self.rows[trial.trial_id]

    def _render(self) -> Table:
        done = sum(r["state"] in ("COMPLETE", "FAIL", "PRUNED") for r in self.rows.values())
        table = Table(title=f"sweep: {done + self.skipped}/{self.total} done ({self.skipped} from before), "
                            f"{time.time() - self.t0:.0f} s", title_justify="left")
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
            self.console.print(f"trial {row['number']} {row['state']} {params}{val}", highlight=False)

    def __getstate__(self) -> dict:  # Tune pickles callbacks at start; the console does not pickle
        return {"swept_keys": self.swept_keys, "total": self.total, "skipped": self.skipped}

    def on_trial_start(self, iteration, trials, trial, **info):
        self._update(trial, "RUNNING")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._update(trial, None, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        state = "FAIL" if result.get("failed") else ("COMPLETE" if result.get("done_training") else "PRUNED")
        self._update(trial, state, result)

    def on_trial_recover(self, iteration, trials, trial, **info):
        # Tune's own report of a failed trial task is a Ray traceback (off: tuner.py sets
        # TUNE_PRINT_ALL_TRIAL_ERRORS=0); a retried trial needs one line, not an alarm.
        self._say(trial, f"{_what_failed(trial)}; retrying from its last checkpoint "
                         f"(retry {trial.run_metadata.num_failures} of {trial.max_failures})")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._say(trial, f"{_what_failed(trial)} and its retries (hydra.sweeper.max_retries={trial.max_failures}) "
                         f"are used up: recorded as failed; its error is in {_error_file(trial)}")
        self._update(trial, "FAIL")

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
