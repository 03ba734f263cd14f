"""The sweep, start to end, on the driver.

1. Parse the overrides into a grid or an Optuna search space (sweeper/config/space.py).
2. Compose and validate every trial's config with Hydra, here, before anything launches;
   a bad override stops the command with one line and leaves nothing behind (compose.py).
   Prepare each distinct corpus once and hold every trial to it (trainer/data_check.py: the
   files readable, long enough, ids within the vocabulary, the budget within train.max_epochs
   passes), still before anything is written.
3. Open the study (SQLite by default) and check the grid against what it recorded (plan.py).
4. Skip trials whose identity already finished; reuse trials a killed driver left RUNNING.
5. If any are left: start or connect to Ray (cluster.py) while Tune is imported, run them as Ray Tune trials (tuner.py: StudySearcher decides which, ASHA may stop them),
   stop Ray.
6. Write results.parquet and print the lowest single trial and the best setting over seeds (results.py).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from smallinit.core.errors import ConfigError, first_line
from smallinit.core.files import atomic_write_json
from smallinit.core.results_schema import results_path
from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.config import protocol
from smallinit.sweeper.config.compose import Composer, check_distinct, validate_sweep
from smallinit.sweeper.config.config import SmallinitSweeperConf, check_sweeper_conf
from smallinit.sweeper.config.precheck import check_name
from smallinit.sweeper.config.schema import check_wandb
from smallinit.sweeper.config.space import parse_sweep
from smallinit.sweeper.config.spec import TrialSpec
from smallinit.sweeper.results.summary import (
    all_failed_before,
    failed_before_message,
    failed_run_message,
    wandb_line,
    wandb_sync_line,
)
from smallinit.sweeper.runtime import resources, stop
from smallinit.sweeper.runtime.cluster import check_reachable, connect_ray, stop_ray
from smallinit.sweeper.runtime.lock import hold_driver_lock
from smallinit.sweeper.study.plan import plan_sweep
from smallinit.sweeper.study.study import FINISHED
from smallinit.sweeper.worker.failures import disk_full, write_refused, write_refused_line
from smallinit.trainer.data_check import check_trials
from smallinit.trainer.machine.host_memory import check_switch as check_allocator_switch

from .tuner import import_tune, run_trials


def run_sweep(conf: SmallinitSweeperConf, loader, base: DictConfig, arguments: list[str]) -> list[dict[str, Any]]:
    try:
        return _run(conf, loader, base, arguments)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    except OSError as e:  # the driver's own writes (plans, the results table, the summary)
        if (refused := write_refused(e)) is not None:
            sys.exit(f"error: {write_refused_line(refused)}")
        if (full := disk_full(e)) is None:
            raise
        sys.exit(f"error: no space left on device: {full.filename or 'a file of the sweep'}; the trials that "
                 "finished are kept in their folders: free some space and rerun the command (it trains "
                 "only what did not finish and writes the table again)")


def _run(conf: SmallinitSweeperConf, loader, base: DictConfig, arguments: list[str]) -> list[dict[str, Any]]:
    from smallinit.sweeper.results.results import write_results

    check_sweeper_conf(conf)
    check_name(base.get("name"))  # precheck did too, unless a Hydra flag made it step aside
    _quiet_libraries()
    ray_cfg = OmegaConf.to_container(base.get("ray", {}), resolve=True) or {}
    resources.check_local(ray_cfg)
    wandb_cfg = OmegaConf.to_container(base.get("wandb", {}), resolve=True) or {}
    check_wandb(wandb_cfg)
    check_allocator_switch()  # read again by each trial's worker
    space = parse_sweep(arguments, dict(conf.params) if conf.params else None)
    if "name" in space.swept_keys:  # `name` is the sweep's folder and study: one of each
        raise ConfigError(f"name={','.join(space.discrete['name'].strings)} is invalid: name is the sweep's "
                          "one folder and study, never a swept axis; run one command per name")
    if not str(base.hydra.sweep.dir or "").strip():  # Path("") is the current folder: a sweep spilled into it
        raise ConfigError("hydra.sweep.dir='' is invalid: name the sweep's folder (the default is sweeps/<name>)")
    sweep_dir = Path(base.hydra.sweep.dir).resolve()
    if conf.protocol.enabled:
        protocol.check(conf.protocol, space, conf.asha.enabled)
        protocol.check_record(conf.protocol, _read_record(sweep_dir))
    composer = Composer(loader, base, space, sweep_dir)
    if conf.protocol.enabled:  # stage 1's points, and every setting on each confirm seed
        grid_specs, checked = _protocol_specs(conf.protocol, composer)
    else:
        grid_specs, checked = validate_sweep(composer)
    # Every corpus read and checked before the first write, and handed to the trials' workers.
    composer.hand_over(check_trials([spec.trial for spec in checked]))
    # ray.fit_device_gib gives each trial its own worker count: the largest must fit too.
    most = max((spec.workers for spec in checked), default=resources.workers(ray_cfg))
    resources.check_local_workers(ray_cfg, most)
    if ray_cfg.get("address"):
        check_reachable(ray_cfg["address"])
    lock = hold_driver_lock(sweep_dir)  # one driver per folder, from its first write to its exit
    name = str(base.get("name", "sweep"))
    trials = _Trials(conf, ray_cfg, lock, most, wandb_line(wandb_cfg, sweep_dir, name), checked[0].trial if checked else None)
    try:
        if conf.protocol.enabled:
            study = _run_protocol(conf, composer, name, trials)
        else:
            plan = plan_sweep(conf, composer, grid_specs, checked, name)
            print(plan.summary(), flush=True)
            trials.run(plan)
            study = plan.study
    except KeyboardInterrupt:  # a stop signal outside Tune's loop: while Ray starts, or between rounds
        if stop.received() is None:
            raise
        study = trials.study
    finally:
        trials.close()
    if study is None:  # stopped before any plan: nothing was trained or claimed
        print(stop.resume_line(), file=sys.stderr)
        return []
    df = write_results(sweep_dir, study)
    sync = wandb_sync_line(sweep_dir)  # also after a stop or failures: what ran offline is complete
    if sync:
        print(sync, flush=True)
    if stop.received() is not None:
        print(stop.resume_line(), file=sys.stderr)
    elif trials.aborted:
        sys.exit(f"error: {trials.aborted}")
    elif trials.failed:
        sys.exit(f"error: {failed_run_message(trials.failed, trials.ended, results_path(sweep_dir))}")
    elif all_failed_before(df):  # a rerun that could not mend any of them is no success either
        sys.exit(f"error: {failed_before_message(len(df), results_path(sweep_dir))}")
    return df.to_dict("records")


class _Trials:
    """Runs plans on Ray, started (or connected to) when the first plan has work: a rerun of
    a finished sweep needs no cluster. Sums the outcomes of every plan it ran. Says once, as the
    first trials start, where their W&B runs go (start_line)."""

    def __init__(self, conf: SmallinitSweeperConf, ray_cfg: dict[str, Any], lock, most_workers: int,
                 start_line: str, first_trial=None):
        self.conf, self.ray_cfg, self.lock, self.most_workers = conf, ray_cfg, lock, most_workers
        self.start_line, self.first_trial = start_line, first_trial
        self.connected, self.started = False, False
        self.study = None  # the last plan's study: what a stop outside Tune's loop records
        self.aborted: str | None = None
        self.failed = self.ended = 0

    def run(self, plan) -> None:
        self.study = plan.study
        if not plan.has_work:
            return
        if not self.connected:
            print(self.start_line, flush=True)
            if self.first_trial is not None:  # imports torch: only once trials are about to run
                from smallinit.trainer.machine.compile_choice import speed_line

                print(speed_line(self.first_trial), flush=True)
            # Ray's start (~4 s, mostly waiting for its processes) overlaps Tune's imports (~1 s).
            ready = _Background(import_tune)
            with stop.handlers_kept():  # ray.init would set SIGTERM to exit 15
                self.started, self.connected = connect_ray(self.ray_cfg), True
            stop.check()
            resources.check_cluster(self.ray_cfg, self.most_workers)
            ready.result()
        stop.check()
        outcome = run_trials(self.conf, self.ray_cfg, plan, lambda: self._record_without_ray(plan))
        self.aborted = self.aborted or outcome.aborted
        self.failed += outcome.failed
        self.ended += outcome.ended

    def _record_without_ray(self, plan) -> None:
        """What the driver's end does, for a stop signal that also ended Ray, or a cluster that
        stopped answering (stop.py)."""
        from smallinit.sweeper.results.results import write_results

        write_results(plan.sweep_dir, plan.study)
        if stop.received() is not None:
            print(stop.resume_line(), file=sys.stderr)
        self.lock.release()

    @property
    def go_on(self) -> bool:
        return stop.received() is None and self.aborted is None

    def close(self) -> None:
        if self.started:
            stop_ray()


def _protocol_specs(conf: protocol.ProtocolConf, composer: Composer) -> tuple[list[TrialSpec], list[TrialSpec]]:
    """(stage 1's first round, that plus each setting on every confirm seed): composed and
    checked before launch, so a bad seed or setting fails now, not after the tuning."""
    space = composer.space
    initial = {k: list(space.discrete[k].values) for k in conf.tune}
    first = {k: v[0] for k, v in initial.items()}
    setts = protocol.settings(conf, space)
    tune = [{**s, **combo, conf.seed_key: seed} for s in setts
            for combo in (dict(zip(initial, vals)) for vals in itertools.product(*initial.values()))
            for seed in conf.tune_seeds]
    confirm = [{**s, **first, conf.seed_key: seed} for s in setts for seed in conf.confirm_seeds]
    composer.space = protocol.round_space(space, tune + confirm)
    specs = [composer.spec(p) for p in tune]
    check_distinct(specs)
    checked = specs + [composer.spec(p) for p in confirm]
    if conf.per_budget and not all(spec.trial.train.budgets for spec in checked):
        raise ConfigError("hydra.sweeper.protocol.per_budget=true is invalid here: it chooses per budget of "
                          "train.budgets, and these trials have one budget; set train.budgets=[...] or drop per_budget")
    composer.space = space  # the sweep as given: each round derives its own from it
    return specs, checked


def _run_protocol(conf: SmallinitSweeperConf, composer: Composer, name: str, trials: _Trials):
    """Tune rounds until every setting has its choice, then the confirm round. Each round is a
    plan over the points it needs, so what finished before (this run or an earlier one) is
    skipped as in any sweep; the first round's plan opens the study the next rounds read."""
    pconf, base = conf.protocol, composer.space
    initial = {k: list(base.discrete[k].values) for k in pconf.tune}
    setts = protocol.settings(pconf, base)
    study, previous = None, None
    for round_number in itertools.count(1):
        outcome = (_outcomes(composer, base, study, pconf.per_budget) if study is not None
                   else (lambda _: protocol.PENDING))
        settled = [protocol.settle(pconf, s, initial, outcome) for s in setts]
        todo = [p for points, _ in settled for p in points]
        if not todo:
            break
        if todo == previous:  # the round ran and its trials still did not end
            raise ConfigError(f"stage 1 (tune) could not finish round {round_number - 1}: "
                              f"{len(todo)} trial(s) did not end; see results.parquet and rerun")
        plan = _plan_round(conf, composer, base, name, todo, f"stage 1 (tune), round {round_number}")
        trials.run(plan)
        study, previous = plan.study, todo
        if not trials.go_on:
            return study
    choices = [c for _, c in settled]
    for line in _choice_lines(pconf, choices):
        print(line, flush=True)
    record = protocol.record(pconf, choices, _read_record(composer.sweep_dir))
    atomic_write_json(composer.sweep_dir / protocol.RECORD, record)
    study.study.set_user_attr("protocol", record)
    confirm = protocol.confirm_points(pconf, choices)
    if confirm:
        plan = _plan_round(conf, composer, base, name, confirm, "stage 2 (confirm)")
        trials.run(plan)
        study = plan.study
    return study


def _read_record(sweep_dir: Path) -> dict[str, Any] | None:
    path = sweep_dir / protocol.RECORD
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        # The shape protocol.record writes, checked before any trial: an edit that breaks it would
        # otherwise surface as a traceback after all of stage 1.
        if not isinstance(record, dict):
            raise ValueError(f"holds a {type(record).__name__}, not the protocol's record")
        choices = record.get("choices", [])
        if not isinstance(choices, list) or not all(isinstance(c, dict) and isinstance(c.get("setting"), dict)
                                                    for c in choices):
            raise ValueError("'choices' is not a list of choices, each with its 'setting'")
        return record
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({first_line(e)}): move it aside and rerun; the choices are "
                          "made again from the study, and nothing finished trains again") from None


