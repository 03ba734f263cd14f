"""One sweep folder, one question: the fixed overrides a folder was made with are recorded in
`fixed_overrides.json`, and a later command with different ones is refused before any trial.

Growing the grid stays allowed: a key that either run sweeps (more seeds, one more gamma, a
subset picked with a fixed value) is not a conflict, and neither are keys that change where
or how trials run rather than what they compute (Ray, W&B, Hydra's sweeper settings, threads).
"""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import ConfigError
from core.files import atomic_write_json

RECORD = "fixed_overrides.json"
# Where and how a trial runs, not what it computes: never a different question.
OPERATIONAL = ("hydra.", "ray.", "wandb.", "train.device", "train.threads", "train.compile", "train.log_every",
               "train.peak_tflops", "data.cache_dir", "name")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _fixed(overrides: list[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        key = _key(o)
        if not key.startswith(OPERATIONAL):
            out[key] = o
    return out


def check(sweep_dir: Path, fixed: list[str], swept: list[str]) -> dict:
    """Raise ConfigError if sweep_dir was made with other fixed overrides; else return the
    record to write once every other check has passed (nothing is written here)."""
    path = Path(sweep_dir) / RECORD
    now = _fixed(fixed)
    before = json.loads(path.read_text()) if path.exists() else None
    if before is not None:
        swept_any = set(before.get("swept", [])) | set(swept)
        old = before.get("fixed", {})
        differ = sorted(k for k in set(old) | set(now) if k not in swept_any and old.get(k) != now.get(k))
        if differ:
            was = " ".join(old[k] for k in differ if k in old) or "(none)"
            given = " ".join(now[k] for k in differ if k in now) or "(none)"
            raise ConfigError(
                f"{sweep_dir} was made with {was}, this command has {given}: that is another question, "
                f"so give it its own folder with name=... (the same fixed overrides grow or resume this one)")
        now = {**old, **now}
        swept = sorted(set(before.get("swept", [])) | set(swept))
    return {"fixed": now, "swept": sorted(swept)}


def record(sweep_dir: Path, checked: dict) -> None:
    atomic_write_json(Path(sweep_dir) / RECORD, checked)
