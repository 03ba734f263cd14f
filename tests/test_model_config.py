"""ModelConfig: validation messages, presets' sizes, and num_params() against built models."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from smallinit.core.errors import ConfigError
from smallinit.model import (
    PRESETS,
    AttnConfig,
    FFNConfig,
    InitConfig,
    ModelConfig,
    NormConfig,
    Transformer,
)
from smallinit.model.layers import MoE


def meta_model(cfg: ModelConfig) -> Transformer:
    """Shapes only: no memory, no init noise, so the 1.5B presets build in milliseconds."""
    with torch.device("meta"):
        return Transformer(cfg)


# --------------------------------------------------------------------------- validation

NAN = float("nan")

# (id, thunk that builds the invalid config, key the message must name, bad value as printed)
INVALID = [
    (
        "heads-not-dividing-d_model",
        lambda: ModelConfig(d_model=100, n_heads=3),
        "model.n_heads",
        "3",
    ),
    ("odd-head_dim", lambda: ModelConfig(d_model=12, n_heads=4), "model.n_heads", "4"),
    (
        "kv-heads-not-dividing-heads",
        lambda: ModelConfig(n_heads=4, n_kv_heads=3),
        "model.n_kv_heads",
        "3",
    ),
    ("kv-heads-above-heads", lambda: ModelConfig(n_heads=4, n_kv_heads=8), "model.n_kv_heads", "8"),
    ("kv-heads-zero", lambda: ModelConfig(n_kv_heads=0), "model.n_kv_heads", "0"),
    ("d_model-zero", lambda: ModelConfig(d_model=0), "model.d_model", "0"),
    ("n_layers-negative", lambda: ModelConfig(n_layers=-2), "model.n_layers", "-2"),
    ("n_heads-zero", lambda: ModelConfig(n_heads=0), "model.n_heads", "0"),
    ("d_ff-float", lambda: ModelConfig(d_ff=688.5), "model.d_ff", "688.5"),
    ("vocab-bool", lambda: ModelConfig(vocab_size=True), "model.vocab_size", "True"),
    ("max_seq_len-string", lambda: ModelConfig(max_seq_len="256"), "model.max_seq_len", "'256'"),
    ("rope_theta-zero", lambda: ModelConfig(rope_theta=0.0), "model.rope_theta", "0.0"),
    ("rope_theta-inf", lambda: ModelConfig(rope_theta=math.inf), "model.rope_theta", "inf"),
    ("norm-not-a-NormConfig", lambda: ModelConfig(norm="rmsnorm"), "model.norm", "'rmsnorm'"),
    (
        "init-not-an-InitConfig",
        lambda: ModelConfig(init={"gamma": 1.0}),
        "model.init",
        "{'gamma': 1.0}",
    ),
    ("gamma-zero", lambda: InitConfig(gamma=0.0), "init.gamma", "0.0"),
    ("gamma-negative", lambda: InitConfig(gamma=-0.5), "init.gamma", "-0.5"),
    ("gamma-nan", lambda: InitConfig(gamma=NAN), "init.gamma", "nan"),
    ("gamma-inf", lambda: InitConfig(gamma=math.inf), "init.gamma", "inf"),
    ("gamma-string", lambda: InitConfig(gamma="1.0"), "init.gamma", "'1.0'"),
    ("gamma-none", lambda: InitConfig(gamma=None), "init.gamma", "None"),
    ("embedding_gamma-zero", lambda: InitConfig(embedding_gamma=0), "init.embedding_gamma", "0"),
    ("lm_head_gamma-nan", lambda: InitConfig(lm_head_gamma=NAN), "init.lm_head_gamma", "nan"),
    (
        "attn_out_gamma-negative",
        lambda: InitConfig(attn_out_gamma=-1.0),
        "init.attn_out_gamma",
        "-1.0",
    ),
    (
        "mlp_out_gamma-string",
        lambda: InitConfig(mlp_out_gamma="big"),
        "init.mlp_out_gamma",
        "'big'",
    ),
    ("seed-negative", lambda: InitConfig(seed=-1), "init.seed", "-1"),
    ("seed-float", lambda: InitConfig(seed=1.5), "init.seed", "1.5"),
    # Seeds feed torch.Generator.manual_seed(seed * 1_000_003 + crc32(name)), which overflows
    # (an opaque error at build time) for seeds of ~2^45 and above.
    ("seed-too-large", lambda: InitConfig(seed=2**45), "init.seed", str(2**45)),
    ("eps-negative", lambda: NormConfig(eps=-1e-6), "norm.eps", "-1e-06"),
    ("eps-nan", lambda: NormConfig(eps=NAN), "norm.eps", "nan"),
    ("eps-string", lambda: NormConfig(eps="1e-5"), "norm.eps", "'1e-5'"),
    ("unknown-norm", lambda: NormConfig(type="batchnorm"), "norm.type", "'batchnorm'"),
    ("unknown-gate", lambda: AttnConfig(gate="sigmoid"), "attn.gate", "'sigmoid'"),
    ("top_k-above-experts", lambda: FFNConfig(type="moe", n_experts=4, top_k=5), "ffn.top_k", "5"),
    ("top_k-zero", lambda: FFNConfig(type="moe", top_k=0), "ffn.top_k", "0"),
    ("n_experts-zero", lambda: FFNConfig(type="moe", n_experts=0), "ffn.n_experts", "0"),
    ("unknown-ffn", lambda: FFNConfig(type="sparse"), "ffn.type", "'sparse'"),
    ("aux-coef-negative", lambda: FFNConfig(aux_loss_coef=-0.1), "ffn.aux_loss_coef", "-0.1"),
    ("d_expert-zero", lambda: FFNConfig(d_expert=0), "ffn.d_expert", "0"),
    ("unknown-preset", lambda: ModelConfig.preset("2b"), "model.preset", "'2b'"),
    ("preset-bad-override", lambda: ModelConfig.preset("nano", n_heads=3), "model.n_heads", "3"),
    ("replace-bad-value", lambda: ModelConfig().replace(n_kv_heads=3), "model.n_kv_heads", "3"),
]


@pytest.mark.parametrize(
    ("make", "key", "value"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_config_names_key_and_value(make, key, value):
    with pytest.raises(ConfigError) as exc:
        make()
    msg = str(exc.value)
    # The message format is "<key>=<repr(value)> is invalid: <allowed>"; require the pair, so a
    # message that names the key but reports a different field's value fails.
    assert f"{key}={value}" in msg, msg
    assert "invalid" in msg


def test_config_error_is_a_value_error():
    # Callers (Hydra, the sweeper) catch ValueError; ConfigError must stay one.
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ModelConfig(),
        lambda: ModelConfig(d_model=64, n_heads=2, n_kv_heads=1),
        lambda: NormConfig(eps=0.0),  # eps = 0 is allowed: the limit the paper's 1e-12 approaches
        lambda: NormConfig(type="layernorm", eps=1e-12),
        lambda: InitConfig(gamma=1.25, embedding_gamma=0.5, seed=7),
        lambda: FFNConfig(type="moe", n_experts=4, top_k=4),
        lambda: AttnConfig(gate="elementwise"),
    ],
)
def test_valid_configs_construct(make):
    make()


def test_n_kv_heads_defaults_to_n_heads():
    assert ModelConfig(n_heads=8, d_model=256).n_kv_heads == 8
    assert ModelConfig(n_heads=8, d_model=256, n_kv_heads=2).n_kv_heads == 2


def test_changing_n_heads_keeps_a_config_without_gqa_without_gqa():
    # nano has n_kv_heads=None ("= n_heads"): overriding n_heads must not silently turn it into
    # GQA with the old head count as kv heads (nor fail with a key the user never set).
    assert ModelConfig.preset("nano", n_heads=8).n_kv_heads == 8
    assert ModelConfig.preset("nano", n_heads=2).n_kv_heads == 2
    assert ModelConfig(d_model=64, n_heads=4).replace(n_heads=8).n_kv_heads == 8
    # Real GQA presets keep their kv heads; an explicit n_kv_heads always wins.
    assert ModelConfig.preset("1b", n_heads=16).n_kv_heads == 8
    assert ModelConfig.preset("nano", n_heads=8, n_kv_heads=2).n_kv_heads == 2
    assert ModelConfig.preset("nano", d_model=256).n_kv_heads == 4


def test_largest_seed_builds():
    cfg = ModelConfig(
        d_model=32, n_heads=2, n_layers=1, d_ff=32, vocab_size=16, init=InitConfig(seed=2**32 - 1)
    )
    assert Transformer(cfg).tok_emb.weight.std() > 0


def test_preset_overrides_replace_only_the_given_fields():
    base = ModelConfig.preset("micro")
    changed = ModelConfig.preset("micro", n_layers=2, init=InitConfig(gamma=0.5))
    assert (changed.n_layers, changed.init.gamma) == (2, 0.5)
    for f in dataclasses.fields(ModelConfig):
        if f.name not in ("n_layers", "init"):
            assert getattr(changed, f.name) == getattr(base, f.name), f.name
    # The registry itself is untouched (presets are frozen values, not shared mutable state).
    assert PRESETS["micro"].n_layers == 4 and PRESETS["micro"].init.gamma == 1.0


# --------------------------------------------------------------------------- presets' sizes

# Name -> the size it promises, in parameters (MoE presets by total parameters).
NOMINAL = {
    "nano": 1e6,
    "micro": 5e6,
    "mini": 20e6,
    "0.1b": 0.1e9,
    "0.25b": 0.25e9,
    "0.5b": 0.5e9,
    "1b": 1e9,
    "1.5b": 1.5e9,
    "moe-0.5b": 0.5e9,
    "moe-1.5b": 1.5e9,
}


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_preset_size_within_10_percent_of_its_name(name):
    n = meta_model(ModelConfig.preset(name)).num_params()
    assert abs(n / NOMINAL[name] - 1) <= 0.10, f"{name}: {n:,} parameters"


def test_every_preset_has_a_size_check_or_is_cpu_moe():
    # A new preset must be added to NOMINAL (or here, with its reason) so its size is checked.
    assert set(PRESETS) - set(NOMINAL) == {"micro-moe"}


def test_moe_presets_are_moe_and_activate_fewer_parameters():
    for name in ("moe-0.5b", "moe-1.5b", "micro-moe"):
        cfg = ModelConfig.preset(name)
        assert cfg.ffn.type == "moe"
        assert cfg.num_params(active=True) < cfg.num_params()


# --------------------------------------------------------------------------- num_params()

VARIANTS = {
    "gate-headwise": dict(attn=AttnConfig(gate="headwise")),
    "gate-elementwise": dict(attn=AttnConfig(gate="elementwise")),
    "layernorm": dict(norm=NormConfig(type="layernorm")),
    "tied": dict(tie_embeddings=True),
    "untied": dict(tie_embeddings=False),
    "gqa": dict(n_kv_heads=1),
    "moe": dict(ffn=FFNConfig(type="moe", n_experts=4, top_k=2, d_expert=96)),
    "moe-default-d_expert": dict(ffn=FFNConfig(type="moe", n_experts=3, top_k=1)),
    "all": dict(
        attn=AttnConfig(gate="elementwise"),
        norm=NormConfig(type="layernorm"),
        tie_embeddings=True,
        n_kv_heads=2,
        ffn=FFNConfig(type="moe", n_experts=4, top_k=3),
    ),
}


def test_the_docs_preset_table_is_the_presets():
    """docs/training.md's table is read against PRESETS, the one place a preset is defined
    (conf/model/<name>.yaml only names it): every preset has a row, every row is its preset."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    rows = {}
    for line in text.split("### Model presets", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    assert set(rows) == set(PRESETS)
    for name, (d_model, layers, heads, d_ff, experts, vocab, total, active) in rows.items():
        cfg = ModelConfig.preset(name)
        kv = cfg.n_kv_heads or cfg.n_heads
        moe = f"{cfg.ffn.n_experts} ({cfg.ffn.top_k}, {cfg.ffn.d_expert})" if cfg.ffn.type == "moe" else "-"
        built = [str(cfg.d_model), str(cfg.n_layers), f"{cfg.n_heads} ({kv})", str(cfg.d_ff), moe,
                 f"{cfg.vocab_size}" + (" (tied)" if cfg.tie_embeddings else ""),
                 f"{cfg.num_params() / 1e6:,.1f}M", f"{cfg.num_params(active=True) / 1e6:,.1f}M"]
        assert [d_model, layers, heads, d_ff, experts, vocab, total, active] == built, name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_num_params_matches_built_preset(name):
    cfg = ModelConfig.preset(name)
    assert cfg.num_params() == meta_model(cfg).num_params()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("preset", ["nano", "micro"])
def test_num_params_matches_built_variant(preset, variant):
    cfg = ModelConfig.preset(preset, **VARIANTS[variant])
    model = meta_model(cfg)
    assert cfg.num_params() == model.num_params()
    # Tied embeddings: the head reuses the embedding, so no separate lm_head parameter.
    assert (model.lm_head is None) == cfg.tie_embeddings


@pytest.mark.parametrize("variant", ["moe", "moe-default-d_expert", "all"])
def test_num_params_active_counts_top_k_experts(variant):
    cfg = ModelConfig.preset("micro", **VARIANTS[variant])
    model = meta_model(cfg)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    inactive = 0
    for module in model.modules():
        if isinstance(module, MoE):
            assert len(module.experts) == cfg.ffn.n_experts
            inactive += sum(count(e) for e in module.experts[cfg.ffn.top_k :])
    assert inactive > 0
    assert cfg.num_params(active=True) == model.num_params() - inactive


def test_num_params_counts_gate_parameters():
    base = ModelConfig.preset("micro")
    d, H, hd, L = base.d_model, base.n_heads, base.head_dim, base.n_layers
    head = ModelConfig.preset("micro", attn=AttnConfig(gate="headwise")).num_params()
    elem = ModelConfig.preset("micro", attn=AttnConfig(gate="elementwise")).num_params()
    assert head - base.num_params() == L * (H * d + H)
    assert elem - base.num_params() == L * (H * hd * d + H * hd)


def test_meta_model_holds_no_storage():
    model = meta_model(ModelConfig.preset("1.5b"))
    assert all(p.is_meta for p in model.parameters())
    assert isinstance(model.tok_emb, nn.Embedding)
