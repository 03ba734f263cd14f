"""One trial's folder: every file in it named here, and its path taken from here by the code
that writes it. The JSON records (sweep.json, placement.json, trial.json, budgets/, result.json,
failure.json) are read and written here; .hydra/ by the sweeper (config/compose.py),
metrics.jsonl by trainer/reporting.py, probes/, per_token_losses.npz and model.pt by the
trainer (loop.py, observer.py), checkpoints by trainer/checkpoint.py and distributed.py.

    .hydra/               the composed Hydra config and the overrides (sweeps only)
    sweep.json            the planned trial (params, overrides, identity, resolved config,
                          worker count), written by the sweep driver before any worker starts
    placement.json        one entry per attempt: the Ray node, host and pid that ran it
    trial.json            the resolved TrialConfig, its identity and the worker count training
                          it, written when training starts
    metrics.jsonl         every logged step (train, val, probes, throughput)
    probes/step_*.npz     row-cosine matrices at log-spaced probe steps (heatmaps)
    checkpoint.pt         latest state (model, optimizer, step), for resume; removed when done
    checkpoint.dcp/       the same from a trial trained by several workers: each rank's shard
                          (torch.distributed.checkpoint) and rank 0's scalars.json; written as
                          checkpoint.dcp.new/, swapped in through checkpoint.dcp.old/; removed when done
    per_token_losses.npz  loss of each token of the fixed eval slice, at the end
    model.pt              the final weights
    budgets/<tokens>.json one token budget's result (train.budgets): written when its cooldown
                          branch has been evaluated; the largest budget's equals result.json
    result.json           the final summary: its presence means the trial finished (a driver
                          sets a damaged one aside, result_problem says which, and trains again)
    failure.json          why a trial raised or diverged, and whether that is the environment's
                          fault (transient: retried by the next run) or its own (permanent)
    trial.log             the worker's output while it ran the trial (every attempt, appended)
    trial.lock            held by the worker training the trial (a second worker is refused)

Every JSON file is written atomically, so a reader sees the old file or the new one. Readers
that decide whether to train (the trainer, the worker) let a damaged file raise: taking a
damaged result.json for "not finished" would train over a finished trial. The results table
passes `damaged_ok=True`: one unreadable folder must not cost every other trial its row.

result.json lists every other file the finished trial keeps, with its size and sha256
(core/trial_files.py); damaged_result() holds the folder to that list, so a file changed since
the trial finished makes its record as unusable as a damaged result.json, for every reader.

A result read back must also be this trial's: a file copied in from another trial folder
(another identity, or another budget's branch) is as unusable as a damaged one, and the same
readers treat it the same way (damaged_result, damaged_budget). Paths a record stores
(result.json's `artifacts`) are relative to the trial folder, so a copied folder reads its own.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

from . import metrics_log, trial_files
from .files import atomic_write_json

TRIALS_FOLDER = "trials"  # a sweep folder keeps each trial at trials/<identity>/


class DamagedFile(json.JSONDecodeError):
    """A trial file that is there but cannot be read; the message names it. A JSONDecodeError,
    so every reader that caught the undecorated error still does."""

    def __init__(self, path: Path, cause: Exception):
        super().__init__(str(cause).splitlines()[0], getattr(cause, "doc", ""), getattr(cause, "pos", 0))
        self.path = path
        self.why = str(cause).splitlines()[0]

    def __str__(self) -> str:
        return f"{self.path} is damaged ({self.why})"

    def __reduce__(self):  # raised inside Ray workers: it must survive a pickle round trip
        return DamagedFile, (self.path, ValueError(self.why))


def _read_json(path: Path, damaged_ok: bool) -> Any:
    """The file's JSON, None if it is missing (or damaged, with damaged_ok)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # cut off, or not text at all
        if damaged_ok:
            return None
        raise DamagedFile(path, e) from e


# What the results table reads from result.json (trainer.loop.TrialResult writes them all);
# a file without one of them was not written by a finished trial.
RESULT_KEYS = ("identity", "steps", "tokens", "n_params", "final_val_loss", "best_val_loss", "unigram_entropy",
               "wall_s", "tokens_per_s", "mfu")


