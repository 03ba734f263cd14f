"""The crossover record's claims, judged again from the record's own numbers: what the report that
wrote its summary.json could not know or judged too widely.

The report reads one sweep. The crossover record is a sweep plus checks run beside it
(checks.txt), and four of its claim rows need more than the report had:

- "The small-init recipe lowers loss at every size, dense and MoE": the report marks it supported
  from the sizes it compared. One size cannot show "every size", and a dense record cannot show
  MoE: with fewer than two sizes, or without both kinds, a lead is inconclusive for this claim
  (a size where the recipe is behind still contradicts it).
- "Small init is worth a larger effective model size": the report needs 3 sizes of the recipe's
  own sweep and says "not run"; the widths check (crossover_widths) measures the baseline at
  d = 96 and 192 beside the record's d = 128, so N_eff/N is read off measured widths at each
  budget (fits/effective_width.py): a number with its interval inside the widths, a bound with
  its interval's end past them. The rule is the report's for a several-budget record
  (claims/budgets.py): supported where every budget's lower end lies above 1, contradicted where
  an upper end lies below 1, inconclusive otherwise.
- "Small init condenses, then expands": the report compared the two arms' mean |cos| rise with no
  interval; judged again from the summary's per-trial trajectories by the library's rule as it now
  stands (every small-init trial condenses then expands, and the rise beats γ < 1's paired by seed
  with an interval that excludes 0).
- "The recipe's advantage grows with tokens": the slope of the gap over ln D with its Holm p, from
  the summary's token_crossover (the family fixed by decision_rule.md: five budget gaps and the
  slope): supported where the slope is negative with Holm p <= alpha, contradicted where positive.

The judged rows go to docs/results/<exp>/claims.json with the sha256 of the summary they amend;
results_doc shows them in place of the summary's rows of the same claim (and adds the new ones),
and tests/test_record_claims.py holds each verdict to the numbers it rests on.

    python -m records.record_claims --summary docs/results/crossover/summary.json \\
        --crossover sweeps/crossover --widths sweeps/crossover_widths --out docs/results/crossover/claims.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from smallinit.core.provenance import file_sha256, record

from . import OVERWRITE_HELP, committed_record, write_record

EVERY_SIZE = "The small-init recipe lowers loss at every size, dense and MoE"
CONDENSATION = "Small init condenses, then expands"
EFFECTIVE = "Small init is worth a larger effective model size"
TOKENS = "The recipe's advantage grows with tokens"
PAPER_EFFECTIVE = "~+44% effective size for γ = 1 with eps = 1e-12 and the gate, 0.1B-1.5B params, 1T tokens"
PAPER_TOKENS = ("the paper measures its gain after 1T tokens; at CPU budgets the question is whether the gain grows "
                "toward it as training goes on")
CLAIMS_FILE = "claims.json"


def _claim(name: str, paper: str, verdict: str, reason: str, evidence: list[str], numbers: list[dict],
           excluded: float | None = None) -> dict:
    return dict(claim=name, paper=paper, verdict=verdict, reason=reason, evidence=evidence, numbers=numbers,
                excluded=excluded, kind="verdict")


def sizes_compared(numbers: list[dict]) -> list[str]:
    """The sizes a recipe claim's comparisons name ("micro (d=128, L=4, 1.90M): A vs B" -> "micro (...)")."""
    return sorted({n["label"].split(": ")[0] for n in numbers})


def every_size_verdict(claim: dict) -> dict:
    """The report's row, narrowed: "supported" needs two sizes or more, dense and MoE among them."""
    sizes = sizes_compared(claim["numbers"])
    moe = [s for s in sizes if "moe" in s.lower()]
    if claim["verdict"] != "supported" or (len(sizes) >= 2 and moe and len(moe) < len(sizes)):
        return claim
    kinds = "MoE only" if moe else "dense only"
    shown = "; ".join(f"{n['label'].split(': ')[0]}: {n['diff']:+.4f} [{n['lo']:+.4f}, {n['hi']:+.4f}]"
                      for n in claim["numbers"])
    return dict(claim, verdict="inconclusive", excluded=None,
                reason=f"the recipe is ahead beyond the seed spread at {'the one size' if len(sizes) == 1 else f'each of the {len(sizes)} sizes'} compared ({shown}), "
                       f"{kinds}: one size cannot show every size, dense and MoE (the report's verdict was supported)")


