"""Why a trial failed, and whether the next run of the same command tries it again.

    transient   the environment's fault: a full disk, W&B's network or credentials, a crashed
                or killed worker, memory. Fixed outside the trial, so the next run retries it.
    permanent   the trial's own: it diverged, the model rejects its config, its code raises.
                The same config would fail again: final unless hydra.sweeper.retry_failed=true.

A failure's kind is written with its reason to the trial folder (failure.json) and to the
study (user attribute `fail_kind`); plan.py reads it back to decide.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

from smallinit.core.errors import ConfigError, first_line

TRANSIENT, PERMANENT = "transient", "permanent"

# What the study records when Tune gave up on a trial whose worker process died (killed, out
# of memory, segfault): no failure.json could be written, and nothing says the config is at fault.
WORKER_CRASHED = "the Ray worker crashed and retries were exhausted (see the Tune error file)"

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _chain(e: BaseException) -> Iterator[BaseException]:
    """e, then what it was raised from or while handling: torch reports a full disk as
    RuntimeError("[enforce fail at inline_container.cc:...] unexpected pos ...") raised while
    handling the OSError(ENOSPC) of the write underneath."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def disk_full(e: BaseException) -> OSError | None:
    """The full-disk OSError behind e, if that is what e is."""
    return next((c for c in _chain(e) if isinstance(c, OSError) and c.errno in _DISK_FULL), None)


_WRITE_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)


def write_refused(e: BaseException) -> OSError | None:
    """The OSError behind e that refused a write (permission, an immutable file, a read-only
    file system), if that is what e is."""
    return next((c for c in _chain(e) if isinstance(c, OSError) and c.errno in _WRITE_REFUSED), None)


def write_refused_line(e: OSError) -> str:
    """One line for a write the system refused: the path, why, and what to do."""
    what = e.filename2 or e.filename or "a file of the sweep"  # a rename onto it: the target
    return (f"cannot write {what} ({e.strerror or 'refused'}): make it writable (chmod u+w, or chattr -i for an "
            "immutable file; a read-only file system: use another hydra.sweep.dir) and rerun the same command; "
            "what finished is kept")


def classify(e: BaseException) -> tuple[str, str]:
    """(kind, reason): the reason a user reads in the results table, one line first."""
    from smallinit.trainer.folder_checks import FolderRemoved
    from smallinit.trainer.loop import TrialDiverged

    for cause in _chain(e):
        if isinstance(cause, FolderRemoved):  # the next run trains it again
            return TRANSIENT, str(cause)
        if isinstance(cause, TrialDiverged | ConfigError):
            return PERMANENT, f"{type(cause).__name__}: {cause}"
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL:
            where = cause.filename or "a file of the trial"
            return TRANSIENT, f"no space left on device: {where} (free some space and rerun the command)"
        if type(cause).__module__.split(".")[0] == "wandb":  # wandb.errors.*: network, key, service
            return TRANSIENT, f"W&B failed ({type(cause).__name__}: {first_line(cause)}); check WANDB_API_KEY, " \
                              "the network or wandb.mode=offline, and rerun the command"
        if type(cause).__name__ in ("ActorDiedError", "RayActorError", "ActorUnavailableError"):
            # A Ray Train worker of the trial was killed: the next run resumes from the checkpoint.
            return TRANSIENT, f"a worker of the trial died ({type(cause).__name__}: {first_line(cause)}); rerun to resume"
        if isinstance(cause, OSError | MemoryError) or type(cause).__name__ == "OutOfMemoryError":
            return TRANSIENT, f"{type(cause).__name__}: {cause}"
    return PERMANENT, f"{type(e).__name__}: {e}"


def retry_on_rerun(kind: str | None, retry_failed: bool) -> bool:
    """Whether a failed trial runs again on this run. A failure recorded without a kind
    (before kinds were recorded) counts as the trial's own."""
    return retry_failed or kind == TRANSIENT


def recorded_kind(folder_failure: dict | None, study_attrs: dict) -> str | None:
    """A failed trial's kind: its folder's word first (the source of truth), else the study's.
    A worker that crashed wrote no folder record; studies from before kinds name it by reason."""
    if folder_failure is not None and folder_failure.get("kind"):
        return folder_failure["kind"]
    if study_attrs.get("fail_kind"):
        return study_attrs["fail_kind"]
    if folder_failure is None and study_attrs.get("fail_reason") == WORKER_CRASHED:
        return TRANSIENT
    return None
