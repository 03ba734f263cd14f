"""Select, then confirm: each setting's tuned values are chosen on tuning seeds, and the
comparison between settings runs on other (confirm) seeds.

    python sweep.py -m arm=baseline,small optim.lr=1e-3,3e-3,1e-2 \\
        'hydra.sweeper.protocol.tune=[optim.lr]' \\
        'hydra.sweeper.protocol.tune_seeds=[100]' \\
        'hydra.sweeper.protocol.confirm_seeds=[1,2,3,4]'

Tune rounds: every setting (a combination of the swept keys that are not tuned) runs every
value of the tuned keys on the tuning seeds. A setting's choice is the combination with the
lowest mean validation loss over the tuning seeds, among those where every seed completed.
A choice at an edge of the values tried adds one value past that edge (the ratio of the two
values at that edge: 1e-3, 3e-3, 1e-2 extends to 3.33e-2 above and 3.33e-4 below), at most
`max_extensions` a side, and the choice is made again. Confirm round: every setting at its
chosen values on the confirm seeds.

With per_budget (trials with train.budgets), every budget makes its own choice from its cooldown
branch on the tuning seeds, a choice at an edge for any budget extends that edge, and the
confirm round runs each value some budget chose; a budget's comparison then reads each
confirm run's branch at that budget. With confirm_to_chosen, a confirm run ends at the largest
budget that chose its value (train.stop_after): the branches it trains are the whole run's, step
for step, and nothing past them is trained.

Choosing on the seeds that are then compared flatters the arm with the noisier lr curve;
choosing on separate seeds does not (the reason for the two roles).

Nothing here is state: every round is recomputed from what the study holds, so rerunning the
same command after a kill (between rounds or inside one) skips what finished and trains
nothing twice. Pure functions; the driver (core.py) runs the rounds.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smallinit.core.errors import ConfigError

from .config import ProtocolConf
from .space import Choices, SweepSpace

RECORD = "protocol.json"  # in the sweep folder: the roles and every setting's choice
TUNE, CONFIRM = "tune", "confirm"
PENDING = object()  # a trial that has not ended: its round is not done
STOP_KEY = "train.stop_after"  # where a confirm run ends with confirm_to_chosen (trainer/config.py)


def check(conf: ProtocolConf, space: SweepSpace, asha: bool) -> None:
    """One line naming the key, the value and what is allowed; before anything is written."""
    p = "hydra.sweeper.protocol"
    if not conf.tune:
        raise ConfigError(f"{p}.tune={conf.tune!r} is invalid: name the keys chosen on the tuning seeds, e.g. [optim.lr]")
    for name in ("tune_seeds", "confirm_seeds"):
        seeds = getattr(conf, name)
        if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise ConfigError(f"{p}.{name}={seeds!r} is invalid: must be a non-empty list of integers")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{p}.{name}={seeds!r} is invalid: it lists a seed twice")
    both = sorted(set(conf.tune_seeds) & set(conf.confirm_seeds))
    if both:
        raise ConfigError(f"{p}.confirm_seeds={conf.confirm_seeds!r} is invalid: {both} also tune; a seed has one role")
    if not (isinstance(conf.max_extensions, int) and conf.max_extensions >= 0):
        raise ConfigError(f"{p}.max_extensions={conf.max_extensions!r} is invalid: must be an integer >= 0")
    if space.intervals:
        raise ConfigError(f"{p}.tune is invalid with the interval(s) {list(space.intervals)}: the protocol runs a grid")
    if conf.seed_key in space.swept_keys:
        raise ConfigError(f"{conf.seed_key}={','.join(space.discrete[conf.seed_key].strings)} is invalid with "
                          f"{p}: the seeds come from {p}.tune_seeds and {p}.confirm_seeds; drop {conf.seed_key} from the sweep")
    if conf.confirm_to_chosen and not conf.per_budget:
        raise ConfigError(f"{p}.confirm_to_chosen=true is invalid without {p}.per_budget=true: a confirm run ends at "
                          "the largest budget that chose its values, so the budgets must choose")
    if conf.confirm_to_chosen and STOP_KEY in space.swept_keys:
        raise ConfigError(f"{STOP_KEY}={','.join(space.discrete[STOP_KEY].strings)} is invalid with "
                          f"{p}.confirm_to_chosen=true: the protocol sets where each confirm run ends")
    if asha:
        raise ConfigError(f"hydra.sweeper.asha.enabled=true is invalid with {p}: the choice is made from complete "
                          "tuning trials, and ASHA would stop some of them")
    for key in conf.tune:
        choices = space.discrete.get(key)
        single = [o for o in space.fixed if o.split("=", 1)[0].lstrip("+~") == key]
        if choices is None and single:
            raise ConfigError(f"{single[0]} is invalid as a tuned key: needs at least 2 positive numbers to choose from")
        if choices is None:
            raise ConfigError(f"{p}.tune names {key}, which the sweep does not sweep: give its values, e.g. {key}=1e-3,3e-3,1e-2")
        if len(choices.values) < 2 or not all(_is_number(v) and v > 0 for v in choices.values):
            raise ConfigError(f"{key}={','.join(choices.strings)} is invalid as a tuned key: needs at least 2 "
                              "positive numbers (the edge extension steps by their ratio)")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def settings(conf: ProtocolConf, space: SweepSpace) -> list[dict[str, Any]]:
    """Every combination of the swept keys that are not tuned, in command-line order."""
    rest = SweepSpace(discrete={k: c for k, c in space.discrete.items() if k not in conf.tune})
    return rest.grid()


def step_past(values: list[float], side: str) -> float:
    """One value past the low or high edge of `values`, at the ratio of the two edge values."""
    v = sorted(values)
    edge, inner = (v[0], v[1]) if side == "low" else (v[-1], v[-2])
    out = edge * (edge / inner)
    if all(isinstance(x, int) for x in v):
        out = int(round(out))
        out = out if out != edge else edge + (edge - inner)
        return max(out, 1)
    return float(f"{out:.6g}")  # 3.3333333e-2 recorded as 0.0333333


@dataclass
class Choice:
    """One setting's tuning outcome."""

    setting: dict[str, Any]
    tried: dict[str, list[Any]]  # per tuned key, every value run on the tuning seeds (sorted)
    means: list[tuple[dict[str, Any], float]]  # each combination where every tuning seed completed
    chosen: dict[str, Any] | None  # None: no combination completed on every tuning seed
    at_edge: list[str]  # tuned keys whose choice is still at an edge after the extensions ran out
    extensions: int
    # per_budget: each budget's (tokens) choice and means; `chosen`/`means` are the largest budget's.
    by_budget: dict[int, dict[str, Any]] | None = None
    budget_means: dict[int, list[tuple[dict[str, Any], float]]] | None = None

    def confirm_combos(self, to_chosen: bool = False) -> list[dict[str, Any]]:
        """The values the confirm seeds run at: the choice, or every budget's (each once); with
        to_chosen, each with the largest budget that chose it as its train.stop_after."""
        if self.by_budget is None:
            return [] if self.chosen is None else [self.chosen]
        out: list[dict[str, Any]] = []
        for combo in self.by_budget.values():
            if combo not in out:
                out.append(combo)
        if not to_chosen:
            return out
        return [{**c, STOP_KEY: max(b for b, chosen in self.by_budget.items() if chosen == c)} for c in out]

    def to_dict(self) -> dict[str, Any]:
        out = {"setting": self.setting, "chosen": self.chosen, "at_edge": self.at_edge, "tried": self.tried,
               "extensions": self.extensions,
               "tune_means": [{"values": combo, "mean_val_loss": mean} for combo, mean in self.means]}
        if self.by_budget is not None:
            out["chosen_by_budget"] = [{"budget_tokens": b, "chosen": combo} for b, combo in self.by_budget.items()]
            out["tune_means_by_budget"] = [{"budget_tokens": b, "values": combo, "mean_val_loss": mean}
                                           for b, ms in (self.budget_means or {}).items() for combo, mean in ms]
        return out