def condensation_verdict(claim: dict) -> dict:
    """The report's row judged again from its own per-trial trajectories by the claim as the library
    now states it (claims.condensation_claim): the rise under small init against γ < 1's, paired
    by seed with its interval, where the report that wrote the summary compared the two means."""
    from smallinit.experiments.claims.claims import condensation_claim

    rows = [n for n in claim["numbers"] if "peak_step" in n]
    if not rows:
        return claim
    judged = condensation_claim(pd.DataFrame(rows).assign(identity=range(len(rows)))).as_dict()
    if judged["verdict"] != claim["verdict"]:
        judged["reason"] += f" (the report's verdict was {claim['verdict']})"
    return judged


def reading_ends(r: dict) -> tuple[float | None, float | None, str]:
    """(lower end, upper end, text) of one budget's N_eff/N off the measured widths: the t-interval
    inside them; past the widest, the bound on the seed means and the interval's end (no upper end)."""
    if r["kind"] == "inside":
        lo, hi = r["ratio_ci"] or (None, None)
        return lo, hi, r["text"]
    limit = (r.get("edge") or {}).get("limit")
    widest, narrowest = max(r["widths_n"]) / r["n"], min(r["widths_n"]) / r["n"]
    if r["kind"] == "above":
        return limit, None, f"N_eff/N > {widest:.3g} on the seed means, ≥ {limit:.3g} at the interval's end (a bound)"
    return None, limit, f"N_eff/N < {narrowest:.3g} on the seed means, ≤ {limit:.3g} at the interval's end (a bound)"


def effective_size_claim(readings: list[dict], head_note: str) -> dict:
    """The rule of claims/budgets.py over the budgets the widths check measured."""
    parts, numbers, above, below = [], [], 0, 0
    for r in readings:
        lo, hi, text = reading_ends(r)
        above += lo is not None and lo > 1
        below += hi is not None and hi < 1
        parts.append(f"{r['budget']:,} tokens: {text}")
        numbers.append(dict(budget_tokens=r["budget"], kind=r["kind"], ratio=r["ratio"], lower_end=lo, upper_end=hi,
                            widths=r["widths"], head_dims=r.get("head_dims"), seeds=r["n_seeds"],
                            seeds_inside=r["n_inside"], edge=r.get("edge")))
    n = len(readings)
    where = f"N_eff/N at d = 128 off the baseline's measured widths {head_note}: " + "; ".join(parts)
    if below:
        verdict, why = "contradicted", f"an upper end lies below 1 at {below} of {n} budgets"
    elif above == n and n:
        verdict, why = "supported", f"every budget's lower end lies above 1 ({n} budgets)"
    else:
        verdict, why = "inconclusive", f"the lower end lies above 1 at {above} of {n} budgets, not at all of them"
    return _claim(EFFECTIVE, PAPER_EFFECTIVE, verdict, f"{why}. {where}", parts, numbers)


def tokens_claim(tc: dict) -> dict:
    """The slope of the gap over ln D, judged in the record's Holm family."""
    line = tc.get("line")
    if not line:
        return _claim(TOKENS, PAPER_TOKENS, "not run", "no line over the budgets (fewer than 3 seeds with every "
                      "budget)", [], [])
    b, (lo, hi), p = line["b"], line["b_ci"], line["p_b_holm"]
    text = (f"gap slope {b:+.4f} [{lo:+.4f}, {hi:+.4f}] nats per e-fold of tokens over {line['n']} seeds, Holm p "
            f"{p:.2g} over the record's {tc['family_size']} comparisons (the budget gaps and the slope)")
    q, (q_lo, q_hi) = line["quad"], line["quad_ci"]
    bends = (f"; the gap is not a line (quadratic term {q:+.4f} [{q_lo:+.4f}, {q_hi:+.4f}]), so the slope says the "
             "advantage is larger at the larger budgets, not that it grows at a steady rate"
             if q_lo is not None and q_hi is not None and (q_lo > 0 or q_hi < 0) else "")
    # Scope: each budget's gap pairs the arms at the lrs that budget chose, so the slope is the
    # recipe's lead with what comes with it, not the init's share of it.
    bends += ("; each budget pairs the arms at its own chosen lrs, so the slope does not say whether the larger lead "
              "belongs to the init, to the lower lr it permits, to the WSD branches or to text repeated past one pass")
    if p <= tc["alpha"] and b < 0:
        verdict = "supported"
    elif p <= tc["alpha"] and b > 0:
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    numbers = [dict(slope=b, lo=lo, hi=hi, p_holm=p, p_two=line["p_b_two"], p_signflip=line["p_b_signflip"],
                    seeds=line["n"], quad=q, quad_ci=[q_lo, q_hi], alpha=tc["alpha"], family_size=tc["family_size"],
                    unit="nats per e-fold of tokens")]
    return _claim(TOKENS, PAPER_TOKENS, verdict, text + bends, [text], numbers,
                  excluded=max(abs(lo), abs(hi)) if verdict == "inconclusive" else None)


