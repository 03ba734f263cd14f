"""The report's token-crossover section (a sweep run with hydra.sweeper.protocol.per_budget):
the gap against ln D with the per-seed lines, the fit and the D* band; loss against lr per
budget from the tuning branches; and the table of budgets. The numbers are token_crossover.py's."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from smallinit.experiments.fits.token_crossover import crossing_note, curvature_note  # noqa: E402
from smallinit.experiments.output.render import Block  # noqa: E402


def _f(x, fmt: str = "+.4f") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def gap_figure(tc: dict):
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    per_seed, line = tc["per_seed"], tc["line"]
    x = np.log(np.asarray(per_seed.columns, dtype=float)) if not per_seed.empty else np.array([])
    for _, row in per_seed.iterrows():
        ax.plot(x, row.to_numpy(), color="0.75", lw=0.8, marker=".", zorder=1)
    b = tc["budgets"]
    xs = np.log([g["tokens"] for g in b])
    ax.errorbar(xs, [g["gap"] for g in b], yerr=[[g["gap"] - g["lo"] for g in b], [g["hi"] - g["gap"] for g in b]],
                fmt="o", color="C3", capsize=3, zorder=3, label="mean gap, 95% t-interval")
    if line is not None:
        grid = np.linspace(xs.min() - 0.3, xs.max() + 0.3, 50)
        ax.plot(grid, line.a + line.b * (grid - line.c), color="C0", lw=1.5, label="fit a + b (ln D − c)", zorder=2)
        if line.star_kind == "bounded":
            ax.axvspan(line.star_lo, line.star_hi, color="C0", alpha=0.12, label="D* 95% (Fieller)")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xlabel("ln D [D in tokens]")
    ax.set_ylabel("gap: recipe − baseline [nats]")
    ax.set_title("Recipe's gap against token budget, each budget at its own lr")
    ax.legend(fontsize=8)
    return fig


def lr_figure(tc: dict):
    tune = tc["tune"]
    budgets = sorted(tune["budget_tokens"].unique())
    fig, axes = plt.subplots(1, len(budgets), figsize=(3.0 * len(budgets), 3.2), sharey=False, squeeze=False)
    for ax, tokens in zip(axes[0], budgets):
        for i, (arm, g) in enumerate(tune[tune["budget_tokens"] == tokens].groupby("arm")):
            g = g.groupby("lr")["loss"].mean()
            ax.plot(g.index, g.to_numpy(), marker="o", color=f"C{i}", label=arm)
            pick = tc["chosen"].get(arm, {}).get(int(tokens))
            if pick is not None and pick in g.index:
                ax.plot([pick], [g[pick]], marker="*", ms=12, color=f"C{i}")
        ax.set_xscale("log")
        ax.set_xlabel("lr [peak, log scale]")
        ax.set_ylabel("val loss, tuning seed [nats]")
        ax.set_title(f"{tokens / 1e6:g}M tokens")
        ax.legend(fontsize=7)
    fig.suptitle("Loss against lr per budget (tuning branches); star = chosen")
    return fig


def section(tc: dict, figs) -> tuple[list[Block], dict]:
    line = tc["line"]
    blocks = [Block("h2", "Where the gap crosses: each budget at its own lr"),
              Block("p", f"Recipe ({tc['recipe']}) minus baseline ({tc['baseline']}) at each token budget, paired by confirm "
                         "seed, each arm at the lr that budget chose on the tuning seed(s) from its own cooldown branch. "
                         f"Holm over the {tc['family_size']} comparisons (each budget's gap and the slope), α = "
                         f"{tc['alpha']:g} two-sided. Decision rule: docs/results/crossover/decision_rule.md."),
              Block("p", f"**{tc['decision']}**")]
    table = pd.DataFrame([{
        "budget (tokens)": f"{g['tokens']:,}", "lr baseline": f"{g['lr_baseline']:g}", "lr recipe": f"{g['lr_recipe']:g}",
        "loss baseline": _f(g["loss_baseline"], ".4f"), "loss recipe": _f(g["loss_recipe"], ".4f"),
        "gap [95%]": f"{_f(g['gap'])} [{_f(g['lo'])}, {_f(g['hi'])}]", "n": g["n"],
        "sign-flip p": _f(g["p_signflip"], ".3g"), "Holm p": _f(g["p_holm"], ".3g"), "verdict": g["verdict"]}
        for g in tc["budgets"]])
    blocks.append(Block("table", table, "Per budget: each arm's chosen lr and seed-mean loss, the paired gap, and its verdict."))
    if line is not None:
        lo, hi = line.d_star_interval()
        blocks.append(Block("p", f"Line over {line.n} seeds: slope {_f(line.b)} [{_f(line.b_ci[0])}, {_f(line.b_ci[1])}] nats "
                                 f"per e-fold (sign-flip p {_f(line.p_b_signflip, '.3g')}, Holm p {_f(line.p_b_holm, '.3g')}); "
                                 f"quadratic term {_f(line.quad)} [{_f(line.quad_ci[0])}, {_f(line.quad_ci[1])}]; "
                                 f"Fieller set for D*: {line.star_kind}"
                                 + (f" [{lo:.3g}, {hi:.3g}] tokens." if line.star_kind == "bounded" else ".")))
        bend = curvature_note(line.quad, line.quad_ci)
        if bend:
            blocks.append(Block("p", bend))
    cross = crossing_note(tc["budgets"])
    if cross:
        blocks.append(Block("p", cross))
    if tc["budgets"]:
        blocks.append(Block("figure", figs.save(gap_figure(tc), "crossover_gap",
                                                "Gap against ln D: grey per-seed lines, red means with 95% intervals, "
                                                "blue the fitted line and the D* band.")))
    if not tc["tune"].empty:
        blocks.append(Block("figure", figs.save(lr_figure(tc), "crossover_lr",
                                                "Loss against lr at each budget on the tuning seed; star = that budget's choice.")))
    summary = {k: v for k, v in tc.items() if k not in ("per_seed", "line", "tune")}
    summary["per_seed"] = tc["per_seed"].reset_index().rename(columns={"index": "seed"}).to_dict("records")
    summary["line"] = None if line is None else {**line.__dict__, "d_star": line.d_star,
                                                  "d_star_interval": list(line.d_star_interval())}
    return blocks, summary
