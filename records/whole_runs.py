"""The recipe's lead from whole runs under each schedule, and what makes it: per budget, the lead
in every sweep that trained both arms (each at the lr its own sweep chose), the schedule x arm
interaction for every (WSD, cosine) pair of those, what differs between two sweeps of one schedule
(at 4M, the crossover record's cooldown branch against a whole WSD run: what a branch costs each
arm), and the lead at a shared lr (a sweep of the recipe at the lr the baseline chose).

    python -m records.whole_runs sweeps/crossover ~/records/whole_wsd_4m ~/records/whole_cosine_4m \\
        --shared ~/records/shared_cosine_4m ~/records/shared_wsd_4m --out docs/results/crossover_whole

crossover_registry's rule reads its two WSD sweeps at every budget, the lead in each and the lead's
difference between them (what repetition does to it):

    python -m records.whole_runs ~/records/crossover_registry ~/records/crossover_registry_repeat \\
        --family lead,leads_differ --every-budget --out docs/results/crossover_registry

Each sweep's schedule is read from its results table (config/optim.schedule); a per-budget WSD
sweep's cooldown branch at a budget below its largest is the same schedule, step for step, as a
whole WSD run of that budget. Every comparison is a − b paired by seed over the confirm seeds
(--seeds, 1-6); a budget a sweep does not yet hold for every seed is listed as waiting. The
p-values are two-sided paired t-tests, Holm-adjusted over every comparison the record holds
(docs/results/crossover_whole/README.md, "How it is read", fixed before the first read). Writes
`summary.json` (the comparisons, the reader's provenance and the trials') and `lead.md`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from smallinit.core import provenance, written
from smallinit.core.markdown import table as md_table
from smallinit.core.trial_dir import TrialDir
from smallinit.experiments.report.report import write_results_tables
from smallinit.experiments.stats.paired import holm, signflip_p, t_interval, t_pvalues

from . import OVERWRITE_HELP, refusals, sweep_read
from .wsd_check import ARM, LOSS, _complete

ALPHA = 0.05
SCHEDULE = "config/optim.schedule"
SCHEDULE_NAMES = {"wsd": "WSD"}
# What must be the same in two sweeps for their runs to pair: the model and the data, and per arm its recipe.
SAME = ("d_model", "n_layers", "config/train.batch_size", "config/train.seq_len")
# The corpus may differ between sweeps (crossover_registry: the whole corpus and a prefix of it); only
# leads_differ compares across it, every other pairing is between sweeps of one corpus.
CORPUS = "corpus_tokens"
SAME_PER_ARM = ("gamma", "eps", "gate", "norm")
# kind: (what it is, the words for a negative and a positive mean)
KINDS = {
    "lead": ("lead under {schedule}: {a} − {b} ({source})", "recipe ahead", "baseline ahead"),
    "interaction": ("schedule x arm: lead under WSD ({a}) − lead under cosine ({b})", "larger under WSD", "larger under cosine"),
    "sweeps_differ": ("{arm} under {schedule}: {a} − {b}", "lower in {a}", "lower in {b}"),
    "leads_differ": ("lead under {schedule} in {a} − lead in {b}", "larger in {a}", "larger in {b}"),
    "lead_shared_lr": ("lead under {schedule} at the baseline's lr: {recipe} ({a}) − {baseline} ({b})",
                       "recipe ahead", "baseline ahead"),
}


@dataclass
class Sweep:
    name: str
    schedule: str
    runs: pd.DataFrame  # complete confirm runs: budget, train_seed, config/arm, lr, final_val_loss, ...
    table: Any = None  # its results table as read (sweep_read): what the record copies and hashes

    def at(self, budget: int, arm: str, seeds: list[int]) -> pd.DataFrame | None:
        """This arm's runs at `budget`, one per seed in `seeds` order, or None where a seed is missing."""
        g = self.runs[(self.runs["budget"] == budget) & (self.runs[ARM] == arm)].drop_duplicates("train_seed")
        g = g.set_index("train_seed")
        return g.loc[seeds] if set(seeds) <= set(g.index) else None

    def holds(self, budget: int) -> bool:
        return bool((self.runs["budget"] == budget).any())

    @property
    def corpus(self) -> tuple[str, ...]:
        """The training tokens of the corpus its runs read (one value in a sweep that pairs)."""
        return tuple(sorted(set(self.runs[CORPUS].astype(str)))) if CORPUS in self.runs else ()


