"""Where small init starts to pay: the recipe-minus-baseline gap over (width, token budget).

Per seed s (pass the confirm seeds' rows only), gap_s(d, D) = L_recipe - L_baseline at every
(width, budget) cell both arms ran, fitted by least squares to b0 + b1 ln d + b2 ln D, plus
b3 ln d ln D where the data support it (>= 3 widths and >= 3 budgets). d*(D) is where the mean
of the seeds' fits is 0 at budget D; D*(d) where it is 0 at width d. The interval is the set
where the seeds' fitted gaps have a 95% t-interval holding 0 (Fieller's construction, as in
experiments/claims/width.py), searched over WIDTH_RANGE / BUDGET_RANGE; None = unbounded.

An endpoint beyond the measured range is an extrapolation of the surface and is dropped (the
interval becomes one-sided); an interval wholly beyond it becomes the bound at the measured edge
("d* > 384": at 384 the gap is already significantly away from 0). paying_budget() gives the
budget at which small init would pay at any width (the 0.1B preset's, say) from the surface as
fitted, unclipped and flagged as an extrapolation where it is one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats as sps

from smallinit.model.config import ModelConfig

from .effective_size import LOSS, EffectiveSize, Law, cell_seeds, json_float

WIDTH_RANGE, BUDGET_RANGE = (8.0, 1e6), (1e4, 1e13)
GRID_POINTS = 4001
COEF_NAMES = ("b0", "b1 (ln d)", "b2 (ln D)", "b3 (ln d ln D)")
# A saddle offset |r| below this (nats) puts the fitted zero set on the saddle's two lines, for
# every practical purpose: CPU-record gaps are tenths of a nat (Crossover.saddle).
SADDLE_NEAR_NATS = 0.01
CONF_MODEL = Path(__file__).resolve().parents[2] / "conf" / "model"


@dataclass
class Crossing:
    at: float  # the budget of a d*(D), the width of a D*(d)
    point: float | None  # None: the mean fit does not reach 0 in the search range
    lo: float | None  # None: unbounded (or beyond the measured range)
    hi: float | None
    pays: str  # where the mean gap < 0: "above"/"below" the crossing, "everywhere", "nowhere"
    extrapolated: bool = False
    note: str = ""

    @property
    def kind(self) -> str:
        if self.point is None:
            return "no crossing"
        return {(True, True): "two-sided", (True, False): "lower bound", (False, True): "upper bound",
                (False, False): "unbounded"}[(self.lo is not None, self.hi is not None)]

    def as_dict(self) -> dict:
        return dict(point=json_float(self.point), lo=json_float(self.lo), hi=json_float(self.hi), kind=self.kind,
                    pays=self.pays, extrapolated=self.extrapolated, note=self.note)


@dataclass
class Crossover:
    status: str  # "fit" or why there is none
    interaction: bool = False
    seeds: list[str] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    budgets: list[float] = field(default_factory=list)
    coefs: np.ndarray = field(default_factory=lambda: np.empty((0, 3)))  # (seeds, 3 or 4)
    d_star: list[Crossing] = field(default_factory=list)  # one per measured budget
    budget_star: list[Crossing] = field(default_factory=list)  # one per measured width

    def saddle(self) -> dict | None:
        """With the interaction term the seeds' mean fit is b3·ln(d/d0)·ln(D/D0) + r, d0 =
        exp(-b2/b3), D0 = exp(-b1/b3), r = b0 - b1·b2/b3: its zero set is a hyperbola about the
        lines d = d0 and D = D0, on them when r = 0. Then every d*(D) sits near d0 and every D*(d)
        near D0 by the form of the fit (D*(d) = D0·exp(-r / (b3·ln(d/d0)))), not by measurement."""
        if not self.interaction or not len(self.coefs):
            return None
        b0, b1, b2, b3 = (float(v) for v in self.coefs.mean(0))
        if b3 == 0 or max(abs(b1 / b3), abs(b2 / b3)) > 700:  # a saddle at no representable width or budget
            return None
        r = b0 - b1 * b2 / b3
        return dict(d_model=json_float(math.exp(-b2 / b3)), budget_tokens=json_float(math.exp(-b1 / b3)),
                    offset_nats=json_float(r), near_lines=abs(r) < SADDLE_NEAR_NATS)

    def as_dict(self) -> dict:
        names = COEF_NAMES[: self.coefs.shape[1]]
        return dict(
            status=self.status, model=" + ".join(names), interaction=self.interaction, seeds=self.seeds,
            widths=self.widths, budgets=[json_float(b) for b in self.budgets],
            coefs_mean={n: json_float(v) for n, v in zip(names, self.coefs.mean(0))} if len(self.coefs) else {},
            saddle=self.saddle(),
            d_star=[dict(budget_tokens=json_float(c.at), **c.as_dict()) for c in self.d_star],
            budget_star=[dict(d_model=int(c.at), **c.as_dict()) for c in self.budget_star])


def saddle_text(saddle: dict | None) -> str:
    """One sentence on the fitted surface's saddle (Crossover.saddle), or ""."""
    if not saddle or saddle["offset_nats"] is None:
        return ""
    text = (f"The mean fit is b3·ln(d/d0)·ln(D/D0) + r with d0 = {saddle['d_model']:.3g}, "
            f"D0 = {saddle['budget_tokens']:.3g} tokens, r = {saddle['offset_nats']:+.4f} nats")
    if saddle["near_lines"]:
        return (text + f": with |r| below {SADDLE_NEAR_NATS:g} nats its zero set runs along d = d0 and D = D0, so "
                "every d*(D) is near d0 and every D*(d) near D0 by the form of the fit, not as separate measurements.")
    return text + "."


