"""Does a WSD cooldown branch (train.budgets) reach the loss of a dedicated cosine run of its
budget? Pairs each cosine trial of one sweep with the branch of another sweep's trial that is the
same model, arm and seeds at that budget, each at the lr its own sweep chose (the confirm trials
of a select-then-confirm sweep; every trial of a sweep without one), and gives the paired
difference per budget.

    python -m records.wsd_check --wsd sweeps/scaling_law --cosine sweeps/wsd_check [--out check.md]

conf/experiment/wsd_check.yaml runs the cosine side of the scaling_law record's check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from smallinit.core.markdown import table as md_table
from smallinit.experiments.stats.paired import signflip_p, t_interval

from . import OVERWRITE_HELP, sweep_protocol, sweep_table, write_record

# What makes a branch and a cosine run the same trial but for the schedule and its lr.
MATCH = ("d_model", "n_layers", "gamma", "eps", "gate", "norm", "init_seed", "train_seed")
LOSS = "final_val_loss"
ARM = "config/arm"  # the arm's name, where the sweeps swept one (matched too, and used to label rows)


def _complete(sweep: Path, table=None) -> pd.DataFrame:
    """The sweep's complete runs (of `table`, a sweep_read of it, where given)."""
    df = sweep_table(sweep, table=table)
    df = df.assign(**{LOSS: pd.to_numeric(df[LOSS], errors="coerce")})  # all empty while a sweep's first trials run
    df = df[(df["state"] == "COMPLETE") & np.isfinite(df[LOSS])]
    # A select-then-confirm sweep compares its confirm runs only, none until its confirm round has
    # run; its tuning runs (read mid-stage-1, before protocol.json exists) choose lrs, never compare.
    if "role" in df:
        df = df[df["role"].astype(str) != "tune"]
        if (sweep / "protocol.json").is_file() or (df["role"] == "confirm").any():
            df = df[df["role"] == "confirm"]
    return at_budget_choice(df, sweep)


def at_budget_choice(df: pd.DataFrame, sweep: Path) -> pd.DataFrame:
    """A sweep that chose each budget's lr (protocol per_budget) runs its confirm seeds at several
    lrs: keep, per arm and budget, only the branches at the lr that budget chose."""
    record = sweep_protocol(sweep)
    if not record.get("per_budget") or ARM not in df:
        return df
    chosen = {(c["setting"].get("arm"), int(x["budget_tokens"])): float(f"{x['chosen']['optim.lr']:.6g}")
              for c in record.get("choices", []) for x in c.get("chosen_by_budget") or []}
    keep = [chosen.get((arm, int(b))) == float(f"{lr:.6g}")
            for arm, b, lr in zip(df[ARM], df["budget_tokens"], df["lr"])]
    return df[keep]


def pair(wsd: pd.DataFrame, cosine: pd.DataFrame) -> pd.DataFrame:
    """One row per cosine trial with its branch: budget, seeds, both losses, wsd - cosine."""
    def budget(d: pd.DataFrame) -> pd.Series:  # a one-budget trial's row may leave budget_tokens empty
        return (d["budget_tokens"] if "budget_tokens" in d else d["tokens"]).fillna(d["tokens"]).astype(int)

    branches, runs = wsd.assign(budget=budget), cosine.assign(budget=budget)
    keys = [*MATCH, *([ARM] if ARM in wsd and ARM in cosine else []), "budget"]
    joined = runs[[*keys, "lr", LOSS]].merge(branches[[*keys, "lr", LOSS]], on=keys, suffixes=("_cosine", "_wsd"))
    return joined.assign(diff=joined[f"{LOSS}_wsd"] - joined[f"{LOSS}_cosine"]).sort_values(["budget", "train_seed"])


def _arm_labels(pairs: pd.DataFrame) -> pd.Series:
    if ARM in pairs:
        return pairs[ARM].astype(str)
    return "γ, eps, gate = " + pairs[["gamma", "eps", "gate"]].astype(str).agg(" ".join, axis=1)