def same_corpus(a: Sweep, b: Sweep) -> bool:
    return a.corpus == b.corpus or not a.corpus or not b.corpus  # a table without the column: as before, not held


def load(path: Path, arm: str | None = None) -> Sweep:
    """A sweep's complete confirm runs. `arm` names the one arm a sweep trained where it did not sweep
    one (the shared-lr sweeps fix `arm=small`, so their table has no config/arm); check_same then holds
    its γ, eps, gate and norm to that arm's in the other sweeps."""
    table = sweep_read(path)  # one read: the runs, the schedule, the CSV copy and the hash
    runs = _complete(path, table)
    if arm is not None:
        if ARM in runs and set(runs[ARM].astype(str)) - {arm}:
            raise SystemExit(f"error: {path} holds arms {sorted(set(runs[ARM].astype(str)))}: a --shared sweep trains "
                             f"the recipe ({arm}) alone")
        runs = runs.assign(**{ARM: arm})
    budget = (runs["budget_tokens"] if "budget_tokens" in runs else runs["tokens"]).fillna(runs["tokens"])
    runs = runs.assign(budget=budget.astype(int), train_seed=runs["train_seed"].astype(int))
    schedules = sorted(set(table.rows[SCHEDULE].dropna())) if SCHEDULE in table.rows and SCHEDULE in runs else []
    if len(schedules) != 1:
        raise SystemExit(f"error: {path} holds runs of schedules {schedules or 'unknown'}: a sweep read here has one schedule")
    return Sweep(path.name, SCHEDULE_NAMES.get(schedules[0], schedules[0]), runs, table)


def check_same(sweeps: list[Sweep], corpora_may_differ: bool = False) -> None:
    """One line naming the sweeps and the column where two sweeps trained different models or data
    (the corpus may differ only where the rule compares leads across corpora: leads_differ)."""
    for col in (*SAME, *(() if corpora_may_differ else (CORPUS,))):
        values = {s.name: sorted(set(s.runs[col].astype(str))) for s in sweeps if col in s.runs and len(s.runs)}
        if len({tuple(v) for v in values.values()}) > 1:
            raise SystemExit(f"error: the sweeps differ in {col} ({values}): their runs do not pair")
    for col in SAME_PER_ARM:
        for arm in set().union(*(set(s.runs[ARM]) for s in sweeps)):
            values = {s.name: sorted(set(s.runs.loc[s.runs[ARM] == arm, col].astype(str)))
                      for s in sweeps if col in s.runs and (s.runs[ARM] == arm).any()}
            if len({tuple(v) for v in values.values()}) > 1:
                raise SystemExit(f"error: arm {arm} differs in {col} across the sweeps ({values}): their runs do not pair")


def _side(label: str, runs: pd.DataFrame) -> dict:
    return {"label": label, "lrs": sorted({float(x) for x in runs["lr"]}), "mean": float(runs[LOSS].mean())}


def _row(kind: str, budget: int, seeds: list[int], diffs, a: dict, b: dict, **words) -> dict:
    mean, lo, hi = t_interval(diffs)
    return dict(budget_tokens=int(budget), comparison=kind, what=KINDS[kind][0].format(a=a["label"], b=b["label"], **words),
                words=[w.format(a=a["label"], b=b["label"]) for w in KINDS[kind][1:]], a=a, b=b, seeds=seeds,
                diffs=[float(x) for x in diffs], mean=mean, lo=lo, hi=hi, p_two=min(1.0, 2 * min(t_pvalues(diffs))),
                p_signflip=signflip_p(diffs))


# The comparisons crossover_whole's rule reads (its README, "How it is read"); a record with
# another rule names its own with --family.
WHOLE_RUNS_FAMILY = ("lead", "interaction", "sweeps_differ", "lead_shared_lr")


