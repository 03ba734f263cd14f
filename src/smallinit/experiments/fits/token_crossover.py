"""Where the recipe's gap to the baseline crosses 0 as tokens grow, at one width
(conf/experiment/crossover.yaml; decision rule: docs/results/crossover/decision_rule.md).

Each budget D of train.budgets chose each arm's lr on the tuning seeds (sweeper/config/protocol.py,
per_budget). On every confirm seed s the gap at D is the recipe's branch loss minus the
baseline's, each arm at D's own lr: g_s(D). Per budget: the mean gap, its 95% t-interval, the
paired t p-values and the exact sign-flip p. Per seed, a line g_s(D) = a_s + b_s (ln D - c)
over the budgets (c the mean ln D, so a_s and b_s are nearly uncorrelated); the seeds' mean
line crosses 0 at ln D* = c - a/b, and its 95% interval is Fieller's: the ln D where 0 lies
inside the line's own t-interval there. When the slope's interval holds 0 that set is
unbounded, and the record says D* is not bounded. Holm runs over the claim's family: every
budget's gap and the slope. A per-seed quadratic term says whether a line is enough.

Pure functions over a table of rows (arm, seed, lr, budget_tokens, loss, role); reading the
sweep's files is `from_sweep`'s job.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from smallinit.core import results_schema as schema
from smallinit.core.trial_dir import TrialDir
from smallinit.experiments.data.sweep_records import (
    PROTOCOL,
    ReportError,
    read_record,
    read_table,
    require_record,
)
from smallinit.experiments.output.md_table import fmt, table
from smallinit.experiments.stats.paired import holm, signflip_p, t_interval, t_pvalues

ALPHA = 0.05  # two-sided, family-wise over the budget gaps and the slope (Holm)
LR_DIGITS = 6  # lrs compared after rounding, as tuning.py does


@dataclass
class BudgetGap:
    tokens: int
    lr_baseline: float | None
    lr_recipe: float | None
    loss_baseline: float  # seed means over the paired seeds
    loss_recipe: float
    n: int  # paired confirm seeds
    gap: float  # recipe - baseline, mean over seeds
    lo: float
    hi: float
    p_lower: float  # paired t, one-sided: gap < 0
    p_higher: float
    p_two: float
    p_signflip: float  # exact, two-sided
    p_holm: float = float("nan")
    verdict: str = ""


@dataclass
class LineFit:
    """The seeds' mean line gap(D) = a + b (ln D - c) and where it crosses 0."""

    n: int  # seeds with every budget
    c: float  # mean ln D of the budgets
    a: float
    a_ci: tuple[float, float]
    b: float  # nats per e-fold of tokens
    b_ci: tuple[float, float]
    p_b_lower: float
    p_b_higher: float
    p_b_two: float
    p_b_signflip: float
    p_b_holm: float
    log_d_star: float  # nan when b == 0
    # Fieller's 95% set for ln D*: "bounded" [lo, hi]; "outside" (-inf, lo] U [hi, inf);
    # "everything" (no bound at all).
    star_kind: str
    star_lo: float
    star_hi: float
    quad: float  # mean per-seed quadratic coefficient in (ln D - c)^2
    quad_ci: tuple[float, float]
    per_seed: list[dict] = field(default_factory=list)

    @property
    def d_star(self) -> float:
        return math.exp(self.log_d_star) if math.isfinite(self.log_d_star) else float("nan")

    def d_star_interval(self) -> tuple[float, float]:
        if self.star_kind != "bounded":
            return float("nan"), float("nan")
        return math.exp(self.star_lo), math.exp(self.star_hi)


def _round(x) -> float:
    return float(f"{float(x):.{LR_DIGITS}g}")


def _side(rows: pd.DataFrame, arm: str, tokens: int, lr: float) -> pd.Series:
    """seed -> arm's loss at budget `tokens`, from its run at `lr` (that budget's choice)."""
    at = rows[(rows["arm"] == arm) & (rows["budget_tokens"] == tokens) & (rows["lr"].map(_round) == _round(lr))]
    return at.groupby("seed")["loss"].mean()


def per_seed_gaps(rows: pd.DataFrame, chosen: dict[str, dict[int, float]], baseline: str, recipe: str) -> pd.DataFrame:
    """seed x budget table of g_s(D), each arm at D's chosen lr (NaN where a side is missing).
    rows: arm, seed, lr, budget_tokens, loss (confirm rows that completed)."""
    cols = {int(t): _side(rows, recipe, t, chosen[recipe][t]) - _side(rows, baseline, t, chosen[baseline][t])
            for t in sorted(set(chosen.get(baseline, {})) & set(chosen.get(recipe, {})))}
    return pd.DataFrame(cols).sort_index()


