"""A Ray Tune Searcher backed by our Optuna study.

Tune decides when a trial can start and whether ASHA stops it; this searcher decides which
trial it is (the next grid point, an interrupted trial to resume, or a new Optuna sample)
and records every outcome in the study exactly once, with its identity and failure reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState
from ray.tune.search import Searcher

from smallinit.core.errors import ConfigError
from smallinit.sweeper.config.space import SweepSpace
from smallinit.sweeper.config.spec import TrialSpec
from smallinit.sweeper.worker import failures
from smallinit.sweeper.worker.trainable import METRIC

from .study import Pending, Study, trial_names

log = logging.getLogger(__name__)


class StudySearcher(Searcher):
    def __init__(self, study: Study, space: SweepSpace, pending: list[Pending], n_new: int,
                 build_spec: Callable[[dict[str, Any]], TrialSpec], max_failure_rate: float,
                 grid_distributions: dict[str, BaseDistribution] | None = None,
                 on_trial_ended: Callable[[], None] | None = None):
        super().__init__(metric=METRIC, mode="min")
        self.on_trial_ended = on_trial_ended  # after the study records an ending (the driver rewrites the table)
        self.study, self.space, self.queue, self.n_new = study, space, list(pending), n_new
        # How fixed points (grid points, reruns) are recorded; a search records its own space.
        self.fixed_distributions = grid_distributions or space.distributions()
        self.build_spec, self.max_failure_rate = build_spec, max_failure_rate
        self.live: dict[str, tuple[FrozenTrial, TrialSpec]] = {}
        self.counts = {"complete": 0, "pruned": 0, "failed": 0}
        self.aborted: str | None = None

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True  # metric and mode are fixed at construction

    def suggest(self, trial_id: str) -> dict | None:
        if self.aborted:
            return Searcher.FINISHED
        if self.queue:
            item = self.queue.pop(0)
            spec = item.spec
            named = trial_names(spec)
            if item.existing is None:
                trial = self.study.create_running(spec.params, self.fixed_distributions, **named)
            else:
                trial = item.existing
                self.study.set_attrs(trial, **named)
            self.live[trial_id] = (trial, spec)
            return spec.tune_config(trial.number)
        if self.n_new > 0:
            self.n_new -= 1
            trial = self.study.ask(self.space.distributions())
            try:
                spec = self.build_spec(trial.params)
            except ConfigError as e:  # a sampled point the model rejects: record, move on
                self.study.finish(trial, TrialState.FAIL, reason=str(e))
                self.counts["failed"] += 1
                return self.suggest(trial_id)
        else:
            return Searcher.FINISHED
        # Optuna's ask writes the trial before its attributes: a driver killed in between leaves
        # one unnamed RUNNING trial, which no rerun counts (Study.by_identity) and the
        # sampler reads as a point in flight.
        self.study.set_attrs(trial, **trial_names(spec))
        self.live[trial_id] = (trial, spec)
        return spec.tune_config(trial.number)


    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if trial_id in self.live and result.get(METRIC) is not None and "step" in result:
            self.study.report(self.live[trial_id][0], int(result["step"]), float(result[METRIC]))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.live:
            return
        trial, _ = self.live.pop(trial_id)
        result = result or {}
        kind = None
        if error:
            state, reason, kind = TrialState.FAIL, failures.WORKER_CRASHED, failures.TRANSIENT
        elif result.get("failed"):
            state, reason, kind = TrialState.FAIL, result.get("fail_reason", "failed"), result.get("fail_kind")
        elif not result.get("done_training"):
            state, reason = TrialState.PRUNED, None
        else:
            state, reason = TrialState.COMPLETE, None
        self.study.finish(trial, state, result.get(METRIC), reason, **({"fail_kind": kind} if kind else {}))
        key = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}.get(state, "failed")
        self.counts[key] += 1
        self._check_failure_rate()
        if self.on_trial_ended is not None:
            try:
                self.on_trial_ended()
            except Exception as e:  # the trials go on; the table is written again as the sweep ends
                log.warning("results table not rewritten after trial %s ended: %s", trial.number, e)

    def _check_failure_rate(self) -> None:
        ended = sum(self.counts.values())
        failed = self.counts["failed"]
        # Judge only after a few trials, so one early failure does not stop a long sweep.
        if ended >= 3 and failed / ended > self.max_failure_rate and not self.aborted:
            self.aborted = (
                f"{failed} of {ended} trials failed, above hydra.sweeper.max_failure_rate={self.max_failure_rate}: "
                "the sweep was stopped (see the fail_reason column of results.parquet)"
            )
            log.error(self.aborted)

    # The study is the durable state; Tune's own experiment checkpoints need nothing from us.
    # (Tune pickles its searcher and callbacks when a run starts: keep only what pickles.)
    def __getstate__(self) -> dict:
        return {"_metric": self._metric, "_mode": self._mode}

    def save(self, checkpoint_path: str) -> None:
        pass

    def restore(self, checkpoint_path: str) -> None:
        pass