def comparisons(sweeps: list[Sweep], shared: list[Sweep], seeds: list[int], baseline: str, recipe: str,
                family: tuple[str, ...] = WHOLE_RUNS_FAMILY, every_budget: bool = False) -> tuple[list[dict], list[str]]:
    """(every comparison of the kinds in `family` the sweeps hold for all `seeds`, one line per
    sweep and budget still waiting). The budgets read: those a cosine sweep trained (crossover_whole's
    rule: a per-budget WSD record's others are not asked), or with `every_budget` every budget any sweep holds."""
    out = []
    asked = [*sweeps, *(shared if "lead_shared_lr" in family else [])]
    waiting = [f"{s.name}: no complete confirm run yet" for s in asked if s.runs.empty]
    budgets = sorted(set().union(*(set(s.runs["budget"]) for s in sweeps if every_budget or s.schedule == "cosine")))
    for budget in budgets:
        leads: dict[str, tuple[Sweep, object]] = {}
        for s in sweeps:
            if not s.holds(budget):
                continue
            b, r = s.at(budget, baseline, seeds), s.at(budget, recipe, seeds)
            if b is None or r is None:
                waiting.append(f"{budget:,} tokens: {s.name} holds {_held(s, budget, seeds, (baseline, recipe))}")
                continue
            d = r[LOSS].to_numpy(float) - b[LOSS].to_numpy(float)
            leads[s.name] = (s, d)
            if "lead" in family:
                out.append(_row("lead", budget, seeds, d, _side(recipe, r), _side(baseline, b), schedule=s.schedule,
                                source=s.name))
        for (w, dw), (c, dc) in itertools.product(leads.values(), leads.values()):
            if "interaction" in family and w.schedule == "WSD" and c.schedule == "cosine" and same_corpus(w, c):
                out.append(_row("interaction", budget, seeds, dw - dc, {"label": w.name, "mean": float(dw.mean())},
                                {"label": c.name, "mean": float(dc.mean())}))
        for (s1, d1), (s2, d2) in itertools.combinations(leads.values(), 2):
            if "leads_differ" in family and s1.schedule == s2.schedule:
                out.append(_row("leads_differ", budget, seeds, d1 - d2, {"label": s1.name, "mean": float(d1.mean())},
                                {"label": s2.name, "mean": float(d2.mean())}, schedule=s1.schedule))
            if "sweeps_differ" in family and s1.schedule == s2.schedule and same_corpus(s1, s2):
                for arm in (baseline, recipe):
                    x, y = s1.at(budget, arm, seeds), s2.at(budget, arm, seeds)
                    out.append(_row("sweeps_differ", budget, seeds, x[LOSS].to_numpy(float) - y[LOSS].to_numpy(float),
                                    _side(s1.name, x), _side(s2.name, y), arm=arm, schedule=s1.schedule))
        for h in shared if "lead_shared_lr" in family else []:
            if h.holds(budget):
                out.extend(_shared_lead(h, [s for s, _ in leads.values()], budget, seeds, baseline, recipe, waiting))
    return out, waiting


def _count(s: Sweep, budget: int, seeds: list[int], arm: str) -> int:
    g = s.runs[(s.runs["budget"] == budget) & (s.runs[ARM] == arm)]
    return len(set(g["train_seed"]) & set(seeds))


def _held(s: Sweep, budget: int, seeds: list[int], arms: tuple[str, ...]) -> str:
    """How many of the seeds each arm holds at budget ('4 of 6 seeds in both arms', or each arm's
    count where they differ: an arm with none is named, not left out)."""
    counts = [_count(s, budget, seeds, arm) for arm in arms]
    if len(set(counts)) == 1:
        return f"{counts[0]} of {len(seeds)} seeds in {'both arms' if len(arms) == 2 else arms[0]}"
    return " and ".join(f"{n} of {len(seeds)} seeds in {arm}" for arm, n in zip(arms, counts))


