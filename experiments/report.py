"""`make report`: what a sweep says about gamma, effective model size and the paper's claims.

    python -m experiments.report                              # the newest sweeps/*/results.parquet
    python -m experiments.report --sweep sweeps/a,sweeps/b    # several sweeps (one per size) together
    python -m experiments.report --arms 'gamma=1,eps=1e-12' 'gamma=0.5,eps=1e-5' --baseline-gamma 0.5

Writes reports/<sweep-name>/: index.html (self-contained), report.md, the figures as PNG and
summary.json (best gamma per arm, the effective-size fit and gains, the claims table).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from . import anchor as anchor_mod
from . import claims as claims_mod
from . import figures as F
from . import protocol
from .importance import importances
from .load import LOSS, ReportError, Sweep, load, recipe_variant, resolve_dirs, variant_of
from .mechanism import balance_slopes, heatmap_panels, probe_curves, residual_balance, trajectories
from .render import Block, to_html, to_markdown
from .scaling import effective_size
from .stats import compare
from .tokens import analyse
from .width import width_trend

PAPER_PARAMS = (0.1e9, 1.5e9)
PAPER_TOKENS = 1e12
DEFAULT_WIDTHS = (64, 128, 256, 512, 1024, 2048)
DEFAULT_GAMMAS = (0.5, 0.75, 1.0, 1.25)


def _num(v, fmt: str = ".4f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return format(v, fmt)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, pd.DataFrame):
        return _jsonable(obj.to_dict("records"))
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating | float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def best_gamma_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per arm: the gamma with the lowest seed-mean loss, and the runner-up compared paired."""
    rows = []
    for arm, g in df.groupby("arm"):
        means = g.groupby("gamma")[metric].mean().sort_values()
        best = float(means.index[0])
        row = dict(arm=arm, size=g["size"].iloc[0], setting=g["setting"].iloc[0], best_gamma=best,
                   best_loss=float(means.iloc[0]), seeds=int(g[np.isclose(g["gamma"], best)]["seed"].nunique()),
                   gammas=[float(x) for x in sorted(means.index)], runner_up=None, margin=None, margin_text="")
        if len(means) > 1:
            second = float(means.index[1])
            c = compare(g[np.isclose(g["gamma"], second)], g[np.isclose(g["gamma"], best)], metric)
            row.update(runner_up=second, margin=c.as_dict(), margin_text=c.text())
        rows.append(row)
    return pd.DataFrame(rows)


def cell_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (size, setting, gamma): the metric's seed count, mean, standard deviation and range."""
    g = df.groupby(["size", "setting", "gamma"], sort=False)[metric]
    out = g.agg(seeds="count", mean="mean", sd="std", min="min", max="max").reset_index()
    order = df.drop_duplicates("size").set_index("size")["n_params"]
    return out.assign(_n=out["size"].map(order)).sort_values(["_n", "setting", "gamma"]).drop(columns="_n")


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
            "complete trials": f"{len(g)} of {n_all}", "seeds": int(g["seed"].nunique()),
            "γ": ", ".join(f"{x:g}" for x in sorted(g["gamma"].unique())),
            "eps": ", ".join(f"{x:g}" for x in sorted(g["eps"].unique())),
            "gate": ", ".join(sorted(g["gate"].unique())),
            "lr": ", ".join(f"{x:g}" for x in sorted(sweep.tuning.all_trials.loc[
                sweep.tuning.all_trials["size"] == size, "lr"].dropna().unique())),
            "dtype": ", ".join(sorted(str(x) for x in g["dtype"].dropna().unique())) or "not recorded",
        })
    n_max = float(done["n_params"].max())
    t_max = float(done["tokens"].max()) if done["tokens"].notna().any() else float("nan")
    info = dict(
        sweeps=[str(d) for d in sweep.dirs], sizes=len(rows), max_params=n_max, max_tokens=t_max,
        trials=int(len(res)), complete=int(len(done)), compared=int(len(sweep.complete)),
        states=res["state"].value_counts().to_dict(),
        wall_s=float(pd.to_numeric(res.get("wall_s"), errors="coerce").sum()),
        params_below_paper=PAPER_PARAMS[0] / n_max, tokens_below_paper=PAPER_TOKENS / t_max if t_max else None,
    )
    return pd.DataFrame(rows), info


