"""Whose a trial folder is, read before and while a trial trains into it: a finished result or
a checkpoint of another trial (refused: ForeignFolder), the folder removed or replaced mid-run
(FolderRemoved), and which of train.budgets' branches already have their file. The trainer
(loop.py) and the one entry point (entry.py) ask here; a single run asks folder_refusal before
Hydra writes anything into the folder."""

from __future__ import annotations

from pathlib import Path

from smallinit.core.trial_dir import TrialDir, unusable

from .config import TrialConfig
from .schedule import Branch


class ForeignFolder(RuntimeError):
    """out_dir holds another trial's result or checkpoint: nothing is trained over it."""


class FolderRemoved(RuntimeError):
    """The trial's folder was removed (or emptied) while it trained: what it would write next has
    no trial.json to belong to, so it stops rather than leave a result nobody can read."""


def finished_result(folder: TrialDir, trial: TrialConfig, identity: str, world: int, log=print) -> dict | None:
    """The folder's result if trial `identity` finished there; None if nothing finished there;
    ForeignFolder if another trial did (DamagedFile from read_result if it cannot be read)."""
    finished = folder.read_result()
    if finished is None:
        return None
    if finished.get("identity") != identity:
        raise ForeignFolder(not_this_trial(folder.path, "finished trial", finished.get("identity"), trial, world, identity))
    log(f"trial {identity} already finished in {folder.path}")
    return finished


def folder_refusal(trial: TrialConfig, out_dir: Path, identity: str, world: int = 1) -> str | None:
    """Why trial `identity` must not train in out_dir, read without writing anything: a finished
    trial or a checkpoint of another trial is there (run_trial and the trainer refuse the same).
    For a caller that writes into the folder before training starts (Hydra's .hydra/): ask first."""
    folder = TrialDir(out_dir)
    finished = folder.read_result(damaged_ok=True)
    if isinstance(finished, dict) and finished.get("identity") != identity:
        return not_this_trial(Path(out_dir), "finished trial", finished.get("identity"), trial, world, identity)
    return foreign_checkpoint(folder, trial, world, identity)


def not_this_trial(out_dir: Path, what: str, other: str, trial: TrialConfig, world: int, identity: str) -> str:
    """The one line refusing a folder that holds `what` of trial `other`, not of this trial
    (`identity`) on `world` workers; when `other` is this trial on another worker count, it says so."""
    workers = trial.workers_of(other)
    if workers is None:
        return f"{out_dir} holds {what} {other}, not {identity}: use another folder"
    return (f"{out_dir} holds {what} {other}, this trial on {_count(workers)}, not {identity} on "
            f"{_count(world)}: a trial's worker count is part of its identity (docs/sweeps.md); run it "
            f"there on {_count(workers)}, or use another folder")


def folder_gone(folder: TrialDir, identity: str) -> str | None:
    """Why folder is no longer this trial's (its trial.json removed or replaced), or None."""
    meta = folder.read_trial(damaged_ok=True)
    if meta is not None and meta.get("identity") == identity:
        return None
    what = "its trial.json is gone" if meta is None else f"its trial.json now names {meta.get('identity')}"
    return (f"{folder.path} was removed or replaced while the trial trained ({what}): this run's work is not "
            "kept; rerun the command to train the trial again")


def _count(workers: int) -> str:
    return "1 worker" if workers == 1 else f"{workers} workers"


def foreign_checkpoint(folder: TrialDir, trial: TrialConfig, world: int, identity: str) -> str | None:
    """Why folder's checkpoint cannot be resumed here: trial.json says it is another trial's;
    None without a checkpoint or with this trial's (a damaged one is set aside when read)."""
    record = folder.read_trial(damaged_ok=True)
    other = record.get("identity") if isinstance(record, dict) else None
    if not folder.has_checkpoint or not isinstance(other, str) or other == identity:
        return None
    return not_this_trial(folder.path, "a checkpoint of trial", other, trial, world, identity)


def budgets_done(folder: TrialDir, side: list[Branch], identity: str, state: dict | None, log) -> tuple[set[int], bool]:
    """(the budgets whose branch already ran, whether the run must start again from step 0).
    A branch ran when its budgets/<tokens>.json is whole and this trial's <tokens> branch: the
    file is what the table reports, so the checkpoint's list (written after it) only says which
    to expect. A damaged or foreign file is set aside and named in one line; its branch runs
    again at its fork, or, when the checkpoint is past that fork (the stable state there is
    gone), the trial trains again from step 0 rather than finish without that budget."""
    step = state["step"] if state is not None else 0
    listed = set(state.get("budgets_done", ())) if state is not None else set()
    done, restart = set(), False
    for b in side:
        path, why = folder.budget_json(b.tokens), folder.damaged_budget(b.tokens, identity)
        if why is None and path.exists():
            done.add(b.tokens)
            continue
        if why is None and b.tokens not in listed and b.fork >= step:
            continue  # not reached yet
        what = f"{path} is missing"
        if why is not None:
            what = f"{path} is {unusable(why)}: set aside as {folder.set_aside_budget(b.tokens).name}"
        if b.fork < step:
            restart = True
            log(f"{what}; the checkpoint (step {step}) is past its fork (step {b.fork}): training the trial "
                "again from step 0")
        else:
            log(f"{what}; the {b.tokens}-token branch runs again at its fork (step {b.fork})")
    return done, restart
