"""smallinit's model: a Llama-style decoder with the gamma init rule, gated attention and probes."""

from .config import (
    PRESETS,
    AttnConfig,
    ConfigError,
    FFNConfig,
    InitConfig,
    ModelConfig,
    NormConfig,
)
from .init import Initializer, init_std
from .probes import ProbeResult, run_probes
from .transformer import Transformer

__all__ = [
    "PRESETS",
    "AttnConfig",
    "ConfigError",
    "FFNConfig",
    "InitConfig",
    "Initializer",
    "ModelConfig",
    "NormConfig",
    "ProbeResult",
    "Transformer",
    "init_std",
    "run_probes",
]
