"""The report's sections, except the mechanism's (sections_mechanism.py). Each takes the shared
Context and returns its blocks and its part of summary.json; report.build runs them in page order.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from smallinit.experiments.claims import anchor_phase, budgets
from smallinit.experiments.data.importance import importances
from smallinit.experiments.data.load import Sweep
from smallinit.experiments.fits import token_crossover
from smallinit.experiments.output import figures as F
from smallinit.experiments.output.render import Block

from . import findings, sections_protocol, token_crossover_section
from .context import Context, Part

PAPER_PARAMS = (0.1e9, 1.5e9)
PAPER_TOKENS = 1e12


def _num(v, fmt: str = ".4f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return format(v, fmt)


def scale_table(sweep: Sweep) -> tuple[pd.DataFrame, dict]:
    res, done = sweep.results, sweep.tuning.all_trials  # every complete trial, every lr
    rows = []
    for size, g in sorted(done.groupby("size"), key=lambda kv: kv[1]["n_params"].min()):
        r = g.iloc[0]
        same = (res["model"] == r["model"]) & (res["d_model"] == r["d_model"]) & (res["n_layers"] == r["n_layers"])
        n_all = int(same.sum())
        rows.append({
            "size": size, "params": f"{int(r['n_params']):,}", "d_model": int(r["d_model"]), "layers": int(r["n_layers"]),
            "tokens / trial": ", ".join(f"{int(t):,}" for t in sorted(g["tokens"].dropna().unique())),
            "passes": _passes(g),
            "complete trials": f"{len(g)} of {n_all}", "seeds": int(g["seed"].nunique()),
            "γ": ", ".join(f"{x:g}" for x in sorted(g["gamma"].unique())),
            "eps": ", ".join(f"{x:g}" for x in sorted(g["eps"].unique())),
            "gate": ", ".join(sorted(g["gate"].unique())),
            "lr": ", ".join(f"{x:g}" for x in sorted(done.loc[done["size"] == size, "lr"].dropna().unique())),
            "dtype": ", ".join(sorted(str(x) for x in g["dtype"].dropna().unique())) or "not recorded",
        })
    n_max = float(done["n_params"].max())
    t_max = float(done["tokens"].max()) if done["tokens"].notna().any() else float("nan")
    passes = pd.to_numeric(done["tokens"], errors="coerce") / pd.to_numeric(done["corpus_tokens"], errors="coerce")
    p_max = float(passes.max()) if passes.notna().any() else None
    info = dict(
        sweeps=[str(d) for d in sweep.dirs], sizes=len(rows), max_params=n_max, max_tokens=t_max, max_passes=p_max,
        trials=int(len(res)), complete=int(len(done)), compared=int(len(sweep.complete)),
        states=res["state"].value_counts().to_dict(),
        wall_s=float(pd.to_numeric(res.get("wall_s"), errors="coerce").sum()),
        params_below_paper=PAPER_PARAMS[0] / n_max, tokens_below_paper=PAPER_TOKENS / t_max if t_max else None,
    )
    return pd.DataFrame(rows), info


def _passes(g: pd.DataFrame) -> str:
    """Each distinct tokens / corpus training tokens of a size's trials: above a few, the trials
    measure memorisation. "not recorded" for tables written before trials recorded their corpus."""
    ratio = pd.to_numeric(g["tokens"], errors="coerce") / pd.to_numeric(g["corpus_tokens"], errors="coerce")
    ratio = ratio[np.isfinite(ratio)]
    return ", ".join(f"{x:.2f}" for x in sorted(ratio.round(2).unique())) or "not recorded"


def cell_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (size, setting, gamma): the metric's seed count, mean, standard deviation and range."""
    g = df.groupby(["size", "setting", "gamma"], sort=False)[metric]
    out = g.agg(seeds="count", mean="mean", sd="std", min="min", max="max").reset_index()
    order = df.drop_duplicates("size").set_index("size")["n_params"]
    return out.assign(_n=out["size"].map(order)).sort_values(["_n", "setting", "gamma"]).drop(columns="_n")


