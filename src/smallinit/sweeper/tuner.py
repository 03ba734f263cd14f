"""The Ray Tune wiring: one Tuner that runs a SweepPlan's trials. StudySearcher decides
which trial runs next, ASHA may stop it early, ProgressTable draws the terminal."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smallinit.sweeper.config.config import SmallinitSweeperConf
from smallinit.sweeper.runtime import stop
from smallinit.sweeper.runtime.cluster import (
    ClusterWatch,
    local_ray_lost,
    trial_resources,
    trial_slots,
)
from smallinit.sweeper.study.plan import SweepPlan


def import_tune() -> None:
    """Tune's imports (~1 s), done ahead so they can overlap Ray's start."""
    # Tune's usage telemetry imports its W&B integration, and with it wandb (~0.8 s), when
    # the run starts: imported here, beside Ray's start, it is off the critical path.
    import ray.air.integrations.wandb  # noqa: F401
    import ray.tune.logger  # noqa: F401
    import ray.tune.schedulers  # noqa: F401

    from smallinit.sweeper.results import progress  # noqa: F401
    from smallinit.sweeper.study import searcher  # noqa: F401


@dataclass
class TuneOutcome:
    aborted: str | None  # why the sweep was stopped early (hydra.sweeper.max_failure_rate)
    failed: int  # trials of this run recorded as FAIL
    ended: int  # trials of this run that ended (COMPLETE, PRUNED or FAIL)


def run_trials(conf: SmallinitSweeperConf, ray_cfg: dict[str, Any], plan: SweepPlan,
               record_without_ray: Callable[[], None]) -> TuneOutcome:
    """Run the plan's trials on the connected Ray; record_without_ray() ends the sweep should a
    stop signal end Ray's own processes too (stop.py)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our ProgressTable is the display
    # A failed trial's last report has no val_loss; it is still a result we want recorded.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # A failed trial task is one line from ProgressTable (retried or not), not Tune's Ray traceback.
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # Tune's default loggers include TensorBoard's, whose import pulls torch into the driver
    # (~2-3 s of every sweep's start): add the loggers ourselves, TensorBoard only when asked.
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from smallinit.sweeper.results.progress import ProgressTable, trial_cost
    from smallinit.sweeper.results.results import TableRefresher
    from smallinit.sweeper.study.searcher import StudySearcher
    from smallinit.sweeper.worker.trainable import METRIC, run_spec

    composer = plan.composer
    # Each trial's own worker count (ray.fit_device_gib gives sizes their own); the largest caps the slots.
    most = max(s.workers for s in [*plan.checked, *(p.spec for p in plan.pending)])
    searcher = StudySearcher(plan.study, plan.space, plan.pending, plan.n_new, lambda p: composer.spec(p, write=True),
                             conf.max_failure_rate, plan.grid_distributions,
                             on_trial_ended=TableRefresher(plan.sweep_dir, plan.study))

    class AbortStopper(tune.Stopper):
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return searcher.aborted is not None

    progress = ProgressTable(plan.space.swept_keys, plan.total, plan.skipped, [trial_cost(p.spec) for p in plan.pending])
    callbacks = [progress, CSVLoggerCallback(), JsonLoggerCallback()]
    if conf.tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        callbacks.append(TBXLoggerCallback())
    tuner = tune.Tuner(
        tune.with_resources(run_spec, lambda config: trial_resources(ray_cfg, config["spec"].workers)),
        tune_config=tune.TuneConfig(metric=METRIC, mode="min", search_alg=searcher, scheduler=_scheduler(conf, plan),
                                    num_samples=len(plan.pending) + plan.n_new,
                                    max_concurrent_trials=trial_slots(ray_cfg, conf.max_concurrent, most),
                                    reuse_actors=conf.reuse_workers,
                                    trial_name_creator=_trial_name, trial_dirname_creator=_trial_name),
        run_config=tune.RunConfig(name="tune", storage_path=str(plan.sweep_dir / "ray"), callbacks=callbacks, verbose=0,
                                  stop=AbortStopper(), failure_config=tune.FailureConfig(max_failures=conf.max_retries)),
    )
    try:
        with stop.tune_takes_stops(record_without_ray, local_ray_lost, ClusterWatch.of_connected()):
            tuner.fit()
    finally:
        progress.close()
    return TuneOutcome(searcher.aborted, searcher.counts["failed"], sum(searcher.counts.values()))


def _scheduler(conf: SmallinitSweeperConf, plan: SweepPlan):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if not conf.asha.enabled:
        return FIFOScheduler()
    # A search with nothing to resume has no spec yet: its first corner stands in.
    steps = [p.spec.trial.train.total_steps for p in plan.pending] or [plan.checked[0].trial.train.total_steps]
    max_t = max(steps)
    # max_t + 1: ASHA stops a trial that reaches max_t, which would cut it off before
    # it writes its results; finishing trials must end on their own.
    return ASHAScheduler(time_attr="step", max_t=max_t + 1, grace_period=conf.asha.grace_period or max(1, max_t // 4),
                         reduction_factor=conf.asha.reduction_factor)


def _trial_name(trial) -> str:
    return f"trial_{trial.config['number']}_{trial.config['spec'].identity}"
