"""The anchor-function composition probe: does a model infer or memorise a composition?

Zhang, Lin, Wang, Zhang, Xu, "Initialization is Critical to Whether Transformers Fit
Composite Functions by Reasoning or Memorizing" (NeurIPS 2024, arXiv 2405.05409).

Vocabulary 0-99. Keys are 20-99; anchors 1, 2, 3, 4 stand for the shifts +5, +1, -2, -8
(mod 100). A sequence of length 8 holds one key followed directly by two anchors (a1, a2)
at a random position; the label is f_a2(f_a1(key)) mod 100, predicted at the last position:

    position  0   1   2   3   4   5   6   7
    token    57  31 [k]  a1  a2  88  23  64     label = k + shift[a1] + shift[a2]

Choices the recipe leaves open, made here:
- Noise tokens are uniform on 20-99, the key range, so a key is told apart from noise only
  by its place before the anchors; tokens 0 and 5-19 never occur in inputs. Noise from
  the key range is what makes the task need attention to locate the key rather than a
  token-identity shortcut.
- The key's position p is uniform on 0..5 so that both anchors fit (p + 2 <= 7).
- All 16 ordered anchor pairs, repeats such as (1, 1) included, are trained except (4, 3);
  the train set is balanced over the 15 seen pairs. (3, 4) is labelled key - 6 instead of
  its composition key - 10: the one seen pair that disagrees with composition.
- The unseen pair (4, 3) composes to key - 10 (inferential answer); a model that learned
  pairs as symmetric units copies (3, 4)'s label, key - 6 (symmetric answer). Its stored
  label is the inferential one.
- The test sets are fresh draws from separate random streams. A pair has 6 * 80^6 ~ 1.6e12
  possible sequences, so a test sequence repeats one of the 600 train sequences of its pair
  with probability ~4e-10: in-distribution test measures generalisation, not recall.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from smallinit.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

VOCAB_SIZE = 100
SEQ_LEN = 8
KEYS = (20, VOCAB_SIZE)  # [low, high)
SHIFTS = {1: 5, 2: 1, 3: -2, 4: -8}
UNSEEN = (4, 3)
RELABELLED = {(3, 4): -6}
PAIRS = tuple((a1, a2) for a1 in SHIFTS for a2 in SHIFTS)
SEEN_PAIRS = tuple(p for p in PAIRS if p != UNSEEN)


def label_shift(a1: int, a2: int) -> int:
    """Shift the training labels use for pair (a1, a2) (for (4, 3): the composed one)."""
    return RELABELLED.get((a1, a2), SHIFTS[a1] + SHIFTS[a2])


@dataclass(frozen=True)
class AnchorData:
    """The task's settings (conf/data/anchor.yaml); `task` is fixed, `vocab_size` is the
    recipe's and so not a setting."""

    task: str = field(default="anchor", init=False)
    n_train: int = 9000  # split evenly over the 15 seen pairs
    n_test: int = 1500  # in-distribution test sequences, split over the seen pairs
    n_unseen: int = 500  # sequences of the held-out pair (4, 3)
    seed: int = 0
    vocab_size: ClassVar[int] = VOCAB_SIZE

    def __post_init__(self) -> None:
        for key in ("n_train", "n_test", "n_unseen"):
            v = getattr(self, key)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= len(SEEN_PAIRS)):
                raise ConfigError(f"data.{key}={v!r} is invalid: an int >= {len(SEEN_PAIRS)}")
        if not (isinstance(self.seed, int) and self.seed >= 0):
            raise ConfigError(f"data.seed={self.seed!r} is invalid: an int >= 0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _sequences(rng: np.random.Generator, pairs: list[tuple[int, int]], n: int):
    """n sequences spread as evenly as possible over pairs -> (x (n, 8), y (n,)) int64."""
    import torch  # here, not at the top: the sweep driver validates AnchorData without torch

    counts = [n // len(pairs) + (i < n % len(pairs)) for i in range(len(pairs))]
    a = np.repeat(np.array(pairs, dtype=np.int64), counts, axis=0)  # (n, 2)
    x = rng.integers(*KEYS, size=(n, SEQ_LEN))  # noise everywhere, the key included
    pos = rng.integers(0, SEQ_LEN - 2, size=n)  # key position
    rows = np.arange(n)
    x[rows, pos + 1] = a[:, 0]
    x[rows, pos + 2] = a[:, 1]
    shift = np.array([label_shift(a1, a2) for a1, a2 in a.tolist()], dtype=np.int64)
    y = (x[rows, pos] + shift) % VOCAB_SIZE
    order = rng.permutation(n)
    return torch.from_numpy(x[order]), torch.from_numpy(y[order])


def make_dataset(cfg: AnchorData = AnchorData()) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"train", "test_in_dist", "test_unseen"} -> (x LongTensor (N, 8), y LongTensor (N,))."""
    streams = np.random.SeedSequence(cfg.seed).spawn(3)
    gen = [np.random.Generator(np.random.PCG64(s)) for s in streams]
    return {
        "train": _sequences(gen[0], list(SEEN_PAIRS), cfg.n_train),
        "test_in_dist": _sequences(gen[1], list(SEEN_PAIRS), cfg.n_test),
        "test_unseen": _sequences(gen[2], [UNSEEN], cfg.n_unseen),
    }


def parse(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(key, a1, a2), each (N,), read back from sequences (N, 8)."""
    import torch

    is_anchor = (x >= 1) & (x <= 4)
    if not bool((is_anchor.sum(1) == 2).all()):
        raise ValueError("every sequence must hold exactly two anchor tokens")
    first = is_anchor.int().argmax(1)  # position of a1
    rows = torch.arange(len(x))
    return x[rows, first - 1], x[rows, first], x[rows, first + 1]


def evaluate(predict_fn: Callable[[torch.Tensor], torch.Tensor],
             data: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
             batch_size: int = 4096) -> dict[str, float]:
    """Accuracies of predict_fn (x (N, 8) -> predicted token (N,)) on the anchor splits.

    anchor/in_dist_acc: held-out sequences of the seen pairs; anchor/train_acc: the train
    set; anchor/inferential_acc and anchor/symmetric_acc: fraction of (4, 3) sequences
    answered key - 10 and key - 6. Pass the dataset the model trained on; by default
    make_dataset(AnchorData()).
    """
    import torch

    data = make_dataset() if data is None else data

    @torch.no_grad()
    def predict(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.as_tensor(predict_fn(x[i:i + batch_size])).reshape(-1).cpu()
                          for i in range(0, len(x), batch_size)])

    out = {}
    for split, name in (("test_in_dist", "in_dist_acc"), ("train", "train_acc")):
        x, y = data[split]
        out[f"anchor/{name}"] = float((predict(x) == y).float().mean())
    x, _ = data["test_unseen"]
    key, _, _ = parse(x)
    pred = predict(x)
    for name, shift in (("inferential_acc", SHIFTS[4] + SHIFTS[3]), ("symmetric_acc", RELABELLED[(3, 4)])):
        out[f"anchor/{name}"] = float((pred == (key + shift) % VOCAB_SIZE).float().mean())
    return out
