"""The attention capture probes attach from outside the model: inside the capture context the
explicit path matches SDPA and yields the sink, outside it training never forms the weights,
and the probe values stay pinned on a fixed seed."""

from __future__ import annotations

import pytest
import torch

from smallinit.model import AttnConfig, FFNConfig, NormConfig, Transformer
from smallinit.model.layers import Attention
from smallinit.model.probes import activation_probes, first_token_mass_capture

from .conftest import tiny_cfg, tokens


@pytest.mark.parametrize(
    "kw",
    [
        {},
        dict(n_kv_heads=2),
        dict(n_kv_heads=1, attn=AttnConfig(gate="elementwise")),
        dict(
            n_kv_heads=2,
            attn=AttnConfig(gate="headwise"),
            ffn=FFNConfig(type="moe", n_experts=4, top_k=2),
        ),
    ],
    ids=["mha", "gqa", "mqa-elementwise", "gqa-headwise-moe"],
)
def test_explicit_attention_path_matches_sdpa(kw):
    cfg = tiny_cfg(**kw)
    model = Transformer(cfg)
    idx = tokens(cfg.vocab_size, 2, cfg.max_seq_len)
    sdpa = model(idx)
    with first_token_mass_capture(model) as masses:
        explicit = model(idx)
    assert (sdpa - sdpa.mean()).abs().max() > 0.1  # non-trivial logits
    torch.testing.assert_close(explicit, sdpa, rtol=1e-5, atol=1e-5)
    assert sorted(masses) == list(range(cfg.n_layers))
    for mass in masses.values():
        assert mass.shape == (2, cfg.n_heads)
        assert ((mass >= 0) & (mass <= 1)).all()


def test_training_forward_never_forms_attention_weights(monkeypatch):
    # Capture costs only inside first_token_mass_capture: outside it attention stays fused.
    def explicit_path(*args, **kwargs):
        raise AssertionError("the explicit attention path ran outside a probe")

    model = Transformer(tiny_cfg())
    with first_token_mass_capture(model):
        pass
    monkeypatch.setattr(Attention, "_attention_with_weights", explicit_path)
    model(tokens(97, 2, 8)).sum().backward()
    assert all(b.attn.weights_observer is None for b in model.blocks)


def test_activation_probes_keep_their_values_on_a_fixed_seed():
    # Pinned on a fixed seed, so a change in how probes capture attention cannot move them.
    # Block 1 reads the explicit path's output, so its sink and ratio check that output too.
    # eps is fixed here (the values were pinned at 1e-5) so a change of NormConfig's default
    # cannot move them either.
    cfg = tiny_cfg(n_kv_heads=2, attn=AttnConfig(gate="headwise"), norm=NormConfig(eps=1e-5))
    out = activation_probes(Transformer(cfg), tokens(cfg.vocab_size, 2, 16))
    expected = {
        "attn_sink/blocks.0": 0.1424708217382431,
        "attn_sink/blocks.1": 0.15522024035453796,
        "residual_ratio/blocks.0": 5.3821120262146,
        "residual_ratio/blocks.1": 1.1032370328903198,
        "saturation/blocks.1.norm2": 0.999981701374054,
    }
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, rel=1e-6), key
