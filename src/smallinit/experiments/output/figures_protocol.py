"""Figures of the comparison protocol: loss against gamma per learning rate with the
lr-optimal envelope, the paired gap over training, and the gap against width."""

from __future__ import annotations

import math

import matplotlib.ticker
import numpy as np
import pandas as pd

from .figures import GAMMA, LINESTYLES, LOSS_Y, STEP, _grid, color_map, label_panel, plt

GAP_Y = "paired gap A − B [nats/token]"
WIDTH_X = "width d_model [units, log scale]"
MAX_GAP_PANELS = 9


def loss_vs_gamma_by_lr(all_trials: pd.DataFrame, metric: str, lr_col: str = "lr"):
    """One panel per size: per setting (colour) a thin line per lr (style) through the seed
    means, and the lr-optimal envelope (thick): each gamma at its own best lr."""
    sizes = list(all_trials.sort_values("n_params")["size"].unique())
    colors = color_map(all_trials["setting"])
    lrs = sorted(all_trials[lr_col].dropna().unique())
    fig, axes = _grid(len(sizes))
    for ax, size in zip(axes, sizes):
        d = all_trials[all_trials["size"] == size]
        for setting, g in d.groupby("setting"):
            c = colors[setting]
            means = g.groupby(["gamma", lr_col])[metric].mean().unstack(lr_col)
            for i, lr in enumerate(lrs):
                if lr in means:
                    col = means[lr].dropna()
                    ax.plot(col.index, col.values, color=c, ls=LINESTYLES[(i + 1) % len(LINESTYLES)], lw=0.9,
                            alpha=0.6, marker=".", label=f"{setting}, lr {lr:g}")
            env = means.min(axis=1).dropna()
            if env.empty:
                continue
            ax.plot(env.index, env.values, color=c, lw=2.4, marker="o", ms=5, label=f"{setting}: best lr per γ")
            ax.scatter([env.idxmin()], [env.min()], marker="*", s=180, color=c, edgecolor="k", zorder=5)
        if "unigram_entropy" in d and d["unigram_entropy"].notna().any():
            ax.axhline(d["unigram_entropy"].mean(), color="grey", ls=":", lw=1, label="unigram entropy")
        label_panel(ax, size, GAMMA, LOSS_Y, legend=6, title_size=10)
    fig.suptitle("Final validation loss against γ: one line per lr, thick = each γ at its own best lr")
    fig.tight_layout()
    return fig


def loss_vs_lr(all_trials: pd.DataFrame, metric: str, chosen: pd.DataFrame, lr_col: str = "lr"):
    """One panel per size: loss against lr (log x) per variant, seeds as dots, seed means joined;
    the trials each variant is compared at (`chosen`, tuning's pick) starred. Shows where each
    optimum sits inside (or at the edge of) the grid."""
    sizes = list(all_trials.sort_values("n_params")["size"].unique())
    colors = color_map(all_trials["variant"])
    fig, axes = _grid(len(sizes))
    for ax, size in zip(axes, sizes):
        d = all_trials[all_trials["size"] == size]
        for variant, g in d.groupby("variant"):
            c = colors[variant]
            means = g.groupby(lr_col)[metric].mean()
            ax.scatter(g[lr_col], g[metric], s=10, color=c, alpha=0.35)
            ax.plot(means.index, means.values, color=c, marker="o", ms=4, lw=1.5, label=variant)
            pick = chosen[(chosen["size"] == size) & (chosen["variant"] == variant)]
            if not pick.empty:
                ax.scatter([pick[lr_col].iloc[0]], [pick[metric].mean()], marker="*", s=180, color=c, edgecolor="k",
                           zorder=5)
        ax.set_xscale("log")
        label_panel(ax, size, "peak learning rate [1/step, log scale]", LOSS_Y, legend=6, title_size=10)
    fig.suptitle("Final validation loss against learning rate (star: each variant's best lr)")
    fig.tight_layout()
    return fig


def gap_over_training(items: list[tuple[str, list[dict]]]):
    """One panel per comparison: the mean paired gap at every evaluation with its 95%
    interval; the last quarter of training, where the ranking must hold, shaded."""
    items = items[:MAX_GAP_PANELS]
    fig, axes = _grid(len(items), width=5.2, height=3.4)
    for ax, (label, trend) in zip(axes, items):
        steps = np.array([t["step"] for t in trend], dtype=float)
        diff = np.array([t["diff"] for t in trend], dtype=float)
        lo = np.array([np.nan if t["lo"] is None else t["lo"] for t in trend], dtype=float)
        hi = np.array([np.nan if t["hi"] is None else t["hi"] for t in trend], dtype=float)
        last = steps.max() if len(steps) else 1
        ax.axvspan(0.75 * last, last, color="#f2e6c9", alpha=0.6, lw=0)
        ax.fill_between(steps, lo, hi, color="C0", alpha=0.25, lw=0)
        ax.plot(steps, diff, color="C0", marker="o", ms=3, lw=1.4)
        ax.axhline(0, color="k", lw=0.8)
        label_panel(ax, _wrap(label), STEP, GAP_Y, legend=None, title_size=8)
    fig.suptitle("Paired gap over training (mean over seed pairs, 95% interval; shaded: last quarter)")
    fig.tight_layout()
    return fig


def width_trend(trend):
    """The lr-optimal paired gap (recipe − baseline) against width, each seed's fit faint, the
    mean fit bold, extended to where it crosses 0 when that is within 16x of the range."""
    p = trend.points
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    d = p["d_model"].to_numpy(dtype=float)
    lo, hi = p["lo"].to_numpy(dtype=float), p["hi"].to_numpy(dtype=float)
    gap = p["gap"].to_numpy(dtype=float)
    ax.errorbar(d, gap, yerr=[gap - lo, hi - gap], fmt="o", color="C3", capsize=4, label="paired gap at best lrs (95%)")
    right = d.max()
    if trend.crossover and d.max() < trend.crossover <= 16 * d.max():
        right = trend.crossover * 1.1
    xs = np.exp(np.linspace(math.log(d.min()), math.log(right), 100))
    for s in trend.per_seed:
        ax.plot(xs, s["intercept"] + s["slope"] * np.log(xs), color="C3", alpha=0.25, lw=0.8)
    if math.isfinite(trend.slope):
        ax.plot(xs, trend.intercept + trend.slope * np.log(xs), color="C3", lw=2,
                label=f"fit: {trend.intercept:+.3f} {trend.slope:+.3f}·ln d")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xticks(d)
    ax.set_xticklabels([f"{int(x)}" for x in d])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    label_panel(ax, "Recipe against baseline over width (each at its own best lr)", WIDTH_X,
                "recipe − baseline [nats/token]")
    fig.tight_layout()
    return fig


def _wrap(text: str, width: int = 60) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if len(line) + len(w) + 1 > width and line:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join([*lines, line])
