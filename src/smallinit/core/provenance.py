"""Where a record came from: the commit (and whether the tree differed from it), the exact
package versions, the lock file they should match, and the machine (CPU model, the feature
flags that decide which kernels run, cores, load). Every record the project writes
(a report's summary.json, a bench entry) carries one, so a number can be traced to the code,
libraries and hardware that made it; machines differ (some lack bf16), and so do numbers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
LOCK_FILE = "requirements-lock.txt"  # `make lock` writes it from the CPU environment
# The libraries whose versions can change a record's numbers or how it was made.
PACKAGES = ("torch", "numpy", "scipy", "pandas", "pyarrow", "ray", "optuna", "hydra-core", "omegaconf", "wandb",
            "tokenizers", "transformers", "matplotlib")
# The CPU features that decide which kernels torch runs here: vector width, and native bf16,
# fp16 and int8 math (x86 /proc/cpuinfo "flags", Arm "Features"). A figure measured with
# avx512_bf16 says nothing about a CPU without it, so each record names those present.
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2", "bf16", "i8mm")


def git_state(repo: Path = REPO) -> tuple[str | None, list[str] | None]:
    """(HEAD's commit, the tracked files that differ from it); (None, None) outside a checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=30).stdout

    try:
        return git("rev-parse", "HEAD").strip(), sorted(git("diff", "--name-only", "HEAD").split())
    except (OSError, subprocess.SubprocessError):
        return None, None


def cpu_identity() -> tuple[str, set[str]]:
    """(CPU model, feature flags) from /proc/cpuinfo; the platform's name and no flags elsewhere."""
    model, flags = "", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key in ("model name", "cpu part") and not model:
                model = value.strip()
            elif key in ("flags", "features") and not flags:
                flags = set(value.split())
    return model or platform.processor() or platform.machine(), flags


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def record(repo: Path = REPO) -> dict[str, Any]:
    """The provenance block a record carries."""
    commit, changed = git_state(repo)
    model, flags = cpu_identity()
    load = None
    with contextlib.suppress(OSError):
        load = [round(x, 2) for x in os.getloadavg()]
    return {
        "commit": commit,
        "dirty": None if changed is None else bool(changed),
        "uncommitted": changed,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "packages": package_versions(),
        "lock_file": LOCK_FILE,
        "lock_sha256": file_sha256(repo / LOCK_FILE),
        "machine": {"hostname": platform.node(), "platform": platform.platform(), "cpu_model": model,
                    "cpu_count": os.cpu_count(), "cpu_flags": [f for f in CPU_FLAGS if f in flags], "loadavg": load},
    }


# What a record must hold to be traced: a field absent or None here leaves a number unexplained.
REQUIRED = ("commit", "dirty", "date", "lock_sha256", "packages.python", "packages.torch", "packages.numpy",
            "machine.cpu_model", "machine.cpu_count", "machine.cpu_flags")


def missing(block: dict[str, Any]) -> list[str]:
    """The REQUIRED fields a provenance block lacks (dotted paths), in REQUIRED's order."""
    def get(path: str):
        value: Any = block
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return [path for path in REQUIRED if get(path) is None]