def table(pairs: pd.DataFrame) -> str:
    header = ["budget [tokens]", "seeds", "lr WSD", "lr cosine", "WSD branch", "cosine run", "WSD − cosine", "95% interval"]
    rows = []
    arms = _arm_labels(pairs)
    several = arms.nunique() > 1
    for (budget, arm), g in pairs.assign(_arm=arms).groupby(["budget", "_arm"]):
        mean, lo, hi = t_interval(g["diff"].to_numpy())
        lrs = [", ".join(f"{v:g}" for v in sorted(g[f"lr_{side}"].unique())) for side in ("wsd", "cosine")]
        label = f"{budget:,}" + (f" ({arm})" if several else "")
        rows.append([label, ", ".join(str(int(s)) for s in g["train_seed"]), lrs[0], lrs[1],
                     f"{g[f'{LOSS}_wsd'].mean():.4f}", f"{g[f'{LOSS}_cosine'].mean():.4f}", f"{mean:+.4f}",
                     f"[{lo:+.4f}, {hi:+.4f}]"])
    return md_table(header, rows)


def arm_difference(pairs: pd.DataFrame, baseline: str) -> str | None:
    """What the branch costs one arm more than the other: per budget, the seed-paired difference
    of the two arms' (WSD - cosine). A gap read off the branches carries this difference; an
    interval that holds 0 says the branches cost the arms alike within what the seeds resolve."""
    arms = _arm_labels(pairs)
    if arms.nunique() != 2 or baseline not in set(arms):
        return None
    other = next(a for a in arms.unique() if a != baseline)
    rows = []
    for budget, g in pairs.assign(_arm=arms).groupby("budget"):
        if g.duplicated(["train_seed", "_arm"]).any():  # two cosine runs of one seed would be averaged unseen
            raise SystemExit(f"error: budget {budget:,} pairs one seed of one arm more than once: the sweeps hold "
                             "two runs of the same trial")
        cost = g.pivot(index="train_seed", columns="_arm", values="diff").dropna()
        if len(cost) < 2 or cost.shape[1] != 2:
            continue
        d = (cost[other] - cost[baseline]).to_numpy()
        mean, lo, hi = t_interval(d)
        rows.append([f"{budget:,}", ", ".join(str(int(s)) for s in cost.index), f"{cost[baseline].mean():+.4f}",
                     f"{cost[other].mean():+.4f}", f"{mean:+.4f}", f"[{lo:+.4f}, {hi:+.4f}]", f"{signflip_p(d):.3g}"])
    if not rows:
        return None
    header = ["budget [tokens]", "seeds", f"branch cost, {baseline}", f"branch cost, {other}",
              f"{other} − {baseline}", "95% interval", "sign-flip p"]
    return (f"What the branch costs {other} beyond {baseline} (each arm's WSD − cosine, paired by seed): a gap between "
            "the arms read off the branches at that budget is off by this much.\n\n" + md_table(header, rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wsd", type=Path, required=True, help="the sweep whose trials ran train.budgets")
    ap.add_argument("--cosine", type=Path, required=True, help="the sweep of dedicated runs, one per budget")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    ap.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    ap.add_argument("--baseline", default="baseline", help="the arm (config/arm) the other's branch cost is compared with")
    args = ap.parse_args(argv)
    pairs = pair(_complete(args.wsd), _complete(args.cosine))
    if pairs.empty:
        print(f"error: no cosine trial of {args.cosine} matches a branch of {args.wsd} (same {', '.join(MATCH)} "
              "and budget)", file=sys.stderr)
        return 1
    text = (f"A WSD cooldown branch against a dedicated cosine run of its budget (`python -m records.wsd_check "
            f"--wsd {args.wsd.name} --cosine {args.cosine.name}`): paired by seed, each at the lr its own sweep "
            f"chose; final validation loss, nats/token.\n\n" + table(pairs))
    extra = arm_difference(pairs, args.baseline)
    if extra:
        text += "\n\n" + extra
    print(text)
    if args.out:
        write_record(args.out, text + "\n", "records.wsd_check", args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
