"""Building blocks of the decoder: norms, RoPE, gated attention, SwiGLU and MoE feed-forward.

Each module owns an `init_weights(init, prefix)` that applies the gamma rule to exactly the
parameters it creates; `Transformer.init_weights` calls them all and checks none was missed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig, NormConfig
from .init import Initializer


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * g. With eps = 1e-5 and a residual stream whose
    mean square is far below eps (small init at large width), the output is damped by
    sqrt(ms / eps): the saturation the paper removes with eps = 1e-12."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 statistics: under bf16 autocast, eps = 1e-12 and a tiny mean square still work.
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)

    def init_weights(self, init: Initializer, prefix: str) -> None:
        init.constant(f"{prefix}.weight", self.weight, 1.0)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), self.bias.float(), self.eps).to(x.dtype)

    def init_weights(self, init: Initializer, prefix: str) -> None:
        init.constant(f"{prefix}.weight", self.weight, 1.0)
        init.constant(f"{prefix}.bias", self.bias, 0.0)


def make_norm(dim: int, cfg: NormConfig) -> RMSNorm | LayerNorm:
    return RMSNorm(dim, cfg.eps) if cfg.type == "rmsnorm" else LayerNorm(dim, cfg.eps)


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (T, head_dim/2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (Llama/HF layout). x: (B, H, T, hd); cos, sin: (T, hd/2).
    Written as HF writes it, x * cos + rotate_half(x) * sin over the whole head: the same numbers
    as rotating each half, and the form torch.compile (2.13, CPU) differentiates correctly; the
    half-by-half form (two products concatenated) gave NaN gradients there in front of
    attention that is not the fused SDPA kernel."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    cos, sin = torch.cat((cos, cos), dim=-1)[None, None], torch.cat((sin, sin), dim=-1)[None, None]
    return (xf * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    """Causal multi-head attention with GQA and the optional G1 output gate of Qiu et al.:
    Y' = Y * sigmoid(X W_g + b_g), X the normalised block input (so the gate depends on the
    query token), applied per head to the SDPA output before o_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, self.n_heads, self.n_kv_heads, self.head_dim = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        self.gate_type = cfg.attn.gate
        if self.gate_type == "headwise":
            self.gate_proj = nn.Linear(d, self.n_heads, bias=True)
        elif self.gate_type == "elementwise":
            self.gate_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=True)
        else:
            self.gate_proj = None
        # None in training: attention is fused SDPA and its weights are never formed. A probe
        # (model/probes.py) sets a callable to see the (B, H, T, T) weights; attention then
        # takes the explicit path that forms them.
        self.weights_observer: Callable[[torch.Tensor], None] | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        if self.weights_observer is None and q.device.type == "cpu" and q.dtype == torch.bfloat16:
            y = self._attention_cpu_bf16(q, k, v)
        elif self.weights_observer is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        else:
            y = self._attention_with_weights(q, k, v, self.weights_observer)
        if self.gate_proj is not None:
            g = torch.sigmoid(self.gate_proj(x))  # (B, T, H) or (B, T, H*hd)
            if self.gate_type == "headwise":
                y = y * g.transpose(1, 2).unsqueeze(-1)  # (B, H, T, 1) broadcast over hd
            else:
                y = y * g.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y)

    def _attention_cpu_bf16(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention as two bf16 matmuls around an fp32 softmax. On a CPU, torch's fused
        SDPA kernel in bf16 takes ~2.5x the time of this at the CPU presets' sizes (sequence 128,
        heads of 64: fwd+bwd 30 ms against 11 ms at batch 16, 4 heads, one thread), ~20% of a
        micro training step; in fp32 the fused kernel is as fast, so fp32 keeps it."""
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, T, hd)
        T = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)).float() * self.head_dim**-0.5  # (B, H, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # what a query may not see
        return scores.masked_fill(future, float("-inf")).softmax(dim=-1).to(v.dtype) @ v

    def _attention_with_weights(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                observe: Callable[[torch.Tensor], None]) -> torch.Tensor:
        """The slow path for probes: same result as SDPA, but hands the weights to observe."""
        rep = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B, H, T, hd)
        T = q.shape[-2]
        scores = (q.float() @ k.float().transpose(-2, -1)) * self.head_dim**-0.5  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        observe(att)
        return (att @ v.float()).to(q.dtype)

    def init_weights(self, init: Initializer, prefix: str) -> None:
        init.linear(f"{prefix}.q_proj", self.q_proj)
        init.linear(f"{prefix}.k_proj", self.k_proj)
        init.linear(f"{prefix}.v_proj", self.v_proj)
        init.linear(f"{prefix}.o_proj", self.o_proj, group="attn_out")
        if self.gate_proj is not None:
            init.linear(f"{prefix}.gate_proj", self.gate_proj)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_hidden: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_hidden, bias=False)  # gate branch
        self.w3 = nn.Linear(d_model, d_hidden, bias=False)  # up branch
        self.w2 = nn.Linear(d_hidden, d_model, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, init: Initializer, prefix: str) -> None:
        init.linear(f"{prefix}.w1", self.w1)
        init.linear(f"{prefix}.w3", self.w3)
        init.linear(f"{prefix}.w2", self.w2, group="mlp_out")


class MoE(nn.Module):
    """Top-k routed SwiGLU experts (Mixtral-style: softmax router, top-k weights renormalised)
    with the Switch-Transformer load-balancing loss E * sum_e f_e * P_e, which is 1 for a
    perfectly balanced router and grows as routing concentrates."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_experts, self.top_k = cfg.ffn.n_experts, cfg.ffn.top_k
        self.router = nn.Linear(cfg.d_model, self.n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.d_model, cfg.d_expert) for _ in range(self.n_experts))
        self.last_expert_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # (N, d)
        probs = self.router(x).float().softmax(dim=-1)  # (N, E)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # (N, k)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)  # (E,)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        frac_routed = counts.float() / chosen.numel()  # f_e
        aux = self.n_experts * (frac_routed * probs.mean(0)).sum()
        self.last_expert_counts = counts.detach()
        return out.view(shape), aux

    def init_weights(self, init: Initializer, prefix: str) -> None:
        init.linear(f"{prefix}.router", self.router)
        for e, expert in enumerate(self.experts):
            expert.init_weights(init, f"{prefix}.experts.{e}")