def _plan_round(conf, composer: Composer, base, name: str, points: list[dict[str, Any]], label: str):
    composer.space = protocol.round_space(base, points)
    specs = [composer.spec(p) for p in points]
    seeds = {"tune_seeds": conf.protocol.tune_seeds, "confirm_seeds": conf.protocol.confirm_seeds}
    for spec in specs:  # recorded by the searcher when it creates the study trial
        spec.role = protocol.role_of(spec.params[conf.protocol.seed_key], seeds)
    plan = plan_sweep(conf, composer, specs, specs, name)
    print(f"protocol: {label}: {plan.summary()}", flush=True)
    return plan


def _outcomes(composer: Composer, base, study, per_budget: bool = False) -> protocol.Outcome:
    """params -> the trial's final loss, None if it ended without one, or protocol.PENDING.
    per_budget: {budget tokens: that branch's final loss, or None} from budgets/<tokens>.json."""
    known = study.by_identity()

    def outcome(params: dict[str, Any]) -> Any:
        composer.space = protocol.round_space(base, [params])
        spec = composer.spec(params)
        t = known.get(spec.identity)
        if t is None or t.state not in FINISHED:
            return protocol.PENDING
        if per_budget:
            return _branch_losses(spec) if t.state == TrialState.COMPLETE else {}
        return t.value if t.state == TrialState.COMPLETE else None

    return outcome