def judge(summary: dict, readings: list[dict] | None, head_note: str = "") -> list[dict]:
    """The rows claims.json holds, in the summary's claim order, new ones last."""
    out = [every_size_verdict(c) for c in summary["claims"] if c["claim"] == EVERY_SIZE]
    out += [condensation_verdict(c) for c in summary["claims"] if c["claim"] == CONDENSATION]
    if readings:
        out.append(effective_size_claim(readings, head_note))
    if summary.get("token_crossover"):
        out.append(tokens_claim(summary["token_crossover"]))
    return out


def merged(summary: dict, folder: Path) -> dict:
    """The summary with its folder's claims.json applied: a judged row replaces the summary's row of
    the same claim, a new one is added before the checks at init; `rejudged` names them. A
    claims.json written for another summary is refused: it would judge numbers that are not there."""
    path = Path(folder) / CLAIMS_FILE
    if not path.is_file():
        return summary
    doc = committed_record(path)
    if doc.get("summary_sha256") != file_sha256(Path(folder) / "summary.json"):
        raise SystemExit(f"error: {path} judges another summary.json than the one beside it: rerun its command "
                         f"({doc['command']})")
    judged = {c["claim"]: c for c in doc["claims"]}
    claims = [judged.pop(c["claim"], c) for c in summary["claims"]]
    at = next((i for i, c in enumerate(claims) if c.get("kind") == "check at init"), len(claims))
    claims[at:at] = list(judged.values())
    return dict(summary, claims=claims, rejudged=dict(file=str(path.name), command=doc["command"],
                                                      claims=[c["claim"] for c in doc["claims"]]))


def widths_readings(crossover: Path, widths: Path, baseline: str = "baseline") -> tuple[list[dict], str]:
    """crossover_size's per-budget readings off the measured widths, and the widths with their head dims."""
    from .crossover_size import _widths_text, check_same_baseline, chosen_rows, width_readings

    rows, w = chosen_rows(crossover), chosen_rows(widths)
    check_same_baseline(rows, w, baseline)
    recipe = next(a for a in sorted(set(rows["arm"])) if a != baseline)
    readings = width_readings(pd.concat([rows, w.assign(arm=baseline)], ignore_index=True), baseline, recipe)
    return readings, (f"(d = {_widths_text(readings[0])}: width (head dim))" if readings else "")


def _clean(x):
    """JSON for the record: NaN as null, numpy scalars as numbers."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if hasattr(x, "item"):
        x = x.item()
    return None if isinstance(x, float) and not math.isfinite(x) else x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--summary", type=Path, required=True, help="the record's committed summary.json")
    ap.add_argument("--crossover", type=Path, help="the record's sweep folder (with --widths: the effective size)")
    ap.add_argument("--widths", type=Path, help="the crossover_widths sweep folder")
    ap.add_argument("--out", type=Path, required=True, help="claims.json, beside the summary")
    ap.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    a = ap.parse_args(argv)
    if (a.crossover is None) != (a.widths is None):
        ap.error("--crossover and --widths go together (the recipe at d = 128 read off the baseline's widths)")
    summary = committed_record(a.summary)
    readings, note = widths_readings(a.crossover, a.widths) if a.crossover else (None, "")
    claims = judge(summary, readings, note)
    # The command that rebuilds the record, as a reader would run it: without --overwrite, so a rerun
    # over an edited claims.json is refused rather than silently replacing it.
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python -m records.record_claims", *(x for x in given if x != "--overwrite")])
    doc = dict(about=__doc__.split("\n\n")[0].replace("\n", " "), summary=a.summary.name,
               summary_sha256=file_sha256(a.summary), command=command, claims=claims, provenance=record())
    write_record(a.out, json.dumps(_clean(doc), indent=1, ensure_ascii=False) + "\n", "records.record_claims", a.overwrite)
    for c in claims:
        print(f"{c['claim']}: {c['verdict']} ({c['reason']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
