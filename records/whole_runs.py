"""The recipe's lead from whole runs under each schedule, and how much of it the schedule makes:
per budget, the lead under cosine (whole cosine runs), the lead under WSD (a per-budget WSD record:
its cooldown branch at a budget below its largest is the same schedule, step for step, as a whole
WSD run of that budget) and their difference per seed, the schedule x arm interaction.

    python -m records.whole_runs --wsd sweeps/crossover \\
        --cosine ~/records/whole_cosine_4m [~/records/whole_cosine_8m] --out docs/results/crossover_whole

Every arm is at the lr its own sweep chose for that budget; runs are paired by seed. A budget is
read once its cosine sweep holds every confirm seed of both arms; until then it is listed as
waiting. The p-values are two-sided paired t-tests, Holm-adjusted over every comparison the record
holds (docs/results/crossover_whole/README.md, "How it is read", fixed before the first read).
Writes `summary.json` (the comparisons, the reader's provenance and the trials') and `lead.md`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from smallinit.core import provenance
from smallinit.core.markdown import table as md_table
from smallinit.core.results_schema import results_path
from smallinit.core.trial_dir import TrialDir
from smallinit.experiments.report.report import write_results_tables
from smallinit.experiments.stats.paired import holm, signflip_p, t_interval, t_pvalues

from .wsd_check import LOSS, _complete, pair

ALPHA = 0.05
# name: (what it is, the words for a negative and a positive mean)
KINDS = {
    "lead_cosine": ("lead under cosine: {r} − {b}, whole cosine runs", "recipe ahead", "baseline ahead"),
    "lead_wsd": ("lead under WSD: {r} − {b}, the WSD record", "recipe ahead", "baseline ahead"),
    "interaction": ("schedule x arm: lead under WSD − lead under cosine", "larger under WSD", "larger under cosine"),
}


def comparisons(pairs: pd.DataFrame, confirm_seeds: dict[int, set[int]], baseline: str) -> tuple[list[dict], list[str]]:
    """(one dict per comparison of the budgets whose cosine runs hold every confirm seed, one line
    for each budget still waiting). `confirm_seeds`: {budget: the cosine sweep's confirm seeds}."""
    out, waiting = [], []
    recipe = next((a for a in sorted(pairs["param.arm"].unique()) if a != baseline), None)
    for budget, want in sorted(confirm_seeds.items()):
        g = pairs[pairs["budget"] == budget]
        wide = {side: g.pivot(index="train_seed", columns="param.arm", values=f"{LOSS}_{side}")
                for side in ("cosine", "wsd")}
        seeds = sorted(int(s) for s in wide["cosine"].dropna().index)
        if recipe is None or not want or not want <= set(seeds) or baseline not in wide["cosine"]:
            waiting.append(f"{budget:,} tokens: {len(seeds)} of {len(want) or '?'} confirm seeds paired in both arms")
            continue
        seeds = sorted(want)
        lead = {side: (w.loc[seeds, recipe] - w.loc[seeds, baseline]).to_numpy(float) for side, w in wide.items()}
        lrs = {side: {arm: sorted({float(x) for x in g.loc[g["param.arm"] == arm, f"lr_{side}"]}) for arm in (baseline, recipe)}
               for side in ("cosine", "wsd")}
        arm_means = {side: {arm: float(w.loc[seeds, arm].mean()) for arm in (baseline, recipe)} for side, w in wide.items()}
        for name, d, side in (("lead_cosine", lead["cosine"], "cosine"), ("lead_wsd", lead["wsd"], "wsd"),
                              ("interaction", lead["wsd"] - lead["cosine"], None)):
            mean, lo, hi = t_interval(d)
            out.append(dict(budget_tokens=int(budget), comparison=name, recipe=recipe, baseline=baseline,
                            seeds=seeds, diffs=[float(x) for x in d], mean=mean, lo=lo, hi=hi,
                            p_two=min(1.0, 2 * min(t_pvalues(d))), p_signflip=signflip_p(d), lrs=lrs,
                            arm_means=arm_means[side] if side else None))
    return out, waiting


def judge(rows: list[dict]) -> None:
    """Holm over the family; each row's verdict and the effects its interval excludes."""
    for row, adjusted in zip(rows, holm([r["p_two"] for r in rows])):
        row["p_holm"] = adjusted
        below, above = KINDS[row["comparison"]][1:]
        if row["lo"] > 0 or row["hi"] < 0:
            word = below if row["hi"] < 0 else above
            row["verdict"] = word if adjusted <= ALPHA else f"inconclusive ({word} before Holm)"
        else:
            row["verdict"] = "inconclusive"
        row["excludes"] = (f"below {row['lo']:+.4f} and above {row['hi']:+.4f}")


def trials_made_by(sweeps: list[Path], frames: list[pd.DataFrame]) -> dict:
    """What made the trials read: their commits, dtypes, compile choices' kind and machines."""
    seen: dict[str, set] = {"commits": set(), "dirty": set(), "dtypes": set(), "machines": set(), "torch": set()}
    for sweep, df in zip(sweeps, frames):
        for rel in sorted(set(df["trial_dir"])):
            made = (TrialDir(sweep / rel).read_result() or {}).get("made_by") or {}
            m = made.get("machine") or {}
            seen["commits"].add(made.get("commit"))
            seen["dirty"].add(made.get("dirty"))
            seen["dtypes"].add(made.get("dtype"))
            seen["torch"].add((made.get("packages") or {}).get("torch"))
            seen["machines"].add(f"{m.get('cpu_model')} ({m.get('cpu_count')} cores; "
                                 f"{'AMX' if 'amx_bf16' in (m.get('cpu_flags') or []) else 'no AMX'})")
    return {k: sorted(str(x) for x in v) for k, v in seen.items()}


def markdown(rows: list[dict], waiting: list[str], sources: dict) -> str:
    header = ["budget [tokens]", "comparison", "lrs (baseline, recipe)", "loss (baseline, recipe)", "mean",
              "95% interval", "t p", "Holm p", "sign-flip p", "verdict"]
    body = []
    for r in rows:
        lrs = "" if r["comparison"] == "interaction" else "; ".join(
            f"{', '.join(f'{x:g}' for x in r['lrs'][side][r['baseline']])}, {', '.join(f'{x:g}' for x in r['lrs'][side][r['recipe']])}"
            for side in (("cosine",) if r["comparison"] == "lead_cosine" else ("wsd",)))
        losses = ", ".join(f"{r['arm_means'][a]:.4f}" for a in (r["baseline"], r["recipe"])) if r["arm_means"] else ""
        body.append([f"{r['budget_tokens']:,}", KINDS[r["comparison"]][0].format(r=r["recipe"], b=r["baseline"]), lrs,
                     losses, f"{r['mean']:+.4f}", f"[{r['lo']:+.4f}, {r['hi']:+.4f}]", f"{r['p_two']:.3g}", f"{r['p_holm']:.3g}",
                     f"{r['p_signflip']:.3g}", r["verdict"]])
    text = (f"The recipe's lead per schedule from whole runs (`python -m records.whole_runs "
            f"--wsd {sources['wsd']} --cosine {' '.join(sources['cosine'])}`): final validation loss, nats/token, "
            f"paired by seed; Holm over the {len(rows)} comparisons below.\n\n")
    text += md_table(header, body) if body else "No budget has all its confirm seeds yet."
    if waiting:
        text += "\n\nWaiting: " + "; ".join(waiting) + "."
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wsd", type=Path, required=True, help="the per-budget WSD record's sweep (train.budgets)")
    ap.add_argument("--cosine", type=Path, nargs="+", required=True, help="sweeps of whole cosine runs, one budget each")
    ap.add_argument("--baseline", default="baseline", help="the baseline arm's name (param.arm)")
    ap.add_argument("--out", type=Path, help="write summary.json and lead.md into this folder")
    args = ap.parse_args(argv)
    wsd = _complete(args.wsd)
    cosine = [_complete(s) for s in args.cosine]
    pairs = pd.concat([pair(wsd, c) for c in cosine], ignore_index=True)
    confirm = {}
    for sweep, c in zip(args.cosine, cosine):
        seeds = set(json.loads((sweep / "protocol.json").read_text()).get("confirm_seeds") or [])
        for b in set(c["budget_tokens"].fillna(c["tokens"]).astype(int)):
            confirm[int(b)] = seeds
    rows, waiting = comparisons(pairs, confirm, args.baseline)
    judge(rows)
    sources = {"wsd": args.wsd.name, "cosine": [s.name for s in args.cosine]}
    text = markdown(rows, waiting, sources)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        sweeps = [args.wsd, *args.cosine]
        tables = write_results_tables(sweeps, args.out)  # the tables read, kept beside the record as CSV
        block = {**provenance.record(), "results_sha256": {d.name: provenance.file_sha256(results_path(d)) for d in sweeps},
                 "results_tables": tables}
        summary = {"provenance": block, "trials_made_by": trials_made_by([args.wsd, *args.cosine], [wsd, *cosine]),
                   "sources": sources, "alpha": ALPHA, "comparisons": rows, "waiting": waiting}
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
        (args.out / "lead.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
