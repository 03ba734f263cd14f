"""The report over several token budgets (train.budgets): where the baseline arm ran at >= 2
budgets and >= 2 widths, the joint fit L(N, D) replaces the one-budget L(N) fit (scaling.py).

The arms are the effective-size baseline (γ = --baseline-gamma in its conventional setting) and
the paper's recipe as far as the sweep has it (load.recipe_variant), each over every budget: a
budget row's setting names its `tokens`, which is left out when the rows of an arm are gathered.
Only compared rows enter (sweep.complete: role=confirm at the cell's chosen lr, tuning.py).
vocab_size, tie_embeddings and seq_len (for N and the FLOPs) come from the trials' trial.json.

What the page shows (effective_size.py and crossover.py do the fitting): loss against training
compute per arm with the baseline's fitted curve per width; N_eff/N and the compute multiplier per
measured recipe cell with their seed-bootstrap intervals; the fitted recipe-minus-baseline gap over
(width, budget) with the measured cells marked; and the verdicts on the effective size and on
whether the recipe's advantage grows with width and with tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from smallinit.core.trial_dir import TrialDir
from smallinit.experiments.data.load import Sweep
from smallinit.experiments.fits.crossover import (
    Crossing,
    Crossover,
    crossover,
    paying_budget,
    preset_width,
    saddle_text,
    summary_dict,
)
from smallinit.experiments.fits.effective_size import (
    BUDGET,
    EffectiveSize,
    effective_size,
    flops_per_token,
    non_embedding_params,
)
from smallinit.experiments.output.figures import LOSS_Y, color_map, plt
from smallinit.experiments.output.render import Block
from smallinit.experiments.stats.paired import holm, one_comparison, t_interval
from smallinit.experiments.stats.stats import (
    ALPHA_ONE_SIDED,
    CONTRADICTED,
    INCONCLUSIVE,
    NOT_RUN,
    SUPPORTED,
)

from .claims import Claim

PRESET = "0.1b"  # the paper's smallest model: the width at which the paying budget is read
# Setting columns that name a budget row's budget (or follow it), not the arm.
NOT_ARM = ("tokens",)
COMPUTE_X = "training compute C = F·D [FLOPs]"


@dataclass
class BudgetFit:
    baseline: str  # the arms' labels
    recipe: str | None
    base_rows: pd.DataFrame
    rec_rows: pd.DataFrame
    shape: dict  # vocab_size, seq_len, tie_embeddings
    es: EffectiveSize
    co: Crossover
    pays_at: Crossing | None

    def summary(self) -> dict:
        out = summary_dict(self.es, self.co, PRESET if self.pays_at else None, self.pays_at)
        out["effective_size"].update(baseline=self.baseline, recipe=self.recipe, **self.shape)
        return out


def arm_rows(df: pd.DataFrame, variant: str | None, setting_cols: list[str]) -> pd.DataFrame:
    """Every budget's rows of the arm `variant` belongs to: its γ and setting, less the budget.
    `variant` may be labelled without the budget (the largest-budget sweep's label)."""
    if variant is None:
        return df.iloc[:0]
    same = df[df["variant"].map(arm_label) == arm_label(variant)]
    if same.empty:
        return df.iloc[:0]
    ref = same.iloc[0]
    mask = np.isclose(df["gamma"].astype(float), float(ref["gamma"]))
    for col in (c for c in setting_cols if c not in NOT_ARM):
        mask &= (df[col] == ref[col]) | (df[col].isna() & pd.isna(ref[col]))
    return df[mask]


def arm_label(variant: str | None) -> str | None:
    """'γ=0.5 | eps=1e-5, gate=none, tokens=512' -> 'γ=0.5 | eps=1e-5, gate=none'."""
    if variant is None:
        return None
    head, _, setting = variant.partition(" | ")
    kept = [p for p in setting.split(", ") if p.split("=")[0] not in NOT_ARM]
    return " | ".join([head, ", ".join(kept)]) if kept else head


def applies(df: pd.DataFrame, base: pd.DataFrame) -> bool:
    return BUDGET in df and base[BUDGET].nunique() >= 2 and base["d_model"].nunique() >= 2


def trial_shape(rows: pd.DataFrame) -> tuple[dict | None, str]:
    """(vocab_size, tie_embeddings and seq_len from the trials' trial.json, or None; why not)."""
    found: dict[str, set] = {"vocab_size": set(), "tie_embeddings": set(), "seq_len": set()}
    for folder in rows["trial_dir"].dropna().unique() if "trial_dir" in rows else ():
        try:  # through the one reader of a trial's files; a damaged trial.json counts as absent
            config = (TrialDir(folder).read_trial(damaged_ok=True) or {})["config"]
            found["vocab_size"].add(int(config["model"]["vocab_size"]))
            found["tie_embeddings"].add(bool(config["model"]["tie_embeddings"]))
            found["seq_len"].add(int(config["train"]["seq_len"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    for key, values in found.items():
        if not values:
            return None, (f"no readable trial.json under the trials' trial_dir, so no {key} to count N and FLOPs "
                          "with (rerun the sweep's command to rebuild its trial folders)")
        if len(values) > 1:
            return None, (f"the fitted trials differ in {key} ({', '.join(map(str, sorted(values)))}): N and FLOPs "
                          "are counted with one value; report those sweeps apart")
    return {k: v.pop() for k, v in found.items()}, ""


def analyse(sweep: Sweep, base_variant: str | None, recipe: str | None, metric: str, n_boot: int) -> BudgetFit | None:
    """The several-budget fits, or None where the sweep is a one-budget one (the L(N) fit applies)."""
    df = sweep.complete
    base = arm_rows(df, base_variant, sweep.setting_cols)
    if base.empty or not applies(df, base):
        return None
    rec = arm_rows(df, recipe, sweep.setting_cols)
    shape, why = trial_shape(pd.concat([base, rec]))
    if shape is None:
        es = EffectiveSize(f"no L(N, D) fit: {why}", baseline_cells=base.groupby(["d_model", BUDGET]).ngroups)
        shape = {}
    else:
        es = effective_size(base, rec, vocab_size=shape["vocab_size"], seq_len=shape["seq_len"],
                            tie_embeddings=shape["tie_embeddings"], metric=metric, n_boot=n_boot)
    co = crossover(base, rec, metric)
    pays = paying_budget(co, preset_width(PRESET)) if co.status == "fit" else None
    return BudgetFit(arm_label(base_variant), arm_label(recipe), base, rec, shape, es, co, pays)


# --- claims ----------------------------------------------------------------------------------------

def _ratio(v: float, ci) -> str:
    return f"{v:.3g} " + (_ci(ci) if _ci(ci) != "–" else "(no interval)")


def _where(c) -> str:
    return f"d={c.d_model}, D={c.budget_tokens:,.0f}"


def effective_size_claim(bf: BudgetFit) -> Claim:
    """N_eff/N per measured recipe cell, read off the baseline's L(N, D): supported where every
    cell's 95% interval lies above 1 (an intersection-union rule: no correction), contradicted
    where one lies below 1 and its bootstrap p against the claim survives Holm over the cells."""
    c = Claim("Small init is worth a larger effective model size", "~+44% effective size for γ = 1 with eps = 1e-12 "
              "and the gate, 0.1B-1.5B params, 1T tokens", NOT_RUN, "")
    es = bf.es
    if es.status not in ("fit", "degenerate"):
        c.reason = es.status
        c.verdict = INCONCLUSIVE if es.baseline_cells else NOT_RUN
        return c
    f = es.fit
    c.evidence.append(f"fit on the baseline {bf.baseline} over {es.baseline_cells} (width, budget) cells, N = "
                      f"non-embedding parameters: L = {f.E:.3f} + {f.A:.3g}·N^-{f.alpha:.3f} + {f.B:.3g}·D^-{f.beta:.3f}")
    if not es.cells:
        c.reason = f"no recipe arm beside the baseline {bf.baseline}"
        return c
    for cell in es.cells:
        c.evidence.append(f"{bf.recipe} at {_where(cell)} ({cell.seeds} seeds): N_eff/N = "
                          f"{_ratio(cell.n_eff_ratio, cell.n_eff_ratio_ci)}, compute multiplier "
                          f"{_ratio(cell.compute_multiplier, cell.compute_multiplier_ci)}")
    c.numbers = bf.summary()["effective_size"]["cells"]
    p_holm = holm([1.0 if math.isnan(x.p_not_smaller) else x.p_not_smaller for x in es.cells]) if es.n_boot else []
    for number, p in zip(c.numbers, p_holm):
        number["p_holm"] = p  # against the claim: N_eff/N not below 1, adjusted over the claim's cells
    c.verdict = INCONCLUSIVE
    if es.status == "degenerate":  # every reason is in the evidence; the verdict table names the first two
        c.evidence += [f"degenerate: {r}" for r in es.reasons]
        more = len(es.reasons) - 2
        c.reason = "degenerate: " + "; ".join(es.reasons[:2]) + (f"; and {more} more (see the evidence)" if more > 0 else "")
        return c
    seeds = min([cell.seeds for cell in es.cells] + [int(v) for v in bf.base_rows.groupby(
        ["d_model", BUDGET])["seed"].nunique()])
    top = max(es.cells, key=lambda x: (x.d_model, x.budget_tokens))  # nearest the paper's scale
    lead = f"N_eff/N at {_where(top)} = {_ratio(top.n_eff_ratio, top.n_eff_ratio_ci)}"
    if seeds < 2 or es.n_boot == 0:
        c.reason = f"{lead}; one seed in some cell: no interval" if seeds < 2 else f"{lead}; no bootstrap"
        return c
    above = [x for x in es.cells if x.n_eff_ratio_ci[0] > 1]
    below = [(x, p) for x, p in zip(es.cells, p_holm) if x.n_eff_ratio_ci[1] < 1]
    n = len(es.cells)
    survive = [(x, p) for x, p in below if p <= ALPHA_ONE_SIDED]
    if survive:
        worst, p = min(survive, key=lambda xp: xp[0].n_eff_ratio)
        c.verdict, c.reason = CONTRADICTED, (
            f"N_eff/N below 1 beyond the seed spread at {len(below)} of {n} cells, {len(survive)} after Holm over "
            f"the {n} (at {_where(worst)}: {_ratio(worst.n_eff_ratio, worst.n_eff_ratio_ci)}, bootstrap p against "
            f"{worst.p_not_smaller:.3g}, Holm-adjusted {p:.3g})")
    elif below:  # below 1 at some cell, yet not beyond what n comparisons allow: no null, nothing excluded
        c.reason = (f"{lead}; N_eff/N below 1 beyond the seed spread at {len(below)} of {n} cells, none after Holm "
                    f"over the {n} (smallest adjusted p {min(p for _, p in below):.3g}; {es.n_boot} resamples "
                    f"give no p below {1 / (1 + es.n_boot):.2g} before adjusting)")
    elif len(above) == n:
        c.verdict, c.reason = SUPPORTED, f"{lead}; the 95% interval lies above 1 at all {n} cells"
    else:
        within = [x for x in es.cells if x not in above]
        c.excluded = max(max(1 - x.n_eff_ratio_ci[0], x.n_eff_ratio_ci[1] - 1) for x in within)
        c.reason = (f"{lead}; the interval holds 1 at {len(within)} of {n} cells: |N_eff/N − 1| > "
                    f"{c.excluded:.2g} excluded there")
    return c


def _slopes(co: Crossover, axis: str) -> np.ndarray:
    """Per seed: d gap / d ln(width) at the measured budgets' geometric mean, or d gap / d ln(budget)
    at the widths' (the same everywhere without the ln d ln D term)."""
    b = co.coefs
    b3 = b[:, 3] if b.shape[1] == 4 else 0.0
    if axis == "width":
        return b[:, 1] + b3 * float(np.mean(np.log(co.budgets)))
    return b[:, 2] + b3 * float(np.mean(np.log(co.widths)))


def trend_claims(bf: BudgetFit) -> list[Claim]:
    """From the crossover surface's per-seed fits: the advantage (−gap) grows along an axis where
    the slope of the gap along it has a 95% t-interval below 0."""
    width = Claim("The recipe's advantage grows with width",
                  "the residual update scales like d^(1−γ): small init's balance changes with width, and the two "
                  "barriers (norm saturation, attention sink) hide its benefit as width grows unless removed",
                  NOT_RUN, "")
    tokens = Claim("The recipe's advantage grows with tokens",
                   "the paper measures its gain after 1T tokens; at CPU budgets the question is whether the gain "
                   "grows toward it as training goes on", NOT_RUN, "")
    co = bf.co
    for claim, axis, unit in ((width, "width", "width"), (tokens, "budget", "tokens")):
        if co.status != "fit":
            claim.reason = co.status
            continue
        slopes = _slopes(co, axis)
        m, lo, hi = t_interval(slopes)
        p = one_comparison(slopes, predicted="less")  # the claim: the gap falls along the axis
        claim.numbers = [dict(slope=m, lo=lo, hi=hi, seeds=len(co.seeds), unit=f"nats per e-fold of {unit}", **p)]
        text = (f"gap slope {m:+.4f} nats per e-fold of {unit}, 95% interval [{lo:+.4f}, {hi:+.4f}] over "
                f"{len(co.seeds)} seeds (sign-flip p {p['p_signflip']:.3g}; against the claim p {p['p_against']:.3g}, "
                f"one comparison, so Holm leaves it as is)")
        crossings = co.d_star if axis == "width" else co.budget_star
        coefs = ", ".join(f"{n.split()[0]} = {v:+.4f}" for n, v in co.as_dict()["coefs_mean"].items())
        claim.evidence = [f"gap (recipe − baseline) = {co.as_dict()['model']}: {coefs} (seed means)", text,
                          *[_crossing_text(x, axis) for x in crossings]]
        if hi < 0:
            claim.verdict, claim.reason = SUPPORTED, f"the gap falls with {unit} beyond the seed spread: {text}"
        elif lo > 0:
            claim.verdict, claim.reason = CONTRADICTED, f"the gap grows with {unit} beyond the seed spread: {text}"
        else:
            claim.excluded = max(abs(lo), abs(hi))
            claim.verdict, claim.reason = INCONCLUSIVE, f"the slope's interval holds 0: {text}"
    if bf.pays_at is not None:
        tokens.evidence.append("0.1B preset: " + _crossing_text(bf.pays_at, "budget"))
    return [width, tokens]


def _num(v) -> str:
    return "–" if v is None else f"{v:,.3g}"


def _crossing_text(x: Crossing, axis: str) -> str:
    """'D*(d=128) = 2.1e+06 [1.4e+06, –] (lower bound; small init pays above it)'."""
    name = f"d*(D={x.at:,.0f})" if axis == "width" else f"D*(d={int(x.at)})"
    if x.point is None:
        return f"{name}: no crossing ({x.note}; the recipe is ahead {x.pays})"
    flags = [x.kind, f"small init pays {x.pays} it", *(["extrapolated"] if x.extrapolated else []),
             *([x.note] if x.note else [])]
    return f"{name} = {_num(x.point)} [{_num(x.lo)}, {_num(x.hi)}] ({'; '.join(flags)})"


# --- figures ---------------------------------------------------------------------------------------

def _cells(bf: BudgetFit, rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    v, t, tie = bf.shape["vocab_size"], bf.shape["seq_len"], bf.shape["tie_embeddings"]
    g = rows.groupby(["d_model", "n_layers", BUDGET]).agg(loss=(metric, "mean"), sd=(metric, "std"),
                                                          n_params=("n_params", "mean")).reset_index()
    n_ne = non_embedding_params(g["n_params"], g["d_model"], v, tie)
    return g.assign(flops=flops_per_token(n_ne, g["d_model"], g["n_layers"], t, v) * g[BUDGET])


def loss_vs_compute(bf: BudgetFit, metric: str):
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    base, rec = _cells(bf, bf.base_rows, metric), _cells(bf, bf.rec_rows, metric)
    colors = color_map(sorted(base["d_model"].unique().tolist() + rec["d_model"].unique().tolist()))
    v, t, tie = bf.shape["vocab_size"], bf.shape["seq_len"], bf.shape["tie_embeddings"]
    fit = bf.es.fit
    for (d, layers), g in base.groupby(["d_model", "n_layers"]):
        if fit is not None:  # the fitted surface along this width's budgets
            n_ne = float(non_embedding_params(g["n_params"].mean(), d, v, tie))
            dd = np.geomspace(g[BUDGET].min() / 1.5, g[BUDGET].max() * 1.5, 50)
            ax.plot(flops_per_token(n_ne, d, layers, t, v) * dd, fit.loss(n_ne, dd), color=colors[d], lw=1, alpha=0.7)
        ax.errorbar(g["flops"], g["loss"], yerr=g["sd"].fillna(0), color=colors[d], marker="o", ls="none", capsize=2,
                    label=f"baseline, d={d}")
    for d, g in rec.groupby("d_model"):
        ax.errorbar(g["flops"], g["loss"], yerr=g["sd"].fillna(0), color=colors[d], marker="s", mfc="none", ls="none",
                    capsize=2, label=f"recipe, d={d}")
    ax.set_xscale("log")
    ax.set_xlabel(COMPUTE_X)
    ax.set_ylabel(LOSS_Y)
    ax.set_title(f"Loss against compute; lines: the baseline's L(N, D) per width ({bf.es.status})")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def gap_map(bf: BudgetFit, metric: str):
    co = bf.co
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    d = np.geomspace(min(co.widths) / 1.3, max(co.widths) * 1.3, 120)
    b = np.geomspace(min(co.budgets) / 1.5, max(co.budgets) * 1.5, 120)
    ld, lb = np.meshgrid(np.log(d), np.log(b))
    m = co.coefs.mean(0)
    gap = m[0] + m[1] * ld + m[2] * lb + (m[3] * ld * lb if len(m) == 4 else 0)
    lim = float(np.abs(gap).max()) or 1e-6
    mesh = ax.pcolormesh(d, b, gap, cmap="RdBu_r", vmin=-lim, vmax=lim, shading="auto")
    if gap.min() < 0 < gap.max():
        ax.contour(d, b, gap, levels=[0], colors="k", linewidths=1.2)
    base = bf.base_rows.groupby(["d_model", BUDGET])[metric].mean()
    rec = bf.rec_rows.groupby(["d_model", BUDGET])[metric].mean()
    for (w, tok), r in rec.items():
        if (w, tok) in base.index:
            ax.scatter([w], [tok], color="k", s=18, zorder=3)
            ax.annotate(f"{r - base[(w, tok)]:+.3f}", (w, tok), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("width d_model [units]")
    ax.set_ylabel("token budget D [tokens]")
    ax.set_title("Fitted gap, recipe − baseline (seed mean); dots: measured, black line: gap = 0")
    fig.colorbar(mesh, ax=ax).set_label("recipe − baseline [nats/token]")
    fig.tight_layout()
    return fig


# --- the section -----------------------------------------------------------------------------------

def _ci(ci) -> str:
    lo, hi = ci
    if math.isnan(lo) or math.isnan(hi):
        return "–"
    return f"[{lo:.3g}, {'∞' if math.isinf(hi) else f'{hi:.3g}'}]"


def _shape_text(shape: dict) -> str:
    if not shape:
        return "the trials' vocabulary and context were not read"
    tied = "tied embedding and head" if shape["tie_embeddings"] else "untied embedding and head"
    return f"V = {shape['vocab_size']}, T = {shape['seq_len']}, {tied}, from the trials' trial.json"


def section(bf: BudgetFit, figs, metric: str) -> tuple[list[Block], dict]:
    es, co = bf.es, bf.co
    blocks = [Block("h2", "Effective model size over widths and token budgets"),
              Block("p", "Fit L(N, D) = E + A·N^-α + B·D^-β (Chinchilla's approach 3: Huber loss on log L) to the "
                         f"baseline {bf.baseline} over its (width, budget) cells; N = non-embedding parameters (the "
                         "total-N fit is in summary.json). The recipe "
                         f"{bf.recipe or '(none)'} at a cell (N, D, loss L) matches a baseline of N_eff parameters at "
                         "the same D; its compute multiplier is the baseline's training compute at N_eff over its own, "
                         "6(N + dV) + 12LdT FLOPs per token (head and both attention matmuls counted; "
                         f"{_shape_text(bf.shape)}). Intervals: seed bootstrap, 95% "
                         f"percentile ({es.n_boot} replicates); they run narrow, see experiments/fits/effective_size.py.")]
    if es.fit is not None:
        f = es.fit
        blocks.append(Block("p", f"Fit: E = {f.E:.4f} nats, A = {f.A:.4g}, α = {f.alpha:.4f}, B = {f.B:.4g}, "
                                 f"β = {f.beta:.4f} over {es.baseline_cells} cells (Huber objective {f.objective:.3g})."))
        blocks.append(Block("figure", figs.save(loss_vs_compute(bf, metric), "loss_vs_compute",
                                                "Seed-mean loss per (width, budget) cell against training compute "
                                                "(bars: seed sd); lines: the baseline's fitted L(N, D) per width.")))
    if es.status != "fit":
        blocks.append(Block("note", ("Degenerate: " + "; ".join(es.reasons)) if es.reasons else f"No fit: {es.status}"))
    if es.cells:
        blocks.append(Block("table", pd.DataFrame({
            "d_model": [c.d_model for c in es.cells], "budget [tokens]": [f"{c.budget_tokens:,.0f}" for c in es.cells],
            "N (non-emb.)": [f"{c.n_nonembed:,.0f}" for c in es.cells], "loss": [f"{c.loss:.4f}" for c in es.cells],
            "seeds": [c.seeds for c in es.cells],
            "N_eff/N": [f"{c.n_eff_ratio:.3g}" if math.isfinite(c.n_eff_ratio) else "∞" for c in es.cells],
            "N_eff/N 95% interval": [_ci(c.n_eff_ratio_ci) for c in es.cells],
            "compute multiplier": [f"{c.compute_multiplier:.3g}" if math.isfinite(c.compute_multiplier) else "∞"
                                   for c in es.cells],
            "multiplier 95% interval": [_ci(c.compute_multiplier_ci) for c in es.cells],
            "N_eff/N (total N)": [f"{c.n_eff_ratio_total:.3g}" for c in es.cells],
        }), "The recipe per measured cell: its effective size and the factor of baseline compute it is worth."))
    blocks.append(Block("h3", "Where small init starts to pay: the gap over width and budget"))
    if co.status == "fit":
        blocks.append(Block("p", f"Per confirm seed ({', '.join(co.seeds)}), gap = recipe − baseline at each cell, "
                                 f"fitted to {co.as_dict()['model']} (ln d·ln D only with ≥ 3 widths and ≥ 3 budgets). "
                                 "d*(D), D*(d): where the seeds' mean fit is 0; intervals where the seeds' fitted gaps "
                                 "have a 95% t-interval holding 0, cut to the measured range. "
                                 + saddle_text(co.saddle())))
        blocks.append(Block("figure", figs.save(gap_map(bf, metric), "gap_map",
                                                "The fitted recipe − baseline gap over (width, budget), seed mean; "
                                                "blue: the recipe is ahead; dots: measured cells with their measured gap.")))
        lines = [_crossing_text(x, "width") for x in co.d_star] + [_crossing_text(x, "budget") for x in co.budget_star]
        if bf.pays_at is not None:
            lines.append(f"the {PRESET} preset (d={preset_width(PRESET)}): " + _crossing_text(bf.pays_at, "budget"))
        blocks.append(Block("list", lines))
    else:
        blocks.append(Block("note", f"No crossover surface: {co.status}."))
    return blocks, bf.summary()
