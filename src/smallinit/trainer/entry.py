"""The one way a trial is trained into its folder. A single run (`sweep.py` without -m,
smallinit/cli.py) and a sweep's Ray worker (sweeper/worker/trainable.py) both call train_trial,
so both take the folder's lock, treat a damaged or finished result and refuse another trial's
folder the same way; only how the training itself runs (this process, or a sweep's Ray Train
run of several workers) and where its output goes differ, and the caller passes those in."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from smallinit.core.trial_dir import TrialDir, unusable
from smallinit.core.trial_lock import trial_lock

from .config import TrialConfig
from .folder_checks import finished_result
from .loop import run_trial


def train_trial(trial: TrialConfig, out_dir: Path | str, identity: str, *,
                fit: Callable[[], dict[str, Any] | None] | None = None, set_aside_damaged: bool = False,
                world: int = 1, log: Callable[..., None] = print, **run: Any) -> dict[str, Any] | None:
    """Train trial `identity` into out_dir and return its result (result.json's fields).

    Holds the folder's trial.lock throughout (a second trainer gets TrialBusy at once). A
    result.json that cannot be reported is set aside and the trial trains again where
    `set_aside_damaged` (a sweep: its driver has said so already), else read_result raises
    DamagedFile (a single run: its user decides). A finished result of this trial is returned
    as it is, another trial's is ForeignFolder (`world`: the trial's worker count, for that
    line). Else `fit()` trains (a sweep's attempt, its output in the trial's log and its
    failure recorded: None then), or run_trial in this process with `run`'s arguments."""
    folder = TrialDir(out_dir)
    folder.path.mkdir(parents=True, exist_ok=True)
    with trial_lock(folder.lock):
        why = folder.damaged_result() if set_aside_damaged else None
        if why is not None:
            log(f"{folder.result_json} is {unusable(why)}: set aside as {folder.set_aside_result().name}; training the trial")
        finished = finished_result(folder, trial, identity, world, log)
        if finished is not None:
            return finished
        if fit is not None:
            return fit()
        return json.loads(json.dumps(asdict(run_trial(trial, folder.path, log=log, identity=identity, **run)), default=str))
