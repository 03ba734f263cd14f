"""What a sweep will run: open the study, see what it already holds, and decide which trials
are skipped (finished), reused (left RUNNING by a killed driver) or left to run.

Decided on the driver before Ray starts, and handed to the Tune wiring as one SweepPlan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from smallinit.core.trial_dir import TrialDir
from smallinit.sweeper.config import fixed_overrides
from smallinit.sweeper.config.compose import Composer
from smallinit.sweeper.config.config import SmallinitSweeperConf
from smallinit.sweeper.config.space import SweepSpace
from smallinit.sweeper.config.spec import TrialSpec
from smallinit.sweeper.runtime.lock import live_driver
from smallinit.sweeper.worker import failures

from .study import (
    FINISHED,
    Pending,
    Study,
    default_storage_url,
    make_sampler,
    open_storage,
    redacted,
    trial_names,
)
from .study_rebuild import reconcile, restore_from_folders


@dataclass
class SweepPlan:
    space: SweepSpace
    composer: Composer
    study: Study
    storage_url: str
    sweep_dir: Path
    # Validated before launch: every grid point, or a search space's corners.
    checked: list[TrialSpec]
    # How a grid's points are recorded, reconciled with what the study holds; None for a search.
    grid_distributions: dict[str, BaseDistribution] | None
    # Run first: unfinished grid points and the trials a killed driver left RUNNING.
    pending: list[Pending]
    # New Optuna samples to ask for once the pending trials are handed out.
    n_new: int
    skipped: int
    total: int
    elsewhere: int = 0  # being trained now by another sweep's driver on the same study: not here


    @property
    def has_work(self) -> bool:
        return bool(self.pending or self.n_new)

    def summary(self) -> str:
        """`sweep x: grid, 8 trials (3 already done); to run: 2 resume from a checkpoint, 3 new; folder ...`:
        finished trials are skipped, interrupted ones go on from their checkpoints, the rest start at step 0."""
        busy = f", {self.elsewhere} being trained by another sweep" if self.elsewhere else ""
        return (f"sweep {self.study.study.study_name}: {self.space.mode}, {self.total} trials ({self.skipped} already done{busy}); "
                f"{to_run(self.pending, self.n_new)}; folder {self.sweep_dir}, study {redacted(self.storage_url)}")


def to_run(pending: list[Pending], n_new: int) -> str:
    """What is left, by how it starts: from a checkpoint its folder holds, or new (from step 0)."""
    if not pending and not n_new:
        return "nothing to run"
    resume = sum(TrialDir(p.spec.out_dir).has_checkpoint for p in pending)
    return f"to run: {resume} resume from a checkpoint, {len(pending) - resume + n_new} new"


def plan_sweep(conf: SmallinitSweeperConf, composer: Composer, grid_specs: list[TrialSpec],
               checked: list[TrialSpec], sweep_name: str) -> SweepPlan:
    """Open the study and plan against it. Writes the folder of each trial left to run."""
    space, sweep_dir = composer.space, composer.sweep_dir
    fixed = fixed_overrides.check(sweep_dir, space.fixed, space.swept_keys,
                                  {k: c.strings for k, c in space.discrete.items()})
    storage_url = conf.storage or default_storage_url(sweep_dir)
    storage = open_storage(storage_url)
    sampler = make_sampler(conf.sampler, conf.seed, space.distributions())
    study = Study(storage, conf.study_name or sweep_name, sampler)
    for line in reconcile(study, sweep_dir):  # the folders are the truth: nothing finished is silently dropped
        print(f"study: {line}", flush=True)
    restored, closed = restore_from_folders(study, sweep_dir, space.grid_distributions() if space.mode == "grid"
                                            else space.distributions())
    if restored:
        print(f"study: recorded {restored} ended trials from {sweep_dir / 'trials'} that it lacked", flush=True)
    if closed:
        print(f"study: closed {_trials(closed)} left RUNNING by a stopped driver, as {sweep_dir / 'trials'} "
              "records them", flush=True)
    # A grid rerun with more values (seeds, gammas) must fit what the study recorded: checked
    # before Ray starts, so this error, like every other, comes in the first seconds.
    grid_dists = study.grid_distributions(space) if space.mode == "grid" else None
    # Everything is valid: from here on we write.
    fixed_overrides.record(sweep_dir, fixed)
    pending, n_new, skipped, total, elsewhere = _left_to_run(conf, space, study, grid_specs, composer, grid_dists)
    return SweepPlan(space=space, composer=composer, study=study, storage_url=storage_url, sweep_dir=sweep_dir,
                     checked=checked, grid_distributions=grid_dists, pending=pending, n_new=n_new,
                     skipped=skipped, total=total, elsewhere=elsewhere)


def _trials(n: int) -> str:
    return f"{n} trial" if n == 1 else f"{n} trials"


def _running_elsewhere(t, sweep_dir: Path) -> str | None:
    """Where a RUNNING study trial is being trained by another live driver (a study shared
    between sweep folders), or None if it was left by a driver that is gone: only then is it
    adopted here. Two drivers finishing one study trial would collide (UpdateFinishedTrialError)."""
    if t is None or t.state != TrialState.RUNNING or "trial_dir" not in t.user_attrs:
        return None
    folder = Path(t.user_attrs["trial_dir"]).parent.parent  # <sweep folder>/trials/<identity>
    if folder.resolve() == Path(sweep_dir).resolve():
        return None  # this driver holds that folder's lock: no other driver runs there
    holder = live_driver(folder)
    if holder is None:
        return None
    return f"{folder} (pid {holder.get('pid')} on {holder.get('host')})"


def _say_running_elsewhere(elsewhere: dict[str, str]) -> None:
    if elsewhere:
        where = "; ".join(sorted(set(elsewhere.values())))
        print(f"study: {_trials(len(elsewhere))} of this sweep {'is' if len(elsewhere) == 1 else 'are'} being trained "
              f"by another sweep's driver ({where}): not trained here; rerun once it ends for the result",
              flush=True)


def _left_to_run(conf, space, study, specs, composer, grid_dists) -> tuple[list[Pending], int, int, int, int]:
    """(pending, n_new, skipped, total, running elsewhere). A grid's trials left to run are
    claimed in the study now, RUNNING and named, before Ray starts: another sweep's driver on
    the same study, started seconds later, sees them as trained here and leaves them."""
    known = study.by_identity()
    elsewhere = {ident: where for ident, t in known.items()
                 if (where := _running_elsewhere(t, composer.sweep_dir)) is not None}
    _say_running_elsewhere(elsewhere)
    if space.mode == "grid":
        pending, skipped, busy = [], 0, 0
        for spec in specs:
            t = known.get(spec.identity)
            folder = TrialDir(spec.out_dir)
            failed = folder.failed or (t is not None and t.state == TrialState.FAIL)
            if spec.identity in elsewhere:
                busy += 1
                continue
            if folder.finished or (failed and not _retry(conf, folder, t)) or (
                    not failed and t is not None and t.state in FINISHED):
                skipped += 1
                continue
            composer.spec(spec.params, write=True)
            if t is None or t.state != TrialState.RUNNING:
                t = study.create_running(spec.params, grid_dists, **trial_names(spec))
            pending.append(Pending(spec, t))
        return pending, 0, skipped, len(specs), busy
    # Count every finished trial (a sampler may propose the same point twice); a RUNNING one
    # was left by a killed driver (one driver per study at a time) and is resumed. A failure
    # to retry runs again as a new study trial with the same params.
    gone = study.superseded()
    trials = [t for t in study.study.get_trials(deepcopy=False) if t.number not in gone]
    # A trial whose folder lost it (reconcile) trains again with its params, once.
    lost = {t.user_attrs.get("identity"): t for t in study.study.get_trials(deepcopy=False)
            if t.number in gone and t.user_attrs.get("identity") not in known}
    retry = [t for t in known.values() if t.state == TrialState.FAIL and "trial_dir" in t.user_attrs
             and _retry(conf, TrialDir(t.user_attrs["trial_dir"]), t)]
    retried = {t.number for t in retry}
    superseded = {t.number for t in trials if t.state == TrialState.FAIL
                  and known.get(t.user_attrs.get("identity"), t).number != t.number}
    finished = [t for t in trials if t.state in FINISHED and t.number not in superseded | retried]
    interrupted = [t for ident, t in known.items() if t.state == TrialState.RUNNING and ident not in elsewhere]
    pending = [Pending(composer.spec(t.params, write=True), t) for t in interrupted]
    pending += [Pending(composer.spec(t.params, write=True)) for t in [*retry, *lost.values()]]
    n_new = max(0, conf.n_trials - len(finished) - len(pending))
    return pending, n_new, len(finished), conf.n_trials, len(elsewhere)


def _retry(conf: SmallinitSweeperConf, folder: TrialDir, t) -> bool:
    """A failed trial runs again if its failure was the environment's, or retry_failed says so."""
    kind = failures.recorded_kind(folder.read_failure(damaged_ok=True), t.user_attrs if t is not None else {})
    return failures.retry_on_rerun(kind, conf.retry_failed)
