"""How a CPU trial's process gets its memory back from glibc: kept, not returned each step.

glibc's malloc serves blocks above its mmap threshold (128 KiB, rising dynamically to at most
32 MiB) with a fresh mmap and gives them back with munmap on free, and trims the heap's free
top back to the kernel. A training step on the CPU allocates and frees the same large tensors
every step (activations, the (B, T, V) logits and their gradients), so every step faults
those pages in again and the kernel zeroes each one: on the default micro trial that is ~3
million page faults and ~5 s of system time in a ~43 s trial, and the trial runs ~10-15%
faster without them (bench `cpu_allocator`). Raising both thresholds keeps freed memory in
the process for the next step, at the cost of holding the peak (+8-20% peak RSS measured).
This is what PyTorch's CPU tuning guides get from jemalloc or tcmalloc; mallopt does it with
the allocator every Linux build already has.

Process-wide and left alone where the user chose: set SMALLINIT_CPU_ALLOCATOR=default to keep
glibc's behaviour, and any MALLOC_*_ setting in the environment, or another allocator in
LD_PRELOAD, wins over this.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from core.errors import ConfigError

ENV_SWITCH = "SMALLINIT_CPU_ALLOCATOR"  # "retain" (default) | "default"
# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# Freed memory up to this much stays in the process; blocks below it come from the heap.
RETAIN_BYTES = 1 << 30
_USER_ALLOCATOR_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

_applied: str | None = None


def retain_freed_memory() -> str:
    """Apply once per process; return what the host allocator does, for the trial's log."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def check_switch() -> str:
    """The switch's value, or a one-line error naming it (the sweep checks before any trial)."""
    choice = os.environ.get(ENV_SWITCH, "retain")
    if choice not in ("retain", "default"):
        raise ConfigError(f"{ENV_SWITCH}={choice!r}: use 'retain' (keep freed memory, the default) or 'default' (glibc's own)")
    return choice


def _apply() -> str:
    if check_switch() == "default":
        return f"glibc defaults ({ENV_SWITCH}=default)"
    user = [v for v in _USER_ALLOCATOR_VARS if os.environ.get(v)]
    if user:
        return f"left as the environment sets it ({user[0]})"
    if "malloc" in os.environ.get("LD_PRELOAD", ""):
        return "left to the preloaded allocator (LD_PRELOAD)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"the platform's own ({platform.system()}, not glibc)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    # Order matters: setting either threshold ends glibc's dynamic adjustment of both.
    if not (libc.mallopt(M_MMAP_THRESHOLD, RETAIN_BYTES) and libc.mallopt(M_TRIM_THRESHOLD, RETAIN_BYTES)):
        return "glibc defaults (mallopt refused the thresholds)"
    return f"glibc keeps freed memory up to {RETAIN_BYTES >> 20} MiB (no page faults per step)"
