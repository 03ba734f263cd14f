"""A trial's identity names its folder, and a sweep resumes by it: a record started months ago
finds its finished trials only if the same command still gives the same identities. These are
the identities of commit 276e17b; a change to the config code must leave every one of them
(an experiment's own trials change only when its file does, so they are not pinned here)."""

from __future__ import annotations

import pytest

PINNED = [
    # The default trial (`python sweep.py`) and `make sweep`'s grid (Makefile SWEEP_GRID).
    ([], "ca73ce39d569"),
    (["init.gamma=0.5", "norm.eps=1e-5"], "2043bc0db37b"),
    (["init.gamma=0.5", "norm.eps=1e-12"], "cd37835e19fa"),
    (["init.gamma=0.75", "norm.eps=1e-5"], "1bdb0d80a33a"),
    (["init.gamma=0.75", "norm.eps=1e-12"], "ac53b5826bc7"),
    (["init.gamma=1.0", "norm.eps=1e-5"], "4bf777c32652"),
    (["init.gamma=1.0", "norm.eps=1e-12"], "ca73ce39d569"),
    (["init.gamma=1.25", "norm.eps=1e-5"], "e9a8ad1aa25a"),
    (["init.gamma=1.25", "norm.eps=1e-12"], "5254025b57d2"),
    # Integers where a float is expected keep their own identity (1 and 1.0 hash differently),
    # and each group option, derived shape and budget form.
    (["init.gamma=1"], "cbb4201d6216"),
    (["optim.weight_decay=0", "optim.warmup_frac=0"], "143e180e2633"),
    (["model.rope_theta=500000"], "76bf71f05edb"),
    (["train.tokens_per_param=20"], "892158b7c37c"),
    (["model.d_model=512", "model.head_dim=64"], "06976b692eaf"),
    (["model=micro-moe"], "ab3b737bc14c"),
    (["model.ffn={type: moe, n_experts: 4, top_k: 1}"], "7fc188fb6d74"),
    (["model=nano", "data=anchor", "train=anchor"], "35dfc79a2ce4"),
    (["norm=layernorm", "init=standard", "attn=headwise"], "4d34906edd1b"),
    (["arm=small", "seed=3"], "a9d9d3e7e4fb"),
    (["train=gpu", "model=0.1b", "data.vocab_size=32768"], "08dfd8877d5a"),
    (["optim.schedule=wsd", "train.budgets=[40960,81920]"], "c4f2439dbaa5"),
    (["optim.betas=[0,0.95]", "optim.grad_clip=null"], "334f4a07fe6d"),
]


@pytest.mark.parametrize("overrides, identity", PINNED, ids=[" ".join(o) or "default" for o, _ in PINNED])
def test_a_command_gives_the_identity_it_gave_at_276e17b(compose, overrides, identity):
    from smallinit.trainer.config import trial_config_from_dict

    assert trial_config_from_dict(compose(*overrides, tiny=False)).identity() == identity
