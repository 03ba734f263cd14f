"""docs/results.md's block for a record with several token budgets (experiments/claims/budgets.py): the
baseline's L(N, D) fit, the recipe's N_eff/N and compute multiplier per measured cell, and where
the fitted gap crosses 0, from the record's summary.json."""

from __future__ import annotations

import math

from smallinit.experiments.fits.crossover import saddle_text
from smallinit.experiments.fits.token_crossover import crossing_note, curvature_note
from smallinit.experiments.output.md_table import fmt as _fmt
from smallinit.experiments.output.md_table import table as _table


def budgets_lines(es: dict, co: dict) -> list[str]:
    """A several-budget record's L(N, D) fit, the recipe's N_eff/N and compute multiplier per
    measured cell, and where the fitted gap crosses 0 (experiments/claims/budgets.py)."""
    f, t = es["fit"], es.get("fit_total_n") or {}
    total = (f" (with total N: α = {t['alpha']:.4f}, β = {t['beta']:.4f})" if t else "")
    out = [f"**Effective size.** The baseline ({es['baseline']}) fitted to L(N, D) = E + A·N^-α + B·D^-β over its "
           f"{es['baseline_cells']} (width, budget) cells, N = {es['n']}: E = {f['E']:.4f}, A = {f['A']:.4g}, "
           f"α = {f['alpha']:.4f}, B = {f['B']:.4g}, β = {f['beta']:.4f}{total}. The recipe ({es['recipe']}) "
           f"at each cell, as the baseline of N_eff parameters at the same D, and the factor of baseline compute "
           f"({es['compute']}) that reaches its loss; {es['interval']} intervals"
           + (f" over {es['n_boot']} resamples" if es.get("n_boot") else "") + ":", ""]
    ci = lambda c, k: f"[{_g3(c[k + '_ci'][0])}, {_g3(c[k + '_ci'][1])}]" if c.get(k + "_ci") else "–"  # noqa: E731
    out += [_table(["d_model", "budget [tokens]", "N", "recipe loss", "seeds", "N_eff / N", "95% interval",
                    "compute multiplier", "95% interval"],
                   [[str(c["d_model"]), f"{c['budget_tokens']:,.0f}", f"{c['n_nonembed']:,.0f}", _fmt(c["loss"]),
                     str(c["seeds"]), _g3(c["n_eff_ratio"]), ci(c, "n_eff_ratio"), _g3(c["compute_multiplier"]),
                     ci(c, "compute_multiplier")] for c in es["cells"]]), ""]
    if co.get("status") == "fit":
        saddle = saddle_text(co.get("saddle"))
        out += [f"**Crossover.** Per confirm seed, gap = recipe − baseline fitted to {co['model']}; below, where the "
                "seeds' mean fit is 0, with the interval where their fits' 95% t-interval holds 0."
                + (f" {saddle}" if saddle else ""), ""]
        out += [f"- {_crossing(c, 'd*(D=' + format(c['budget_tokens'], ',.0f') + ')')}" for c in co["d_star"]]
        out += [f"- {_crossing(c, 'D*(d=' + str(c['d_model']) + ')')}" for c in co["budget_star"]]
        if co.get("pays_at_preset"):
            c = co["pays_at_preset"]
            out += [f"- the {c['preset']} preset: {_crossing(c, 'D*(d=' + str(c['d_model']) + ')')}"]
        out += [""]
    elif co:
        out += [f"**Crossover.** No fit: {co['status']}.", ""]
    return out


def _crossing(c: dict, name: str) -> str:
    if c["point"] is None:
        return f"{name}: no crossing ({c['note']}; the recipe is ahead {c['pays']})"
    flags = [c["kind"], f"small init pays {c['pays']} it", *(["extrapolated"] if c["extrapolated"] else []),
             *([c["note"]] if c["note"] else [])]
    return f"{name} = {_g3(c['point'])} [{_g3(c['lo'])}, {_g3(c['hi'])}] ({'; '.join(flags)})"


def _s4(x) -> str:
    """A signed gap to 4 places; "–" where the summary holds none (JSON null for NaN)."""
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:+.4f}"


def _lr(x) -> str:
    return "–" if x is None else f"{x:g}"


def _g3(x) -> str:
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


def token_crossover_lines(tc: dict) -> list[str]:
    """A per-budget record's gap at each budget, each arm at that budget's own lr, the line over
    ln D and the decision (fits/token_crossover.py; the rule in docs/results/crossover/decision_rule.md)."""
    line = tc.get("line")
    out = [f"**The gap per budget.** Recipe ({tc['recipe']}) minus baseline ({tc['baseline']}), paired by confirm seed, "
           f"each arm at the lr that budget chose on the tuning seed; Holm over the {tc['family_size']} comparisons "
           f"(each budget's gap and the slope), α = {tc['alpha']:g} two-sided.", ""]
    out += [_table(["budget [tokens]", "lr baseline", "lr recipe", "loss baseline", "loss recipe", "gap", "95% interval",
                    "seeds", "sign-flip p", "Holm p", "verdict"],
                   [[f"{g['tokens']:,}", _lr(g["lr_baseline"]), _lr(g["lr_recipe"]), _fmt(g["loss_baseline"]),
                     _fmt(g["loss_recipe"]), _s4(g["gap"]), f"[{_s4(g['lo'])}, {_s4(g['hi'])}]", str(g["n"]),
                     _g3(g["p_signflip"]), _g3(g["p_holm"]), g["verdict"]] for g in tc["budgets"]]), ""]
    if line:
        quad_ci = [math.nan if x is None else x for x in line["quad_ci"]]
        out += [f"**The line.** Per seed, gap = a + b (ln D − c) over the budgets ({line['n']} seeds): slope "
                f"{_s4(line['b'])} [{_s4(line['b_ci'][0])}, {_s4(line['b_ci'][1])}] nats per e-fold of tokens; quadratic "
                f"term {_s4(line['quad'])} [{_s4(quad_ci[0])}, {_s4(quad_ci[1])}]. "
                + curvature_note(line["quad"] if line["quad"] is not None else math.nan, quad_ci), ""]
    out += [f"**Decision** (the rule fixed before the confirm seeds ran): {tc['decision']}.", ""]
    note = crossing_note(tc["budgets"])
    if note:
        out += [note, ""]
    return out
