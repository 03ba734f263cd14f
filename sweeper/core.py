"""The sweep, start to end, on the driver.

1. Parse the overrides into a grid or an Optuna search space (sweeper/space.py).
2. Compose and validate every trial's config with Hydra, here, before anything launches;
   a bad override stops the command with one line and leaves nothing behind (compose.py).
   Prepare each distinct corpus once and hold every trial to it (trainer/data_check.py: the
   files readable, long enough, ids within the vocabulary, the budget within train.max_epochs
   passes), still before anything is written.
3. Open the study (SQLite by default) and check the grid against what it recorded (plan.py).
4. Skip trials whose identity already finished; reuse trials a killed driver left RUNNING.
5. If any are left: start or connect to Ray (cluster.py) while Tune is imported, run them as Ray Tune trials (tuner.py: StudySearcher decides which, ASHA may stop them),
   stop Ray.
6. Write results.parquet and print the best trial (results.py).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from core.errors import ConfigError
from core.results_schema import results_path
from trainer.data_check import check_trials
from trainer.host_memory import check_switch as check_allocator_switch

from . import resources, stop
from .cluster import check_reachable, connect_ray, stop_ray
from .compose import Composer, validate_sweep
from .config import SmallinitSweeperConf, check_sweeper_conf
from .lock import hold_driver_lock
from .plan import plan_sweep
from .precheck import check_name
from .space import parse_sweep
from .summary import failed_run_message
from .tuner import import_tune, run_trials


def run_sweep(conf: SmallinitSweeperConf, loader, base: DictConfig, arguments: list[str]) -> list[dict[str, Any]]:
    try:
        return _run(conf, loader, base, arguments)
    except ConfigError as e:
        sys.exit(f"error: {e}")


def _run(conf: SmallinitSweeperConf, loader, base: DictConfig, arguments: list[str]) -> list[dict[str, Any]]:
    from .results import write_results

    check_sweeper_conf(conf)
    check_name(base.get("name"))  # precheck did too, unless a Hydra flag made it step aside
    _quiet_libraries()
    ray_cfg = OmegaConf.to_container(base.get("ray", {}), resolve=True) or {}
    resources.check_local(ray_cfg)
    check_allocator_switch()  # read again by each trial's worker
    space = parse_sweep(arguments, dict(conf.params) if conf.params else None)
    sweep_dir = Path(base.hydra.sweep.dir).resolve()
    composer = Composer(loader, base, space, sweep_dir)
    grid_specs, checked = validate_sweep(composer)
    check_trials([spec.trial for spec in checked])  # every corpus read and checked before the first write
    if ray_cfg.get("address"):
        check_reachable(ray_cfg["address"])
    hold_driver_lock(sweep_dir)  # one driver per folder, from its first write to its exit
    plan = plan_sweep(conf, composer, grid_specs, checked, str(base.get("name", "sweep")))
    print(plan.summary(), flush=True)
    outcome = None
    if plan.has_work:  # a rerun of a finished sweep needs no cluster
        # Ray's start (~4 s, mostly waiting for its processes) overlaps Tune's imports (~1 s).
        ready = _Background(import_tune)
        started = connect_ray(ray_cfg)
        stop.install()  # ray.init set its own SIGTERM handler
        try:
            resources.check_cluster(ray_cfg)
            ready.result()
            outcome = run_trials(conf, ray_cfg, plan)
        finally:
            if started:
                stop_ray()
    df = write_results(sweep_dir, plan.study)
    if stop.received() is not None:
        print(f"stopped by {stop.signal_name()}; rerun the same command to resume", file=sys.stderr)
    elif outcome and outcome.aborted:
        sys.exit(f"error: {outcome.aborted}")
    elif outcome and outcome.failed:
        sys.exit(f"error: {failed_run_message(outcome.failed, outcome.ended, results_path(sweep_dir))}")
    return df.to_dict("records")


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