def title(ctx: Context) -> Part:
    sweep = ctx.sweep
    return [Block("h1", f"smallinit report: {sweep.name}")], dict(
        sweep=sweep.name, dirs=[str(d) for d in sweep.dirs], metric=ctx.metric, generated=time.time())


def lead(ctx: Context) -> Part:
    """What the sweep measured, in a few sentences from its data, above the claims (findings.py)."""
    sentences, summary = findings.lead(ctx.sweep, ctx.df, ctx.best, ctx.claims, ctx.metric)
    return [Block("lead", sentences, summary["command"] or "")], dict(findings=summary)


def header(ctx: Context) -> Part:
    """What was run and at what scale against the paper's."""
    sweep, df, metric, unigram = ctx.sweep, ctx.df, ctx.metric, ctx.unigram
    scale, info = scale_table(sweep)
    blocks = [Block("h2", "What was run")]
    blocks.append(Block("p", f"Sweep folder(s): {', '.join(str(d) for d in sweep.dirs)}. Generated {time.strftime('%Y-%m-%d %H:%M')}. "
                             f"Loss = {metric} (nats/token) of COMPLETE trials; {info['complete']} of "
                             f"{info['trials']} trials complete ({', '.join(f'{k}: {v}' for k, v in info['states'].items())})"
                             + (f"; {info['compared']} of them are at their setting's best lr and enter the comparisons."
                                if info["compared"] != info["complete"] else ".")))
    if sweep.left_out:
        blocks.append(Block("note", "Left out of every comparison, because the files in their folders changed since "
                                    "they finished: " + " ".join(sweep.left_out)))
    if sweep.damaged_records:
        blocks.append(Block("note", "Records of the sweep folder that could not be read: " + " ".join(sweep.damaged_records)))
    tok_txt = f"{info['max_tokens']:,.0f}" if math.isfinite(info["max_tokens"]) else "?"
    blocks.append(Block("note", f"Scale: {info['sizes']} model size(s), the largest {info['max_params'] / 1e6:.2f}M "
                                f"parameters trained on {tok_txt} tokens per trial"
                                + (f" (at most {info['max_passes']:.2f} passes over its corpus's training tokens)"
                                   if info["max_passes"] is not None else "")
                                + ". The paper trains 0.1B–1.5B-parameter "
                                f"models on 1T tokens: its smallest model has {info['params_below_paper']:.0f}× the "
                                f"parameters of the largest here" + (f", and it trains on {info['tokens_below_paper']:.1e}× the tokens"
                                                                     if info['tokens_below_paper'] else "")
                                + f". These are CPU-scale measurements, not a reproduction of the paper's setting "
                                f"(all trials together: {info['wall_s'] / 60:.1f} min of training)."))
    if math.isfinite(unigram) and df[metric].min() > unigram:
        blocks.append(Block("note", f"Every trial ends above the unigram entropy ({df[metric].min():.3f} > {unigram:.3f} nats): "
                                    "no model has learned more than token frequencies, so differences between arms say little "
                                    "about the paper's claims. Train longer (train.max_tokens) before reading the verdicts."))
    blocks.append(Block("table", scale, "What was run, per model size."))
    return blocks, dict(scale=dict(**info, table=scale.to_dict("records")))


def tuning(ctx: Context) -> Part:
    blocks, summary = sections_protocol.tuning_section(ctx.sweep, ctx.figs, ctx.metric)
    return blocks, dict(tuning=summary)


def failures(ctx: Context) -> Part:
    failed = ctx.sweep.results[ctx.sweep.results["state"] == "FAIL"]
    if failed.empty:
        return [], {}
    return [Block("p", f"{len(failed)} trial(s) failed:"),
            Block("list", [f"γ={r.gamma:g}, eps={r.eps:g}, gate={r.gate}, {r.model}: {r.fail_reason}"
                           for r in failed.itertuples()])], {}


