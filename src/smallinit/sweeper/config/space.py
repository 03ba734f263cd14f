"""Hydra override grammar -> a sweep space, as pure functions (no Ray, no trials).

    init.gamma=0.5,1.0            choice  } discrete: a grid, every combination runs
    model=nano,micro              choice  }
    train.seed=range(0,3)         range   }
    optim.lr=interval(1e-4,1e-2)          continuous: an Optuna search
    optim.lr=tag(log,interval(1e-4,1e-2)) log-uniform
    optim.warmup_frac=tag(int,...)        integer interval

With no interval the sweep is a grid. With one or more intervals it is an Optuna search over
hydra.sweeper.n_trials trials, in which discrete sweeps become categorical parameters.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.errors import OverrideParseException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from smallinit.core.errors import ConfigError, first_line


@dataclass(frozen=True)
class Choices:
    """A discrete sweep: the override strings to pass to Hydra and the values to record."""

    strings: tuple[str, ...]
    values: tuple[Any, ...]


@dataclass
class SweepSpace:
    fixed: list[str] = field(default_factory=list)  # plain overrides, passed to every trial
    discrete: dict[str, Choices] = field(default_factory=dict)
    intervals: dict[str, BaseDistribution] = field(default_factory=dict)
    # The grid's points when they are not every combination (a round of the select-then-
    # confirm protocol: each setting at its own values); None = the full product.
    points: list[dict[str, Any]] | None = None

    @property
    def mode(self) -> str:
        return "search" if self.intervals else "grid"

    @property
    def swept_keys(self) -> list[str]:
        return [*self.discrete, *self.intervals]

    def grid(self) -> list[dict[str, Any]]:
        """Every combination of the discrete sweeps, as {key: value}, in command-line order."""
        if self.points is not None:
            return [dict(p) for p in self.points]
        keys = list(self.discrete)
        combos = itertools.product(*(range(len(self.discrete[k].values)) for k in keys))
        return [{k: self.discrete[k].values[i] for k, i in zip(keys, combo)} for combo in combos]

    def distributions(self) -> dict[str, BaseDistribution]:
        """The Optuna search space: intervals, plus discrete sweeps as categoricals."""
        cats = {k: CategoricalDistribution(list(c.values)) for k, c in self.discrete.items()}
        return {**cats, **self.intervals}

    def grid_distributions(self) -> dict[str, BaseDistribution]:
        """How a grid's points are recorded in the study. Nothing samples them, so numbers are
        recorded as ranges: Optuna lets a range change between trials but not a categorical's
        choices, and a grid that grows later (more seeds, one more gamma) must still fit."""
        return {k: _recorded_range(c.values) for k, c in self.discrete.items()}

    def override_string(self, key: str, value: Any) -> str:
        """The Hydra override that sets key to one of its swept values."""
        if key in self.discrete:
            choices = self.discrete[key]
            return f"{key}={choices.strings[choices.values.index(value)]}"
        return f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"

    def overrides_for(self, params: dict[str, Any]) -> list[str]:
        return [*self.fixed, *(self.override_string(k, v) for k, v in params.items())]


LOG_SPAN = 10.0


def _recorded_range(values: tuple[Any, ...]) -> BaseDistribution:
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(numbers) < len(values):
        return CategoricalDistribution(list(values))
    if all(isinstance(v, int) for v in numbers):
        return IntDistribution(min(numbers), max(numbers))
    low, high = float(min(numbers)), float(max(numbers))
    # Values a decade or more apart (eps 1e-12..1e-5, lr 1e-3..3e-2) are a log-scale axis:
    # recorded as one, dashboards and importance plots space them evenly.
    return FloatDistribution(low, high, log=low > 0 and high >= LOG_SPAN * low)


def _interval(override: Override, sweep: IntervalSweep) -> BaseDistribution:
    key = override.get_key_element()
    if sweep.start is None or sweep.end is None or not sweep.start < sweep.end:
        raise ConfigError(f"{key}=interval({sweep.start}, {sweep.end}) is invalid: needs start < end")
    log = "log" in sweep.tags
    if log and sweep.start <= 0:
        raise ConfigError(f"{key}={override.input_line} is invalid: a log interval needs start > 0")
    # As in Hydra's Optuna plugin: interval() is continuous unless tagged int.
    if "int" in sweep.tags:
        return IntDistribution(int(sweep.start), int(sweep.end), log=log)
    return FloatDistribution(float(sweep.start), float(sweep.end), log=log)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


# A grid larger than this is refused with its size before it is expanded: range(0,100000000)
# would otherwise build a hundred million overrides before anything is printed.
GRID_LIMIT = 100_000


def _range_length(sweep: RangeSweep) -> int:
    step = sweep.step if sweep.step is not None else 1
    if not step or sweep.start is None or sweep.stop is None:
        return 0
    return max(0, math.ceil((sweep.stop - sweep.start) / step))


def _discrete(override: Override) -> Choices:
    key = override.get_key_element()
    strings = tuple(override.sweep_string_iterator())
    values = tuple(override.sweep_iterator())
    if not values:
        raise ConfigError(f"{override.input_line} is invalid: the sweep of {key} has no values")
    if len(set(map(repr, values))) != len(values):
        raise ConfigError(f"{override.input_line} is invalid: {key} lists a value twice")
    first_of: dict[float, Any] = {}  # 1 and 1.0: two strings, one number, one trial
    for b in values:
        if _is_number(b):
            a = first_of.setdefault(b, b)
            if a is not b:
                raise ConfigError(f"{override.input_line} is invalid: {key} lists {a!r} and {b!r}, one value; give it once")
    return Choices(strings, values)


def _refuse_a_sweep_given_twice(arguments: list[str], parser: OverridesParser) -> None:
    """A key given twice where either is a sweep: Hydra keeps the last, silently dropping the
    other's values. A plain key given twice keeps Hydra's rule (the last wins), which is how a
    Makefile's default and the user's override combine."""
    seen: dict[str, str] = {}
    for line in arguments:
        key = line.split("=", 1)[0].lstrip("+~")
        if key in seen and any(_is_sweep(x, parser) for x in (seen[key], line)):
            raise ConfigError(f"{key} is given twice ({seen[key]} and {line}): give a swept key once, with all its values")
        seen[key] = line


def _is_sweep(line: str, parser: OverridesParser) -> bool:
    try:
        return parser.parse_overrides([line])[0].is_sweep_override()
    except OverrideParseException:
        return False  # named with the grammar when parse_sweep reaches it


def parse_sweep(arguments: list[str], params: dict[str, str] | None = None) -> SweepSpace:
    """Parse command-line overrides (and hydra.sweeper.params, which the command line
    overrides key by key) into a SweepSpace. Raises ConfigError on malformed syntax."""
    lines = [f"{k}={v}" for k, v in (params or {}).items()]
    parser = OverridesParser.create()
    _refuse_a_sweep_given_twice(arguments, parser)
    given = {line.split("=", 1)[0].lstrip("+~") for line in arguments}
    lines = [line for line in lines if line.split("=", 1)[0] not in given] + list(arguments)
    parsed = [(line, _parse(line, parser)) for line in lines]
    _refuse_a_grid_past_the_limit([o for _, o in parsed])
    space = SweepSpace()
    for line, override in parsed:
        key = override.get_key_element()
        if not override.is_sweep_override():
            space.fixed.append(line)
        elif isinstance(override.value(), IntervalSweep):
            space.intervals[key] = _interval(override, override.value())
        elif isinstance(override.value(), ChoiceSweep | RangeSweep) or override.is_sweep_override():
            space.discrete[key] = _discrete(override)
    return space


def _parse(line: str, parser: OverridesParser) -> Override:
    try:
        (override,) = parser.parse_overrides([line])
    except OverrideParseException as e:
        from .precheck import GRAMMAR

        raise ConfigError(f"{line} is invalid: {first_line(e)} ({GRAMMAR})") from None
    return override


def _refuse_a_grid_past_the_limit(overrides: list[Override]) -> None:
    """Counted from each sweep's bounds, before any value list is built."""
    sizes = {o.get_key_element(): _range_length(o.value()) if isinstance(o.value(), RangeSweep) else len(o.value().list)
             for o in overrides if isinstance(o.value(), ChoiceSweep | RangeSweep)}
    points = math.prod(sizes.values())
    if points > GRID_LIMIT and not any(isinstance(o.value(), IntervalSweep) for o in overrides):
        raise ConfigError(f"the grid {' x '.join(f'{k} ({n:,})' for k, n in sizes.items())} has {points:,} points, "
                          f"more than a sweep may hold ({GRID_LIMIT:,}): sweep fewer values")