def _shared_lead(h: Sweep, sweeps: list[Sweep], budget: int, seeds: list[int], baseline: str, recipe: str,
                 waiting: list[str]) -> list[dict]:
    """The recipe at one lr (sweep h) against the baseline of each complete sweep of h's schedule
    whose baseline chose that lr."""
    r = h.at(budget, recipe, seeds)
    if r is None:
        waiting.append(f"{budget:,} tokens: {h.name} holds {_held(h, budget, seeds, (recipe,))}")
        return []
    rows = []
    for s in sweeps:
        b = s.at(budget, baseline, seeds)
        if s.schedule == h.schedule and same_corpus(s, h) and set(b["lr"]) == set(r["lr"]):
            rows.append(_row("lead_shared_lr", budget, seeds, r[LOSS].to_numpy(float) - b[LOSS].to_numpy(float),
                             _side(h.name, r), _side(s.name, b), schedule=s.schedule, recipe=recipe, baseline=baseline))
    if not rows:
        waiting.append(f"{budget:,} tokens: {h.name} (lr {sorted(set(r['lr']))}) has no complete {h.schedule} sweep "
                       "whose baseline chose its lr")
    return rows


INTERIM = "interim: not a verdict (comparisons still waiting)"


def judge(rows: list[dict], interim: bool = False) -> None:
    """Holm over the family; each row's verdict and the effects its interval excludes. While any
    comparison of the family waits (`interim`), Holm here runs over fewer comparisons than the
    record's rule fixes, so its p-values are too small: no row gets a verdict, only INTERIM."""
    for row, adjusted in zip(rows, holm([r["p_two"] for r in rows])):
        row["p_holm"] = adjusted
        below, above = row["words"]
        if interim:
            row["verdict"] = INTERIM
        elif row["lo"] > 0 or row["hi"] < 0:
            word = below if row["hi"] < 0 else above
            row["verdict"] = word if adjusted <= ALPHA else f"inconclusive ({word} before Holm)"
        else:
            row["verdict"] = "inconclusive"
        row["excludes"] = f"below {row['lo']:+.4f} and above {row['hi']:+.4f}"


def trials_made_by(sweeps: list[Path], frames: list[pd.DataFrame]) -> dict:
    """What made each sweep's trials read: their commits, dtypes, torch and machines."""
    return {sweep.name: _made_by(sweep, df) for sweep, df in zip(sweeps, frames)}


def _made_by(sweep: Path, df: pd.DataFrame) -> dict:
    seen: dict[str, set] = {"commits": set(), "dirty": set(), "dtypes": set(), "machines": set(), "torch": set()}
    for rel in sorted(set(df["trial_dir"])) if not df.empty else []:
        made = (TrialDir(sweep / rel).read_result(damaged_ok=True) or {}).get("made_by") or {}
        m = made.get("machine") or {}
        seen["commits"].add(made.get("commit"))
        seen["dirty"].add(made.get("dirty"))
        seen["dtypes"].add(made.get("dtype"))
        seen["torch"].add((made.get("packages") or {}).get("torch"))
        seen["machines"].add(f"{m.get('cpu_model')} ({m.get('cpu_count')} cores; "
                             f"{'AMX' if 'amx_bf16' in (m.get('cpu_flags') or []) else 'no AMX'})")
    return {k: sorted(str(x) for x in v) for k, v in seen.items()}


def _describe(side: dict) -> str:
    lrs = f" at {', '.join(f'{x:g}' for x in side['lrs'])}" if side.get("lrs") else ""
    return f"{side['label']}{lrs}: {side['mean']:.4f}"


