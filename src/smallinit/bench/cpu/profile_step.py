"""Where one training step's time goes: the torch profiler over a few steps of a trial's model.

    python -m smallinit.bench.cpu.profile_step +experiment=bf16_gap arm=small            # the crossover's model
    python -m smallinit.bench.cpu.profile_step --dtype fp32 --compile                    # micro, compiled fp32

The step is the bare loop's (bench/base/bare.py: forward under the dtype's autocast, the loss,
backward, clipping, fused AdamW) on one thread, warmed for a few steps; it prints the tokens/s of
the timed steps, then the operators by their own CPU time. What is not a matmul (aten::mm, bmm)
is what compilation or the model's code can remove.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from ..base.common import compose_trial, prepared_data


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m smallinit.bench.cpu.profile_step", description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="*", help="config overrides, as sweep.py takes them")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--compile", action="store_true", help="through torch.compile (static shapes, as the trainer)")
    p.add_argument("--steps", type=int, default=10, help="profiled steps (as many are timed before)")
    p.add_argument("--rows", type=int, default=15)
    args = p.parse_args(argv)

    from smallinit.data.pipeline import TrainBatches
    from smallinit.model import Transformer
    from smallinit.trainer.loop import make_optimizer
    from smallinit.trainer.machine.compile_choice import compile_model

    torch.set_num_threads(1)
    trial = compose_trial(*args.overrides, "train.device=cpu", "train.threads=1")
    data, t = prepared_data(trial), trial.train
    model = Transformer(trial.model)
    optimizer = make_optimizer(model, trial.optim)
    forward = compile_model(model) if args.compile else model
    batches = TrainBatches(data.train_tokens(), t.batch_size, t.seq_len, t.seed)

    def step(i: int) -> None:
        x, y = batches.batch(i)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = F.cross_entropy(forward(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trial.optim.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for i in range(5):  # warm-up: compilation, kernel choice, the allocator
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    rate = args.steps * t.tokens_per_step / (time.perf_counter() - t0)
    m = trial.model
    print(f"{trial.preset} d={m.d_model} L={m.n_layers} heads {m.n_heads}x{m.head_dim} gate {m.attn.gate}, batch "
          f"{t.batch_size}x{t.seq_len}, {args.dtype}{', compiled' if args.compile else ''}, one thread: "
          f"{rate:,.0f} tokens/s over {args.steps} steps")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(args.steps):
            step(i)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
