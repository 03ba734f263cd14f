"""The gamma initialisation rule, in one place.

    std(W) = d_in ** -gamma          every Linear (d_in = in_features), experts, router, gate
    std(E) = d_model ** -gamma       the token embedding
    norm gains = 1, biases = 0

gamma = 0.5 is the LeCun/Xavier-like standard; gamma = 1 is the paper's small init. Why the
embedding uses d_model: a normalised block input is O(1), two matrices scale it by
d^(1/2 - gamma) each, so a block's update is ~d^(1 - 2 gamma); against a stream of scale
d^-gamma the update-to-stream ratio is d^(1 - gamma), which is width-independent exactly at
gamma = 1 (docs/paper.md#embedding-and-head-std).

Each parameter draws its noise from its own generator seeded by (init.seed, parameter name),
on the CPU, then moves to the parameter's device. So the same seed gives identical weights on
any device, and arms that differ only in gamma, eps or gate share the same noise for every
matrix they have in common: the pairing that makes small differences measurable.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from .config import InitConfig


def init_std(gamma: float, fan_in: int) -> float:
    """The paper's rule: std = fan_in ** -gamma."""
    return float(fan_in) ** -gamma


class Initializer:
    """Writes parameters by the rule and remembers which it wrote, so the root can check
    that no parameter was missed (a new layer cannot silently escape the rule)."""

    def __init__(self, cfg: InitConfig):
        self.cfg = cfg
        self.written: set[str] = set()

    def _generator(self, name: str) -> torch.Generator:
        # crc32 is stable across processes (Python's hash() is salted per process).
        return torch.Generator(device="cpu").manual_seed(self.cfg.seed * 1_000_003 + zlib.crc32(name.encode()))

    @torch.no_grad()
    def normal(self, name: str, param: nn.Parameter, fan_in: int, group: str | None = None) -> None:
        self.written.add(name)
        if param.is_meta:  # shape-only model (parameter counting): nothing to draw
            return
        std = init_std(self.cfg.gamma_for(group), fan_in)
        noise = torch.randn(param.shape, generator=self._generator(name), dtype=torch.float32)
        param.copy_((noise * std).to(device=param.device, dtype=param.dtype))

    def linear(self, name: str, layer: nn.Linear, group: str | None = None) -> None:
        self.normal(f"{name}.weight", layer.weight, layer.in_features, group)
        if layer.bias is not None:
            self.constant(f"{name}.bias", layer.bias, 0.0)

    @torch.no_grad()
    def constant(self, name: str, param: nn.Parameter, value: float) -> None:
        param.fill_(value)
        self.written.add(name)