def crossover(baseline: pd.DataFrame, recipe: pd.DataFrame, metric: str = LOSS) -> Crossover:
    base, rec = cell_seeds(baseline, metric), cell_seeds(recipe, metric)
    keys = sorted(set(base) & set(rec))
    shared = {k: set(base[k].index) & set(rec[k].index) for k in keys}
    seeds = sorted(set.intersection(*shared.values())) if keys else []
    widths, budgets = sorted({k[0] for k in keys}), sorted({k[2] for k in keys})
    if len(widths) < 2 or len(budgets) < 2:
        return Crossover(f"needs both arms at >= 2 widths and >= 2 budgets; have {len(widths)} widths, "
                         f"{len(budgets)} budgets", widths=widths, budgets=budgets)
    if len(seeds) < 2:
        return Crossover(f"needs >= 2 seeds with both arms at every cell (have {len(seeds)}): no interval",
                         widths=widths, budgets=budgets)
    interaction = len(widths) >= 3 and len(budgets) >= 3
    ln_d, ln_b = np.log([k[0] for k in keys]), np.log([k[2] for k in keys])
    x = np.column_stack([np.ones_like(ln_d), ln_d, ln_b, *([ln_d * ln_b] if interaction else [])])
    gaps = np.array([[rec[k][s] - base[k][s] for s in seeds] for k in keys])  # (cells, seeds)
    coefs = np.linalg.lstsq(x, gaps, rcond=None)[0].T  # (seeds, p)
    co = Crossover("fit", interaction, [str(s) for s in seeds], widths, budgets, coefs)
    co.d_star = [_measured(_crossing(coefs, b, "width"), widths) for b in budgets]
    co.budget_star = [_measured(_crossing(coefs, d, "budget"), budgets) for d in widths]
    return co