def budget_gaps(rows: pd.DataFrame, chosen: dict[str, dict[int, float]], baseline: str, recipe: str) -> list[BudgetGap]:
    """Per budget, the paired gap on the confirm seeds, each arm at that budget's chosen lr."""
    out = []
    for tokens in sorted(set(chosen.get(baseline, {})) & set(chosen.get(recipe, {}))):
        pair = pd.concat({arm: _side(rows, arm, tokens, chosen[arm][tokens]) for arm in (baseline, recipe)},
                         axis=1, join="inner").dropna()
        d = (pair[recipe] - pair[baseline]).to_numpy()
        m, lo, hi = t_interval(d) if len(d) else (float("nan"),) * 3
        p_lo, p_hi = t_pvalues(d) if len(d) else (float("nan"), float("nan"))
        out.append(BudgetGap(
            tokens=int(tokens), lr_baseline=chosen[baseline][tokens], lr_recipe=chosen[recipe][tokens],
            loss_baseline=float(pair[baseline].mean()) if len(pair) else float("nan"),
            loss_recipe=float(pair[recipe].mean()) if len(pair) else float("nan"),
            n=len(d), gap=m, lo=lo, hi=hi, p_lower=p_lo, p_higher=p_hi, p_two=_two(p_lo, p_hi),
            p_signflip=signflip_p(d) if len(d) else float("nan")))
    return out


def _two(p_lower: float, p_higher: float) -> float:
    return min(1.0, 2 * min(p_lower, p_higher)) if math.isfinite(p_lower) and math.isfinite(p_higher) else float("nan")


def fit_line(gaps: pd.DataFrame) -> LineFit | None:
    """The per-seed lines over the seeds that have every budget; None with < 3 such seeds or < 3 budgets."""
    full = gaps.dropna()
    if len(full) < 3 or full.shape[1] < 3:
        return None
    x = np.log(np.asarray(full.columns, dtype=float))
    c = float(x.mean())
    xc = x - c
    design = np.column_stack([np.ones_like(xc), xc])
    coef = np.linalg.lstsq(design, full.to_numpy().T, rcond=None)[0].T  # (seeds, 2): a_s, b_s
    quad = np.linalg.lstsq(np.column_stack([design, xc**2]), full.to_numpy().T, rcond=None)[0].T[:, 2]
    n = len(coef)
    a_s, b_s = coef[:, 0], coef[:, 1]
    a, a_lo, a_hi = t_interval(a_s)
    b, b_lo, b_hi = t_interval(b_s)
    q, q_lo, q_hi = t_interval(quad)
    p_lo, p_hi = t_pvalues(b_s)
    cov = np.cov(coef.T, ddof=1) / n  # of the means (a, b)
    kind, lo, hi = fieller(a, b, cov, stats.t.ppf(1 - ALPHA / 2, n - 1))
    star = -a / b if b != 0 else float("nan")
    return LineFit(n=n, c=c, a=a, a_ci=(a_lo, a_hi), b=b, b_ci=(b_lo, b_hi), p_b_lower=p_lo, p_b_higher=p_hi,
                   p_b_two=_two(p_lo, p_hi), p_b_signflip=signflip_p(b_s), p_b_holm=float("nan"),
                   log_d_star=c + star, star_kind=kind, star_lo=c + lo, star_hi=c + hi,
                   quad=q, quad_ci=(q_lo, q_hi),
                   per_seed=[{"seed": s, "a": float(ai), "b": float(bi)} for s, ai, bi in zip(full.index, a_s, b_s)])


def fieller(a: float, b: float, cov: np.ndarray, t: float) -> tuple[str, float, float]:
    """Fieller's set for r = -a/b (the zero of a + b x): every x where |a + b x| is within t
    standard errors, (a + b x)^2 <= t^2 (v_aa + 2 x v_ab + x^2 v_bb). A quadratic A x^2 + B x + C <= 0:
    A > 0 (the slope excludes 0 at this t) gives a bounded interval; otherwise it is unbounded."""
    v_aa, v_ab, v_bb = cov[0, 0], cov[0, 1], cov[1, 1]
    qa, qb, qc = b * b - t * t * v_bb, 2 * (a * b - t * t * v_ab), a * a - t * t * v_aa
    disc = qb * qb - 4 * qa * qc
    if disc < 0:
        return "everything", float("-inf"), float("inf")
    r1, r2 = sorted(((-qb - math.sqrt(disc)) / (2 * qa), (-qb + math.sqrt(disc)) / (2 * qa))) if qa != 0 else (float("nan"),) * 2
    return ("bounded" if qa > 0 else "outside"), r1, r2


