"""Which dtype a trial computes in: `train.dtype=auto` follows the machine.

On CUDA, bf16 autocast. On a CPU, bf16 autocast only where its matmuls are actually faster:
CPUs with native bf16 instructions (AVX512-BF16, AMX, Arm's BF16) run bf16 GEMMs ~3x faster
than fp32, while CPUs without them emulate bf16 and can be 50x slower (an AVX2-only EPYC here:
71 GFLOP/s fp32 against 1.1 GFLOP/s bf16, one thread). The flags say whether a fast path can
exist; a short timed matmul says whether torch uses it. The answer is cached per machine
(CPU model, flags, torch version), so only the first trial on a machine pays for the timing.

Autocast leaves RMSNorm's statistics in fp32 (model/layers.py computes them in fp32), so
eps = 1e-12 keeps its meaning under bf16.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from smallinit.core.provenance import cpu_identity

# CPU feature flags (x86 /proc/cpuinfo "flags", Arm "Features") that give native bf16 math.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# bf16 must beat fp32 by this much on the timed matmul to be chosen: autocast adds casts,
# so a marginal matmul gain does not survive a training step.
MIN_SPEEDUP = 1.3
# ~67 MFLOP a call: where bf16 is emulated (~1 GFLOP/s) one call is ~0.07 s, so the whole check
# stays near a second there too.
PROBE_SHAPE = (512, 256, 256)


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str  # "bf16" | "fp32"
    reason: str


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device='cuda' but no CUDA device is visible: use train.device=auto or cpu")
    return torch.device(name)


def _cpu_identity() -> tuple[str, set[str]]:
    return cpu_identity()


def _matmul_gflops(dtype: torch.dtype, min_s: float = 0.1) -> float:
    """GFLOP/s of PROBE_SHAPE in dtype, warmed (kernel choice, AMX tile setup and the first
    allocations happen in the first calls) and timed over at least min_s: a handful of ~0.1 ms
    calls timed once drew anything from 1x to 49x for the same CPU."""
    m, k, n = PROBE_SHAPE
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(3):
        a @ b
    reps, elapsed = 0, 0.0
    start = time.perf_counter()
    while elapsed < min_s:
        a @ b
        reps += 1
        elapsed = time.perf_counter() - start
    return 2 * m * k * n * reps / elapsed / 1e9


def timed_bf16_ratio(rounds: int = 3) -> tuple[float, float]:
    """(fp32, bf16) GFLOP/s of PROBE_SHAPE: each the best of `rounds`, the two dtypes alternating
    so a burst of other load on the machine lands on both."""
    fp32, bf16 = 0.0, 0.0
    for _ in range(rounds):
        fp32 = max(fp32, _matmul_gflops(torch.float32))
        bf16 = max(bf16, _matmul_gflops(torch.bfloat16))
    return fp32, bf16


def native_bf16_flags() -> list[str]:
    """This CPU's feature flags that give native bf16 math (empty: bf16 is emulated)."""
    return sorted(set(BF16_FLAGS) & _cpu_identity()[1])


def measure_cpu_bf16() -> DtypeChoice:
    """Decide for this CPU now (no cache): flags first, then a timed matmul."""
    model, flags = _cpu_identity()
    native = sorted(set(BF16_FLAGS) & flags)
    if not native:
        return DtypeChoice("fp32", f"CPU ({model}) has no native bf16 instructions ({'/'.join(BF16_FLAGS)})")
    fp32, bf16 = timed_bf16_ratio()
    ratio = bf16 / fp32
    m, k, n = PROBE_SHAPE
    timed = f"bf16 matmul {bf16:.0f} GFLOP/s vs fp32 {fp32:.0f} ({ratio:.2f}x, {m}x{k}x{n}, warmed, best of 3 alternating)"
    if ratio >= MIN_SPEEDUP:
        return DtypeChoice("bf16", f"CPU has {', '.join(native)}; {timed}")
    return DtypeChoice("fp32", f"CPU has {', '.join(native)} but {timed} < {MIN_SPEEDUP}x")


def _cache_path() -> Path:
    root = Path(os.environ.get("SMALLINIT_CACHE", "~/.cache/smallinit")).expanduser()
    model, flags = _cpu_identity()
    key = hashlib.sha256(f"{model}|{sorted(flags)}|{torch.__version__}".encode()).hexdigest()[:16]
    return root / "cpu_dtype" / f"{key}.json"


def cpu_dtype(use_cache: bool = True) -> DtypeChoice:
    """The CPU's choice, measured once per machine and cached."""
    path = _cache_path()
    if use_cache:
        try:
            return DtypeChoice(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass
    choice = measure_cpu_bf16()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(choice)))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the timing again next time
    return choice


def resolve_dtype(device: torch.device, requested: str) -> DtypeChoice:
    """train.dtype (auto | fp32 | bf16) on this device -> what the trial computes in, and why."""
    if requested != "auto":
        return DtypeChoice(requested, f"train.dtype={requested}")
    if device.type == "cuda":
        return DtypeChoice("bf16", "CUDA: bf16 autocast")
    if device.type == "cpu":
        return cpu_dtype()
    return DtypeChoice("fp32", f"{device.type}: fp32")


def autocast_for(device: torch.device, dtype: str):
    """A context-manager factory: bf16 autocast for dtype "bf16", nothing for "fp32"."""
    if dtype != "bf16":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
