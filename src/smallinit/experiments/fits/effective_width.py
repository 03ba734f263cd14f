"""The recipe's effective size read off the baseline's measured widths, not a fitted law.

The baseline is trained at several widths (same depth, protocol and budget); its loss against
ln N (N = non-embedding parameters) is joined through the points. The recipe's loss at width d is
placed on that curve (a monotone cubic through the points, PCHIP, in ln N): N_eff is where the baseline would reach it, and N_eff / N says how much
larger a baseline the recipe is worth. No power law is assumed, so nothing depends on where an
irreducible loss E sits (the fitted L(N, D) of scaling_law moved N_eff/N by orders of magnitude
with E). Beyond the measured widths there is no number, only a bound: a recipe below the widest
baseline is worth more than that width, one above the narrowest less than it.

Per confirm seed (the arms share seeds), the same reading gives ln(N_eff/N)_s; the interval is
the t-interval of those when every seed's is bounded, else the record says how many were.

A bound comes from the seed means, so it also says how far the recipe sits past the edge width,
paired by seed with its t-interval, and where the interval's far end reads on the curve: a recipe
a hair below the widest baseline, inside the seeds' spread, is worth "about that width", and the
far end gives the N_eff/N the data still guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.interpolate import PchipInterpolator
from scipy.optimize import brentq

from smallinit.experiments.stats.paired import t_interval, t_pvalues


@dataclass
class Reading:
    kind: str  # "inside" | "above" (N_eff > the widest measured) | "below" (< the narrowest)
    log_ratio: float  # ln(N_eff / N) inside, else the bound's ln ratio
    n_eff: float  # parameters (the bound where kind is not inside)


def read_off(log_n: np.ndarray, loss: np.ndarray, target: float, log_n_self: float) -> Reading:
    """Where the baseline curve loss(ln N) reaches `target`. The curve is made
    non-increasing first (a wider baseline is never credited with a higher loss than a narrower
    one: a bump from seed noise would give two crossings)."""
    order = np.argsort(log_n)
    x, y = np.asarray(log_n, float)[order], np.minimum.accumulate(np.asarray(loss, float)[order])
    if target < y[-1]:
        return Reading("above", x[-1] - log_n_self, math.exp(x[-1]))
    if target > y[0]:
        return Reading("below", x[0] - log_n_self, math.exp(x[0]))
    if len(x) == 2 or y[0] == y[-1]:
        f = 0.0 if y[0] == y[-1] else (y[0] - target) / (y[0] - y[-1])
        ln = x[0] + f * (x[-1] - x[0])
    else:  # monotone cubic through the points: follows a convex curve closer than straight segments
        curve = PchipInterpolator(x, y)
        ln = brentq(lambda v: float(curve(v)) - target, x[0], x[-1]) if y[0] != target else x[0]
    return Reading("inside", ln - log_n_self, math.exp(ln))


def effective_width(baseline: pd.DataFrame, recipe: pd.DataFrame, n_self: float) -> dict:
    """baseline: seed, n_params (non-embedding), loss, one row per (width, seed); recipe: seed,
    loss at the width whose non-embedding count is n_self. Returns the mean-curve reading, the
    per-seed ones, the interval of ln(N_eff/N) over seeds and its p against N_eff/N = 1."""
    curve = baseline.groupby("n_params")["loss"].mean()
    log_n, ln_self = np.log(curve.index.to_numpy(float)), math.log(n_self)
    mean = read_off(log_n, curve.to_numpy(), float(recipe["loss"].mean()), ln_self)
    per_seed = []
    for seed, rows in baseline.groupby("seed"):
        mine = recipe[recipe["seed"] == seed]["loss"]
        if mine.empty or rows["n_params"].nunique() < curve.size:
            continue
        r = read_off(np.log(rows["n_params"].to_numpy(float)), rows["loss"].to_numpy(), float(mine.mean()), ln_self)
        per_seed.append(dict(seed=seed, kind=r.kind, log_ratio=r.log_ratio))
    inside = [p["log_ratio"] for p in per_seed if p["kind"] == "inside"]
    out = dict(kind=mean.kind, ratio=math.exp(mean.log_ratio), n_eff=mean.n_eff, n=n_self,
               widths_n=curve.index.tolist(), per_seed=per_seed, n_seeds=len(per_seed), n_inside=len(inside),
               ratio_ci=None, p_lower=None, p_higher=None)
    if per_seed and len(inside) == len(per_seed) and len(inside) >= 2:
        _, lo, hi = t_interval(np.array(inside))
        p_lo, p_hi = t_pvalues(np.array(inside))
        out.update(ratio_ci=[math.exp(lo), math.exp(hi)], p_lower=p_lo, p_higher=p_hi)
    if mean.kind != "inside":
        out["edge"] = edge_gap(baseline, recipe, curve, log_n, ln_self, above=mean.kind == "above")
    out["text"] = describe(out)
    return out


def edge_gap(baseline: pd.DataFrame, recipe: pd.DataFrame, curve: pd.Series, log_n: np.ndarray, ln_self: float,
             above: bool) -> dict:
    """recipe − baseline at the edge width the recipe reads past (the widest when above), paired by
    seed, and the reading at the interval's end nearest the measured widths: the N_eff/N the data
    still guarantee (a reading inside the widths), or the edge itself where even that end is past it.
    The limit reads that end on the seed-mean curve: the curve's own noise between widths is not in it."""
    edge = curve.index.max() if above else curve.index.min()
    at_edge = baseline[baseline["n_params"] == edge].groupby("seed")["loss"].mean()
    diff = (recipe.groupby("seed")["loss"].mean() - at_edge).dropna().to_numpy()
    gap, lo, hi = t_interval(diff)
    near = hi if above else lo  # the end of the interval that pulls the recipe back toward the curve
    limit = None
    if math.isfinite(near):
        r = read_off(log_n, curve.to_numpy(), float(curve[edge]) + near, ln_self)
        limit = math.exp(r.log_ratio)
    return dict(gap=gap, ci=[lo, hi], seeds=len(diff), limit=limit)