# params -> final loss, None (ended without one), or PENDING; with per_budget, params -> {budget
# tokens: loss or None} once the trial ended (its branches' losses), or PENDING.
Outcome = Callable[[dict[str, Any]], Any]


def settle(conf: ProtocolConf, setting: dict[str, Any], initial: dict[str, list[Any]],
           outcome: Outcome) -> tuple[list[dict[str, Any]], Choice | None]:
    """(tuning points still to run, None) while the setting's tuning is unfinished, else
    ([], its Choice). Replays the extensions from the outcomes, so it is the same on a rerun.
    With per_budget every budget chooses on its own, and a choice at an edge for any budget
    extends that edge."""
    tried = {k: sorted(v) for k, v in initial.items()}
    used = {(k, side): 0 for k in tried for side in ("low", "high")}
    while True:
        combos = [dict(zip(tried, vals)) for vals in itertools.product(*tried.values())]
        points = [{**setting, **combo, conf.seed_key: s} for combo in combos for s in conf.tune_seeds]
        todo = [p for p in points if outcome(p) is PENDING]
        if todo:
            return todo, None
        means = _means_by_budget(conf, setting, combos, outcome)
        extensions = sum(used.values())
        largest = max(means, key=lambda b: -1 if b is None else b)
        if not means[largest]:
            return [], Choice(setting, tried, [], None, [], extensions, *_per_budget(conf, means, {}))
        best = {b: min(ms, key=lambda cm: cm[1])[0] for b, ms in means.items() if ms}
        grew, at_edge = False, []
        for key, values in tried.items():
            sides = {"low" if c[key] == values[0] else "high" if c[key] == values[-1] else None for c in best.values()}
            for side in sorted(sides - {None}):
                if used[key, side] < conf.max_extensions:
                    tried[key] = sorted([*tried[key], step_past(tried[key], side)])
                    used[key, side] += 1
                    grew = True
                elif key not in at_edge:
                    at_edge.append(key)
        if not grew:
            return [], Choice(setting, tried, means[largest], best[largest], at_edge, extensions,
                              *_per_budget(conf, means, best))


