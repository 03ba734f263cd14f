"""The report's figures. Each is saved through `Figures.save`, which refuses a figure whose
axes lack a title, an x or y label, or a unit in [brackets], and records what it checked
(summary.json lists it, the tests read it back)."""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from smallinit.core import written  # noqa: E402

GAMMA = "γ, init std = d_in^-γ [unitless]"
LOSS_Y = "validation loss [nats/token]"
PARAMS = "parameters N [count]"
STEP = "training step [steps]"
COLORS = plt.get_cmap("tab10").colors


@dataclass
class FigureInfo:
    name: str
    file: str
    title: str
    caption: str
    axes: list[dict] = field(default_factory=list)


class LabelError(ValueError):
    """A figure is missing a title, an axis label or a unit."""


def check_labels(fig) -> list[dict]:
    """Every plotted axes needs a title (its own or the figure's), x and y labels with a
    [unit]; colorbars need a label with a unit. Returns what was found."""
    sup = fig._suptitle.get_text() if fig._suptitle is not None else ""
    found = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        if ax.get_label() == "<colorbar>":
            label = ax.get_ylabel() or ax.get_xlabel()
            if "[" not in label:
                raise LabelError(f"colorbar without a label and [unit]: {label!r}")
            found.append(dict(kind="colorbar", title=sup, xlabel=label, ylabel=label))
            continue
        info = dict(kind="axes", title=ax.get_title() or sup, xlabel=ax.get_xlabel(), ylabel=ax.get_ylabel())
        for key in ("title", "xlabel", "ylabel"):
            if not info[key].strip():
                raise LabelError(f"axes {ax.get_title()!r} in figure {sup!r} has no {key}")
        for key in ("xlabel", "ylabel"):
            if "[" not in info[key] or "]" not in info[key]:
                raise LabelError(f"{key} {info[key]!r} in figure {sup!r} has no [unit]")
        found.append(info)
    if not found:
        raise LabelError(f"figure {sup!r} has no axes")
    return found


class Figures:
    def __init__(self, out_dir: Path):
        self.out_dir = Path(out_dir)
        self.items: list[FigureInfo] = []

    def save(self, fig, name: str, caption: str) -> FigureInfo:
        axes = check_labels(fig)
        title = fig._suptitle.get_text() if fig._suptitle is not None else axes[0]["title"]
        path = self.out_dir / f"{name}.png"
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        # The report checked its whole folder before its first write (core/written.py).
        written.write_outputs(self.out_dir, {path.name: png.getvalue()}, by="smallinit.experiments.report", adopt=True)
        info = FigureInfo(name=name, file=path.name, title=title, caption=caption, axes=axes)
        self.items.append(info)
        return info

    def as_dicts(self) -> list[dict]:
        return [asdict(i) for i in self.items]


def _grid(n: int, width: float = 5.0, height: float = 3.8, max_cols: int = 3):
    cols = min(n, max_cols)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def color_map(labels) -> dict:
    return {lab: COLORS[i % len(COLORS)] for i, lab in enumerate(sorted(set(labels)))}


LINESTYLES = ("-", "--", ":", "-.")


def variant_styles(df: pd.DataFrame) -> dict[str, dict]:
    """Colour by gamma (dark = small init), line style by setting: variants read as a grid."""
    gammas = sorted(df["gamma"].unique())
    cmap = plt.get_cmap("viridis")
    gcol = {g: cmap(0.9 * i / max(1, len(gammas) - 1)) for i, g in enumerate(gammas[::-1])}
    settings = sorted(df["setting"].unique())
    out = {}
    for v, g in df.groupby("variant"):
        r = g.iloc[0]
        out[v] = dict(color=gcol[r["gamma"]], ls=LINESTYLES[settings.index(r["setting"]) % len(LINESTYLES)])
    return out


def _kilo(ax) -> None:
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1e3:g}k" if x else "0"))