def markdown(rows: list[dict], waiting: list[str], command: str) -> str:
    header = ["budget [tokens]", "comparison (a − b)", "a", "b", "mean", "95% interval", "t p", "Holm p",
              "sign-flip p", "verdict"]
    body = [[f"{r['budget_tokens']:,}", r["what"], _describe(r["a"]), _describe(r["b"]), f"{r['mean']:+.4f}",
             f"[{r['lo']:+.4f}, {r['hi']:+.4f}]", f"{r['p_two']:.3g}", f"{r['p_holm']:.3g}", f"{r['p_signflip']:.3g}",
             r["verdict"]] for r in rows]
    text = (f"The recipe's lead per schedule from whole runs (`{command}`): final validation loss, nats/token, "
            f"a − b paired by seed (columns a and b: each side's mean loss, or for an interaction each side's mean "
            f"lead); Holm over the {len(rows)} comparisons below.\n\n")
    if waiting and rows:
        text += ("**Interim**: comparisons of the family lack seeds (below), so the Holm p-values here are over "
                 "fewer comparisons than the record's rule and no row is a verdict until every comparison it "
                 "names has its seeds.\n\n")
    text += md_table(header, body) if body else "No budget has all its confirm seeds yet."
    if waiting:
        text += "\n\nWaiting: " + "; ".join(waiting) + "."
    return text


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in text.split(",")]


BY = "records.whole_runs"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", type=Path, nargs="+", help="sweeps of both arms, each arm at its chosen lr, any schedule")
    ap.add_argument("--shared", type=Path, nargs="*", default=[], help="sweeps of the recipe alone at the baseline's chosen lr")
    ap.add_argument("--seeds", default="1-6", help="the confirm seeds every comparison pairs over: 1-6 or 1,2,3")
    ap.add_argument("--baseline", default="baseline", help="the baseline arm's name (config/arm)")
    ap.add_argument("--recipe", default="small", help="the recipe arm's name (config/arm)")
    ap.add_argument("--family", default=",".join(WHOLE_RUNS_FAMILY),
                    help=f"the kinds of comparison the record's rule reads, comma-separated, of {sorted(KINDS)}")
    ap.add_argument("--every-budget", action="store_true",
                    help="read every budget the sweeps hold (default: those a cosine sweep trained)")
    ap.add_argument("--out", type=Path, help="write summary.json and lead.md into this folder")
    ap.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    args = ap.parse_args(argv)
    family = tuple(k.strip() for k in args.family.split(",") if k.strip())
    if set(family) - set(KINDS) or not family:
        ap.error(f"--family={args.family!r} is invalid: comma-separated kinds of {sorted(KINDS)}")
    paths = [*args.sweeps, *args.shared]
    sweeps, shared = [load(p) for p in args.sweeps], [load(p, arm=args.recipe) for p in args.shared]
    check_same([*sweeps, *shared], corpora_may_differ="leads_differ" in family)
    rows, waiting = comparisons(sweeps, shared, _seeds(args.seeds), args.baseline, args.recipe, family, args.every_budget)
    judge(rows, interim=bool(waiting))
    command = (f"python -m records.whole_runs {' '.join(p.name for p in args.sweeps)}"
               + (f" --shared {' '.join(p.name for p in args.shared)}" if args.shared else "")
               + (f" --family {','.join(family)}" if family != WHOLE_RUNS_FAMILY else "")
               + (" --every-budget" if args.every_budget else ""))
    text = markdown(rows, waiting, command)
    print(text)
    if args.out:
        with refusals():  # every file checked before the first is written
            written.check(args.out, [*(f"results-{p.name}.csv" for p in paths), "summary.json", "lead.md"], args.overwrite)
        read = [s.table for s in [*sweeps, *shared]]  # the tables compared above, as read
        tables = write_results_tables(read, args.out, by=BY)  # kept beside the record as CSV
        block = {**provenance.record(), "results_sha256": {t.folder.name: t.sha256 for t in read}, "results_tables": tables}
        summary = {"provenance": block, "trials_made_by": trials_made_by(paths, [s.runs for s in [*sweeps, *shared]]),
                   "sources": {s.name: s.schedule for s in [*sweeps, *shared]},
                   "corpus_tokens": {s.name: list(s.corpus) for s in [*sweeps, *shared]}, "seeds": _seeds(args.seeds),
                   "alpha": ALPHA, "family": list(family), "every_budget": args.every_budget, "comparisons": rows,
                   "waiting": waiting, "interim": bool(waiting)}
        written.write_outputs(args.out, {"summary.json": json.dumps(summary, indent=1, default=float) + "\n",
                                         "lead.md": text + "\n"}, by=BY, adopt=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
