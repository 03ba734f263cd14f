"""The report's protocol sections: how the variants were compared (each at its own best lr),
whether the budget let the rankings settle, how far each variant got below the unigram entropy,
and the width trend. Each function returns its blocks and its part of summary.json."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from smallinit.experiments.claims.claims import Claim
from smallinit.experiments.claims.width import MIN_HEADS, WidthTrend, width_text
from smallinit.experiments.data.load import Sweep
from smallinit.experiments.data.tuning import chosen_label
from smallinit.experiments.output import figures_protocol as FP
from smallinit.experiments.output.render import Block
from smallinit.experiments.stats.stats import CONTRADICTED, INCONCLUSIVE, NOT_RUN, SUPPORTED


def _g(x, fmt: str = ".4f") -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def tuning_section(sweep: Sweep, figs, metric: str) -> tuple[list[Block], dict]:
    t = sweep.tuning
    heading = "How the arms are compared" + (": each at its own best learning rate" if t.axes else "")
    blocks = [Block("h2", heading),
              Block("note" if not t.axes or not t.edges.empty else "p", t.describe())]
    summary = dict(axes=t.axes, description=t.describe(), chosen=[])
    if not t.axes:
        return blocks, summary
    c = t.chosen
    table = pd.DataFrame({
        "size": c["size"], "setting": c["setting"], "γ": c["gamma"].map(lambda x: f"{x:g}"),
        "chosen": [chosen_label(r, t.axes) for _, r in c.iterrows()],
        "tried": [", ".join(f"{v:g}" for v in r[f"{t.axes[0]}_tried"]) for _, r in c.iterrows()],
        "seed-mean loss": c["loss"].map(_g), "seeds": c["seeds"],
        "flag": [f"best at the edge of the grid: widen it ({r['edge']})" if r["at_edge"] else ""
                 for _, r in c.iterrows()],
    })
    blocks.append(Block("table", table, f"The optimiser settings each (size, setting, γ) is compared at. 'tried' lists "
                                        f"the {t.axes[0]} values swept."))
    summary["chosen"] = c.to_dict("records")
    if "lr" in t.axes:
        blocks.append(Block("figure", figs.save(FP.loss_vs_lr(t.all_trials, metric, sweep.complete), "loss_vs_lr",
                                                "Loss against learning rate per variant; star = its best lr.")))
        if (t.all_trials.groupby(["size", "setting"])["gamma"].nunique() > 1).any():
            blocks.append(Block("figure", figs.save(FP.loss_vs_gamma_by_lr(t.all_trials, metric), "loss_vs_gamma_by_lr",
                                                    "Loss against γ per learning rate (thin) and the lr-optimal "
                                                    "envelope (thick); star = best γ at its best lr.")))
    return blocks, summary


def budget_section(sweep: Sweep, claims: list[Claim], figs, metric: str) -> tuple[list[Block], dict]:
    """The paired gap over training of every loss comparison, and each variant against the unigram entropy."""
    blocks = [Block("h2", "Was the budget enough? The gap over training"),
              Block("p", "A ranking read while the paired gap is still moving ranks learning speed, not end points. "
                         "Each loss comparison is recomputed at every evaluation (same seed pairs, each side at its "
                         "chosen lr); a verdict counts only if the sign of the mean gap held over the last quarter of "
                         "training, otherwise it is 'inconclusive: the ranking was still changing'.")]
    items, rows = [], []
    for c in claims:
        for n in c.numbers:
            trend = n.get("over_training")
            if not trend:
                continue
            items.append((n["label"], trend))
            rows.append({"comparison": n["label"], "final gap": _g(n.get("diff")),
                         "95% interval": f"[{_g(n.get('lo'))}, {_g(n.get('hi'))}]",
                         "sign-flip p": _g(n.get("p_signflip"), ".3g"),
                         "Holm p against": _g(n.get("p_holm"), ".3g"), "pairs": n.get("n"),
                         "last quarter": ("held" if n.get("settled") else "changing" if n.get("settled") is False
                                          else "not checked"),
                         "verdict": n.get("verdict", "") + (" (side behind at its lr grid's edge)"
                                                            if n.get("edge_behind") else "")})
    summary = dict(comparisons=rows)
    if items:
        blocks.append(Block("figure", figs.save(FP.gap_over_training(items), "gap_over_training",
                                                f"Paired gap A − B at every evaluation (first {FP.MAX_GAP_PANELS} "
                                                "comparisons); shaded: the last quarter, where the ranking must hold.")))
        blocks.append(Block("table", pd.DataFrame(rows), "Every loss comparison, its final gap and whether its "
                                                         "ranking held over the last quarter of training."))
    else:
        blocks.append(Block("note", "No loss curves to check the rankings over training (metrics.jsonl missing)."))
    below = _below_unigram(sweep.complete, metric)
    if not below.empty:
        blocks.append(Block("table", below.assign(**{c: below[c].map(_g) for c in ("loss", "unigram entropy",
                                                                                  "below unigram")}),
                            "Each arm at its chosen lr: how far its loss got below the unigram entropy (the loss of "
                            "a model that learned only token frequencies), mean over seeds."))
        summary["below_unigram"] = below.to_dict("records")
    return blocks, summary


def _below_unigram(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    if "unigram_entropy" not in df or not df["unigram_entropy"].notna().any():
        return pd.DataFrame()
    rows = []
    for (size, variant), g in df.groupby(["size", "variant"], sort=False):
        loss, uni = float(g[metric].mean()), float(g["unigram_entropy"].mean())
        lrs = sorted(g["lr"].dropna().unique()) if "lr" in g else []
        rows.append({"size": size, "variant": variant, "lr": ", ".join(f"{x:g}" for x in lrs), "seeds": g["seed"].nunique(),
                     "dtype": ", ".join(sorted(g["dtype"].dropna().unique())) if "dtype" in g else "",
                     "loss": loss, "unigram entropy": uni, "below unigram": uni - loss})
    return pd.DataFrame(rows)


def width_section(trend: WidthTrend, figs) -> tuple[list[Block], dict]:
    blocks = [Block("h2", "Width trend: the recipe's gap against width")]
    if trend.status != "fit" and trend.points.empty:
        blocks.append(Block("note", width_text(trend)))
        return blocks, trend.as_dict()
    blocks.append(Block("p", "At each width (fixed depth) the recipe and the baseline are compared at their own best "
                             "lr, paired by seed. Each seed's gaps are fitted with gap(d) = a + b·ln d; the slope's "
                             "95% interval is the t-interval over seeds, and the crossover band is the set of widths "
                             "where the seeds' fitted gaps have an interval holding 0. Widths whose model has fewer than "
                             f"{MIN_HEADS} attention heads are shown but not fitted. " + width_text(trend)))
    p = trend.points
    heads = {"heads": p["n_heads"].map(lambda h: "?" if h is None or pd.isna(h) else f"{int(h)}"),
             "in fit": p["fitted"].map({True: "yes", False: "no"})} if "fitted" in p else {}
    blocks.append(Block("table", pd.DataFrame({
        "d_model": p["d_model"], **heads, "pairs": p["pairs"], "recipe − baseline": p["gap"].map(_g),
        "95% interval": [f"[{_g(lo)}, {_g(hi)}]" for lo, hi in zip(p["lo"], p["hi"])],
        "lr recipe": p["lr_recipe"].map(_lrs), "lr baseline": p["lr_baseline"].map(_lrs), "verdict": p["verdict"],
    }), "Lr-optimal paired gap per width (negative: the recipe is better)."))
    if trend.status == "fit":
        blocks.append(Block("figure", figs.save(FP.width_trend(trend), "width_trend",
                                                "Recipe − baseline per width (95% intervals), each seed's fit (faint) "
                                                "and their mean (bold).")))
    return blocks, trend.as_dict()


def _lrs(v) -> str:
    if isinstance(v, list | tuple | np.ndarray):
        return ", ".join(f"{x:g}" for x in v)
    return "–" if v is None else f"{v:g}"


def width_claim(trend: WidthTrend) -> Claim:
    c = Claim("The recipe's advantage grows with width",
              "the residual update scales like d^(1−γ): small init's balance changes with width, and the two "
              "barriers (norm saturation, attention sink) hide its benefit as width grows unless removed",
              NOT_RUN, trend.status if trend.status != "fit" else "")
    if trend.status != "fit":
        if not trend.points.empty:
            c.verdict = INCONCLUSIVE
        return c
    c.evidence.append(width_text(trend))
    p = trend.slope_p
    if p:
        seeds = f"; lr chosen on seed(s) {', '.join(trend.tune_seeds)}" if trend.tune_seeds else ""
        c.evidence.append(f"slope over {p['n_confirm']} seeds: sign-flip p = {p['p_signflip']:.3g}; against the claim "
                          f"(slope > 0) p = {p['p_against']:.3g}, one comparison, so Holm leaves it as is{seeds}")
    c.numbers = [dict(slope=trend.slope, lo=trend.slope_lo, hi=trend.slope_hi, crossover=trend.crossover,
                      **p, tune_seeds=trend.tune_seeds)]
    if trend.slope_hi < 0:
        c.verdict, c.reason = SUPPORTED, "the gap falls with width beyond the seed spread (slope's interval < 0)"
    elif trend.slope_lo > 0:
        c.verdict, c.reason = CONTRADICTED, "the gap grows with width beyond the seed spread (slope's interval > 0)"
    else:
        c.excluded = max(abs(trend.slope_lo), abs(trend.slope_hi))
        c.verdict, c.reason = INCONCLUSIVE, (f"the slope's interval holds 0 ({trend.seeds} seeds): |slope| > "
                                             f"{c.excluded:.3g} nats per e-fold of width excluded")
    return c