def verdicts(ctx: Context) -> Part:
    from smallinit.experiments.claims.claims import CHECK
    from smallinit.experiments.stats.valnoise import record_sentence

    def table(checks: bool) -> pd.DataFrame:
        return pd.DataFrame([dict(claim=c.claim, verdict=c.verdict, why=c.reason) for c in ctx.claims
                             if (c.kind == CHECK) == checks])

    blocks = [Block("h2", "The paper's claims, as this data supports them"),
              Block("verdicts", table(False), "Details and numbers under 'Evidence for each claim' at the end.")]
    if not table(True).empty:  # deterministic measurements at init: not verdicts on trained models
        blocks.append(Block("verdicts", table(True), "Checks at init (deterministic, no training): listed apart "
                                                     "from the verdicts."))
    noise = record_sentence([n for c in ctx.claims for n in c.numbers])  # None without per-token losses
    if noise:
        blocks.append(Block("p", noise))
    return blocks, dict(claims=[c.as_dict() for c in ctx.claims])


def budget(ctx: Context) -> Part:
    blocks, summary = sections_protocol.budget_section(ctx.sweep, ctx.claims, ctx.figs, ctx.metric)
    return blocks, dict(budget=summary)


def crossover_by_budget(ctx: Context) -> Part:
    """A sweep that chose each budget's lr (protocol per_budget): the gap per budget and D*."""
    if ctx.budget_sweep is None or len(ctx.sweep.dirs) != 1:
        return [], dict(token_crossover=None)
    tc = token_crossover.from_sweep(ctx.sweep.dirs[0], ctx.budget_sweep.results, metric=ctx.metric)
    if tc is None:
        return [], dict(token_crossover=None)
    blocks, summary = token_crossover_section.section(tc, ctx.figs)
    return blocks, dict(token_crossover=summary)


def loss_vs_gamma(ctx: Context) -> Part:
    df, metric, best, curves, unigram = ctx.df, ctx.metric, ctx.best, ctx.curves, ctx.unigram
    blocks = [Block("h2", "Loss against γ, per arm"),
              Block("p", "An arm is a model size with a setting (eps, gate, norm and any other swept key); γ varies along "
                         "the x axis. Lines join seed means, dots are single trials, bars the seed standard deviation, the "
                         "star the best γ (lowest seed-mean loss)." + (f" Dotted: unigram entropy {unigram:.3f} nats, the "
                                                                        "loss of a model that learned only token frequencies." if math.isfinite(unigram) else "")),
              Block("figure", ctx.figs.save(F.metric_vs_gamma(df, metric, F.LOSS_Y, "Final validation loss against γ", best,
                                                              hline="unigram_entropy"),
                                            "loss_vs_gamma", "Loss against γ per arm; star = best γ."))]
    bt = best.assign(**{"best γ": best["best_gamma"].map(lambda x: f"{x:g}"), "loss": best["best_loss"].map(_num),
                        "runner-up γ": best["runner_up"].map(lambda x: "–" if x is None or pd.isna(x) else f"{x:g}"),
                        "runner-up − best": best["margin_text"].replace("", "–")})
    blocks.append(Block("table", bt[["size", "setting", "best γ", "loss", "seeds", "runner-up γ", "runner-up − best"]],
                        "Best γ per arm. The margin is the runner-up's loss minus the best's, paired by seed with its 95% "
                        "interval; with one seed it has no interval and names no winner."))
    if not curves.empty and curves["val_loss"].notna().any():
        blocks.append(Block("figure", ctx.figs.save(F.loss_curves(curves), "loss_curves",
                                                    "Validation loss over training, mean over seeds.")))
    # summary.json names a gamma curve `arm`: committed summaries and results_doc read that key.
    summary = dict(best_gamma=best.drop(columns=["margin_text"]).rename(columns={"gamma_curve": "arm"}).to_dict("records"),
                   cells=cell_table(df, metric).to_dict("records"))
    return blocks, summary


