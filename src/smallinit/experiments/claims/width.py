"""The width trend: does the recipe's gap to the baseline change with width?

The paper's argument is that the residual update scales like d^(1-gamma) relative to the
stream, so small init's balance against the standard init changes with width. At each width
(same depth) the recipe and the baseline are compared at their own best lr (tuning.py), paired
by seed: gap_s(d) = loss_recipe(s, d) - loss_baseline(s, d). The trend is fitted per seed,
gap_s(d) = a_s + b_s ln d, and the slope's 95% t-interval is taken over seeds: the same rule
(paired by seed) as every other comparison. The crossover width is where the mean fit is 0;
its interval is the set of widths where the seeds' fitted gaps have a 95% interval that
holds 0 (Fieller's construction), which can be unbounded on either side.

The fit uses only widths whose models have at least MIN_HEADS attention heads: a one-head model
(d = 64 at heads of 64) has no multi-head attention and is mostly embedding and output head, so
its gap says little about how the residual balance changes with width. Such widths stay in the
table, marked, and the page says which widths the fit used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from smallinit.core.trial_dir import TrialDir
from smallinit.experiments.stats.paired import one_comparison, t_interval
from smallinit.experiments.stats.stats import A_LOWER, compare, outcome

# Widths over which the crossover band is searched (log-spaced; beyond this it is "unbounded").
SEARCH_WIDTHS = (8.0, 1e6)
MIN_HEADS = 2


@dataclass
class WidthTrend:
    status: str  # "fit" or why there is none
    points: pd.DataFrame = field(default_factory=pd.DataFrame)  # per width: gap and its interval, lrs
    n_layers: int | None = None
    seeds: int = 0
    slope: float = float("nan")  # nats per e-fold of width (per unit of ln d)
    slope_lo: float = float("nan")
    slope_hi: float = float("nan")
    intercept: float = float("nan")
    per_seed: list[dict] = field(default_factory=list)
    crossover: float | None = None  # width where the mean fit is 0
    crossover_lo: float | None = None  # None = unbounded below
    crossover_hi: float | None = None  # None = unbounded above
    crossover_note: str = ""
    fit_widths: list[int] = field(default_factory=list)  # the widths the fit used (>= MIN_HEADS heads)
    fit_note: str = ""  # which widths were left out of the fit, and why
    # The slope's p-values (paired.one_comparison; the claim predicts a slope < 0) and the seeds
    # that chose each arm's lr (never among the fitted seeds under select, then confirm).
    slope_p: dict = field(default_factory=dict)
    tune_seeds: list[str] | None = None

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("status", "n_layers", "seeds", "slope", "slope_lo", "slope_hi",
                                             "intercept", "per_seed", "crossover", "crossover_lo",
                                             "crossover_hi", "crossover_note", "fit_widths", "fit_note",
                                             "slope_p", "tune_seeds")}
        out["points"] = self.points.to_dict("records") if not self.points.empty else []
        return out


def heads_of(trials: pd.DataFrame) -> int | None:
    """The trials' attention heads: an n_heads column, else the resolved config in a trial's
    trial.json; None where neither is there."""
    if "n_heads" in trials and trials["n_heads"].notna().any():
        return int(trials["n_heads"].dropna().iloc[0])
    for col in ("trial_dir", "metrics_path"):
        for v in trials.get(col, pd.Series(dtype=object)).dropna():
            folder = Path(v) if col == "trial_dir" else Path(v).parent
            try:
                return int((TrialDir(folder).read_trial(damaged_ok=True) or {})["config"]["model"]["n_heads"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return None


def width_trend(df: pd.DataFrame, recipe: str | None, baseline: str | None, metric: str) -> WidthTrend:
    """df: the lr-optimal complete trials (Sweep.complete)."""
    if recipe is None or baseline is None:
        return WidthTrend("needs the baseline and the recipe in one sweep (e.g. arm=baseline,small)")
    both = df[df["variant"].isin([recipe, baseline])]
    if both.empty:
        return WidthTrend("neither the recipe nor the baseline has complete trials")
    # Fixed depth: the depth with the most widths that ran both variants.
    widths_by_depth = {}
    for depth, g in both.groupby("n_layers"):
        ok = [d for d, gd in g.groupby("d_model") if gd["variant"].nunique() == 2]
        widths_by_depth[int(depth)] = sorted(ok)
    depth = max(widths_by_depth, key=lambda k: len(widths_by_depth[k]))
    all_widths = widths_by_depth[depth]
    heads = {d: heads_of(both[(both["n_layers"] == depth) & (both["d_model"] == d)]) for d in all_widths}
    widths = [d for d in all_widths if heads[d] is None or heads[d] >= MIN_HEADS]
    left_out = [d for d in all_widths if d not in widths]
    unknown = [d for d in widths if heads[d] is None]
    notes = [f"fit over d = {', '.join(map(str, widths)) or 'none'} (widths with ≥ {MIN_HEADS} attention heads)"]
    if left_out:
        shown = ", ".join(f"{d} ({heads[d]} head{'s' * (heads[d] != 1)})" for d in left_out)
        notes.append(f"d = {shown} shown but not fitted")
    if unknown:
        notes.append(f"heads not recorded for d = {', '.join(map(str, unknown))} (fitted)")
    fit_note = "; ".join(notes)
    if len(widths) < 3:
        return WidthTrend(f"needs both arms at ≥ 3 widths of one depth; have {len(widths)} "
                          f"({', '.join(map(str, widths)) or 'none'}) at {depth} layers"
                          + (f" with ≥ {MIN_HEADS} heads" if left_out else "") + ": run +experiment=width_trend",
                          n_layers=depth, fit_widths=widths, fit_note=fit_note)
    rows, per_seed_gaps, tune_seeds = [], {}, None
    for d in all_widths:
        g = both[(both["n_layers"] == depth) & (both["d_model"] == d)]
        a, b = g[g["variant"] == recipe], g[g["variant"] == baseline]
        c = compare(a, b, metric, curve="val/loss")
        rows.append(dict(d_model=int(d), size=g["size"].iloc[0], n_params_recipe=float(a["n_params"].mean()),
                         n_params_baseline=float(b["n_params"].mean()), pairs=c.n, gap=c.diff, lo=c.lo, hi=c.hi,
                         lr_recipe=(c.optim_a or {}).get("lr"), lr_baseline=(c.optim_b or {}).get("lr"),
                         verdict=outcome(c, A_LOWER), settled=c.settled, n_heads=heads[d], fitted=d in widths))
        if c.tune_seeds is not None:
            tune_seeds = list(dict.fromkeys([*(tune_seeds or []), *c.tune_seeds]))  # each in compare's order
        if d not in widths:
            continue
        ma, mb = a.groupby("seed")[metric].mean(), b.groupby("seed")[metric].mean()
        for s in ma.index.intersection(mb.index):
            per_seed_gaps.setdefault(s, {})[int(d)] = float(ma[s] - mb[s])
    points = pd.DataFrame(rows)
    # Seeds that ran both variants at every width: each gives its own line.
    seeds = sorted(s for s, gaps in per_seed_gaps.items() if len(gaps) == len(widths))
    trend = WidthTrend("fit", points=points, n_layers=depth, seeds=len(seeds), fit_widths=widths, fit_note=fit_note,
                       tune_seeds=tune_seeds)
    if len(seeds) < 2:
        trend.status = f"needs ≥ 2 seeds with both arms at every width (have {len(seeds)}): no interval"
        return trend
    x = np.log(np.array(widths, dtype=float))
    coefs = []
    for s in seeds:
        y = np.array([per_seed_gaps[s][d] for d in widths])
        b, a = np.polyfit(x, y, 1)
        coefs.append((a, b))
        trend.per_seed.append(dict(seed=s, intercept=float(a), slope=float(b)))
    a_s, b_s = np.array(coefs).T
    trend.slope, trend.slope_lo, trend.slope_hi = t_interval(b_s)
    trend.slope_p = one_comparison(b_s, predicted="less")  # the claim: the recipe's gap falls with width
    trend.intercept = float(a_s.mean())
    _crossover(trend, a_s, b_s, widths)
    return trend


def _fmt_width(x: float) -> str:
    return f"{math.exp(x):,.0f}"


def _crossover(trend: WidthTrend, a_s: np.ndarray, b_s: np.ndarray, widths: list[int]) -> None:
    """Point crossover of the mean fit, and the widths where the seeds' fitted gaps have a 95%
    interval holding 0 (one or more pieces; bounded by the search range), all in ln d."""
    lo_x, hi_x = math.log(SEARCH_WIDTHS[0]), math.log(SEARCH_WIDTHS[1])
    if trend.slope != 0 and math.isfinite(trend.slope):
        root = -trend.intercept / trend.slope  # ln d where the mean fit is 0
        if lo_x <= root <= hi_x:
            trend.crossover = float(math.exp(root))
    grid = np.linspace(lo_x, hi_x, 2000)
    holds_zero = np.array([lo <= 0 <= hi for lo, hi in (t_interval(a_s + b_s * x)[1:] for x in grid)])
    limits = f"{SEARCH_WIDTHS[0]:g}–{SEARCH_WIDTHS[1]:g}"
    if not holds_zero.any():
        side = "below" if (a_s + b_s * grid[0]).mean() < 0 else "above"
        trend.crossover = None
        trend.crossover_note = f"the fitted gap stays {side} 0 with its interval over widths {limits}: no crossover"
        return
    # Contiguous pieces of the band (a flat, noisy fit can hold 0 on two rays with a gap between).
    edges = np.flatnonzero(np.diff(holds_zero.astype(int)))
    starts = [0] * bool(holds_zero[0]) + [i + 1 for i in edges if not holds_zero[i]]
    ends = [i for i in edges if holds_zero[i]] + [len(grid) - 1] * bool(holds_zero[-1])
    pieces = []
    for i, j in zip(starts, ends):
        left = f"< {SEARCH_WIDTHS[0]:g}" if i == 0 else _fmt_width(grid[i])
        right = f"> {SEARCH_WIDTHS[1]:g}" if j == len(grid) - 1 else _fmt_width(grid[j])
        pieces.append(f"[{left}, {right}]")
    first, last = starts[0], ends[-1]
    trend.crossover_lo = None if first == 0 else float(math.exp(grid[first]))
    trend.crossover_hi = None if last == len(grid) - 1 else float(math.exp(grid[last]))
    band = " ∪ ".join(pieces)
    lo_w, hi_w = min(widths), max(widths)
    if trend.crossover is None:
        trend.crossover_note = f"no crossover of the mean fit within widths {limits}; widths where the gap's interval holds 0: {band}"
    elif lo_w <= trend.crossover <= hi_w:
        trend.crossover_note = f"the fit crosses 0 at d ≈ {trend.crossover:,.0f}, inside the measured range; 95% band {band}"
    else:
        trend.crossover_note = (f"the fit crosses 0 at d ≈ {trend.crossover:,.3g}, outside the measured range "
                                f"{lo_w}–{hi_w} (an extrapolation); 95% band {band}")


def width_text(t: WidthTrend) -> str:
    if t.status != "fit":
        return f"No width trend: {t.status}."
    return (f"gap(d) = {t.intercept:+.4f} {t.slope:+.4f}·ln d over d = {', '.join(map(str, t.fit_widths))} "
            f"({t.n_layers} layers, {t.seeds} seeds): slope {t.slope:+.4f} nats per e-fold of width, 95% interval "
            f"[{t.slope_lo:+.4f}, {t.slope_hi:+.4f}]; {t.crossover_note}. {t.fit_note[:1].upper()}{t.fit_note[1:]}.")
