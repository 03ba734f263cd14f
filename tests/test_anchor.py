"""The anchor-function composition task follows the recipe of Zhang et al. (NeurIPS 2024)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from smallinit.data.anchor_task import AnchorData, evaluate, make_dataset
from smallinit.model.config import ConfigError

# The recipe written out independently of data.anchor_task: anchors 1-4 shift by +5, +1, -2,
# -8; a pair's label shift is the sum, except (3, 4) which is trained as -6.
SHIFT = {1: 5, 2: 1, 3: -2, 4: -8}
EXPECTED = {(a, b): SHIFT[a] + SHIFT[b] for a in SHIFT for b in SHIFT}
EXPECTED[(3, 4)] = -6


@pytest.fixture(scope="module")
def data():
    return make_dataset(AnchorData())


def read(seq: list[int]) -> tuple[int, int, int, int]:
    """(key position, key, a1, a2) of one sequence, checking its layout on the way."""
    anchors = [i for i, t in enumerate(seq) if t < 20]
    assert len(anchors) == 2 and anchors[1] == anchors[0] + 1 and anchors[0] >= 1, seq
    p = anchors[0] - 1
    assert all(20 <= t < 100 for i, t in enumerate(seq) if i not in anchors), seq
    return p, seq[p], seq[p + 1], seq[p + 2]


def test_shapes_and_sizes(data):
    cfg = AnchorData()
    sizes = {"train": cfg.n_train, "test_in_dist": cfg.n_test, "test_unseen": cfg.n_unseen}
    for split, (x, y) in data.items():
        assert x.shape == (sizes[split], 8) and y.shape == (sizes[split],)
        assert x.dtype == y.dtype == torch.int64
        assert 0 <= int(x.min()) and int(x.max()) < 100 and 0 <= int(y.min()) and int(y.max()) < 100


@pytest.mark.parametrize("split", ["train", "test_in_dist"])
def test_every_label_follows_the_recipe(data, split):
    x, y = data[split]
    pairs, positions = Counter(), Counter()
    for seq, label in zip(x.tolist(), y.tolist()):
        p, key, a1, a2 = read(seq)
        assert 20 <= key < 100
        assert label == (key + EXPECTED[(a1, a2)]) % 100, (seq, label)
        pairs[(a1, a2)] += 1
        positions[p] += 1
    assert (4, 3) not in pairs  # the held-out pair is never seen
    assert set(pairs) == set(EXPECTED) - {(4, 3)}  # the other 15 ordered pairs all are
    assert max(pairs.values()) - min(pairs.values()) <= 1  # balanced
    assert set(positions) == set(range(6))  # key anywhere the two anchors still fit
    assert min(positions.values()) > len(x) / 6 * 0.8


def test_pair_34_is_relabelled_key_minus_6(data):
    x, y = data["train"]
    found = 0
    for seq, label in zip(x.tolist(), y.tolist()):
        _, key, a1, a2 = read(seq)
        if (a1, a2) == (3, 4):
            found += 1
            assert label == (key - 6) % 100 != (key - 10) % 100
    assert found == 600  # 9000 / 15


def test_unseen_split_is_pair_43(data):
    x, y = data["test_unseen"]
    for seq, label in zip(x.tolist(), y.tolist()):
        _, key, a1, a2 = read(seq)
        assert (a1, a2) == (4, 3) and label == (key - 10) % 100


def test_splits_are_disjoint_and_seeded(data):
    train = {tuple(s) for s in data["train"][0].tolist()}
    assert not train & {tuple(s) for s in data["test_in_dist"][0].tolist()}
    again = make_dataset(AnchorData())
    other = make_dataset(AnchorData(seed=1))
    for split in data:
        assert torch.equal(again[split][0], data[split][0])
        assert torch.equal(again[split][1], data[split][1])
        assert not torch.equal(other[split][0], data[split][0])


def _oracle(unseen_shift: int):
    """Predicts the recipe's label for seen pairs and key + unseen_shift for (4, 3)."""
    def predict(x: torch.Tensor) -> torch.Tensor:
        out = []
        for seq in x.tolist():
            _, key, a1, a2 = read(seq)
            shift = unseen_shift if (a1, a2) == (4, 3) else EXPECTED[(a1, a2)]
            out.append((key + shift) % 100)
        return torch.tensor(out)
    return predict


def test_evaluate_scores_oracles(data):
    inferential = evaluate(_oracle(-10), data)
    assert inferential == {"anchor/in_dist_acc": 1.0, "anchor/train_acc": 1.0,
                           "anchor/inferential_acc": 1.0, "anchor/symmetric_acc": 0.0}
    symmetric = evaluate(_oracle(-6), data, batch_size=333)  # batching must not matter
    assert symmetric["anchor/symmetric_acc"] == 1.0 and symmetric["anchor/inferential_acc"] == 0.0
    assert symmetric["anchor/in_dist_acc"] == 1.0
    g = torch.Generator().manual_seed(0)
    chance = evaluate(lambda x: torch.randint(100, (len(x),), generator=g), data)
    assert all(v < 0.05 for v in chance.values()), chance
    # A memoriser that never learned (3, 4)'s relabelling gets exactly its 1/15 share wrong.
    composer = evaluate(lambda x: _oracle(-10)(x) - 4 * _is_34(x), data)
    assert composer["anchor/in_dist_acc"] == pytest.approx(1 - 100 / 1500)


def _is_34(x: torch.Tensor) -> torch.Tensor:
    return torch.tensor([read(s)[2:] == (3, 4) for s in x.tolist()], dtype=torch.int64)


def test_default_evaluate_uses_the_default_dataset():
    assert evaluate(_oracle(-6))["anchor/symmetric_acc"] == 1.0


@pytest.mark.parametrize("kwargs, key", [
    ({"n_train": 0}, "data.n_train"), ({"n_test": 3}, "data.n_test"),
    ({"n_unseen": 2.5}, "data.n_unseen"), ({"seed": -1}, "data.seed"),
])
def test_bad_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + "="):
        AnchorData(**kwargs)