def anchor(ctx: Context) -> Part:
    if not ctx.anchor:
        return [], dict(anchor=None)
    phase = anchor_phase.phase_table(ctx.df)
    return anchor_phase.blocks(phase, ctx.figs), dict(anchor=phase.to_dict("records"))


def width(ctx: Context) -> Part:
    if ctx.anchor:
        return [], dict(width_trend=None)
    blocks, summary = sections_protocol.width_section(ctx.width_trend, ctx.figs)
    return blocks, dict(width_trend=summary)


def effective_size(ctx: Context) -> Part:
    if ctx.budgets is not None:  # several budgets: the L(N, D) fit replaces the L(N) one
        return budgets.section(ctx.budgets, ctx.figs, ctx.metric)
    es = ctx.effective
    blocks = [Block("h2", "Effective model size"),
              Block("p", "Fit L(N) = E + A·N^-α to the baseline variant over the sizes present; a variant with loss L at "
                         "size N matches a baseline of N_eff = (A/(L − E))^(1/α) parameters, a gain of N_eff/N − 1. "
                         f"N is the total parameter count. Baseline: γ = {ctx.baseline_gamma:g}, {es.baseline_setting}.")]
    if es.status == "fit":
        f = es.fit
        blocks.append(Block("p", f"Fit: E = {f.E:.4f} nats, A = {f.A:.4g}, α = {f.alpha:.4f} over {len(es.points)} sizes "
                                 f"(residual sum of squares {f.sse:.2e}; with exactly three sizes the fit is exact)."))
        blocks.append(Block("figure", ctx.figs.save(F.effective_size(es), "effective_size",
                                                    "Left: the baseline fit, other variants' losses; right: their gains with 95% intervals.")))
        g = es.gains
        if g is not None and not g.empty:
            gt = pd.DataFrame({
                "variant": g["variant"], "size": g["size"], "loss": g["loss"].map(_num), "seeds": g["seeds"],
                "N_eff": g["n_eff"].map(lambda x: f"{x:,.0f}" if math.isfinite(x) else "∞ (L < E)"),
                "gain": g["gain"].map(lambda x: f"{100 * x:+.1f}%" if math.isfinite(x) else "∞"),
                "95% interval": [f"[{100 * lo:+.1f}%, {100 * hi:+.1f}%]" if np.isfinite(lo) else "–"
                                 for lo, hi in zip(g.get("gain_lo", [np.nan] * len(g)), g.get("gain_hi", [np.nan] * len(g)))],
                "interval from": g.get("interval", pd.Series("–", index=g.index)),
            })
            blocks.append(Block("table", gt, "Effective size per variant and size."))
    else:
        blocks.append(Block("note", f"No fit: {es.status}"))
    summary = dict(
        status=es.status, baseline_gamma=es.baseline_gamma, baseline_setting=es.baseline_setting,
        fit=None if es.fit is None else dict(E=es.fit.E, A=es.fit.A, alpha=es.fit.alpha, sse=es.fit.sse),
        points=None if es.points is None else es.points.to_dict("records"),
        gains=None if es.gains is None else es.gains.to_dict("records"), bootstrap_replicates=es.boot_fits)
    return blocks, dict(effective_size=summary)