def result_problem(result: Any) -> str | None:
    """Why a parsed result.json (or budgets/<tokens>.json) cannot be reported; None if it can.
    A finished trial has a finite validation loss: the study records one without it as FAIL."""
    if not isinstance(result, dict):
        return f"not a JSON object but {type(result).__name__}"
    missing = [k for k in RESULT_KEYS if k not in result]
    if missing:
        return f"no {', '.join(missing)}"
    if not all(isinstance(result[k], int) and not isinstance(result[k], bool) for k in ("steps", "tokens", "n_params")):
        return "steps, tokens and n_params are not all integers"
    loss = result["final_val_loss"]
    if not isinstance(loss, int | float) or isinstance(loss, bool) or not math.isfinite(loss):
        return f"final_val_loss={loss!r} is not a finite number"
    return None


# A problem that says the file is another's (result_problem's others say it is damaged): a line
# names it as such, not as damage, so the reader looks for the copy that put it there. So is a
# whole result.json whose trial's other files changed (core/trial_files.py).
FOREIGN = ("another trial's", "another budget's")
CHANGED = "the record of files that changed since: "


def unusable(why: str) -> str:
    """How one line names a file that cannot be reported: `another trial's file (...)`, `the
    record of files that changed since: ...` or `damaged (...)`."""
    return why if why.startswith((*FOREIGN, CHANGED)) else f"damaged ({why})"