def _means_by_budget(conf: ProtocolConf, setting: dict[str, Any], combos: list[dict[str, Any]],
                     outcome: Outcome) -> dict[int | None, list[tuple[dict[str, Any], float]]]:
    """Per budget (None without per_budget), each combination's mean over the tuning seeds,
    where every seed completed that budget."""
    per_seed = {tuple(combo.items()): [outcome({**setting, **combo, conf.seed_key: s}) for s in conf.tune_seeds]
                for combo in combos}
    if conf.per_budget:
        budgets = sorted({b for losses in per_seed.values() for x in losses if isinstance(x, dict) for b in x})
        at = {b: lambda x, b=b: x.get(b) if isinstance(x, dict) else None for b in budgets} or {None: lambda x: None}
    else:
        at = {None: lambda x: x}
    means: dict[int | None, list[tuple[dict[str, Any], float]]] = {}
    for b, read in at.items():
        means[b] = []
        for combo in combos:
            losses = [read(x) for x in per_seed[tuple(combo.items())]]
            if all(x is not None and math.isfinite(x) for x in losses):
                means[b].append((combo, sum(losses) / len(losses)))
    return means


def _per_budget(conf: ProtocolConf, means, best) -> tuple[dict | None, dict | None]:
    if not conf.per_budget:
        return None, None
    return ({b: c for b, c in best.items() if b is not None},
            {b: ms for b, ms in means.items() if b is not None})


def confirm_points(conf: ProtocolConf, choices: list[Choice]) -> list[dict[str, Any]]:
    return [{**c.setting, **combo, conf.seed_key: s} for c in choices
            for combo in c.confirm_combos(conf.per_budget and conf.confirm_to_chosen) for s in conf.confirm_seeds]