def analyse(rows: pd.DataFrame, chosen: dict[str, dict[int, float]], baseline: str, recipe: str) -> dict:
    """Everything the record keeps: per-budget gaps with Holm over (gaps + slope), the line, D*."""
    gaps = budget_gaps(rows, chosen, baseline, recipe)
    table = per_seed_gaps(rows, chosen, baseline, recipe)
    line = fit_line(table)
    family = [g.p_two for g in gaps if math.isfinite(g.p_two)] + ([line.p_b_two] if line else [])
    adjusted = iter(holm(family)) if family else iter(())
    for g in gaps:
        if math.isfinite(g.p_two):
            g.p_holm = next(adjusted)
        g.verdict = gap_verdict(g)
    if line:
        line.p_b_holm = next(adjusted)
    return dict(baseline=baseline, recipe=recipe, alpha=ALPHA, family_size=len(family),
                budgets=[asdict(g) for g in gaps], per_seed=table, line=line,
                decision=decide(gaps, line))


def curvature_note(quad: float, quad_ci) -> str:
    """The decision rule's check on the line: a quadratic term whose interval excludes 0 means the
    gap bends over ln D, so the line, and a D* read off it, is an approximation."""
    lo, hi = quad_ci
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 <= hi:
        return ""
    bend = "falls" if quad < 0 else "rises"
    return (f"The quadratic term's interval excludes 0: the gap bends over ln D (its slope {bend} as D grows), so the line and any "
            "D* read off it are an approximation; the gaps per budget are the measurement.")


def crossing_note(budgets: list[dict]) -> str:
    """What the per-budget gaps say of a crossing, beside the rule's D*: a crossover needs one arm
    ahead at some budget and the other at a larger one. Where only one arm is ever ahead, D* is the
    line's zero, not a change of sign the gaps show, and what is measured is where the lead opens:
    between the last budget with no gap detected and the first with that arm ahead (read after the
    data, not by the rule). `budgets`: the summary's token_crossover budgets, in token order."""
    ahead = [(g["tokens"], g["verdict"]) for g in budgets if g["verdict"] in ("recipe ahead", "baseline ahead")]
    sides = {v for _, v in ahead}
    if len(sides) != 1:
        return ""  # neither arm ever ahead (no lead to place), or both (a crossing the gaps show)
    side = sides.pop()
    other = "baseline" if side == "recipe ahead" else "recipe"
    top = max(budgets, key=lambda g: g["gap"] if other == "baseline" else -g["gap"])
    first = min(t for t, _ in ahead)
    before = [g["tokens"] for g in budgets if g["tokens"] < first]
    where = f"between {before[-1]:,} and {first:,} tokens" if before else f"by {first:,} tokens, the smallest budget"
    return (f"No budget has the {other} ahead (the mean gap nearest its side is {top['gap']:+.4f} at {top['tokens']:,} "
            f"tokens, with its interval [{top['lo']:+.4f}, {top['hi']:+.4f}], Holm p {top['p_holm']:.3g}): the gap never passes from a {other} lead to a "
            f"{side.split()[0]} lead, so D* is where the rule's line crosses 0, not a crossover. What the gaps show is a "
            f"lead that opens {where} (a reading made after the data, not by the rule).")


def gap_verdict(g: BudgetGap) -> str:
    if g.n < 2 or not math.isfinite(g.p_holm):
        return f"not decided: {g.n} paired seed(s)"
    if g.p_holm <= ALPHA:
        return "recipe ahead" if g.gap < 0 else "baseline ahead"
    return f"inconclusive: |gap| > {max(abs(g.lo), abs(g.hi)):.4f} excluded"