def describe(r: dict) -> str:
    widest, narrowest = max(r["widths_n"]) / r["n"], min(r["widths_n"]) / r["n"]
    if r["kind"] == "above":
        return (f"N_eff/N > {widest:.3g} on the seed means: the recipe is below the widest baseline measured"
                f"{_edge_text(r.get('edge'), '≥')}; a bound, not a number (train a wider baseline to read it)")
    if r["kind"] == "below":
        return (f"N_eff/N < {narrowest:.3g} on the seed means: the recipe is above the narrowest baseline measured"
                f"{_edge_text(r.get('edge'), '≤')}; a bound, not a number")
    if r["ratio_ci"] is None:
        return (f"N_eff/N = {r['ratio']:.3g} on the seed-mean curve; {r['n_inside']} of {r['n_seeds']} seeds read inside "
                "the measured widths, so no interval")
    lo, hi = r["ratio_ci"]
    return f"N_eff/N = {r['ratio']:.3g} [{lo:.3g}, {hi:.3g}] (t over {r['n_seeds']} seeds of ln N_eff/N)"


def _edge_text(edge: dict | None, sign: str) -> str:
    """' (recipe − that width -0.0047 [-0.0151, +0.0056] paired over 6 seeds; N_eff/N ≥ 1.84 at the
    interval's end)'."""
    if not edge or edge["seeds"] < 2:
        return ""
    lo, hi = edge["ci"]
    text = f" (recipe − that width {edge['gap']:+.4f} [{lo:+.4f}, {hi:+.4f}] paired over {edge['seeds']} seeds"
    if edge["limit"] is not None:
        text += f"; N_eff/N {sign} {edge['limit']:.3g} at the interval's end"
    return text + ")"
