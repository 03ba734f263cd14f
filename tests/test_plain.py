"""core.plain.plain gives what dataclasses.asdict gives, without deep-copying immutable leaves."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from pathlib import Path

from smallinit.core.plain import plain
from smallinit.trainer.config import TrialArgs

Pair = namedtuple("Pair", "a b")


@dataclasses.dataclass(frozen=True)
class Leaf:
    x: float = 1.5
    where: Path = Path("/tmp/x")


@dataclasses.dataclass
class Tree:
    leaf: Leaf = dataclasses.field(default_factory=Leaf)
    leaves: list = dataclasses.field(default_factory=lambda: [Leaf(2.0), Leaf()])
    pair: Pair = Pair(1, Leaf())
    table: dict = dataclasses.field(default_factory=lambda: {"k": Leaf(), 3: (Leaf(), None)})
    name: str | None = None


def test_plain_is_asdict():
    for value in (Tree(), Tree(name="n", leaves=[]), Leaf()):
        got, want = plain(value), dataclasses.asdict(value)
        assert got == want and repr(got) == repr(want)  # same types and key order
    mutable = Tree()
    assert plain(mutable)["leaf"]["where"] is not mutable.leaf.where  # other leaves are copies, as asdict's


def test_the_default_trials_dict_is_asdicts():
    trial = TrialArgs().build()
    want = {**dataclasses.asdict(trial), "data": trial.data.to_dict()}
    assert repr(trial.to_dict()) == repr(want)
