"""What a finished trial wrote, and the one check every reader of its files makes.

When a trial finishes, its result.json lists (`files`) every file the trial keeps: the plan
(sweep.json, .hydra/), the config it trained (trial.json), its metrics, probes, per-token losses,
the other budgets' results and its weights, each with its size and sha256. result.json is
written last, so the list is what the trial left. `changes()` holds the folder against it and
names, one line each, a listed file that is missing, emptied, cut short or changed (another
trial's copy, or an edit), and a file of those kinds that the trial did not write.

TrialDir.damaged_result() includes these, so every consumer that asks whether a finished trial
can be reported asks this too, and each does what it does for a damaged result.json: the sweep
driver sets the trial's record and the changed files aside and trains it again, the results
table reports it as FAIL with the reason, the report leaves it out of every verdict and says so.
The weights are held to their size everywhere and to their sha256 only where they are read
(export): hashing every model.pt at every table write would cost more than the rest of the table.

A result.json written before this list existed has none: its files are not checked.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

KEY = "files"  # result.json's list
WEIGHTS = "model.pt"
KEPT = (".hydra/config.yaml", ".hydra/overrides.yaml", "sweep.json", "trial.json", "metrics.jsonl",
        "per_token_losses.npz", WEIGHTS)
# The files in a kept folder that a trial writes (a set-aside copy, name.corrupt-<time>, is not one).
KEPT_IN = {"probes": re.compile(r"step_\d+\.npz"), "budgets": re.compile(r"\d+\.json")}
CHUNK = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def kept(folder: Path, own_budget: int | None = None) -> list[str]:
    """The kept files present in folder, relative to it, sorted. The largest budget's result
    (`own_budget`) is left out: it is result.json's twin, rewritten from it when lost."""
    names = [n for n in KEPT if (folder / n).is_file()]
    for sub, pattern in KEPT_IN.items():
        if (folder / sub).is_dir():
            names += [f"{sub}/{p.name}" for p in (folder / sub).iterdir() if pattern.fullmatch(p.name) and p.is_file()]
    skip = f"budgets/{own_budget}.json" if own_budget is not None else None
    return sorted(n for n in names if n != skip)


def listing(folder: Path, own_budget: int | None = None) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "sha256"}} of every kept file: what result.json records at the end."""
    return {n: {"bytes": (folder / n).stat().st_size, "sha256": sha256(folder / n)} for n in kept(folder, own_budget)}


def changes(folder: Path, result: dict[str, Any], weights: bool = False) -> dict[str, str]:
    """{name: what is wrong} for each kept file not as the finished trial left it; {} when all
    are, or when result.json lists none (written before the list existed). model.pt is held to
    its size, and with `weights` to its sha256 too."""
    listed = result.get(KEY)
    if not isinstance(listed, dict) or not listed:
        return {}
    out = {}
    for name, want in sorted(listed.items()):
        path = folder / name
        wrote = want.get("bytes") if isinstance(want, dict) else None
        if not path.is_file():
            out[name] = "missing"
            continue
        size = path.stat().st_size
        if size != wrote:
            what = "empty" if size == 0 else "cut short" if isinstance(wrote, int) and size < wrote else "another size"
            out[name] = f"{what} ({size:,} bytes; the trial wrote {wrote:,})" if isinstance(wrote, int) else what
        elif (name != WEIGHTS or weights) and sha256(path) != want.get("sha256"):
            out[name] = "not the file the trial wrote (same size, another sha256: another trial's copy, or edited)"
    own = result.get("budget_tokens")
    for name in kept(folder, own if isinstance(own, int) else None):
        if name not in listed:
            out[name] = "not written by this trial (put there after it finished)"
    return out


def describe(changed: dict[str, str]) -> str:
    return "; ".join(f"{name} is {why}" for name, why in changed.items())