def round_space(base: SweepSpace, points: list[dict[str, Any]]) -> SweepSpace:
    """A grid space whose grid is exactly `points`. Each key's values are the base sweep's
    (with their override strings) plus the points' own, so every round records a key on the
    same scale in the study (Optuna refuses a key recorded on a log axis, then a linear one)."""
    discrete: dict[str, Choices] = {}
    for key in points[0]:
        given = base.discrete.get(key, Choices((), ()))
        new = [v for v in dict.fromkeys(p[key] for p in points) if v not in given.values]
        discrete[key] = Choices((*given.strings, *map(str, new)), (*given.values, *new))
    return SweepSpace(fixed=list(base.fixed), discrete=discrete, points=list(points))


def role_of(seed: Any, record: dict[str, Any]) -> str | None:
    if seed in record.get("tune_seeds", []):
        return TUNE
    if seed in record.get("confirm_seeds", []):
        return CONFIRM
    return None


def record(conf: ProtocolConf, choices: list[Choice], before: dict[str, Any] | None = None) -> dict[str, Any]:
    """What protocol.json and the study's `protocol` attribute hold. A folder grown by another
    command (one more arm, more confirm seeds) keeps the choices of settings this one did not run."""
    mine = {_setting_key(c.setting): c.to_dict() for c in choices}
    kept = [c for c in (before or {}).get("choices", []) if _setting_key(c["setting"]) not in mine]
    confirm = list(dict.fromkeys([*(before or {}).get("confirm_seeds", []), *conf.confirm_seeds]))
    return {"tune": list(conf.tune), "seed_key": conf.seed_key, "tune_seeds": list(conf.tune_seeds),
            "confirm_seeds": confirm, "max_extensions": conf.max_extensions, "per_budget": conf.per_budget,
            "confirm_to_chosen": conf.confirm_to_chosen,
            "choices": [*kept, *mine.values()]}


def _setting_key(setting: dict[str, Any]) -> str:
    return json.dumps(setting, sort_keys=True, default=str)


def check_record(conf: ProtocolConf, before: dict[str, Any] | None) -> None:
    """A folder's choices were made one way: a later command must tune the same keys on the
    same seeds, or use its own folder. Before any trial."""
    if before is None:
        return
    p = "hydra.sweeper.protocol"
    # Records from before per_budget chose on the largest budget, and ran every confirm run whole.
    before = {"per_budget": False, "confirm_to_chosen": False, **before}
    for name in ("tune", "tune_seeds", "seed_key", "per_budget", "confirm_to_chosen"):
        mine = getattr(conf, name)
        if before.get(name) != (list(mine) if isinstance(mine, list | tuple) else mine):
            raise ConfigError(f"{p}.{name}={getattr(conf, name)!r} is invalid for this folder: its {RECORD} chose with "
                              f"{name}={before.get(name)!r}; keep that or use a new name=...")


def describe_plan(conf: ProtocolConf, space: SweepSpace) -> list[str]:
    """The two stages as `--show` prints them (the chosen values are not known before stage 1)."""
    setts = settings(conf, space)
    grid = {k: space.discrete[k].values for k in conf.tune}
    n_combos = math.prod(len(v) for v in grid.values())
    n_tune = len(setts) * n_combos * len(conf.tune_seeds)
    most = len(setts) * math.prod(len(v) + 2 * conf.max_extensions for v in grid.values()) * len(conf.tune_seeds)
    n_confirm = len(setts) * len(conf.confirm_seeds)
    per_budget = " (per_budget: once per distinct value the budgets choose)" if conf.per_budget else ""
    if conf.per_budget and conf.confirm_to_chosen:
        per_budget = per_budget[:-1] + ", each to the largest budget that chose it)"
    tuned = " ".join(f"{k}={','.join(map(str, v))}" for k, v in grid.items())
    return [
        f"# stage 1 (tune): {len(setts)} setting(s) x {tuned} x {conf.seed_key} in {conf.tune_seeds} = {n_tune} trials; "
        f"a choice at an edge adds a value past it (up to {conf.max_extensions} a side: at most {most} trials)",
        f"# stage 2 (confirm): {len(setts)} setting(s) at the value(s) stage 1 chooses x {conf.seed_key} in "
        f"{conf.confirm_seeds} = {n_confirm} trials{per_budget}",
    ]