def label_panel(ax, title: str, xlabel: str, ylabel: str, legend: float | None = 7, title_size: float | None = None,
                **legend_kw) -> None:
    """A panel's title, axis labels (with units, which check_labels asks of every axis), grid and legend."""
    ax.set_title(title, **({"fontsize": title_size} if title_size else {}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=legend, **legend_kw)


def metric_vs_gamma(df: pd.DataFrame, value: str, ylabel: str, title: str, best: pd.DataFrame | None = None,
                    hline: str | None = None, logy: bool = False):
    """One panel per size; a line per setting through the seed means, seeds as dots, the
    seed standard deviation as error bars, the best gamma starred."""
    sizes = list(df.sort_values("n_params")["size"].unique())
    colors = color_map(df["setting"])
    fig, axes = _grid(len(sizes))
    for ax, size in zip(axes, sizes):
        d = df[df["size"] == size]
        for setting, g in d.groupby("setting"):
            agg = g.groupby("gamma")[value].agg(["mean", "std", "count"]).reset_index()
            c = colors[setting]
            ax.scatter(g["gamma"], g[value], s=10, color=c, alpha=0.35)
            ax.errorbar(agg["gamma"], agg["mean"], yerr=agg["std"].where(agg["count"] > 1), color=c, marker="o",
                        ms=4, capsize=3, lw=1.5, label=setting)
            if best is not None:
                b = best[(best["size"] == size) & (best["setting"] == setting)]
                if not b.empty:
                    ax.scatter(b["best_gamma"], b["best_loss"], marker="*", s=180, color=c, edgecolor="k", zorder=5)
        if hline and d[hline].notna().any():
            ax.axhline(d[hline].mean(), color="grey", ls=":", lw=1, label="unigram entropy")
        if logy:
            ax.set_yscale("log")
        label_panel(ax, size, GAMMA, ylabel, title_size=10)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def loss_curves(curves: pd.DataFrame):
    sizes = list(curves.sort_values("d_model")["size"].unique())
    styles = variant_styles(curves)
    fig, axes = _grid(len(sizes), width=6.5, height=4.2, max_cols=2)
    for ax, size in zip(axes, sizes):
        d = curves[(curves["size"] == size) & curves["val_loss"].notna()]
        for variant, g in d.groupby("variant"):
            m = g.groupby("tokens")["val_loss"].mean()
            ax.plot(m.index, m.values, label=variant, lw=1.4, **styles[variant])
        _kilo(ax)
        label_panel(ax, size, "training tokens [tokens]", LOSS_Y, title_size=10)
    fig.suptitle("Validation loss during training (mean over seeds)")
    fig.tight_layout()
    return fig


def effective_size(es):
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    pts = es.points
    n_line = np.geomspace(pts["n_params"].min() / 1.5, pts["n_params"].max() * 1.5, 100)
    f = es.fit
    ax.plot(n_line, f.loss(n_line), color="k", lw=1.2,
            label=f"fit: E={f.E:.3f} + A·N^-{f.alpha:.3f}")
    ax.scatter(pts["n_params"], pts["loss"], color="k", zorder=4, label=f"baseline γ={es.baseline_gamma:g}")
    colors = color_map(es.gains["variant"]) if es.gains is not None and not es.gains.empty else {}
    if es.gains is not None:
        for variant, g in es.gains.groupby("variant"):
            ax.scatter(g["n_params"], g["loss"], color=colors[variant], marker="s", s=25, label=variant)
            lo = g.get("gain_lo", pd.Series(np.nan, index=g.index))
            hi = g.get("gain_hi", pd.Series(np.nan, index=g.index))
            yerr = np.vstack([(g["gain"] - lo).clip(lower=0), (hi - g["gain"]).clip(lower=0)]) * 100
            yerr = np.where(np.isfinite(yerr), yerr, 0)
            ax2.errorbar(g["n_params"], g["gain"] * 100, yerr=yerr, color=colors[variant], marker="s", capsize=3,
                         label=variant)
    ax.set_xscale("log")
    ax.set_title("L(N) on the baseline, other variants placed on it")
    ax.set_xlabel(PARAMS)
    ax.set_ylabel(LOSS_Y)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    ax2.axhline(0, color="grey", lw=1)
    ax2.axhline(44, color="grey", ls=":", lw=1, label="paper: +44%")
    ax2.set_xscale("log")
    ax2.set_title("Effective-size gain N_eff/N − 1 (95% interval)")
    ax2.set_xlabel(PARAMS)
    ax2.set_ylabel("gain [% of N]")
    ax2.legend(fontsize=7)
    ax2.grid(alpha=0.3, which="both")
    fig.suptitle("Effective model size")
    fig.tight_layout()
    return fig


def token_gain(results: list):
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    width = 0.8 / max(1, len(results))
    for k, tr in enumerate(results):
        b = tr.buckets
        x = b["bucket"].to_numpy() + (k - (len(results) - 1) / 2) * width
        yerr = np.vstack([b["mean_delta"] - b["ci_lo"], b["ci_hi"] - b["mean_delta"]])
        ax.bar(x, b["mean_delta"], width=width, color=COLORS[k % 10], yerr=np.where(np.isfinite(yerr), yerr, 0),
               capsize=3, label=tr.size)
        ax2.plot(tr.curve["difficulty"], tr.curve["mean_delta"], marker="o", ms=3, color=COLORS[k % 10], label=tr.size)
    ax.axhline(0, color="grey", lw=1)
    ax.set_xticks(range(1, 6), ["1 easiest", "2", "3", "4", "5 hardest"])
    ax.set_title("Mean Δ_sym per difficulty quintile")
    ax.set_xlabel("token difficulty quintile [quintile of mean loss]")
    ax.set_ylabel("mean Δ_sym = (p_A − p_B)/(p_A + p_B) [unitless]")
    ax.legend(fontsize=7)
    ax2.axhline(0, color="grey", lw=1)
    ax2.set_title("Δ_sym against difficulty (20 bins)")
    ax2.set_xlabel("token difficulty = mean loss over trials [nats]")
    ax2.set_ylabel("mean Δ_sym [unitless]")
    ax2.legend(fontsize=7)
    for a in (ax, ax2):
        a.grid(alpha=0.3)
    tr = results[0]
    fig.suptitle(f"Token-level gain of A = {tr.variant_a} over B = {tr.variant_b}", fontsize=10)
    fig.tight_layout()
    return fig


def probe_curves(curves: pd.DataFrame, size: str):
    d = curves[curves["size"] == size]
    styles = variant_styles(d)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.6))
    for variant, g in d.groupby("variant"):
        st = styles[variant]
        if g["seed"].nunique() > 1:
            for _, s in g.groupby("seed"):
                ax.plot(s["step"], s["row_cosine"], color=st["color"], alpha=0.25, lw=0.8)
                ax2.plot(s["step"], s["stable_rank"], color=st["color"], alpha=0.25, lw=0.8)
        m = g.groupby("step")[["row_cosine", "stable_rank"]].mean()
        ax.plot(m.index, m["row_cosine"], marker="o", ms=3, label=variant, **st)
        ax2.plot(m.index, m["stable_rank"], marker="o", ms=3, label=variant, **st)
    ax2.set_yscale("log")
    ax.set_title("Row-wise |cos| of the block matrices (mean)")
    ax.set_ylabel("mean |cos| between rows [unitless]")
    ax2.set_title("Stable rank ‖W‖_F²/‖W‖_2² (mean over matrices)")
    ax2.set_ylabel("stable rank [dimensions]")
    for a in (ax, ax2):
        a.set_xlabel(STEP)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    seeds = " (thin lines: single seeds)" if d.groupby("variant")["seed"].nunique().max() > 1 else ""
    fig.suptitle(f"Condensation then expansion? {size}{seeds}", fontsize=10)
    fig.tight_layout()
    return fig


