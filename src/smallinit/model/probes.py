"""Probes of the paper's mechanisms, cheap enough to run every few hundred steps.

- attention sink: attention mass on the first token, per layer (Qiu et al.'s metric)
- stable rank ||W||_F^2 / ||W||_2^2 and row-wise cosine similarity, per weight matrix
  (condensation: rows align and rank collapses under small init, then expand)
- norm saturation: var / (var + eps) of each norm's input (near 0 = eps dominates)
- residual balance: ||block update|| / ||block input|| per block

`run_probes(model, idx)` returns flat scalar metrics (for loggers) and the cosine-similarity
matrices (for heatmaps). It runs one forward pass with hooks and leaves the model unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from .layers import LayerNorm, MoE, RMSNorm
from .transformer import Transformer


def first_token_mass(att: torch.Tensor) -> torch.Tensor:
    """Mean attention on key 0 over queries 1..T-1, per leading index. att: (..., T, T)
    causal weights -> (...). Query 0 is skipped: it can only attend to itself, so it says
    nothing about a sink. Uniform causal attention gives the mean of 1/t, t = 2..T."""
    return att[..., 1:, 0].mean(dim=-1)


@contextmanager
def first_token_mass_capture(model: Transformer) -> Iterator[dict[int, torch.Tensor]]:
    """Inside the block, each attention layer forms its weights explicitly and records their
    first_token_mass, (B, H), under its block index; on leaving, every layer is back on fused
    SDPA. The forward passes inside give the same outputs as SDPA up to rounding."""
    masses: dict[int, torch.Tensor] = {}

    def observer(i: int):
        def observe(att: torch.Tensor) -> None:
            masses[i] = first_token_mass(att).detach()
        return observe

    try:
        for i, block in enumerate(model.blocks):
            block.attn.weights_observer = observer(i)
        yield masses
    finally:
        for block in model.blocks:
            block.attn.weights_observer = None


def stable_rank(w: torch.Tensor) -> float:
    """||W||_F^2 / ||W||_2^2, in [1, min(shape)]; 1 for a rank-1 matrix."""
    # The top eigenvalue of the smaller Gram matrix is ||W||_2^2 and its trace ||W||_F^2: one
    # symmetric eigensolve is several times cheaper than the SVD behind matrix_norm(ord=2)
    # (the SVD was 72% of probe time). float64 because forming the Gram squares the spread.
    w = w.detach().double()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    top = torch.linalg.eigvalsh(gram)[-1]
    if top <= 0:
        return 0.0
    return float(torch.trace(gram) / top)


def row_cosine_matrix(w: torch.Tensor, max_rows: int = 64) -> torch.Tensor:
    """Cosine similarity between the first max_rows rows of W: (R, R)."""
    rows = w.detach().float()[:max_rows]
    rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return rows @ rows.t()


def mean_abs_offdiag(m: torch.Tensor) -> float:
    """Mean |cos| between distinct rows: 0 for orthogonal rows, 1 when all rows are parallel."""
    n = m.shape[0]
    if n < 2:
        return 0.0
    return float((m.abs().sum() - m.diagonal().abs().sum()) / (n * (n - 1)))


def weight_matrices(model: Transformer) -> dict[str, torch.Tensor]:
    """Every 2-D weight in the blocks, by parameter name (experts included)."""
    return {
        name: p
        for name, p in model.named_parameters()
        if p.ndim == 2 and name.startswith("blocks.") and name.endswith(".weight")
    }


@dataclass
class ProbeResult:
    scalars: dict[str, float] = field(default_factory=dict)
    cosine_matrices: dict[str, torch.Tensor] = field(default_factory=dict)


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _norm_input_variance(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the norm compares against eps: mean square for RMSNorm, variance for LayerNorm."""
    xf = x.detach().float()
    if isinstance(norm, LayerNorm):
        return xf.var(dim=-1, unbiased=False)
    return xf.pow(2).mean(dim=-1)


@torch.no_grad()
def activation_probes(model: Transformer, idx: torch.Tensor) -> dict[str, float]:
    """Sink, saturation and residual balance from one forward pass over idx (B, T)."""
    out: dict[str, float] = {}
    hooks = []

    def norm_hook(name: str, eps: float):
        def hook(module, args):
            var = _norm_input_variance(module, args[0])
            out[f"saturation/{name}"] = float((var / (var + eps)).mean())
        return hook

    def block_hook(name: str):
        def hook(module, args, output):
            x_in, x_out = args[0].float(), output[0].float()
            ratio = (x_out - x_in).norm(dim=-1) / x_in.norm(dim=-1).clamp_min(1e-30)
            out[f"residual_ratio/{name}"] = float(ratio.mean())
        return hook

    for name, module in model.named_modules():
        if isinstance(module, RMSNorm | LayerNorm):
            hooks.append(module.register_forward_pre_hook(norm_hook(name, module.eps)))
    for i, block in enumerate(model.blocks):
        hooks.append(block.register_forward_hook(block_hook(f"blocks.{i}")))
    was_training = model.training
    model.eval()
    try:
        with first_token_mass_capture(model) as sink:
            model(idx)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    for i, block in enumerate(model.blocks):
        out[f"attn_sink/blocks.{i}"] = float(sink[i].mean())
        if isinstance(block.ffn, MoE) and block.ffn.last_expert_counts is not None:
            counts = block.ffn.last_expert_counts.float()
            out[f"moe_max_load/blocks.{i}"] = float(counts.max() / counts.mean())
    for kind in ("attn_sink", "saturation", "residual_ratio"):
        out[f"{kind}/mean"] = _mean([v for k, v in out.items() if k.startswith(f"{kind}/") and k != f"{kind}/mean"])
    return out


@torch.no_grad()
def weight_probes(model: Transformer, heatmap_rows: int = 64) -> ProbeResult:
    result = ProbeResult()
    for name, w in weight_matrices(model).items():
        short = name.removesuffix(".weight")
        cos = row_cosine_matrix(w, heatmap_rows)
        result.scalars[f"stable_rank/{short}"] = stable_rank(w)
        result.scalars[f"row_cosine/{short}"] = mean_abs_offdiag(cos)
        result.cosine_matrices[short] = cos.cpu()
    for kind in ("stable_rank", "row_cosine"):
        values = [v for k, v in result.scalars.items() if k.startswith(f"{kind}/")]
        result.scalars[f"{kind}/mean"] = _mean(values)
    return result


def run_probes(model: Transformer, idx: torch.Tensor, heatmap_rows: int = 64) -> ProbeResult:
    """All probes: weight statistics plus one probing forward pass on idx (B, T)."""
    result = weight_probes(model, heatmap_rows)
    result.scalars.update(activation_probes(model, idx))
    return result