def decide(gaps: list[BudgetGap], line: LineFit | None) -> str:
    """The rule docs/results/crossover/decision_rule.md fixed before the confirm seeds ran."""
    if line is None:
        return "no crossover estimate: fewer than 3 confirm seeds with every budget, or fewer than 3 budgets"
    measured = (min(g.tokens for g in gaps), max(g.tokens for g in gaps))
    slope = f"slope {line.b:+.4f} [{line.b_ci[0]:+.4f}, {line.b_ci[1]:+.4f}] nats per e-fold of tokens (Holm p {line.p_b_holm:.3g})"
    if line.p_b_holm > ALPHA or line.star_kind != "bounded":
        return (f"D* not bounded: {slope}; the gap has no trend this data can tell from 0"
                + (f", and D* is outside [{math.exp(line.star_lo):.3g}, {math.exp(line.star_hi):.3g}] tokens"
                   if line.star_kind == "outside" else ""))
    lo, hi = line.d_star_interval()
    where = ("inside the measured budgets" if measured[0] <= lo and hi <= measured[1]
             else f"beyond the measured budgets (up to {measured[1]:,}): an extrapolation of the line" if lo > measured[1]
             else f"before the smallest measured budget ({measured[0]:,}): an extrapolation" if hi < measured[0]
             else "partly outside the measured budgets")
    direction = "the recipe leads past D*" if line.b < 0 else "the baseline leads past D*"
    return f"D* = {line.d_star:.3g} tokens [{lo:.3g}, {hi:.3g}], {where}; {direction}; {slope}"


def from_sweep(sweep_dir: Path, results: pd.DataFrame | None = None,
               baseline: str = "baseline", metric: str = schema.FINAL_VAL_LOSS) -> dict | None:
    """The analysis of a per_budget sweep folder, or None when the folder did not choose per budget
    or has no two arms named in its protocol.json."""
    record, _ = read_record(sweep_dir, PROTOCOL)  # a damaged one reads as absent: load() has named it
    if record is None or not record.get("per_budget"):
        return None
    chosen: dict[str, dict[int, float]] = {}
    for c in record.get("choices", []):
        arm = c["setting"].get("arm")
        if arm is not None and c.get("chosen_by_budget"):
            chosen[arm] = {int(x["budget_tokens"]): float(x["chosen"]["optim.lr"]) for x in c["chosen_by_budget"]}
    others = [a for a in chosen if a != baseline]
    if baseline not in chosen or len(others) != 1:
        return None
    df = results if results is not None else read_table(Path(sweep_dir), short_names=True)
    done = df[(df[schema.STATE] == schema.COMPLETE) & (df["role"] == "confirm")]
    rows = pd.DataFrame({"arm": done["config/arm"], "seed": done["config/seed"], "lr": done["lr"],
                         "budget_tokens": done[schema.BUDGET_TOKENS], "loss": done[metric]}).dropna()
    out = analyse(rows, chosen, baseline, others[0])
    out["chosen"] = chosen
    out["tune"] = tune_table(df, metric)
    return out


def tune_table(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Every tuning branch: arm, lr, budget, loss (the loss-against-lr panel per budget)."""
    t = df[(df[schema.STATE] == schema.COMPLETE) & (df["role"] == "tune")]
    return pd.DataFrame({"arm": t["config/arm"], "lr": t["lr"], "budget_tokens": t[schema.BUDGET_TOKENS],
                         "loss": t[metric]}).dropna().sort_values(["arm", "budget_tokens", "lr"]).reset_index(drop=True)


def status(sweep_dir: Path, metric: str = schema.FINAL_VAL_LOSS) -> str:
    """Where a per_budget sweep stands, as markdown: every finished branch's loss per (stage,
    arm, lr, budget), the choices made so far, and the line once confirm seeds are in."""
    sweep_dir = Path(sweep_dir)
    df = branch_rows(sweep_dir)
    if df.empty:
        return f"# {sweep_dir.name}: no finished branch yet\n"
    lines = [f"# {sweep_dir.name}: where it stands", "",
             f"{df['trial_identity'].nunique()} trials with at least one finished budget, {len(df)} finished "
             "(trial, budget) branches.", ""]
    for role in ("tune", "confirm", "not yet recorded"):
        rows = df[df["role"] == role]
        if rows.empty:
            continue
        header, body = loss_grid(rows, metric)
        lines += [f"## {role}: final validation loss per budget [tokens], mean over each row's seeds", "",
                  table(header, body), ""]
    lines += machine_lines(df)
    record = require_record(sweep_dir, PROTOCOL)
    if record is not None:
        for c in record.get("choices", []):
            picks = ", ".join(f"{x['budget_tokens']:,}: {x['chosen']['optim.lr']:g}" for x in c.get("chosen_by_budget") or [])
            lines.append(f"- {c['setting']}: chose {picks or c.get('chosen')}")
        out = from_sweep(sweep_dir, df.assign(**{schema.STATE: schema.COMPLETE}), metric=metric)
        if out is not None:
            lines += ["", f"Decision so far: {out['decision']}"]
    return "\n".join(lines) + "\n"


def _seed_list(seeds) -> str:
    """1, 2, 3, 5 -> '1-3, 5': which seeds a row's means are over."""
    seeds, runs = sorted(int(s) for s in set(seeds)), []
    for s in seeds:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def loss_grid(rows: pd.DataFrame, metric: str) -> tuple[list[str], list[list[str]]]:
    """One row per (arm, lr): its seeds, then the seed mean per budget. A budget that fewer of
    the row's seeds have finished says over how many ("(n=2)"), so a mean is never read as
    being over seeds it does not hold."""
    keys = ["config/arm", "lr"]
    mean = rows.pivot_table(index=keys, columns=schema.BUDGET_TOKENS, values=metric, aggfunc="mean")
    count = rows.pivot_table(index=keys, columns=schema.BUDGET_TOKENS, values=metric, aggfunc="count")
    seeds = rows.groupby(keys)["config/seed"].agg(_seed_list)
    n_seeds = rows.groupby(keys)["config/seed"].nunique()
    body = []
    for key, vals in zip(mean.index, mean.to_numpy()):
        cells = [fmt(v) if c >= n_seeds[key] or np.isnan(v) else f"{fmt(v)} (n={int(c)})"
                 for v, c in zip(vals, count.loc[key].fillna(0).to_numpy())]
        body.append([str(key[0]), f"{key[1]:g}", seeds[key], *cells])
    return ["arm", "lr", "seeds", *[f"{int(c):,}" for c in mean.columns]], body


