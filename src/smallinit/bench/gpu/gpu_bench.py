"""gpu_mfu: model FLOPs utilisation of the GPU presets, bf16 autocast and torch.compile, as the
trainer runs them (train=gpu: sequence length 2048, the trainer's step with its loss and
grad-norm reads). Random tokens over a 32k vocabulary: throughput does not depend on the data.

MFU = tokens/s * flops_per_token / peak, both from trainer/loop.py (PaLM's count; the dense
bf16 peak of the GPU by name, 989 TFLOP/s on H100/H200). Skipped where CUDA is absent.

    make bench                                      on the GPU machine: every benchmark, gpu_mfu included
    python -m smallinit.bench --only gpu_mfu --out DIR        gpu_mfu alone, into a folder of its own
"""

from __future__ import annotations

import gc
import math
import time

from smallinit import CONF_DIR

from ..base.common import median, progress

TARGET = {"op": ">=", "value": 0.45}
GPU_TRAIN_YAML = CONF_DIR / "train" / "gpu.yaml"


def gpu_train_preset() -> dict[str, int | float | bool]:
    """train=gpu (conf/train/gpu.yaml) as numbers, so the GPU checks train what a GPU sweep
    trains. Its flat `key: value` lines are read here by hand: gpu_check runs where only torch
    and numpy are installed."""
    out: dict[str, int | float | bool] = {}
    for line in GPU_TRAIN_YAML.read_text().splitlines():
        key, sep, value = line.split("#", 1)[0].partition(":")
        if sep and value.strip():
            v = value.strip()
            out[key.strip()] = v == "true" if v in ("true", "false") else float(v) if "." in v or "e" in v else int(v)
    return out


_GPU_TRAIN = gpu_train_preset()
SEQ_LEN = int(_GPU_TRAIN["seq_len"])
# Starting micro-batch per preset (sequences of SEQ_LEN tokens); halved on out-of-memory. The
# 0.1B preset's is train=gpu's batch; the larger presets start smaller to fit.
START_BATCH = {"0.1b": int(_GPU_TRAIN["batch_size"]), "0.25b": 16, "0.5b": 8, "1b": 8, "1.5b": 4}
WARMUP_STEPS = 3  # the first compiles the graph


def run(settings) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device here (torch.cuda.is_available() is False); "
                           "run `make bench` on a GPU machine", "target": TARGET}
    device = torch.device("cuda")
    presets = {}
    for preset in settings.gpu_presets:
        presets[preset] = _measure(preset, device, settings.gpu_steps)
        r = presets[preset]
        if "error" in r:
            progress("gpu_mfu", f"{preset}: {r['error']}")
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a (unknown peak)"
        progress("gpu_mfu", f"{preset}: batch {r['batch_size']}x{SEQ_LEN}, {r['tokens_per_s']:,.0f} tokens/s, MFU {mfu}, "
                            f"compile+warm-up {r['warmup_s']:.0f} s, peak memory {r['max_memory_gb']:.1f} GB")
    mfus = [r["mfu"] for r in presets.values() if r.get("mfu") is not None]
    lowest = min(mfus) if mfus else None
    failed = any("error" in r for r in presets.values())
    return {
        "ratio": lowest,
        "target": TARGET,
        "pass": False if failed else (lowest >= TARGET["value"]) if lowest is not None else None,
        "metric": "lowest MFU over the presets (bf16 autocast, torch.compile, seq 2048)",
        "gpu": torch.cuda.get_device_name(device),
        "presets": presets,
        "repeats": settings.gpu_steps,
    }


def _measure(preset: str, device, steps: int) -> dict:
    import torch

    batch = START_BATCH.get(preset, 8)
    while batch >= 1:
        try:
            return _try(preset, batch, device, steps)
        except torch.OutOfMemoryError:
            progress("gpu_mfu", f"{preset}: batch {batch} does not fit, halving")
            batch //= 2
        finally:
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
    return {"error": "out of memory at batch size 1"}


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _try(preset: str, batch: int, device, steps: int, seq_len: int = SEQ_LEN, compile: bool = True) -> dict:
    """One preset at one micro-batch size (device-generic so it can be smoke-tested on a CPU)."""
    import torch
    import torch.nn.functional as F

    from smallinit.data.config import BilingualData
    from smallinit.model import ModelConfig, Transformer
    from smallinit.model.config import GPU_VOCAB
    from smallinit.trainer.config import OptimConfig, TrainConfig, TrialConfig
    from smallinit.trainer.loop import flops_per_token, make_optimizer, peak_flops

    base = ModelConfig.preset(preset)
    cfg = ModelConfig.preset(preset, vocab_size=GPU_VOCAB, max_seq_len=max(seq_len, base.max_seq_len))
    train = TrainConfig(batch_size=batch, seq_len=seq_len, max_steps=steps, device=device.type, dtype="bf16", compile=compile)
    trial = TrialConfig(model=cfg, optim=OptimConfig(), train=train, data=BilingualData(vocab_size=GPU_VOCAB), preset=preset)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device=device)
    model.init_weights()  # the trainer's init rule (drawn on the CPU, copied over)
    init_s = time.perf_counter() - t0
    optimizer = make_optimizer(model, trial.optim)
    fwd = torch.compile(model) if compile else model
    g = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), device=device, generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> float:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            logits = fwd(x)  # (B, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        value = loss.item()  # the trainer reads the loss every step (divergence check)
        float(torch.nn.utils.clip_grad_norm_(model.parameters(), trial.optim.grad_clip))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return value

    t0 = time.perf_counter()
    for _ in range(WARMUP_STEPS):
        step()
    _sync(device)
    warmup_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    step_s = median(times)
    tok_s = batch * seq_len / step_s
    peak = peak_flops(trial, device)
    flops = flops_per_token(trial)
    out = {
        "batch_size": batch, "seq_len": seq_len, "n_params": cfg.num_params(), "flops_per_token": flops,
        "tokens_per_s": tok_s, "step_s": step_s, "step_s_spread": [min(times), max(times)],
        "mfu": tok_s * flops / peak if peak else None, "peak_tflops": peak / 1e12 if peak else None,
        "init_s": init_s, "warmup_s": warmup_s, "max_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "final_loss": loss if math.isfinite(loss) else None, "steps": steps,
    }
    return out
