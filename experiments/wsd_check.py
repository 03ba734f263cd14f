"""Does a WSD cooldown branch (train.budgets) reach the loss of a dedicated cosine run of its
budget? Pairs each cosine trial of one sweep with the branch of another sweep's trial that is the
same model, arm, lr and seeds at that budget, and gives the paired difference per budget.

    python -m experiments.wsd_check --wsd sweeps/scaling_law --cosine sweeps/wsd_check [--out check.md]

conf/experiment/wsd_check.yaml runs the cosine side of the scaling_law record's check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from .stats import t_interval

# What makes a branch and a cosine run the same trial but for the schedule.
MATCH = ("d_model", "n_layers", "gamma", "eps", "gate", "norm", "lr", "init_seed", "train_seed")
LOSS = "final_val_loss"


def _complete(sweep: Path) -> pd.DataFrame:
    path = sweep / "results.parquet"
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: run that sweep's command first")
    df = pd.read_parquet(path)
    return df[(df["state"] == "COMPLETE") & np.isfinite(df[LOSS])]


def pair(wsd: pd.DataFrame, cosine: pd.DataFrame) -> pd.DataFrame:
    """One row per cosine trial with its branch: budget, seeds, both losses, wsd - cosine."""
    branches = wsd[wsd["budget_tokens"].notna()].assign(budget=lambda d: d["budget_tokens"].astype(int))
    runs = cosine[cosine["budget_tokens"].isna()].assign(budget=lambda d: d["tokens"].astype(int))
    keys = [*MATCH, "budget"]
    joined = runs[[*keys, LOSS]].merge(branches[[*keys, LOSS]], on=keys, suffixes=("_cosine", "_wsd"))
    return joined.assign(diff=joined[f"{LOSS}_wsd"] - joined[f"{LOSS}_cosine"]).sort_values(["budget", "train_seed"])


def table(pairs: pd.DataFrame) -> str:
    lines = ["| budget [tokens] | seeds | WSD branch | cosine run | WSD − cosine | 95% interval |",
             "|---|---|---|---|---|---|"]
    for budget, g in pairs.groupby("budget"):
        mean, lo, hi = t_interval(g["diff"].to_numpy())
        lines.append(f"| {budget:,} | {', '.join(str(int(s)) for s in g['train_seed'])} | "
                     f"{g[f'{LOSS}_wsd'].mean():.4f} | {g[f'{LOSS}_cosine'].mean():.4f} | {mean:+.4f} | "
                     f"[{lo:+.4f}, {hi:+.4f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wsd", type=Path, required=True, help="the sweep whose trials ran train.budgets")
    ap.add_argument("--cosine", type=Path, required=True, help="the sweep of dedicated runs, one per budget")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args(argv)
    pairs = pair(_complete(args.wsd), _complete(args.cosine))
    if pairs.empty:
        print(f"error: no cosine trial of {args.cosine} matches a branch of {args.wsd} (same {', '.join(MATCH)} "
              "and budget)", file=sys.stderr)
        return 1
    text = table(pairs) + ("\n\nPer pair (loss in nats/token):\n\n" +
                           pairs[["budget", "train_seed", f"{LOSS}_wsd", f"{LOSS}_cosine", "diff"]]
                           .to_markdown(index=False, floatfmt=".4f"))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
