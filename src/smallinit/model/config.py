"""Model configuration: one dataclass, validated on construction, with named presets.

Every invalid value raises `ConfigError` naming the field, the value and what is allowed,
so a bad sweep fails on the driver before any trial is scheduled. These dataclasses are also
the schema of conf/ (registered in Hydra's ConfigStore by sweeper/config/config.py): their defaults
are the command line's, and `ModelPreset` is what conf/model/*.yaml and `model.*` set.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from smallinit.core.errors import ConfigError, require

# float32's (and bfloat16's) smallest normal number, 2^-126: an init std below it is zero or
# denormal in the weights, and the model trains as if all-zero.
SMALLEST_NORMAL = 2.0**-126
NORM_TYPES = ("rmsnorm", "layernorm")
GATE_TYPES = ("none", "headwise", "elementwise")
FFN_TYPES = ("dense", "moe")


def _positive_int(key: str, value: Any) -> None:
    require(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        key,
        value,
        "must be a positive integer",
    )


def _finite_number(key: str, value: Any) -> None:
    require(
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
        key,
        value,
        "must be a finite number",
    )


@dataclass(frozen=True)
class NormConfig:
    type: str = "rmsnorm"
    # 1e-12 keeps RMSNorm from saturating when small init makes the residual stream tiny (the
    # paper's fix); norm.eps=1e-5 is the common Llama default.
    eps: float = 1e-12

    def __post_init__(self) -> None:
        require(self.type in NORM_TYPES, "norm.type", self.type, f"one of {list(NORM_TYPES)}")
        _finite_number("norm.eps", self.eps)
        require(self.eps >= 0, "norm.eps", self.eps, "must be >= 0")


@dataclass(frozen=True)
class AttnConfig:
    # Qiu et al. (2505.06708) G1 gate on the SDPA output: one scalar per head ("headwise")
    # or one per channel ("elementwise", the Qwen3-Next form).
    gate: str = "none"

    def __post_init__(self) -> None:
        require(self.gate in GATE_TYPES, "attn.gate", self.gate, f"one of {list(GATE_TYPES)}")


@dataclass(frozen=True)
class FFNConfig:
    type: str = "dense"
    n_experts: int = 8
    top_k: int = 2
    aux_loss_coef: float = 0.01
    # Hidden size of each expert; None means the model's d_ff.
    d_expert: int | None = None

    def __post_init__(self) -> None:
        require(self.type in FFN_TYPES, "ffn.type", self.type, f"one of {list(FFN_TYPES)}")
        _positive_int("ffn.n_experts", self.n_experts)
        _positive_int("ffn.top_k", self.top_k)
        require(
            self.top_k <= self.n_experts,
            "ffn.top_k",
            self.top_k,
            f"must be <= ffn.n_experts ({self.n_experts})",
        )
        _finite_number("ffn.aux_loss_coef", self.aux_loss_coef)
        require(self.aux_loss_coef >= 0, "ffn.aux_loss_coef", self.aux_loss_coef, "must be >= 0")
        if self.d_expert is not None:
            _positive_int("ffn.d_expert", self.d_expert)


# Parameter groups whose gamma can be overridden individually (None = use init.gamma).
INIT_GROUPS = ("embedding", "lm_head", "attn_out", "mlp_out")


@dataclass(frozen=True)
class InitConfig:
    # std = d_in ** -gamma for every weight matrix; 0.5 is the LeCun/Xavier-like standard,
    # 1.0 the paper's "small" initialisation.
    gamma: float = 1.0
    seed: int = 0
    embedding_gamma: float | None = None
    lm_head_gamma: float | None = None
    attn_out_gamma: float | None = None
    mlp_out_gamma: float | None = None

    def __post_init__(self) -> None:
        for key in ("gamma", *(f"{g}_gamma" for g in INIT_GROUPS)):
            value = getattr(self, key)
            if value is None and key != "gamma":
                continue
            _finite_number(f"init.{key}", value)
            require(value > 0, f"init.{key}", value, "must be > 0")
        # < 2^32: model/init.py seeds each generator with seed * 1_000_003 + crc32(name), which
        # must fit torch.Generator.manual_seed (64 bits).
        require(
            isinstance(self.seed, int) and not isinstance(self.seed, bool) and 0 <= self.seed < 2**32,
            "init.seed",
            self.seed,
            "must be an integer in [0, 2^32)",
        )

    def gamma_for(self, group: str | None) -> float:
        """The gamma of a parameter group; groups without an override use `gamma`."""
        if group is None:
            return self.gamma
        override = getattr(self, f"{group}_gamma")
        return self.gamma if override is None else override


# GPU presets use a 32k vocabulary (the size of the Llama-2/Mistral tokenizers; train one
# with `tokenizers` on your corpus at that size). CPU presets use the 4k byte-level BPE that
# the bundled bilingual corpus trains in seconds.
GPU_VOCAB = 32768
CPU_VOCAB = 4096


@dataclass(frozen=True)
class ModelConfig:
    # The defaults are the micro preset's shape (tested), at CPU_VOCAB.
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (no GQA)
    d_ff: int = 704
    vocab_size: int = CPU_VOCAB
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    norm: NormConfig = field(default_factory=NormConfig)
    attn: AttnConfig = field(default_factory=AttnConfig)
    ffn: FFNConfig = field(default_factory=FFNConfig)
    init: InitConfig = field(default_factory=InitConfig)

    def __post_init__(self) -> None:
        for key in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "max_seq_len"):
            _positive_int(f"model.{key}", getattr(self, key))
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        _positive_int("model.n_kv_heads", self.n_kv_heads)
        require(
            self.d_model % self.n_heads == 0,
            "model.n_heads",
            self.n_heads,
            f"must divide model.d_model ({self.d_model})",
        )
        require(
            self.n_heads % self.n_kv_heads == 0,
            "model.n_kv_heads",
            self.n_kv_heads,
            f"must divide model.n_heads ({self.n_heads})",
        )
        require(self.head_dim % 2 == 0, "model.n_heads", self.n_heads, "must leave an even head_dim for RoPE")
        _finite_number("model.rope_theta", self.rope_theta)
        require(self.rope_theta > 0, "model.rope_theta", self.rope_theta, "must be > 0")
        for key, cls in (("norm", NormConfig), ("attn", AttnConfig), ("ffn", FFNConfig), ("init", InitConfig)):
            require(isinstance(getattr(self, key), cls), f"model.{key}", getattr(self, key), f"must be a {cls.__name__}")
        self._check_init_stds()

    def init_fan_ins(self) -> dict[str | None, int]:
        """The largest fan-in each init group draws weights for (None: every Linear without a
        group), so the smallest std of each (std = fan_in^-gamma). Tested against the built model."""
        out = {None: self.d_model, "embedding": self.d_model, "attn_out": self.n_heads * self.head_dim,
               "mlp_out": self.d_ff if self.ffn.type == "dense" else self.d_expert}
        if not self.tie_embeddings:
            out["lm_head"] = self.d_model
        return out

    def _check_init_stds(self) -> None:
        """Every weight's std must be a normal number in the float32 weights and the bfloat16
        autocast (one exponent range): init.gamma=1e9 would otherwise train an all-zero model.
        gamma > 0 and fan_in >= 1 keep every std <= 1, so none can overflow."""
        widest: dict[str, int] = {}  # each gamma key -> the largest fan-in it sets a std for
        for group, fan_in in self.init_fan_ins().items():
            key = "init.gamma" if group is None or getattr(self.init, f"{group}_gamma") is None else f"init.{group}_gamma"
            widest[key] = max(widest.get(key, 1), fan_in)
        for key, fan_in in widest.items():
            gamma = getattr(self.init, key.removeprefix("init."))
            std = float(fan_in) ** -gamma
            if fan_in > 1 and std < SMALLEST_NORMAL:
                most = math.log(1 / SMALLEST_NORMAL) / math.log(fan_in)
                raise ConfigError(f"{key}={gamma!r} is invalid: std = {fan_in}^-{gamma:g} = {std:.3g} underflows "
                                  f"float32/bfloat16 (smallest normal {SMALLEST_NORMAL:.3g}); at this width gamma "
                                  f"must be <= {math.floor(most * 100) / 100:g}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_expert(self) -> int:
        return self.ffn.d_expert or self.d_ff

    def replace(self, **changes: Any) -> ModelConfig:
        # n_kv_heads == n_heads means no GQA (what None resolves to): keep that when n_heads
        # changes, rather than turning the model into GQA with the old head count.
        if "n_heads" in changes and "n_kv_heads" not in changes and self.n_kv_heads == self.n_heads:
            changes["n_kv_heads"] = None
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named size (see PRESETS), with any field replaced by `overrides`."""
        if name not in PRESETS:
            raise ConfigError(f"model.preset={name!r} is invalid: one of {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides)

    def num_params(self, active: bool = False) -> int:
        """Parameter count from the shapes alone (matches the built model, tested).

        active=True counts only the top_k experts a token passes through (MoE).
        """
        d, hd = self.d_model, self.head_dim
        attn = d * self.n_heads * hd + 2 * d * self.n_kv_heads * hd + self.n_heads * hd * d
        if self.attn.gate == "headwise":
            attn += d * self.n_heads + self.n_heads
        elif self.attn.gate == "elementwise":
            attn += d * self.n_heads * hd + self.n_heads * hd
        if self.ffn.type == "dense":
            ffn = 3 * d * self.d_ff
        else:
            experts = self.ffn.top_k if active else self.ffn.n_experts
            ffn = experts * 3 * d * self.d_expert + d * self.ffn.n_experts
        norm = d if self.norm.type == "rmsnorm" else 2 * d
        per_layer = attn + ffn + 2 * norm
        embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.n_layers * per_layer + embed + norm


def llama_d_ff(d_model: int) -> int:
    """Llama's SwiGLU hidden size: 8/3 * d rounded up to a multiple of 64."""
    return 64 * math.ceil(8 * d_model / 3 / 64)


def _llama(d_model: int, n_layers: int, n_heads: int, n_kv_heads: int | None = None, **kw: Any) -> ModelConfig:
    d_ff = kw.pop("d_ff", None) or llama_d_ff(d_model)
    return ModelConfig(
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff, **kw
    )


_gpu = dict(vocab_size=GPU_VOCAB, max_seq_len=2048, rope_theta=500000.0)
_cpu = dict(vocab_size=CPU_VOCAB, max_seq_len=256)

PRESETS: dict[str, ModelConfig] = {
    # CPU sizes: learn real structure from the bundled corpus in minutes on 2 cores.
    "nano": _llama(128, 2, 4, vocab_size=CPU_VOCAB, max_seq_len=128, tie_embeddings=True),
    "micro": _llama(256, 4, 4, **_cpu),
    "mini": _llama(384, 10, 6, **_cpu),
    # Dense GPU sizes (total parameter counts in the README table, checked by tests).
    "0.1b": _llama(640, 12, 10, **_gpu),
    "0.25b": _llama(1024, 16, 16, n_kv_heads=8, **_gpu),
    "0.5b": _llama(1280, 24, 20, n_kv_heads=4, **_gpu),
    "1b": _llama(2048, 20, 32, n_kv_heads=8, **_gpu),
    "1.5b": _llama(2048, 30, 32, n_kv_heads=8, **_gpu),
    # MoE GPU sizes, named by total parameters; active counts in the README table.
    "moe-0.5b": _llama(768, 12, 12, n_kv_heads=4, ffn=FFNConfig("moe", n_experts=16, top_k=2, d_expert=960), **_gpu),
    "moe-1.5b": _llama(1024, 16, 16, n_kv_heads=8, ffn=FFNConfig("moe", n_experts=32, top_k=2, d_expert=896), **_gpu),
    # A CPU-sized MoE so the MoE path can be exercised and swept without a GPU.
    "micro-moe": _llama(256, 4, 4, ffn=FFNConfig("moe", n_experts=4, top_k=2, d_expert=384), **_cpu),
}


@dataclass(frozen=True)
class ModelPreset:
    """A preset and the fields that replace its own: what conf/model/*.yaml and `model.*` on the
    command line set. None keeps the preset's value; `build` makes the ModelConfig."""

    preset: str = "micro"
    d_model: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    # None: the preset's, or Llama's 8/3*d_model (rounded up to 64) when d_model is set.
    d_ff: int | None = None
    # Set to derive n_heads = d_model / head_dim (width sweeps at a fixed head size).
    head_dim: int | None = None
    # None: the trial's (the data's vocabulary; the longer of train.seq_len and the preset's).
    vocab_size: int | None = None
    max_seq_len: int | None = None
    rope_theta: float | None = None
    tie_embeddings: bool | None = None
    ffn: FFNConfig | None = None

    def __post_init__(self) -> None:
        require(self.preset in PRESETS, "model.preset", self.preset, f"one of {sorted(PRESETS)}")

    def build(self, vocab_size: int, seq_len: int, **parts: Any) -> ModelConfig:
        """The preset with every field set here replaced, a width override carrying what scales
        with width (d_ff, and n_heads from head_dim); `parts` are norm, attn and init."""
        base = PRESETS[self.preset]
        shape = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                 if f.name not in ("preset", "head_dim") and getattr(self, f.name) is not None}
        d = shape.get("d_model", base.d_model)
        if "d_model" in shape and "d_ff" not in shape and isinstance(d, int) and d > 0:
            shape["d_ff"] = llama_d_ff(d)
        if self.head_dim is not None:
            require(isinstance(self.head_dim, int) and self.head_dim > 0 and isinstance(d, int) and d % self.head_dim == 0,
                    "model.head_dim", self.head_dim, f"must be a positive integer dividing model.d_model ({d})")
            require("n_heads" not in shape, "model.n_heads", self.n_heads, "leave null when model.head_dim is set")
            shape["n_heads"] = d // self.head_dim
        shape.setdefault("vocab_size", vocab_size)
        shape.setdefault("max_seq_len", max(seq_len, base.max_seq_len))
        return base.replace(**shape, **parts)