def _branch_losses(spec: TrialSpec) -> dict[int, float | None]:
    """Each budget's final validation loss from the trial folder; None where its file is
    missing or damaged (that budget then has no choice from this value)."""
    folder = TrialDir(spec.out_dir)
    out: dict[int, float | None] = {}
    for tokens in spec.trial.train.budgets_trained:
        # the one check of a budget's file (its schema, a finite loss, this trial's, this budget's)
        whole = folder.budget_json(tokens).exists() and folder.damaged_budget(tokens, spec.identity) is None
        out[tokens] = folder.read_budget_result(tokens)["final_val_loss"] if whole else None
    return out


def _choice_lines(pconf, choices: list[protocol.Choice]) -> list[str]:
    lines = []
    for c in choices:
        setting = " ".join(f"{k}={v}" for k, v in c.setting.items()) or "(the one setting)"
        if c.chosen is None:
            lines.append(f"protocol: {setting}: no value completed on every tuning seed; not confirmed")
            continue
        chosen = " ".join(f"{k}={v}" for k, v in c.chosen.items())
        if c.by_budget is not None:
            chosen = "; ".join(f"{b:,} tokens: " + " ".join(f"{k}={v}" for k, v in combo.items())
                               for b, combo in sorted(c.by_budget.items()))
        edge = f" (at the edge of {c.at_edge} after {pconf.max_extensions} extensions a side)" if c.at_edge else ""
        lines.append(f"protocol: {setting}: chose {chosen} on {pconf.seed_key} {pconf.tune_seeds}{edge}")
    return lines


def _quiet_libraries() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


class _Background(threading.Thread):
    """Run a function beside the main thread; result() re-raises its error there. (Ray itself
    must start on the main thread: its processes die with the thread that spawned them.)"""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.error = fn, None
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self.error = e

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error
