"""How a CPU trial's process gets its memory back from glibc: kept, not returned each step.

glibc's malloc serves blocks above its mmap threshold (128 KiB, rising dynamically to at most
32 MiB) with a fresh mmap and gives them back with munmap on free, and trims the heap's free
top back to the kernel. A training step on the CPU allocates and frees the same large tensors
every step (activations, the (B, T, V) logits and their gradients), so every step faults
those pages in again and the kernel zeroes each one: on the default micro trial that is ~3
million page faults and ~5 s of system time in a ~43 s trial. Raising both thresholds keeps
freed memory in the process for the next step, at the cost of holding the peak: on a Zen 4
EPYC the bare loop runs 1.12x faster and the steps' peak RSS is 8% higher (bench
`cpu_allocator`; on an AVX2 Xeon in fp32 a similar setting did not move the wall time).
This is what PyTorch's CPU tuning guides get from jemalloc or tcmalloc; mallopt does it with
the allocator every Linux build already has.

One arena: a thread other than the main one allocates from its own glibc arena, whose heaps are
at most 64 MiB, so larger blocks are still mmapped and freed pages handed back, whatever the
thresholds. Ray Tune runs a function trainable in such a thread: in a thread the micro step
still took ~19k page faults and ran ~7% slower than on the main thread, and with every thread
on the main arena it matched it. A thread keeps the arena it first allocated from, so the
sweep sets all this in its workers' environment before they start (worker_env). A trial
allocates from one thread at a time (autograd on the CPU runs in the caller; OpenMP workers
mostly fill buffers the caller allocated), so one arena costs little waiting.

Process-wide and left alone where the user chose: set SMALLINIT_CPU_ALLOCATOR=default to keep
glibc's behaviour, and any MALLOC_*_ setting in the environment, or another allocator in
LD_PRELOAD, wins over this.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading

from smallinit.core.errors import ConfigError

ENV_SWITCH = "SMALLINIT_CPU_ALLOCATOR"  # "retain" (default) | "default"
# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
# Freed memory up to this much stays in the process; blocks below it come from the heap.
RETAIN_BYTES = 1 << 30
# The same setting as glibc reads it at process start, before any thread has an arena: what the
# sweep gives its Ray workers (sweeper/runtime/cluster.py), whose trials run on Tune's own thread.
RETAIN_ENV = {"MALLOC_MMAP_THRESHOLD_": str(RETAIN_BYTES), "MALLOC_TRIM_THRESHOLD_": str(RETAIN_BYTES),
              "MALLOC_ARENA_MAX": "1"}
USER_ALLOCATOR_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX",
                        "GLIBC_TUNABLES")
KEPT = f"glibc keeps freed memory up to {RETAIN_BYTES >> 20} MiB, one arena"

_applied: str | None = None


def check_switch() -> str:
    """The switch's value, or a one-line error naming it (the sweep checks before any trial)."""
    choice = os.environ.get(ENV_SWITCH, "retain")
    if choice not in ("retain", "default"):
        raise ConfigError(f"{ENV_SWITCH}={choice!r}: use 'retain' (keep freed memory, the default) or 'default' (glibc's own)")
    return choice


def worker_env() -> dict[str, str]:
    """Environment for processes that will run trials: the setting from their first malloc on;
    nothing where the user chose otherwise or the platform is not glibc."""
    return dict(RETAIN_ENV) if _not_applicable() is None else {}


def retain_freed_memory() -> str:
    """Apply once per process; return what the host allocator does, for the trial's log."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _not_applicable() -> str | None:
    """Why this process keeps glibc's behaviour or the user's, or None to apply the setting."""
    if check_switch() == "default":
        return f"glibc defaults ({ENV_SWITCH}=default)"
    user = [v for v in USER_ALLOCATOR_VARS if os.environ.get(v)]
    if user:
        return f"left as the environment sets it ({user[0]})"
    if "malloc" in os.environ.get("LD_PRELOAD", ""):
        return "left to the preloaded allocator (LD_PRELOAD)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"the platform's own ({platform.system()}, not glibc)"
    return None


def _apply() -> str:
    if check_switch() == "retain" and all(os.environ.get(k) == v for k, v in RETAIN_ENV.items()):
        return f"{KEPT} (set at process start)"
    reason = _not_applicable()
    if reason is not None:
        return reason
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    # Setting either threshold also ends glibc's dynamic adjustment of both. A thread that
    # already allocated keeps its arena: on the main thread (a single run, the bench's process
    # pool) that is the main arena, which the thresholds fully cover.
    if not (libc.mallopt(M_MMAP_THRESHOLD, RETAIN_BYTES) and libc.mallopt(M_TRIM_THRESHOLD, RETAIN_BYTES)
            and libc.mallopt(M_ARENA_MAX, 1)):
        return "glibc defaults (mallopt refused the settings)"
    if threading.current_thread() is not threading.main_thread():
        start = " ".join(f"{k}={v}" for k, v in RETAIN_ENV.items())
        return f"{KEPT}, except this thread's own arena: start the process with {start} to cover it"
    return KEPT