def _crossing(coefs: np.ndarray, fixed: float, axis: str) -> Crossing:
    """The zero of the gap along `axis` ("width" or "budget") with the other held at `fixed`."""
    lf = math.log(fixed)
    b3 = coefs[:, 3] if coefs.shape[1] == 4 else 0.0
    if axis == "width":
        c0, c1, rng = coefs[:, 0] + coefs[:, 2] * lf, coefs[:, 1] + b3 * lf, WIDTH_RANGE
    else:
        c0, c1, rng = coefs[:, 0] + coefs[:, 1] * lf, coefs[:, 2] + b3 * lf, BUDGET_RANGE
    z = np.linspace(math.log(rng[0]), math.log(rng[1]), GRID_POINTS)
    g = c0[:, None] + c1[:, None] * z  # (seeds, grid): each seed's fitted gap along the axis
    mean, se = g.mean(0), g.std(0, ddof=1) / math.sqrt(len(c0))
    holds = np.abs(mean) <= sps.t.ppf(0.975, len(c0) - 1) * se
    m0, m1 = float(c0.mean()), float(c1.mean())
    root = -m0 / m1 if m1 != 0 else math.nan
    if not z[0] <= root <= z[-1]:
        pays = "everywhere" if mean[GRID_POINTS // 2] < 0 else "nowhere"
        return Crossing(fixed, None, None, None, pays,
                        note=f"the mean fit does not reach 0 between {rng[0]:g} and {rng[1]:g}")
    i = int(np.clip(np.searchsorted(z, root), 0, GRID_POINTS - 1))
    pays = "above" if m1 < 0 else "below"
    if not holds[i]:  # seeds agree exactly: a point interval
        return Crossing(fixed, math.exp(root), math.exp(root), math.exp(root), pays)
    out = np.flatnonzero(~holds)
    j0 = int(out[out < i].max()) + 1 if (out < i).any() else 0
    j1 = int(out[out > i].min()) - 1 if (out > i).any() else GRID_POINTS - 1
    lo = None if j0 == 0 else math.exp(z[j0])
    hi = None if j1 == GRID_POINTS - 1 else math.exp(z[j1])
    pieces = holds[:j0].any() or holds[j1 + 1:].any()
    return Crossing(fixed, math.exp(root), lo, hi, pays,
                    note="the 95% set has further pieces beyond this interval" if pieces else "")


def _measured(c: Crossing, measured: list[float]) -> Crossing:
    """Keep only what the measured range supports (module docstring)."""
    if c.point is None:
        return c
    lo_m, hi_m = min(measured), max(measured)
    lo, hi = c.lo, c.hi
    if lo is not None:
        lo = hi_m if lo > hi_m else None if lo < lo_m else lo
    if hi is not None:
        hi = lo_m if hi < lo_m else None if hi > hi_m else hi
    c.extrapolated = not lo_m <= c.point <= hi_m
    if (lo, hi) != (c.lo, c.hi):
        c.note = "; ".join(filter(None, [c.note, f"interval cut to the measured range {lo_m:g}-{hi_m:g}"]))
    c.lo, c.hi = lo, hi
    return c


def paying_budget(co: Crossover, d_model: int) -> Crossing:
    """D*(d) at any width from the fitted surface, interval unclipped; extrapolated when the
    width or the budget lies outside the measured cells."""
    if co.status != "fit":
        raise ValueError(f"no crossover surface to read: {co.status}")
    c = _crossing(co.coefs, float(d_model), "budget")
    outside = []
    if not min(co.widths) <= d_model <= max(co.widths):
        outside.append(f"width {d_model} is outside the measured {min(co.widths)}-{max(co.widths)}")
    if c.point is not None and not min(co.budgets) <= c.point <= max(co.budgets):
        outside.append(f"budget {c.point:.3g} is outside the measured {min(co.budgets):g}-{max(co.budgets):g}")
    c.extrapolated = bool(outside)
    c.note = "; ".join(filter(None, [c.note, *(f"extrapolation: {o}" for o in outside)]))
    return c


def preset_width(name: str = "0.1b") -> int:
    """d_model of a model preset, as conf/model/<name>.yaml resolves it (an override, else the
    preset's own in model/config.py)."""
    path = CONF_MODEL / f"{name}.yaml"
    if not path.exists():
        have = sorted(p.stem for p in CONF_MODEL.glob("*.yaml") if not p.stem.startswith("_"))
        raise ValueError(f"model preset {name!r} has no conf/model/{name}.yaml: one of {have}")
    conf = yaml.safe_load(path.read_text()) or {}
    return int(conf.get("d_model") or ModelConfig.preset(conf.get("preset", name)).d_model)


# The summary's blocks here rather than in effective_size.py: they read a Crossover too, and this
# module imports that one.
def summary_dict(es: EffectiveSize, co: Crossover | None = None, preset: str | None = None,
                 pays_at: Crossing | None = None) -> dict:
    """The `effective_size` and `crossover` blocks of summary.json (JSON-able: inf/nan -> None);
    pays_at: crossover.paying_budget(co, preset_width(preset)), shown under `pays_at_preset`."""
    def law(f: Law | None):
        return {k: json_float(v) for k, v in f.params().items()} if f else None

    block = dict(status=es.status, reasons=es.reasons, n="non-embedding parameters", baseline_cells=es.baseline_cells,
                 fit=law(es.fit), fit_total_n=law(es.fit_total), n_boot=es.n_boot, interval="seed bootstrap, 95% percentile",
                 null="an unbounded value or interval end (see reasons), or no bootstrap (n_boot 0)",
                 compute="6 (N + d V) + 12 L d T per token, at the recipe's budget D", cells=[
                     dict(d_model=c.d_model, n_layers=c.n_layers, budget_tokens=json_float(c.budget_tokens),
                          n_nonembed=json_float(c.n_nonembed), loss=json_float(c.loss), seeds=c.seeds,
                          n_eff_ratio=json_float(c.n_eff_ratio), n_eff_ratio_ci=[json_float(v) for v in c.n_eff_ratio_ci],
                          compute_multiplier=json_float(c.compute_multiplier),
                          compute_multiplier_ci=[json_float(v) for v in c.compute_multiplier_ci],
                          n_eff_ratio_total_n=json_float(c.n_eff_ratio_total),
                          p_not_smaller=json_float(c.p_not_smaller), p_not_larger=json_float(c.p_not_larger))
                     for c in es.cells])
    out = dict(effective_size=block)
    if co is not None:
        out["crossover"] = co.as_dict()
        if pays_at is not None:
            out["crossover"]["pays_at_preset"] = dict(preset=preset, d_model=int(pays_at.at), **pays_at.as_dict())
    return out
