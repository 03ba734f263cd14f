"""The gamma rule: measured std of every parameter, group overrides, seeding, missed parameters.

The expected std is written here from the spec (docs/paper.md#the-init-rule and
docs/paper.md#embedding-and-head-std), not read back from model/init.py:
    Linear weight (incl. q/k/v/o, gate_proj, router, experts, lm_head): in_features ** -gamma
    token embedding: d_model ** -gamma
    norm gains 1, every bias 0
Overrides: embedding_gamma (tok_emb), lm_head_gamma (lm_head), attn_out_gamma (o_proj),
mlp_out_gamma (w2, the experts' w2 included).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from smallinit.model import (
    AttnConfig,
    FFNConfig,
    InitConfig,
    Initializer,
    ModelConfig,
    NormConfig,
    Transformer,
    init_std,
)
from smallinit.model.layers import LayerNorm, RMSNorm, SwiGLU

GROUP_OVERRIDES = {
    "embedding_gamma": lambda name: name == "tok_emb.weight",
    "lm_head_gamma": lambda name: name == "lm_head.weight",
    "attn_out_gamma": lambda name: name.endswith(".attn.o_proj.weight"),
    "mlp_out_gamma": lambda name: name.endswith(".w2.weight"),
}


def small_cfg(d_model: int = 128, variant: str = "dense", **init) -> ModelConfig:
    """One or two layers, head_dim 16 and 8 experts so even the smallest matrices (the headwise
    gate, n_heads x d; the router, n_experts x d) have >= 1024 entries: the sample std then has a
    relative standard error <= 1/sqrt(2*1024) = 2.2%, and the 10% tolerance is >= 4.5 of them."""
    common = dict(
        d_model=d_model,
        n_heads=d_model // 16,
        d_ff=2 * d_model,
        vocab_size=256,
        max_seq_len=32,
        init=InitConfig(**init),
    )
    if variant == "dense":  # headwise gate, RMSNorm, untied head, GQA
        return ModelConfig(
            n_layers=2, n_kv_heads=d_model // 32, attn=AttnConfig(gate="headwise"), **common
        )
    # MoE, elementwise gate, LayerNorm (so biases exist), untied head
    return ModelConfig(
        n_layers=1,
        attn=AttnConfig(gate="elementwise"),
        norm=NormConfig(type="layernorm"),
        ffn=FFNConfig(type="moe", n_experts=8, top_k=2, d_expert=64),
        **common,
    )


def expected_init(model: Transformer) -> dict[str, tuple[str, float]]:
    """name -> ("normal", std) or ("constant", value), for every parameter, from the spec."""
    cfg = model.cfg
    gamma = cfg.init.gamma

    def group_gamma(name: str) -> float:
        for key, matches in GROUP_OVERRIDES.items():
            if matches(name) and getattr(cfg.init, key) is not None:
                return getattr(cfg.init, key)
        return gamma

    spec: dict[str, tuple[str, float]] = {}
    for mname, module in model.named_modules():
        prefix = f"{mname}." if mname else ""
        if isinstance(module, nn.Linear):
            name = f"{prefix}weight"
            spec[name] = ("normal", module.in_features ** -group_gamma(name))
            if module.bias is not None:
                spec[f"{prefix}bias"] = ("constant", 0.0)
        elif isinstance(module, nn.Embedding):
            name = f"{prefix}weight"
            spec[name] = ("normal", cfg.d_model ** -group_gamma(name))
        elif isinstance(module, RMSNorm | LayerNorm):
            spec[f"{prefix}weight"] = ("constant", 1.0)
            if isinstance(module, LayerNorm):
                spec[f"{prefix}bias"] = ("constant", 0.0)
    return spec


def check_rule(model: Transformer) -> int:
    """Assert every parameter follows the spec; return how many random matrices were checked."""
    spec = expected_init(model)
    params = dict(model.named_parameters())
    assert set(spec) == set(params), f"spec/model mismatch: {set(spec) ^ set(params)}"
    checked = 0
    for name, p in params.items():
        kind, value = spec[name]
        p = p.detach().double()
        if kind == "constant":
            assert torch.all(p == value), name
            continue
        std, mean = p.std().item(), p.mean().item()
        assert abs(std / value - 1) < 0.10, f"{name}: std {std:.4g} vs rule {value:.4g}"
        # Zero mean: |mean| within 5 standard errors of the sample mean.
        assert abs(mean) < 5 * value / math.sqrt(p.numel()), f"{name}: mean {mean:.3g}"
        checked += 1
    return checked


@pytest.mark.parametrize("variant", ["dense", "moe"])
@pytest.mark.parametrize("d_model", [128, 256, 512])
@pytest.mark.parametrize("gamma", [0.5, 1.0, 1.25])
def test_every_parameter_follows_the_rule(gamma, d_model, variant):
    model = Transformer(small_cfg(d_model, variant, gamma=gamma, seed=d_model))
    checked = check_rule(model)
    # dense: emb + head + 2 layers x (q,k,v,o,gate, w1,w2,w3); moe: emb + head + q,k,v,o,gate,
    # router + 8 experts x 3.
    assert checked == {"dense": 2 + 2 * 8, "moe": 2 + 6 + 8 * 3}[variant]


def test_rule_check_can_fail():
    # The checker itself: a weight scaled by 1.15 or a bias left at 0.1 must be caught.
    model = Transformer(small_cfg(128, "moe", gamma=1.0))
    with torch.no_grad():
        model.blocks[0].ffn.experts[3].w1.weight.mul_(1.15)
    with pytest.raises(AssertionError, match="experts.3.w1"):
        check_rule(model)
    model.init_weights()
    with torch.no_grad():
        model.blocks[0].attn.gate_proj.bias.fill_(0.1)
    with pytest.raises(AssertionError, match="gate_proj.bias"):
        check_rule(model)


@pytest.mark.parametrize("gamma", [0.5, 1.0])
def test_tied_embedding_follows_embedding_rule(gamma):
    cfg = small_cfg(256, "dense", gamma=gamma, embedding_gamma=0.75).replace(tie_embeddings=True)
    model = Transformer(cfg)
    assert model.lm_head is None
    check_rule(model)
    std = model.tok_emb.weight.std().item()
    assert abs(std / 256**-0.75 - 1) < 0.10


def test_init_std_is_the_formula():
    assert init_std(0.5, 256) == pytest.approx(1 / 16)
    assert init_std(1.0, 256) == pytest.approx(1 / 256)
    assert init_std(1.25, 16) == pytest.approx(1 / 32)


# --------------------------------------------------------------------------- overrides


@pytest.mark.parametrize("variant", ["dense", "moe"])
@pytest.mark.parametrize("key", sorted(GROUP_OVERRIDES))
def test_group_override_changes_only_that_group(key, variant):
    base_cfg = small_cfg(128, variant, gamma=1.0, seed=3)
    over_cfg = small_cfg(128, variant, gamma=1.0, seed=3, **{key: 0.6})
    base, over = Transformer(base_cfg), Transformer(over_cfg)
    check_rule(over)  # the override group has its own std, the rest the base rule
    base_params = dict(base.named_parameters())
    changed = 0
    for name, p in over.named_parameters():
        b = base_params[name]
        if GROUP_OVERRIDES[key](name):
            # Same noise, other scale: fan_in^-0.6 / fan_in^-1 = fan_in^0.4 (fan_in = 128 for every
            # group here: d_model for tok_emb, o_proj and lm_head; d_ff or d_expert for w2).
            fan_in = 128 if not name.endswith("w2.weight") else b.shape[1]
            torch.testing.assert_close(p, b * fan_in**0.4, rtol=1e-5, atol=0)
            changed += 1
        else:
            assert torch.equal(p, b), f"{name} changed by {key}"
    expected = {"embedding_gamma": 1, "lm_head_gamma": 1, "attn_out_gamma": base_cfg.n_layers}
    n_w2 = base_cfg.n_layers * (1 if variant == "dense" else base_cfg.ffn.n_experts)
    assert changed == expected.get(key, n_w2)


# --------------------------------------------------------------------------- seeding


def test_same_seed_same_weights_and_logits():
    cfg = small_cfg(128, "moe", gamma=1.0, seed=11)
    a, b = Transformer(cfg), Transformer(cfg)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb), na
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(a(idx), b(idx))


def test_global_rng_does_not_affect_init():
    # Init draws from its own generators, so whatever ran before (data shuffling, dropout...)
    # cannot change the weights.
    cfg = small_cfg(128, "dense", seed=5)
    torch.manual_seed(0)
    a = Transformer(cfg)
    torch.manual_seed(12345)
    torch.randn(1000)
    b = Transformer(cfg)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters()))


def test_different_seed_changes_every_random_matrix():
    a = Transformer(small_cfg(128, "moe", seed=0))
    b = Transformer(small_cfg(128, "moe", seed=1))
    spec = expected_init(a)
    pb = dict(b.named_parameters())
    for name, p in a.named_parameters():
        if spec[name][0] == "normal":
            assert not torch.equal(p, pb[name]), name
            # Independent draws, not a shifted or rescaled copy.
            corr = torch.corrcoef(torch.stack([p.flatten(), pb[name].flatten()]))[0, 1].item()
            assert abs(corr) < 0.2, (name, corr)
        else:
            assert torch.equal(p, pb[name]), name


def test_parameters_draw_independent_noise():
    # Each parameter has its own stream: q_proj and k_proj (same shape) are not the same draw.
    model = Transformer(small_cfg(128, "dense", seed=0))
    attn = model.blocks[0].attn
    q = attn.q_proj.weight[: attn.k_proj.weight.shape[0]].flatten()
    corr = torch.corrcoef(torch.stack([q, attn.k_proj.weight.flatten()]))[0, 1].item()
    assert abs(corr) < 0.1


@pytest.mark.parametrize(("g1", "g2"), [(0.5, 1.0), (1.0, 1.25), (0.5, 1.25)])
def test_gamma_only_rescales_the_same_noise(g1, g2):
    a = Transformer(small_cfg(128, "moe", gamma=g1, seed=4))
    b = Transformer(small_cfg(128, "moe", gamma=g2, seed=4))
    spec = expected_init(a)
    pb = dict(b.named_parameters())
    for name, p in a.named_parameters():
        if spec[name][0] != "normal":
            assert torch.equal(p, pb[name]), name
            continue
        fan_in = 128 if name == "tok_emb.weight" else p.shape[1]
        # w(g2) = w(g1) * fan_in^(g1 - g2), up to float32 rounding of the two products.
        torch.testing.assert_close(pb[name], p * fan_in ** (g1 - g2), rtol=1e-5, atol=0)


@pytest.mark.parametrize(
    "change",
    [
        dict(attn=AttnConfig(gate="headwise")),
        dict(attn=AttnConfig(gate="elementwise")),
        dict(norm=NormConfig(eps=1e-12)),
        dict(norm=NormConfig(type="layernorm")),
        dict(n_layers=3),
        dict(max_seq_len=64),
        dict(tie_embeddings=True),
    ],
    ids=[
        "gate-headwise",
        "gate-elementwise",
        "eps",
        "layernorm",
        "n_layers",
        "max_seq_len",
        "tied",
    ],
)
def test_unrelated_config_keeps_shared_weights_identical(change):
    base = small_cfg(128, "dense", gamma=1.0, seed=9).replace(attn=AttnConfig(gate="none"))
    a, b = Transformer(base), Transformer(base.replace(**change))
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    shared = set(pa) & set(pb)
    assert len(shared) >= len(pa) - 1  # at most lm_head disappears (tied)
    for name in shared:
        assert torch.equal(pa[name], pb[name]), name


# --------------------------------------------------------------------------- one init path


def test_init_weights_restores_the_seeded_weights():
    cfg = small_cfg(128, "moe", seed=2)
    model, fresh = Transformer(cfg), Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.init_weights()
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), name


def test_init_weights_raises_on_a_parameter_added_later():
    model = Transformer(small_cfg(128, "dense"))
    model.blocks[1].attn.extra_scale = nn.Parameter(torch.ones(4))
    with pytest.raises(RuntimeError, match=r"blocks\.1\.attn\.extra_scale"):
        model.init_weights()


def test_construction_raises_when_a_layer_adds_an_uninitialised_parameter(monkeypatch):
    original = SwiGLU.__init__

    def with_extra(self, d_model, d_hidden):
        original(self, d_model, d_hidden)
        self.extra = nn.Parameter(torch.zeros(d_hidden))

    monkeypatch.setattr(SwiGLU, "__init__", with_extra)
    with pytest.raises(RuntimeError, match=r"blocks\.0\.ffn\.extra"):
        Transformer(small_cfg(128, "dense"))
    with pytest.raises(RuntimeError, match=r"blocks\.0\.ffn\.experts\.0\.extra"):
        Transformer(small_cfg(128, "moe"))


def test_initializer_records_every_parameter_on_meta():
    cfg = small_cfg(512, "moe")
    with torch.device("meta"):
        model = Transformer(cfg)
    init = Initializer(cfg.init)
    for i, block in enumerate(model.blocks):
        block.init_weights(init, f"blocks.{i}")
    assert init.written < {n for n, _ in model.named_parameters()}  # root params not yet
    model.init_weights()  # and the root call completes without drawing anything
    assert all(p.is_meta for p in model.parameters())


def test_meta_build_then_to_empty_and_init_equals_direct_build():
    # The large-model path (torchtitan): shapes on meta, storage later, then the one init path.
    cfg = small_cfg(128, "moe", gamma=1.0, seed=6)
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device="cpu")
    model.init_weights()
    direct = Transformer(cfg)
    for (name, p), q in zip(model.named_parameters(), direct.parameters()):
        assert torch.equal(p, q), name
    assert torch.equal(model.rope_cos, direct.rope_cos) and torch.equal(
        model.rope_sin, direct.rope_sin
    )
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(idx), direct(idx))
