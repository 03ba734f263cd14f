"""The Llama-style pre-norm decoder.

    x0 = E[idx]                                   (B, T, d)
    h  = x + Attn(Norm(x))                        RoPE, GQA, optional G1 gate
    x' = h + FFN(Norm(h))                         SwiGLU or top-k MoE
    logits = LMHead(Norm(x_L))                    (B, T, V)
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .init import Initializer
from .layers import Attention, MoE, SwiGLU, make_norm, rope_tables


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = make_norm(cfg.d_model, cfg.norm)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg.d_model, cfg.norm)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff) if cfg.ffn.type == "dense" else MoE(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.norm1(x), cos, sin)
        if isinstance(self.ffn, MoE):
            update, aux = self.ffn(self.norm2(x))
        else:
            update, aux = self.ffn(self.norm2(x)), x.new_zeros((), dtype=torch.float32)
        return x + update, aux

    def init_weights(self, init: Initializer, prefix: str) -> None:
        self.norm1.init_weights(init, f"{prefix}.norm1")
        self.attn.init_weights(init, f"{prefix}.attn")
        self.norm2.init_weights(init, f"{prefix}.norm2")
        self.ffn.init_weights(init, f"{prefix}.ffn")


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = make_norm(cfg.d_model, cfg.norm)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # The single writer of weights. On the meta device it only records the plan.
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Apply the gamma rule to every parameter and fail loudly if one was missed."""
        init = Initializer(self.cfg.init)
        # Embedding: std = d_model^-gamma (its "fan-in" is the one-hot row, see model/init.py).
        init.normal("tok_emb.weight", self.tok_emb.weight, self.cfg.d_model, group="embedding")
        for i, block in enumerate(self.blocks):
            block.init_weights(init, f"blocks.{i}")
        self.norm_f.init_weights(init, "norm_f")
        if self.lm_head is not None:
            init.linear("lm_head", self.lm_head, group="lm_head")
        missed = {name for name, _ in self.named_parameters()} - init.written
        if missed:
            raise RuntimeError(f"init_weights() missed parameters {sorted(missed)}: give their module an init_weights")
        if not self.rope_cos.is_meta:
            cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta, self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(self, idx: torch.Tensor, return_aux: bool = False):
        """idx (B, T) token ids -> logits (B, T, V); with return_aux, also the summed MoE
        load-balancing loss (0 for dense models), unscaled by its coefficient."""
        T = idx.shape[1]
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds model.max_seq_len={self.cfg.max_seq_len}")
        x = self.tok_emb(idx)  # (B, T, d)
        aux_total = x.new_zeros((), dtype=torch.float32)
        for block in self.blocks:
            x, aux = block(x, self.rope_cos, self.rope_sin)
            aux_total = aux_total + aux
        x = self.norm_f(x)
        logits = self.lm_head(x) if self.lm_head is not None else x @ self.tok_emb.weight.t()  # (B, T, V)
        return (logits, aux_total) if return_aux else logits

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
