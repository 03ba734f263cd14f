"""The report's mechanism sections: condensation, attention sink, norm saturation and the
residual balance at init. Each takes the shared Context and returns its blocks and its part of
summary.json; the analyses are experiments.claims.mechanism's."""

from __future__ import annotations

import numpy as np
import pandas as pd

from smallinit.experiments.claims.mechanism import balance_setup, heatmap_panels
from smallinit.experiments.output import figures as F
from smallinit.experiments.output.render import Block

from .context import Context, Part


def _extreme(df: pd.DataFrame, recipe: str | None, size: str) -> list[str]:
    """The largest-gamma variant in the recipe's setting (to show what happens past gamma = 1)."""
    if recipe is None:
        return []
    setting = df[df["variant"] == recipe]["setting"].iloc[0]
    d = df[(df["setting"] == setting) & (df["size"] == size)]
    return [] if d.empty else [d.sort_values("gamma")["variant"].iloc[-1]]


def _trajectory_table(traj: pd.DataFrame) -> pd.DataFrame:
    """Row |cos| and stable rank per (size, variant), seed means, formatted."""
    tt = traj.groupby(["size", "variant"]).agg(
        start=("start", "mean"), peak=("peak", "mean"), peak_step=("peak_step", "median"), final=("final", "mean"),
        rank_start=("rank_start", "mean"), rank_min=("rank_min", "mean"), rank_final=("rank_final", "mean"),
        trials=("pattern", "size"),
        outcome=("status", lambda x: ", ".join(f"{v}× {k}" for k, v in x.value_counts().items()))).reset_index()
    tt["peak_step"] = tt["peak_step"].map(lambda x: f"{x:.0f}")
    for col in ("start", "peak", "final"):
        tt[col] = tt[col].map(lambda x: f"{x:.3f}")
    for col in ("rank_start", "rank_min", "rank_final"):
        tt[col] = tt[col].map(lambda x: f"{x:.1f}")
    return tt.drop(columns=["trials"]).rename(columns={
        "start": "|cos| step 0", "peak": "|cos| peak", "peak_step": "peak step", "final": "|cos| end",
        "rank_start": "rank step 0", "rank_min": "rank min", "rank_final": "rank end"})


def mechanism(ctx: Context) -> Part:
    df, curves, figs, step0 = ctx.df, ctx.curves, ctx.figs, ctx.step0
    blocks = [Block("h2", "Mechanism")]
    largest = df.sort_values("n_params")["size"].iloc[-1]
    if not curves.empty and curves["row_cosine"].notna().any():
        blocks.append(Block("h3", "Condensation then expansion"))
        blocks.append(Block("figure", figs.save(F.probe_curves(curves, largest), "condensation",
                                                "Mean row-wise |cos| and stable rank of the block matrices over training "
                                                "(lines with markers: seed means).")))
        if not ctx.trajectories.empty:
            blocks.append(Block("table", _trajectory_table(ctx.trajectories),
                                "Row |cos| and stable rank per variant (seed means); the outcome counts trials by what their |cos| "
                                "curve did (condense: > 10% rise after step 0; expand: falls back > 10% of the rise)."))
        variants = [v for v in dict.fromkeys([ctx.base_variant, ctx.recipe, *_extreme(df, ctx.recipe, largest)]) if v]
        hm = heatmap_panels(ctx.sweep, variants, largest)
        if hm is not None:
            name, steps, panels = hm
            blocks.append(Block("figure", figs.save(F.heatmaps(name, steps, panels, largest), "cosine_heatmaps",
                                                    f"Cosine similarity between the first rows of {name} (first seed), at init, "
                                                    "at the snapshot where small init is most condensed, and at the end.")))
    else:
        blocks.append(Block("note", "No probe curves (probes were off: train.probe_every=0), so no condensation picture."))
    blocks.append(Block("h3", "Attention sink"))
    sink = df.assign(sink_init=df["identity"].map(step0["attn_sink"]) if not step0.empty else np.nan)
    if sink["attn_sink"].notna().any():
        blocks.append(Block("figure", figs.save(F.attention_sink(sink), "attention_sink",
                                                "Mean attention on the first token (queries 1..T−1, all heads and layers).")))
    else:
        blocks.append(Block("note", "No attention-sink probe in the results."))
    blocks.append(Block("h3", "Norm saturation"))
    trained = ctx.saturation.merge(df[["identity", "gamma", "eps", "size"]], on="identity")
    trained = trained.assign(label=trained["size"].str.split(" ").str[0] + ", eps=" + trained["eps"].map(lambda e: f"{e:g}"))
    blocks.append(Block("figure", figs.save(F.saturation(ctx.balance.data, trained if trained["final"].notna().any() else None),
                                            "saturation",
                                            "var/(var + eps) of the norm inputs (1 = eps irrelevant). Left: at init over widths, "
                                            "no training; right: the sweep's trials.")))
    return blocks, {}


def residual_balance(ctx: Context) -> Part:
    rb, slopes = ctx.balance.data, ctx.balance.slopes
    fig = ctx.figs.save(F.residual_balance(rb, slopes), "residual_balance",
                        "Log-log: measured ratio (solid) against the d^(1−γ) prediction (dashed, its constant fitted).")
    blocks = [
        Block("h2", "Residual balance at init (no training)"),
        Block("p", balance_setup(ctx.widths) + " The paper's argument: the update scales as d^(1−2γ) and the stream "
                   "as d^(−γ), so their ratio as d^(1−γ): it grows with width below γ = 1, shrinks above, and is "
                   "width-independent exactly at γ = 1 (a coordinate check in the spirit of μP's)."),
        Block("figure", fig),
        Block("table", pd.DataFrame({"γ": slopes["gamma"].map(lambda x: f"{x:g}"),
                                     "measured exponent": slopes["measured"].map(lambda x: f"{x:+.3f}"),
                                     "predicted 1−γ": slopes["predicted"].map(lambda x: f"{x:+.3f}"),
                                     "max/min over widths": slopes["spread"].map(lambda x: f"{x:.2f}×")}),
              "Slope of log ratio against log width."),
    ]
    return blocks, dict(residual_balance=dict(slopes=slopes.to_dict("records"), data=rb.to_dict("records")))