def branch_rows(sweep_dir: Path, metric: str = schema.FINAL_VAL_LOSS) -> pd.DataFrame:
    """Every branch evaluated so far, from the trial folders (mid-sweep too, before results.parquet
    exists): its trial's params, the budget and the loss; a branch file that is damaged or
    another trial's is left out. Roles come from protocol.json once stage 1 has settled."""
    record = require_record(sweep_dir, PROTOCOL) or {}
    rows = []
    for folder in TrialDir.all_in_sweep(sweep_dir):
        params = folder.read_sweep_plan().get("params") or {}
        seed = params.get(record.get("seed_key", "seed"))
        role = "tune" if seed in record.get("tune_seeds", []) else "confirm" if seed in record.get("confirm_seeds", []) \
            else "not yet recorded"
        for tokens in folder.planned_budgets():
            branch = folder.read_budget_result(tokens, damaged_ok=True)
            if branch is None or folder.damaged_budget(tokens) is not None:
                continue
            rows.append({"trial_identity": folder.identity, "role": role, "config/arm": params.get("arm"),
                         "config/seed": seed, "lr": params.get("optim.lr"), schema.BUDGET_TOKENS: tokens,
                         metric: branch.get(metric), "cpu": machine_of(branch)})
    return pd.DataFrame(rows)


def machine_of(result: dict) -> str:
    """The CPU a result was trained on (model and the flags that choose torch's kernels), as its
    made_by says; "unrecorded" for results written before they named it."""
    machine = (result.get("made_by") or {}).get("machine") or {}
    return " ".join([machine["cpu_model"], *machine.get("cpu_flags", [])]) if machine.get("cpu_model") else "unrecorded"


def machine_lines(df: pd.DataFrame) -> list[str]:
    """Which CPUs trained the branches, and how many confirm pairs (seed, budget) span two: one
    identity on two CPUs is not bit-identical, so such a pair carries that noise too."""
    lines = ["## trained on", ""]
    per_trial = df.groupby("trial_identity")["cpu"].agg(lambda c: tuple(sorted(set(c))))
    for cpus, trials in per_trial.value_counts().sort_index().items():
        # A trial whose branches name two CPUs (or one and none: written before results named it)
        # is counted once, on a line naming both, so the lines add up to the trials.
        lines.append(f"- {' and '.join(cpus)}: {trials} trial(s)")
    confirm = df[df["role"] == "confirm"]
    if not confirm.empty:
        pairs = confirm.groupby(["config/seed", schema.BUDGET_TOKENS])["cpu"].agg(
            lambda c: len(set(c)) > 1 or "unrecorded" in set(c))
        lines.append(f"- confirm (seed, budget) cells whose runs span CPUs or do not name theirs: "
                     f"{int(pairs.sum())} of {len(pairs)}")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Where a per-budget crossover sweep stands (markdown to stdout).")
    ap.add_argument("--sweep", type=Path, required=True, help="the sweep folder (read while it runs, too)")
    args = ap.parse_args(argv)
    if not (args.sweep / "trials").is_dir():
        print(f"error: --sweep={str(args.sweep)!r} is invalid: no trials/ folder there (run the sweep first)", file=sys.stderr)
        return 2
    try:
        print(status(args.sweep), end="")
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