def heatmaps(name: str, steps: list[int], panels: dict, size: str):
    rows, cols = len(panels), len(steps)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols + 2.4, 3.2 * rows), squeeze=False, layout="constrained")
    im = None
    for i, (variant, mats) in enumerate(panels.items()):
        for j, (step, m) in enumerate(zip(steps, mats)):
            ax = axes[i, j]
            if m is not None:
                im = ax.imshow(m, vmin=-1, vmax=1, cmap="RdBu_r", interpolation="nearest")
            ax.set_title(f"step {step}", fontsize=8)
            ax.set_xlabel("row index [row]", fontsize=7)
            ax.set_ylabel((variant.replace(" | ", "\n") + "\n\n" if j == 0 else "") + "row index [row]", fontsize=7)
            ax.tick_params(labelsize=6)
    if im is not None:
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
        cb.set_label("cosine similarity [unitless]")
    fig.suptitle(f"Row cosine similarity of {name}: init, most condensed, end ({size})", fontsize=10)
    return fig


def residual_balance(rb: pd.DataFrame, slopes: pd.DataFrame, eps: float = 1e-12):
    d = rb[np.isclose(rb["eps"], eps)]
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for k, (gamma, g) in enumerate(d.groupby("gamma")):
        c = COLORS[k % 10]
        s = slopes[np.isclose(slopes["gamma"], gamma)].iloc[0]
        ax.plot(g["width"], g["residual_ratio"], marker="o", color=c,
                label=f"γ={gamma:g}: measured d^{s['measured']:+.2f}")
        w = g["width"].to_numpy(dtype=float)
        # The prediction's constant is fitted (geometric mean), its slope is 1 - gamma.
        c0 = np.exp(np.mean(np.log(g["residual_ratio"]) - (1 - gamma) * np.log(w)))
        ax.plot(w, c0 * w ** (1 - gamma), ls="--", color=c, lw=1, label=f"d^(1−γ) = d^{1 - gamma:+.2f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("width d_model [channels]")
    ax.set_ylabel("‖block update‖ / ‖block input‖ at init [ratio]")
    ax.set_title(f"Residual balance at init (eps={eps:g}, no training)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle("Update-to-stream ratio across widths: flat only at γ = 1")
    fig.tight_layout()
    return fig


def saturation(rb: pd.DataFrame, trained: pd.DataFrame | None):
    n = 2 if trained is not None and not trained.empty else 1
    fig, axes = plt.subplots(1, n, figsize=(6.2 * n, 4.4), squeeze=False)
    ax = axes[0, 0]
    for k, (gamma, g) in enumerate(rb.groupby("gamma")):
        for eps, ls in ((1e-5, "-"), (1e-12, "--")):
            e = g[np.isclose(g["eps"], eps)]
            if not e.empty:
                ax.plot(e["width"], e["saturation"], ls=ls, marker="o", ms=3, color=COLORS[k % 10],
                        label=f"γ={gamma:g}, eps={eps:g}")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.02, 1.05)
    label_panel(ax, "At init across widths (no training)", "width d_model [channels]",
                "var/(var+eps) of norm inputs [unitless]", ncol=2)
    if n == 2:
        ax = axes[0, 1]
        colors = color_map(trained["label"])
        for label, g in trained.groupby("label"):
            for when, mk, ls in (("init", "o", "--"), ("final", "s", "-")):
                m = g.groupby("gamma")[when].mean()
                ax.plot(m.index, m.values, marker=mk, ls=ls, color=colors[label], label=f"{label} ({when})")
        ax.set_ylim(-0.02, 1.05)
        label_panel(ax, "Trained trials: at step 0 (dashed) and at the end", GAMMA,
                    "var/(var+eps) of norm inputs [unitless]", legend=6)
    fig.suptitle("RMSNorm saturation: near 0 means eps swamps the signal")
    fig.tight_layout()
    return fig


def attention_sink(df: pd.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    df = df.assign(label=df["size"].str.split(" ").str[0] + " | gate=" + df["gate"] + ", eps=" + df["eps"].map(lambda e: f"{e:g}"))
    colors = color_map(df["label"])
    for ax, when in zip(axes, ("sink_init", "attn_sink")):
        for label, g in df.groupby("label"):
            agg = g.groupby("gamma")[when].agg(["mean", "std", "count"]).reset_index()
            ax.errorbar(agg["gamma"], agg["mean"], yerr=agg["std"].where(agg["count"] > 1), marker="o", ms=4,
                        capsize=3, color=colors[label], label=label)
        label_panel(ax, "at init (step 0)" if when == "sink_init" else "end of training", GAMMA,
                    "attention on token 0 [fraction of attention]")
    fig.suptitle("First-token attention (attention sink) against γ and the gate")
    fig.tight_layout()
    return fig


def importances(imp: dict[str, dict[str, float]]):
    fig, axes = _grid(len(imp), width=5.5, height=0.5 + 0.45 * max(len(v) for v in imp.values()))
    for ax, (study, values) in zip(axes, imp.items()):
        keys = list(values)[::-1]
        ax.barh(keys, [values[k] for k in keys], color=COLORS[0])
        ax.set_title(study, fontsize=10)
        ax.set_xlabel("importance [fraction of total]")
        ax.set_ylabel("swept parameter [key]")
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle("Optuna parameter importances")
    fig.tight_layout()
    return fig
