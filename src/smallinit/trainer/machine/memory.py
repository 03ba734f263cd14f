"""How much memory one device needs to train a trial: the plan `--show` prints before a
cluster is asked for anything.

Per device, for `ray.workers_per_trial` workers and `train.parallel`:
- weights, gradients and AdamW's two moments: fp32 (the trainer keeps fp32 parameters and runs
  bf16 under autocast), 4 + 4 + 8 bytes per parameter; FSDP shards all three over the workers,
  and holds one block's full weights and gradients while it runs (two blocks with prefetch);
  DDP keeps everything whole plus its gradient buckets (another copy of the gradients);
- activations: what autograd saves for the backward pass at the worker's share of the batch
  (train.batch_size / workers) and train.seq_len. They are counted, not modelled: the model's
  forward runs on PyTorch's meta device (shapes only, no memory, well under a second even for
  the 1.5B preset) with a hook that adds up each saved tensor's storage once. bf16 trials are
  traced with a bf16 model, which saves what autocast saves to within the few fp32 statistics;
- the loss's transient at the start of the backward pass: the gradients of the log-softmax
  output and of the logits (fp32, batch x seq x vocab each), and under bf16 the logits'
  gradient's bf16 copy, beside the saved log-softmax output they are computed from.
Gradients build up while the activations they are computed from are freed, layer by layer, so
the step's peak is the larger of (activations + the loss's transient) at the start of the
backward pass and the gradients at its end (measured: tests/test_memory.py).
Not counted: the CUDA context and kernels' workspaces (about 1 GB on a GPU), the allocator's
fragmentation, and NCCL's buffers; the headroom in `fits` is for them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

GIB = 1024**3
# What a device keeps beyond the estimate (CUDA context, workspaces, fragmentation).
HEADROOM = 0.85
# The accelerators researchers plan for, by memory (GiB): the line names the smallest that fits.
DEVICE_SIZES_GIB = (24, 40, 80, 141)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device holds at the peak of a training step (the start of the backward pass)."""

    workers: int
    parallel: str
    dtype: str
    weights: int
    grads: int
    optimizer: int
    gathered: int  # FSDP: the unsharded blocks in flight; DDP: its gradient buckets
    activations: int
    loss: int  # the loss's transient at the start of the backward pass

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.gathered + max(self.activations + self.loss, self.grads)

    def fits(self, device_gib: float) -> bool:
        return self.total <= HEADROOM * device_gib * GIB

    def line(self) -> str:
        fit = next((s for s in DEVICE_SIZES_GIB if self.fits(s)), None)
        where = f"fits a {fit} GB device" if fit else f"fits no device up to {DEVICE_SIZES_GIB[-1]} GB"
        return f"{self.breakdown()}; {where}"

    def breakdown(self) -> str:
        how = f"{self.workers} workers, {self.parallel}, {self.dtype}" if self.workers > 1 else f"1 worker, {self.dtype}"
        extra = {"fsdp": "blocks gathered", "ddp": "DDP buckets"}.get(self.parallel if self.workers > 1 else "", "")
        parts = [f"weights {size(self.weights)}", f"AdamW {size(self.optimizer)}",
                 *([f"{extra} {size(self.gathered)}"] if extra else []),
                 f"the larger of activations {size(self.activations)} + loss {size(self.loss)} and grads {size(self.grads)}"]
        return f"memory per device ({how}): {size(self.total)} = {' + '.join(parts)}"


