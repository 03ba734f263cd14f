"""smallinit's model: a Llama-style decoder with the gamma init rule, gated attention and probes.

The configs are plain Python; everything else needs torch and is imported on first use, so
the sweep driver can compose and validate trials without paying torch's import (~3 s).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .config import (
    PRESETS,
    AttnConfig,
    ConfigError,
    FFNConfig,
    InitConfig,
    ModelConfig,
    ModelPreset,
    NormConfig,
)

_LAZY = {"Initializer": ".init", "init_std": ".init", "ProbeResult": ".probes", "run_probes": ".probes",
         "Transformer": ".transformer"}

if TYPE_CHECKING:
    from .init import Initializer, init_std
    from .probes import ProbeResult, run_probes
    from .transformer import Transformer


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PRESETS",
    "AttnConfig",
    "ConfigError",
    "FFNConfig",
    "InitConfig",
    "Initializer",
    "ModelConfig",
    "ModelPreset",
    "NormConfig",
    "ProbeResult",
    "Transformer",
    "init_std",
    "run_probes",
]
