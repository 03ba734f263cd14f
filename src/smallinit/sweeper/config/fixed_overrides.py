"""One sweep folder, one question: the fixed overrides a folder was made with are recorded in
`fixed_overrides.json`, and a later command with different ones is refused before any trial.

Growing the grid stays allowed: a key that either run sweeps (more seeds, one more gamma, a
subset picked with a fixed value) is not a conflict, and neither are keys that change where
or how trials run rather than what they compute (Ray, W&B, Hydra's sweeper settings, threads).
A key the folder was made with as a fixed value may become an axis only around that value
(train.seed=0 -> train.seed=0,1,2: the folder's trials are a slice of the grown grid); swept
without it (train.max_tokens=2048,4096 on a folder made at 1024) it is another question.
"""

from __future__ import annotations

import json
from pathlib import Path

from smallinit.core.errors import ConfigError
from smallinit.core.files import atomic_write_json

RECORD = "fixed_overrides.json"
# Where and how a trial runs, not what it computes: never a different question.
# The keys that set a trial's budget: a folder made at one of them is one budget, whichever key a
# later command sweeps.
BUDGET_KEYS = ("train.max_tokens", "train.max_steps", "train.tokens_per_param", "train.budgets", "train.budgets_per_param")
OPERATIONAL = ("hydra.", "ray.", "wandb.", "train.device", "train.threads", "train.compile", "train.log_every",
               "train.peak_tflops", "train.keep_weights", "data.cache_dir", "name")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _fixed(overrides: list[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        key = _key(o)
        if not key.startswith(OPERATIONAL):
            out[key] = o
    return out


def _value(override: str) -> str:
    return override.split("=", 1)[1] if "=" in override else ""


def _same(a: str, b: str) -> bool:
    """One value written two ways (1e-3 and 0.001) is one value."""
    try:
        return a == b or float(a) == float(b)
    except ValueError:
        return False


def check(sweep_dir: Path, fixed: list[str], swept: list[str],
          swept_values: dict[str, tuple[str, ...]] | None = None) -> dict:
    """Raise ConfigError if sweep_dir was made with other fixed overrides, or this command
    sweeps a key it was made with as fixed without that value (swept_values: each swept key's
    values; a key without them, an interval, does not hold it); else return the record to
    write once every other check has passed (nothing is written here)."""
    path = Path(sweep_dir) / RECORD
    now = _fixed(fixed)
    before = _read_record(path)
    if before is not None:
        old = before.get("fixed", {})
        for key in swept:
            for other in BUDGET_KEYS:  # one budget, written through another key, is still the folder's budget
                if key in BUDGET_KEYS and other != key and other in old and key not in old:
                    raise ConfigError(
                        f"{key}={','.join((swept_values or {}).get(key) or ('?',))} is invalid in {sweep_dir}: it was made "
                        f"at {old[other]}, and {key} sets every trial's budget another way, which is another question; "
                        "give it its own folder with name=...")
            if key not in old or key in before.get("swept", []):
                continue
            values = (swept_values or {}).get(key)
            if values is None or not any(_same(v, _value(old[key])) for v in values):
                given = f"{key}={','.join(values)}" if values is not None else f"{key} as an interval"
                raise ConfigError(
                    f"{given} is invalid in {sweep_dir}: it was made with {old[key]}, and a sweep of {key} "
                    f"without {_value(old[key])} is another question, so give it its own folder with name=... "
                    f"(a grid that keeps {_value(old[key])} grows this one)")
        swept_any = set(before.get("swept", [])) | set(swept)
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


def _read_record(path: Path) -> dict | None:
    """The folder's record, None before its first command; a damaged one stops the command in one
    line (guessing its fixed overrides could let another question into the folder)."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("fixed", {}), dict):
            raise ValueError(f"holds a {type(record).__name__} without a 'fixed' mapping")
        # The shape this module writes: each fixed key's override as typed (str), the swept keys (str).
        if not all(isinstance(v, str) for v in record.get("fixed", {}).values()):
            raise ValueError("a 'fixed' value is not an override string (key=value)")
        swept = record.get("swept", [])
        if not isinstance(swept, list) or not all(isinstance(k, str) for k in swept):
            raise ValueError("'swept' is not a list of keys")
        return record
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is unreadable ({str(e).splitlines()[0]}): restore it, or move it aside if this "
                          "command's fixed overrides are the ones the folder was made with") from None


def record(sweep_dir: Path, checked: dict) -> None:
    atomic_write_json(Path(sweep_dir) / RECORD, checked)