def tokens(ctx: Context) -> Part:
    tok = ctx.tokens
    blocks = [Block("h2", "Token level: where the gain sits"),
              Block("p", "Δ_sym = (p_A − p_B) / (p_A + p_B), p = exp(−loss) of the true token (equivalently tanh((loss_B − "
                         "loss_A)/2)); positive where A predicts the token better. Difficulty = the token's mean loss over "
                         "the trials of that size other than A's and B's (every trial when fewer than two others; measured on A and "
                         "B alone it would correlate with their gap by construction); quintiles 1 (easiest) to 5 (hardest); "
                         "'moderate-to-hard' = quintiles 3–5. Means are per seed pair, then averaged.")]
    if tok.results:
        blocks.append(Block("p", f"A = {tok.a}; B = {tok.b}. " + "; ".join(
            f"{t.size}: {t.n_tokens:,} eval tokens, difficulty from {t.n_trials_difficulty} {t.difficulty_from}, {t.interval}"
            for t in tok.results)))
        blocks.append(Block("figure", ctx.figs.save(F.token_gain(tok.results), "token_gain",
                                                    "Mean Δ_sym by difficulty quintile (left) and along difficulty (right).")))
        for t in tok.results:
            b = t.buckets
            blocks.append(Block("table", pd.DataFrame({
                "quintile": b["bucket"].astype(str) + " " + b["name"],
                "difficulty [nats]": [f"{lo:.2f}–{hi:.2f}" for lo, hi in zip(b["difficulty_lo"], b["difficulty_hi"])],
                "tokens": b["tokens"], "mean Δ_sym": b["mean_delta"].map(lambda x: f"{x:+.4f}"),
                "95% interval": [f"[{lo:+.4f}, {hi:+.4f}]" for lo, hi in zip(b["ci_lo"], b["ci_hi"])],
            }), f"{t.size}: mean Δ_sym per difficulty quintile ({t.interval})."))
    else:
        blocks.append(Block("note", f"No token-level comparison: {tok.why_not}."))
    summary = dict(
        formula="Delta_sym = (p_A - p_B) / (p_A + p_B), p = exp(-loss of the true token)", a=tok.a, b=tok.b,
        note=tok.why_not,
        results=[dict(size=t.size, n_tokens=t.n_tokens, pairs=t.pairs, interval=t.interval,
                      buckets=t.buckets.to_dict("records"), overall=t.overall.as_dict(), hard=t.hard.as_dict(),
                      hard_minus_easy=t.hard_minus_easy.as_dict()) for t in tok.results])
    return blocks, dict(tokens=summary)


def optuna_importances(ctx: Context) -> Part:
    sweep = ctx.sweep
    imps, notes = {}, []
    for d in sweep.dirs:
        values, note = importances(d, sweep.results[sweep.results["sweep"] == d.name])
        if note:
            notes.append(note)
        if values:
            imps[d.name] = values
    if not notes:  # grids only: their points were fixed, not searched; the tables compare them
        return [], dict(importances=dict(values={}, notes=[]))
    blocks = [Block("h2", "Optuna parameter importances"), Block("list", notes)]
    if imps:
        blocks.append(Block("figure", ctx.figs.save(F.importances(imps), "importances",
                                                    "Parameter importances per searched study.")))
    return blocks, dict(importances=dict(values=imps, notes=notes))


def evidence(ctx: Context) -> Part:
    blocks = [Block("h2", "Evidence for each claim"),
              Block("p", "Rule: arms are compared paired by seed (init_seed, train_seed), each at its own best lr when the "
                         "sweep has an lr axis; a difference is real only when its 95% t-interval excludes 0 and the sign "
                         "of the mean gap held over the last quarter of training. Supported = every comparison real in the "
                         "predicted direction; contradicted = one real in the opposite direction; inconclusive = the rest "
                         "(one seed, a ranking still changing, or a null: then the effects larger than the interval's far "
                         "end are what the data excludes); not run = the sweep has nothing to compare.")]
    for c in ctx.claims:
        blocks.append(Block("h3", f"{c.claim} — {c.verdict}"))
        blocks.append(Block("p", f"Paper: {c.paper}. Verdict: {c.verdict} ({c.reason})."))
        if c.evidence:
            blocks.append(Block("list", c.evidence))
    return blocks, {}