def _set_aside(path: Path) -> Path:
    """Rename path to <name>.corrupt-<time> beside itself (kept for a look, never read again)."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    path.rename(aside)
    return aside


def _file(name: str) -> property:
    """A read-only path property: the file `name` inside the trial folder."""
    return property(lambda self: self.path / name, doc=f"{name} in the trial folder")


class TrialDir:
    """A trial folder; creating one touches nothing on disk."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"TrialDir({str(self.path)!r})"

    @classmethod
    def in_sweep(cls, sweep_dir: str | Path, identity: str) -> TrialDir:
        return cls(Path(sweep_dir) / TRIALS_FOLDER / identity)

    @classmethod
    def all_in_sweep(cls, sweep_dir: str | Path) -> list[TrialDir]:
        """Every trial folder of a sweep, in name order; [] before the first one is planned."""
        root = Path(sweep_dir) / TRIALS_FOLDER
        return [cls(p) for p in sorted(root.iterdir())] if root.exists() else []

    @property
    def identity(self) -> str:
        return self.path.name

    def own_identity(self) -> str | None:
        """Whose folder this is, to check the results read back against: in a sweep
        (trials/<identity>/) its name, which the driver made from the identity; elsewhere
        (runs/<name>/<time>/) what sweep.json, else trial.json, records; None when nothing says."""
        if self.path.parent.name == TRIALS_FOLDER:
            return self.path.name
        for record in (self.read_sweep_plan(), self.read_trial(damaged_ok=True)):
            if isinstance(record, dict) and isinstance(record.get("identity"), str):
                return record["identity"]
        return None

    # ---- paths ----
    # The files of the module docstring, one line each.
    hydra_config = _file(".hydra/config.yaml")
    hydra_overrides = _file(".hydra/overrides.yaml")
    sweep_json = _file("sweep.json")
    placement_json = _file("placement.json")
    trial_json = _file("trial.json")
    metrics = _file("metrics.jsonl")
    probes = _file("probes")
    checkpoint = _file("checkpoint.pt")
    checkpoint_dcp = _file("checkpoint.dcp")
    checkpoint_dcp_new = _file("checkpoint.dcp.new")
    checkpoint_dcp_old = _file("checkpoint.dcp.old")
    per_token_losses = _file("per_token_losses.npz")
    model_weights = _file("model.pt")
    budgets = _file("budgets")
    result_json = _file("result.json")
    failure_json = _file("failure.json")
    log = _file("trial.log")
    lock = _file("trial.lock")

    def probe_snapshot(self, step: int) -> Path:
        return self.probes / f"step_{step:07d}.npz"

    def budget_json(self, tokens: int) -> Path:
        return self.budgets / f"{tokens}.json"

    # ---- state ----

    @property
    def finished(self) -> bool:
        return self.result_json.exists()

    @property
    def failed(self) -> bool:
        return self.failure_json.exists()

    @property
    def has_checkpoint(self) -> bool:
        """A state to resume from: checkpoint.pt, checkpoint.dcp/, or the whole one a swap cut short kept."""
        return any(p.exists() for p in (self.checkpoint, self.checkpoint_dcp, self.checkpoint_dcp_old))

    def drop_checkpoint(self) -> None:
        """Only after result.json is written: a kill in between still resumes."""
        self.checkpoint.unlink(missing_ok=True)
        self.drop_sharded_checkpoint()

    def drop_sharded_checkpoint(self) -> None:
        """checkpoint.dcp/ and a save or swap of it that a kill cut short (a set-aside copy stays)."""
        for path in (self.checkpoint_dcp, self.checkpoint_dcp_new, self.checkpoint_dcp_old):
            shutil.rmtree(path, ignore_errors=True)

    def artifacts(self, per_token_losses: bool, weights: bool = True) -> dict[str, str]:
        """result.json's `artifacts`: the outputs' names relative to this folder (a copied or
        moved folder then names its own files; artifact() reads them); per_token_losses "" when
        none were written, model "" without weights (train.keep_weights=false)."""
        return {
            "metrics": self.metrics.name, "probes": self.probes.name,
            "per_token_losses": self.per_token_losses.name if per_token_losses else "",
            "model": self.model_weights.name if weights else "",
        }

    def artifact(self, stored: str | None) -> Path | None:
        """Where an `artifacts` entry is: a relative one (written since they are) inside this
        folder; an absolute one (older records) is this folder's own file of that name when
        it names a folder of this name and the file is here (the record was copied with the
        folder), else the path as stored. None for "" or None (not written)."""
        if not stored:
            return None
        path = Path(stored)
        if not path.is_absolute():
            return self.path / path
        own = self.path / path.name
        return own if path.parent.name == self.path.name and own.exists() else path

    # ---- sweep.json: the driver's plan ----

    def write_sweep_plan(self, params: dict[str, Any], overrides: list[str], identity: str,
                         config: dict[str, Any], workers: int = 1) -> None:
        atomic_write_json(self.sweep_json, {"params": params, "overrides": overrides, "identity": identity,
                                            "config": config, "workers": workers})

    def read_sweep_plan(self) -> dict[str, Any]:
        """The plan, {} if missing or damaged (only the results table reads it)."""
        plan = _read_json(self.sweep_json, damaged_ok=True)
        return plan if isinstance(plan, dict) else {}

    # ---- placement.json: one entry per attempt ----

    def record_attempt(self, node_id: str | None, hostname: str, pid: int, cpu: str | None = None) -> None:
        attempts = self.read_attempts()
        attempts.append({"node_id": node_id, "hostname": hostname, "pid": pid, "cpu": cpu})
        atomic_write_json(self.placement_json, attempts)

    def read_attempts(self, damaged_ok: bool = False) -> list[dict[str, Any]]:
        """Every attempt so far, oldest first; [] before the first."""
        return _read_json(self.placement_json, damaged_ok) or []

    # ---- trial.json: what run_trial is training ----

    def write_trial(self, identity: str, config: dict[str, Any], workers: int = 1) -> None:
        atomic_write_json(self.trial_json, {"identity": identity, "config": config, "workers": workers})

    def recorded_workers(self) -> int:
        """The worker count that trains the trial, as trial.json (else sweep.json) records it;
        1 for folders written before it was recorded."""
        for record in (self.read_trial(damaged_ok=True), self.read_sweep_plan()):
            n = record.get("workers") if isinstance(record, dict) else None
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                return n
        return 1

    def read_trial(self, damaged_ok: bool = False) -> dict[str, Any] | None:
        return _read_json(self.trial_json, damaged_ok)

    # ---- result.json / failure.json: how it ended ----

    def write_result(self, result: dict[str, Any]) -> None:
        atomic_write_json(self.result_json, result)

    def read_result(self, damaged_ok: bool = False) -> dict[str, Any] | None:
        """The finished trial's summary, or None if it has not finished."""
        return _read_json(self.result_json, damaged_ok)

    def damaged_result(self) -> str | None:
        """Why result.json, which is there, cannot be reported (unreadable, cut off, another
        schema, no finite loss, another trial's, or a file it lists changed since: the trial's
        record is then not whole); None when it is missing or whole."""
        why = self._problem(self.result_json)
        if why is None and self.result_json.exists():
            changed = self.changed_files()
            if changed:
                return CHANGED + trial_files.describe(changed)
        return why

    def changed_files(self, weights: bool = False) -> dict[str, str]:
        """{name: what is wrong} for the files result.json lists that are not as the trial left
        them (core/trial_files.py); `weights`: model.pt too. {} for an unfinished trial."""
        result = _read_json(self.result_json, damaged_ok=True)
        return trial_files.changes(self.path, result, weights) if isinstance(result, dict) else {}

    def _problem(self, path: Path, tokens: int | None = None, identity: str | None = None) -> str | None:
        """Why the result at path (result.json, or budgets/<tokens>.json) cannot be reported
        as trial `identity`'s (default own_identity()); None when it is missing or whole and its own."""
        try:
            result = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "not readable JSON (cut off or overwritten)"
        problem = result_problem(result)
        if problem is not None:
            return problem
        own = identity or self.own_identity()
        if own is not None and result["identity"] != own:
            return f"another trial's file: it holds trial {result['identity']}'s result, this folder is trial {own}"
        # Files from before budget_tokens was recorded have none: nothing to hold them to.
        recorded = result.get("budget_tokens")
        if tokens is not None and recorded is not None and recorded != tokens:
            return f"another budget's file: it holds the {recorded}-token branch's result, not the {tokens}-token one"
        return None

    def set_aside_result(self) -> Path:
        """Rename result.json beside itself (kept, as a damaged checkpoint is): the trial is
        then unfinished and trains again. The files it lists that changed since are set aside
        with it: training again writes the trial's own, never over a file it did not write."""
        for name in self.changed_files(weights=True):
            if (self.path / name).is_file():
                _set_aside(self.path / name)
        return _set_aside(self.result_json)

    def set_aside_file(self, path: Path) -> Path:
        """Rename one of this folder's files beside itself, as set_aside_result does."""
        return _set_aside(path)

    # ---- budgets/<tokens>.json: one budget's result ----

    def write_budget_result(self, tokens: int, result: dict[str, Any]) -> None:
        atomic_write_json(self.budget_json(tokens), result)

    def read_budget_result(self, tokens: int, damaged_ok: bool = False) -> dict[str, Any] | None:
        """The result of the branch that ends at `tokens`, or None if it has not been evaluated."""
        return _read_json(self.budget_json(tokens), damaged_ok)

    def damaged_budget(self, tokens: int, identity: str | None = None) -> str | None:
        """Why budgets/<tokens>.json, which is there, cannot be reported as the `tokens` branch
        of trial `identity` (default own_identity(); damaged_result's reasons, or another
        budget's); None when it is missing or whole."""
        return self._problem(self.budget_json(tokens), tokens, identity)

    def set_aside_budget(self, tokens: int) -> Path:
        """Rename budgets/<tokens>.json beside itself (kept): its branch is then not done."""
        return _set_aside(self.budget_json(tokens))

    def planned_budgets(self) -> list[int]:
        """The budgets the trial trains, as trial.json (else sweep.json) records them: train.budgets
        up to its max_tokens (train.stop_after ends a run early); [] without budgets or a readable config."""
        for record in (self.read_trial(damaged_ok=True), self.read_sweep_plan()):
            cfg = record.get("config") if isinstance(record, dict) else None
            train = cfg.get("train") if isinstance(cfg, dict) else None
            if isinstance(train, dict):
                budgets, last = train.get("budgets") or [], train.get("max_tokens")
                return [b for b in budgets if isinstance(b, int) and (not isinstance(last, int) or b <= last)
                        ] if isinstance(budgets, list) else []
        return []

    def write_failure(self, reason: str, traceback: str, kind: str | None = None) -> None:
        atomic_write_json(self.failure_json, {"reason": reason, "traceback": traceback, "kind": kind})

    def clear_failure(self) -> None:
        """When the trial runs again: a trial that then completes carries no old reason."""
        self.failure_json.unlink(missing_ok=True)

    def read_failure(self, damaged_ok: bool = False) -> dict[str, Any] | None:
        return _read_json(self.failure_json, damaged_ok)

    # ---- metrics.jsonl ----

    def metrics_rows(self) -> list[dict[str, Any]]:
        """metrics.jsonl's logged steps (core/metrics_log.py: a last line a kill cut short is left
        out); [] without the file. Any other bad line raises DamagedFile naming the file."""
        try:
            return metrics_log.metrics_rows(self.metrics)
        except metrics_log.DamagedLine as e:
            raise DamagedFile(self.metrics, e) from None

    def last_metrics(self) -> dict[str, Any]:
        """Each key's latest non-null value over all logged steps; {} without a metrics file."""
        last: dict[str, Any] = {}
        for row in self.metrics_rows():
            last.update({k: v for k, v in row.items() if v is not None})
        return last