def size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def estimate(trial, workers: int = 1, parallel: str = "ddp", dtype: str | None = None) -> MemoryEstimate:
    """The per-device estimate for `trial` on `workers` workers. dtype: "bf16" or "fp32", the
    precision it trains in (default: planned_dtype)."""
    n_params = trial.model.num_params()
    dtype = dtype or planned_dtype(trial)
    shard = workers if parallel == "fsdp" and workers > 1 else 1
    weights, grads, optimizer = (math.ceil(n * n_params / shard) for n in (4, 4, 8))
    if workers > 1 and parallel == "fsdp":
        block = _largest_block_params(trial.model)
        gathered = 2 * (4 + 4) * block  # this block and the prefetched next, weights and gradients
    elif workers > 1:
        gathered = 4 * n_params  # DDP's buckets: a second copy of the gradients
    else:
        gathered = 0
    rows = max(1, trial.train.batch_size // workers)
    activations = saved_activation_bytes(trial.model, rows, trial.train.seq_len, dtype)
    loss = (10 if dtype == "bf16" else 8) * rows * trial.train.seq_len * trial.model.vocab_size
    return MemoryEstimate(workers, parallel, dtype, weights, grads, optimizer, gathered, activations, loss)


def fsdp_workers_to_fit(trial, device_gib: float, dtype: str | None = None, most: int = 64, start: int = 2) -> int | None:
    """The fewest workers (start doubled, each dividing train.batch_size) with which FSDP fits a
    device of device_gib; None if even `most` do not."""
    workers = start
    while workers <= min(most, trial.train.batch_size):
        if trial.train.batch_size % workers == 0 and estimate(trial, workers, "fsdp", dtype).fits(device_gib):
            return workers
        workers *= 2
    return None


def planned_dtype(trial, gpu: bool = False) -> str:
    """What train.dtype resolves to where the trial runs: as asked; with auto, bf16 on CUDA and
    this machine's choice on its CPU. train.device=auto is read as this machine unless `gpu`
    (the trial asks Ray for GPUs, ray.gpus_per_trial > 0): a GPU trial planned from a CPU-only
    login node is still a bf16 trial."""
    from .precision import resolve_device, resolve_dtype

    device = trial.train.device
    if trial.train.dtype != "auto" or device == "cuda" or (gpu and device == "auto"):
        return "bf16" if trial.train.dtype == "auto" else trial.train.dtype
    return resolve_dtype(resolve_device(device), "auto").dtype


def shape_key(trial, *rest) -> str:
    """What an estimate depends on besides `rest`: the model's shape (its init holds no bytes),
    train.batch_size and train.seq_len. A grid has many points and few such keys."""
    shape = dataclasses.replace(trial.model, init=type(trial.model.init)())
    return repr((shape, trial.train.batch_size, trial.train.seq_len, *rest))


def saved_activation_bytes(model_config, rows: int, seq_len: int, dtype: str) -> int:
    """Bytes autograd saves for backward in one forward of `rows` x `seq_len` tokens and the
    loss, counted on the meta device; parameters (saved by matmuls) are not counted again."""
    import torch
    import torch.nn.functional as F

    from smallinit.model.transformer import Transformer

    routing = 0
    if model_config.ffn.type == "moe":
        # Routing is data-dependent (bincount): the meta device cannot run it. Each token passes
        # through top_k experts of d_expert, which save what a dense block of top_k x d_expert
        # saves, plus the router's fp32 scores and choices per token and expert, and each token's
        # top_k gathered inputs and outputs.
        ffn, tokens, width = model_config.ffn, model_config.n_layers * rows * seq_len, 2 if dtype == "bf16" else 4
        routing = tokens * (ffn.n_experts * (4 + 8) + 2 * ffn.top_k * model_config.d_model * width)
        model_config = dataclasses.replace(model_config, ffn=dataclasses.replace(ffn, type="dense"),
                                           d_ff=ffn.top_k * (ffn.d_expert or model_config.d_ff))
    with torch.device("meta"):
        model = Transformer(model_config).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        idx = torch.zeros(rows, seq_len, dtype=torch.long)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    sizes: dict[int, int] = {}

    def count(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        sizes[storage._cdata] = max(sizes.get(storage._cdata, 0), storage.nbytes())
        return t

    sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_attention().apply_like_sdpa
    try:
        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            logits, _ = model(idx, return_aux=True)
            F.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
    finally:
        F.scaled_dot_product_attention = sdpa
    return routing + sum(n for key, n in sizes.items() if key not in params)


def _fused_attention():
    import torch

    class FusedAttention(torch.autograd.Function):
        """What a fused causal attention kernel saves for backward (FlashAttention, cuDNN and
        PyTorch's CPU flash kernel alike): q, k, v, the output and one fp32 log-sum-exp per
        query row, not the seq x seq probabilities that tracing the math path on meta saves."""

        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty_like(q)
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        @staticmethod
        def apply_like_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            return FusedAttention.apply(q, k, v)

    return FusedAttention


def _largest_block_params(model_config) -> int:
    """Parameters of one decoder block (they are all the same shape): the model's, less the
    embedding, head and final norm, over the number of blocks."""
    d, vocab = model_config.d_model, model_config.vocab_size
    outside = vocab * d * (1 if model_config.tie_embeddings else 2) + d
    return (model_config.num_params() - outside) // model_config.n_layers