def build(dirs: list[Path], out_root: Path = Path("reports"), baseline_gamma: float = 0.5,
          baseline: dict[str, str] | None = None, arms: list[str] | None = None, metric: str = LOSS,
          widths=DEFAULT_WIDTHS, gammas=DEFAULT_GAMMAS, n_boot: int = 500, log=print) -> Path:
    t0 = time.time()
    sweep = load(dirs, metric)
    df = sweep.complete
    out = Path(out_root) / sweep.name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    figs = F.Figures(out)
    blocks: list[Block] = []
    add = blocks.append

    # --- scale ---------------------------------------------------------------------------------
    scale, scale_info = scale_table(sweep)
    unigram = df["unigram_entropy"].mean()

    # --- loss against gamma --------------------------------------------------------------------
    best = best_gamma_table(df, metric)
    curves = probe_curves(sweep)

    # --- effective size ------------------------------------------------------------------------
    try:
        es = effective_size(sweep, baseline_gamma, baseline, metric, n_boot=n_boot)
    except ValueError as e:
        raise ReportError(str(e)) from None
    base_variant = (df[np.isclose(df["gamma"], baseline_gamma) & (df["setting"] == es.baseline_setting)]["variant"]
                    .iloc[0] if es.baseline_setting else None)
    recipe = recipe_variant(df, base_variant)

    # --- tokens --------------------------------------------------------------------------------
    if arms:
        if len(arms) != 2:
            raise ReportError(f"--arms takes two selectors (A then B), got {len(arms)}")
        var_a, var_b = variant_of(df, arms[0]), variant_of(df, arms[1])
    else:
        var_a, var_b = recipe, base_variant
    token_results, token_notes = [], []
    if var_a and var_b and var_a != var_b:
        for size in df.sort_values("n_params")["size"].unique():
            have = set(df[df["size"] == size]["variant"])
            if var_a in have and var_b in have:
                r = analyse(sweep, var_a, var_b, size)
                (token_notes if isinstance(r, str) else token_results).append(r)
    if token_results:
        token_why = None
    elif token_notes:
        token_why = "; ".join(token_notes)
    elif var_b is None:
        token_why = f"no trial at the baseline γ = {baseline_gamma:g} (pass --arms A B, e.g. --arms gamma=1 gamma=0.75)"
    elif var_a is None or var_a == var_b:
        token_why = "the sweep has only one arm"
    else:
        token_why = f"{var_a} and {var_b} never ran at the same size"

    # --- mechanism -----------------------------------------------------------------------------
    traj = trajectories(curves) if not curves.empty else pd.DataFrame()
    step0 = curves[curves["step"] == 0].set_index("identity") if not curves.empty else pd.DataFrame()
    sat_init = pd.DataFrame({"identity": df["identity"],
                             "init": df["identity"].map(step0["saturation"]) if not step0.empty else np.nan,
                             "final": df["saturation"]})
    log(f"residual balance at init over widths {list(widths)} ...")
    rb = residual_balance(widths=widths, gammas=gammas)
    slopes = balance_slopes(rb)

    # --- importances ---------------------------------------------------------------------------
    imps, imp_notes = {}, []
    for d in sweep.dirs:
        values, note = importances(d, sweep.results[sweep.results["sweep"] == d.name])
        imp_notes.append(note)
        if values:
            imps[d.name] = values

    # --- claims --------------------------------------------------------------------------------
    anchor = anchor_mod.has_anchor(df)
    trend = width_trend(df, recipe, base_variant, metric)
    if anchor:  # the anchor task's loss is not a language-modelling loss: only its own claim applies
        claims = [anchor_mod.anchor_claim(df), claims_mod.residual_claim(slopes)]
    else:
        claims = [
            claims_mod.best_gamma_claim(sweep, best, metric),
            claims_mod.eps_claim(sweep, metric, sat_init),
            claims_mod.gate_claim(sweep, metric),
            claims_mod.recipe_claim(sweep, base_variant, recipe, metric),
            claims_mod.token_claim(token_results, token_why),
            claims_mod.condensation_claim(traj),
            claims_mod.effective_size_claim(es, recipe),
            protocol.width_claim(trend),
            claims_mod.residual_claim(slopes),
        ]
    tuning_blocks, tuning_summary = protocol.tuning_section(sweep, figs, metric)
    budget_blocks, budget_summary = protocol.budget_section(sweep, claims, figs, metric)
    width_blocks, width_summary = protocol.width_section(trend, figs) if not anchor else ([], None)

    # === the page ==============================================================================
    add(Block("h1", f"smallinit report: {sweep.name}"))
    add(Block("p", f"Sweep folder(s): {', '.join(str(d) for d in sweep.dirs)}. Generated {time.strftime('%Y-%m-%d %H:%M')}. "
                   f"Loss = {metric} (nats/token) of COMPLETE trials; {scale_info['complete']} of "
                   f"{scale_info['trials']} trials complete ({', '.join(f'{k}: {v}' for k, v in scale_info['states'].items())})"
                   + (f"; {scale_info['compared']} of them are at their setting's best lr and enter the comparisons."
                      if scale_info["compared"] != scale_info["complete"] else ".")))
    tok_txt = f"{scale_info['max_tokens']:,.0f}" if math.isfinite(scale_info["max_tokens"]) else "?"
    add(Block("note", f"Scale: {scale_info['sizes']} model size(s), the largest {scale_info['max_params'] / 1e6:.2f}M "
                      f"parameters trained on {tok_txt} tokens per trial. The paper trains 0.1B–1.5B-parameter "
                      f"models on 1T tokens: its smallest model has {scale_info['params_below_paper']:.0f}× the "
                      f"parameters of the largest here" + (f", and it trains on {scale_info['tokens_below_paper']:.1e}× the tokens"
                                                           if scale_info['tokens_below_paper'] else "")
                      + f". These are CPU-scale measurements, not a reproduction of the paper's setting "
                      f"(all trials together: {scale_info['wall_s'] / 60:.1f} min of training)."))
    if math.isfinite(unigram) and df[metric].min() > unigram:
        add(Block("note", f"Every trial ends above the unigram entropy ({df[metric].min():.3f} > {unigram:.3f} nats): "
                          "no model has learned more than token frequencies, so differences between arms say little "
                          "about the paper's claims. Train longer (train.max_tokens) before reading the verdicts."))
    add(Block("table", scale, "What was run, per model size."))
    blocks += tuning_blocks
    failed = sweep.results[sweep.results["state"] == "FAIL"]
    if not failed.empty:
        add(Block("p", f"{len(failed)} trial(s) failed:"))
        add(Block("list", [f"γ={r.gamma:g}, eps={r.eps:g}, gate={r.gate}, {r.model}: {r.fail_reason}" for r in failed.itertuples()]))

    add(Block("h2", "The paper's claims, as this data supports them"))
    add(Block("verdicts", pd.DataFrame([dict(claim=c.claim, verdict=c.verdict, why=c.reason) for c in claims]),
              "Details and numbers under 'Evidence for each claim' at the end."))
    blocks += budget_blocks

    add(Block("h2", "Loss against γ, per arm"))
    add(Block("p", "An arm is a model size with a setting (eps, gate, norm and any other swept key); γ varies along "
                   "the x axis. Lines join seed means, dots are single trials, bars the seed standard deviation, the "
                   "star the best γ (lowest seed-mean loss)." + (f" Dotted: unigram entropy {unigram:.3f} nats, the "
                                                                  "loss of a model that learned only token frequencies." if math.isfinite(unigram) else "")))
    add(Block("figure", figs.save(F.metric_vs_gamma(df, metric, F.LOSS_Y, "Final validation loss against γ", best,
                                                    hline="unigram_entropy"),
                                  "loss_vs_gamma", "Loss against γ per arm; star = best γ.")))
    bt = best.assign(**{"best γ": best["best_gamma"].map(lambda x: f"{x:g}"), "loss": best["best_loss"].map(_num),
                        "runner-up γ": best["runner_up"].map(lambda x: "–" if x is None or pd.isna(x) else f"{x:g}"),
                        "runner-up − best": best["margin_text"].replace("", "–")})
    add(Block("table", bt[["size", "setting", "best γ", "loss", "seeds", "runner-up γ", "runner-up − best"]],
              "Best γ per arm. The margin is the runner-up's loss minus the best's, paired by seed with its 95% "
              "interval; with one seed it has no interval and names no winner."))
    if not curves.empty and curves["val_loss"].notna().any():
        add(Block("figure", figs.save(F.loss_curves(curves), "loss_curves", "Validation loss over training, mean over seeds.")))

    phase = anchor_mod.phase_table(df) if anchor else None
    if anchor:
        blocks += anchor_mod.blocks(phase, figs)

    blocks += width_blocks
    add(Block("h2", "Effective model size"))
    add(Block("p", "Fit L(N) = E + A·N^-α to the baseline variant over the sizes present; a variant with loss L at "
                   "size N matches a baseline of N_eff = (A/(L − E))^(1/α) parameters, a gain of N_eff/N − 1. "
                   f"N is the total parameter count. Baseline: γ = {baseline_gamma:g}, {es.baseline_setting}."))
    if es.status == "fit":
        f = es.fit
        add(Block("p", f"Fit: E = {f.E:.4f} nats, A = {f.A:.4g}, α = {f.alpha:.4f} over {len(es.points)} sizes "
                       f"(residual sum of squares {f.sse:.2e}; with exactly three sizes the fit is exact)."))
        add(Block("figure", figs.save(F.effective_size(es), "effective_size",
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
            add(Block("table", gt, "Effective size per variant and size."))
    else:
        add(Block("note", f"No fit: {es.status}"))

    add(Block("h2", "Token level: where the gain sits"))
    add(Block("p", "Δ_sym = (p_A − p_B) / (p_A + p_B), p = exp(−loss) of the true token (equivalently tanh((loss_B − "
                   "loss_A)/2)); positive where A predicts the token better. Difficulty = the token's mean loss over "
                   "the trials of that size other than A's and B's (every trial when fewer than two others; measured on A and "
                   "B alone it would correlate with their gap by construction); quintiles 1 (easiest) to 5 (hardest); "
                   "'moderate-to-hard' = quintiles 3–5. Means are per seed pair, then averaged."))
    if token_results:
        add(Block("p", f"A = {var_a}; B = {var_b}. " + "; ".join(
            f"{t.size}: {t.n_tokens:,} eval tokens, difficulty from {t.n_trials_difficulty} {t.difficulty_from}, {t.interval}"
            for t in token_results)))
        add(Block("figure", figs.save(F.token_gain(token_results), "token_gain",
                                      "Mean Δ_sym by difficulty quintile (left) and along difficulty (right).")))
        for t in token_results:
            b = t.buckets
            add(Block("table", pd.DataFrame({
                "quintile": b["bucket"].astype(str) + " " + b["name"],
                "difficulty [nats]": [f"{lo:.2f}–{hi:.2f}" for lo, hi in zip(b["difficulty_lo"], b["difficulty_hi"])],
                "tokens": b["tokens"], "mean Δ_sym": b["mean_delta"].map(lambda x: f"{x:+.4f}"),
                "95% interval": [f"[{lo:+.4f}, {hi:+.4f}]" for lo, hi in zip(b["ci_lo"], b["ci_hi"])],
            }), f"{t.size}: mean Δ_sym per difficulty quintile ({t.interval})."))
    else:
        add(Block("note", f"No token-level comparison: {token_why}."))

    add(Block("h2", "Mechanism"))
    largest = df.sort_values("n_params")["size"].iloc[-1]
    if not curves.empty and curves["row_cosine"].notna().any():
        add(Block("h3", "Condensation then expansion"))
        add(Block("figure", figs.save(F.probe_curves(curves, largest), "condensation",
                                      "Mean row-wise |cos| and stable rank of the block matrices over training "
                                      "(lines with markers: seed means).")))
        if not traj.empty:
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
            add(Block("table", tt.drop(columns=["trials"]).rename(columns={
                "start": "|cos| step 0", "peak": "|cos| peak", "peak_step": "peak step", "final": "|cos| end",
                "rank_start": "rank step 0", "rank_min": "rank min", "rank_final": "rank end"}),
                "Row |cos| and stable rank per variant (seed means); the outcome counts trials by what their |cos| "
                "curve did (condense: > 10% rise after step 0; expand: falls back > 10% of the rise)."))
        variants = [v for v in dict.fromkeys([base_variant, recipe, *_extreme(df, recipe, largest)]) if v]
        hm = heatmap_panels(sweep, variants, largest)
        if hm is not None:
            name, steps, panels = hm
            add(Block("figure", figs.save(F.heatmaps(name, steps, panels, largest), "cosine_heatmaps",
                                          f"Cosine similarity between the first rows of {name} (first seed), at init, "
                                          "at the snapshot where small init is most condensed, and at the end.")))
    else:
        add(Block("note", "No probe curves (probes were off: train.probe_every=0), so no condensation picture."))
    add(Block("h3", "Attention sink"))
    sink = df.assign(sink_init=df["identity"].map(step0["attn_sink"]) if not step0.empty else np.nan)
    if sink["attn_sink"].notna().any():
        add(Block("figure", figs.save(F.attention_sink(sink), "attention_sink",
                                      "Mean attention on the first token (queries 1..T−1, all heads and layers).")))
    else:
        add(Block("note", "No attention-sink probe in the results."))
    add(Block("h3", "Norm saturation"))
    trained = sat_init.merge(df[["identity", "gamma", "eps", "size"]], on="identity")
    trained = trained.assign(label=trained["size"].str.split(" ").str[0] + ", eps=" + trained["eps"].map(lambda e: f"{e:g}"))
    add(Block("figure", figs.save(F.saturation(rb, trained if trained["final"].notna().any() else None), "saturation",
                                  "var/(var + eps) of the norm inputs (1 = eps irrelevant). Left: at init over widths, "
                                  "no training; right: the sweep's trials.")))

    add(Block("h2", "Residual balance at init (no training)"))
    add(Block("p", f"Transformer(ModelConfig(d_model=d, n_layers=2, heads of 64, d_ff=2d, vocab 256, eps=1e-12)) at "
                   f"widths {', '.join(map(str, widths))}, one forward pass over 2×32 random tokens, "
                   "model.probes.activation_probes()['residual_ratio/mean'] = ‖block update‖/‖block input‖. The paper's "
                   "argument: the update scales as d^(1−2γ) and the stream as d^(−γ), so their ratio as d^(1−γ): it grows "
                   "with width below γ = 1, shrinks above, and is width-independent exactly at γ = 1 (a coordinate check "
                   "in the spirit of μP's)."))
    add(Block("figure", figs.save(F.residual_balance(rb, slopes), "residual_balance",
                                  "Log-log: measured ratio (solid) against the d^(1−γ) prediction (dashed, its constant fitted).")))
    add(Block("table", pd.DataFrame({"γ": slopes["gamma"].map(lambda x: f"{x:g}"),
                                     "measured exponent": slopes["measured"].map(lambda x: f"{x:+.3f}"),
                                     "predicted 1−γ": slopes["predicted"].map(lambda x: f"{x:+.3f}"),
                                     "max/min over widths": slopes["spread"].map(lambda x: f"{x:.2f}×")}),
              "Slope of log ratio against log width."))

    add(Block("h2", "Optuna parameter importances"))
    add(Block("list", imp_notes))
    if imps:
        add(Block("figure", figs.save(F.importances(imps), "importances", "Parameter importances per searched study.")))

    add(Block("h2", "Evidence for each claim"))
    add(Block("p", "Rule: arms are compared paired by seed (init_seed, train_seed), each at its own best lr when the "
                   "sweep has an lr axis; a difference is real only when its 95% t-interval excludes 0 and the sign "
                   "of the mean gap held over the last quarter of training. Supported = every comparison real in the "
                   "predicted direction; contradicted = one real in the opposite direction; inconclusive = the rest "
                   "(one seed, a ranking still changing, or a null: then the effects larger than the interval's far "
                   "end are what the data excludes); not run = the sweep has nothing to compare."))
    for c in claims:
        add(Block("h3", f"{c.claim} — {c.verdict}"))
        add(Block("p", f"Paper: {c.paper}. Verdict: {c.verdict} ({c.reason})."))
        if c.evidence:
            add(Block("list", c.evidence))

    # === write ==================================================================================
    (out / "report.md").write_text(to_markdown(blocks))
    (out / "index.html").write_text(to_html(blocks, f"smallinit report: {sweep.name}", out))
    summary = dict(
        sweep=sweep.name, dirs=[str(d) for d in sweep.dirs], metric=metric, generated=time.time(),
        scale=dict(**scale_info, table=scale.to_dict("records")),
        best_gamma=best.drop(columns=["margin_text"]).to_dict("records"),
        cells=cell_table(df, metric).to_dict("records"),
        effective_size=dict(
            status=es.status, baseline_gamma=es.baseline_gamma, baseline_setting=es.baseline_setting,
            fit=None if es.fit is None else dict(E=es.fit.E, A=es.fit.A, alpha=es.fit.alpha, sse=es.fit.sse),
            points=None if es.points is None else es.points.to_dict("records"),
            gains=None if es.gains is None else es.gains.to_dict("records"), bootstrap_replicates=es.boot_fits),
        tokens=dict(
            formula="Delta_sym = (p_A - p_B) / (p_A + p_B), p = exp(-loss of the true token)", a=var_a, b=var_b,
            note=token_why,
            results=[dict(size=t.size, n_tokens=t.n_tokens, pairs=t.pairs, interval=t.interval,
                          buckets=t.buckets.to_dict("records"), overall=t.overall.as_dict(), hard=t.hard.as_dict(),
                          hard_minus_easy=t.hard_minus_easy.as_dict()) for t in token_results]),
        residual_balance=dict(slopes=slopes.to_dict("records"), data=rb.to_dict("records")),
        importances=dict(values=imps, notes=imp_notes),
        anchor=None if phase is None else phase.to_dict("records"),
        tuning=tuning_summary, budget=budget_summary, width_trend=width_summary,
        claims=[c.as_dict() for c in claims],
        figures=figs.as_dicts(),
        build_s=time.time() - t0,
    )
    (out / "summary.json").write_text(json.dumps(_jsonable(summary), indent=1, ensure_ascii=False))
    return out


def _extreme(df: pd.DataFrame, recipe: str | None, size: str) -> list[str]:
    """The largest-gamma variant in the recipe's setting (to show what happens past gamma = 1)."""
    if recipe is None:
        return []
    setting = df[df["variant"] == recipe]["setting"].iloc[0]
    d = df[(df["setting"] == setting) & (df["size"] == size)]
    return [] if d.empty else [d.sort_values("gamma")["variant"].iloc[-1]]


def _parse_kv(spec: str | None) -> dict[str, str] | None:
    if not spec:
        return None
    out = {}
    for part in spec.split(","):
        if "=" not in part:
            raise ReportError(f"--baseline {spec!r}: {part!r} is not key=value")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.report", description=__doc__.split("\n")[0])
    p.add_argument("--sweep", help="sweep folder(s), comma-separated (default: the newest sweeps/*/results.parquet)")
    p.add_argument("--sweeps-root", default="sweeps", help="where to look for the newest sweep")
    p.add_argument("--out", default="reports", help="reports are written to OUT/<sweep-name>/")
    p.add_argument("--baseline-gamma", type=float, default=0.5, help="gamma of the effective-size baseline")
    p.add_argument("--baseline", help="the baseline's other settings, e.g. 'eps=1e-5,gate=none'")
    p.add_argument("--arms", nargs=2, metavar=("A", "B"), help="token-level arms, e.g. 'gamma=1,eps=1e-12' 'gamma=0.5'")
    p.add_argument("--metric", default=LOSS, choices=(LOSS, "best_val_loss"))
    p.add_argument("--widths", default=",".join(map(str, DEFAULT_WIDTHS)), help="residual-balance widths")
    p.add_argument("--boot", type=int, default=500, help="bootstrap replicates for the effective-size intervals")
    a = p.parse_args(argv)
    try:
        widths = tuple(int(w) for w in a.widths.split(",") if w.strip())
        if not widths or any(w < 8 for w in widths):
            raise ReportError(f"--widths {a.widths!r}: give integers >= 8, e.g. 64,128,256")
        out = build(resolve_dirs(a.sweep, Path(a.sweeps_root)), Path(a.out), a.baseline_gamma, _parse_kv(a.baseline),
                    a.arms, a.metric, widths=widths, n_boot=a.boot, log=lambda m: print(m, file=sys.stderr))
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        if "invalid literal" in str(e):
            print(f"error: --widths {a.widths!r}: give integers, e.g. 64,128,256", file=sys.stderr)
            return 2
        raise
    print(f"report: {out / 'index.html'}")
    print(f"        {out / 'report.md'}, {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
