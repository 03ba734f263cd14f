"""Does bf16 autocast train to the same loss as fp32? Read from a sweep over train.dtype.

    python sweep.py -m +experiment=bf16_check
    python -m records.dtype_check sweeps/bf16_check [--json out.json]

The two dtypes are paired by seed (same init noise, same data order), so d_s = loss_bf16(s) -
loss_fp32(s), and the mean gap gets a 95% t-interval (experiments/stats/stats.py). Three outcomes:
- "bf16 changes the loss": the interval excludes 0, and the gap kept its sign over the last
  quarter of training (read from the trials' metrics.jsonl, as the report reads every claim);
  if it flipped there, the outcome is "inconclusive" and says so;
- "inside the seed spread": it holds 0 and the mean gap is no larger than the seed-to-seed
  spread of the fp32 losses (their standard deviation): the precision moves the result less
  than the choice of seed does;
- "inconclusive": it holds 0 but the mean gap is larger than that spread; the line names the
  largest bias the data still allows (more seeds narrow it).
The throughput of each dtype, measured in the same trials, is printed beside it. Exit status 0
only for "inside the seed spread".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from smallinit.core import provenance
from smallinit.core import results_schema as schema
from smallinit.experiments.data.load import SEED_COLS, ReportError, load
from smallinit.experiments.stats.stats import compare, interaction

from . import OVERWRITE_HELP, write_record

REFERENCE, CANDIDATE = "fp32", "bf16"


@dataclass
class DtypeGap:
    pairs: int
    loss_fp32: list[float]  # per seed, in seed order
    loss_bf16: list[float]
    gap: float  # mean of bf16 - fp32 over the seed pairs
    gap_lo: float  # its 95% t-interval
    gap_hi: float
    seed_sd_fp32: float  # standard deviation of the fp32 losses across seeds
    tokens_per_s_fp32: float  # medians over the trials
    tokens_per_s_bf16: float
    settled: bool | None = None  # did the gap's sign hold over the last quarter (None: no curves)
    settle_note: str = ""

    @property
    def outcome(self) -> str:
        """one pair | changes | inside | inconclusive"""
        if self.pairs < 2:
            return "one pair"
        if self.gap_lo > 0 or self.gap_hi < 0:
            return "inconclusive" if self.settled is False else "changes"
        return "inside" if abs(self.gap) <= self.seed_sd_fp32 else "inconclusive"

    @property
    def inside_spread(self) -> bool:
        return self.outcome == "inside"

    @property
    def verdict(self) -> str:
        allowed = max(abs(self.gap_lo), abs(self.gap_hi))
        return {
            "one pair": "one seed pair decides nothing; run seed=0,1,2",
            "changes": f"bf16 changes the loss ({'higher' if self.gap > 0 else 'lower'} by {abs(self.gap):.4f} nats)",
            "inside": f"bf16 sits inside the seed spread (the data allows a bias up to {allowed:.4f} nats)",
            "inconclusive": (f"inconclusive: the final gap excludes 0 but {self.settle_note}; run longer"
                             if self.settled is False else
                             f"inconclusive: no bias shown, but the mean gap is larger than the seed spread; the data "
                             f"allows a bias up to {allowed:.4f} nats (more seeds narrow it)"),
        }[self.outcome]

    def lines(self) -> list[str]:
        return [f"seed pairs: {self.pairs}",
                "final val loss fp32: " + ", ".join(f"{v:.4f}" for v in self.loss_fp32),
                "final val loss bf16: " + ", ".join(f"{v:.4f}" for v in self.loss_bf16),
                f"gap bf16 - fp32: {self.gap:+.4f} nats (95% interval {self.gap_lo:+.4f} to {self.gap_hi:+.4f})",
                f"seed spread (sd of fp32 losses): {self.seed_sd_fp32:.4f} nats",
                f"over training: {self.settle_note or 'not read'}",
                f"throughput: fp32 {self.tokens_per_s_fp32:,.0f} tok/s, bf16 {self.tokens_per_s_bf16:,.0f} tok/s "
                f"({self.tokens_per_s_bf16 / self.tokens_per_s_fp32:.2f}x)",
                f"verdict: {self.verdict}"]


def dtype_gap(complete: pd.DataFrame) -> DtypeGap:
    """The paired bf16 - fp32 gap of COMPLETE trials (a frame with dtype, the seed columns,
    final_val_loss and tokens_per_s), through the report's own comparison (stats.compare)."""
    loss = schema.FINAL_VAL_LOSS
    rows = {d: complete[complete["dtype"] == d] for d in (REFERENCE, CANDIDATE)}
    missing = [d for d, r in rows.items() if r.empty]
    if missing:
        raise ReportError(f"no COMPLETE trial computed in {missing[0]} (dtype column: "
                          f"{sorted(complete['dtype'].dropna().unique())}); sweep train.dtype=fp32,bf16")
    c = compare(rows[CANDIDATE], rows[REFERENCE], loss, curve="val/loss")
    if not c.paired:
        raise ReportError("fp32 and bf16 trials share no seed: sweep both dtypes over the same seed=...")
    per_seed = {d: r.groupby(list(SEED_COLS))[loss].mean() for d, r in rows.items()}
    shared = per_seed[REFERENCE].index.intersection(per_seed[CANDIDATE].index)
    ref, cand = per_seed[REFERENCE].loc[shared], per_seed[CANDIDATE].loc[shared]
    sd = float(np.std(ref.to_numpy(dtype=float), ddof=1)) if len(ref) > 1 else math.nan
    speed = {d: float(r["tokens_per_s"].median()) for d, r in rows.items()}
    return DtypeGap(c.n, [float(v) for v in ref], [float(v) for v in cand], c.diff, c.lo, c.hi, sd,
                    speed[REFERENCE], speed[CANDIDATE], c.settled, c.settle_note)


@dataclass
class GapChange:
    """Does bf16 move the gap between two arms? (small − baseline in bf16) − (small − baseline in
    fp32) per seed: each arm's own dtype gap, and the change of the arms' gap, with its interval."""

    arms: dict[str, DtypeGap]  # each arm's bf16 − fp32
    gap_fp32: float  # small − baseline, mean over the shared seeds
    gap_bf16: float
    change: float  # gap_bf16 − gap_fp32
    lo: float
    hi: float
    pairs: int
    diffs: list[float]
    settle_note: str = ""

    @property
    def verdict(self) -> str:
        if self.pairs < 2:
            return "one seed decides nothing"
        allowed = max(abs(self.lo), abs(self.hi))
        if self.lo > 0 or self.hi < 0:
            return (f"bf16 changes the arms' gap by {self.change:+.4f} nats (95% interval {self.lo:+.4f} to {self.hi:+.4f}): "
                    "the lead's records stay in fp32")
        shown = f"no change of the gap shown: {self.change:+.4f} nats (95% interval {self.lo:+.4f} to {self.hi:+.4f})"
        if allowed >= abs(self.gap_fp32):
            return (f"inconclusive: {shown}, but the data still allows a change of {allowed:.4f} nats, more than the "
                    f"gap itself ({self.gap_fp32:+.4f} in fp32): it cannot say bf16 leaves the gap unchanged (more seeds "
                    "narrow it); records whose gaps are this small stay fp32")
        return f"{shown}; bf16 moves the arms' gap by at most {allowed:.4f} nats, against a gap of {self.gap_fp32:+.4f} in fp32"

    def lines(self) -> list[str]:
        out = []
        for arm, g in self.arms.items():
            out += [f"{arm}: " + line for line in g.lines()[:4]] + [f"{arm}: " + g.lines()[6]]
        return out + [f"gap small − baseline: fp32 {self.gap_fp32:+.4f}, bf16 {self.gap_bf16:+.4f} nats over {self.pairs} seeds",
                      "change of the gap per seed: " + ", ".join(f"{d:+.4f}" for d in self.diffs),
                      f"over training: {self.settle_note or 'not read'}", f"verdict: {self.verdict}"]


def gap_change(baseline: pd.DataFrame, small: pd.DataFrame) -> GapChange:
    """The change bf16 makes to small − baseline, from two frames of COMPLETE trials each over
    train.dtype=fp32,bf16 and the same seeds (one per arm: each arm trains at its own lr)."""
    loss = schema.FINAL_VAL_LOSS
    arms = {"baseline": dtype_gap(baseline), "small": dtype_gap(small)}
    cell = {(arm, d): f[f["dtype"] == d] for arm, f in (("baseline", baseline), ("small", small)) for d in (REFERENCE, CANDIDATE)}
    c = interaction(cell["small", CANDIDATE], cell["baseline", CANDIDATE], cell["small", REFERENCE], cell["baseline", REFERENCE],
                    loss, curve="val/loss")
    if not c.n:
        raise ReportError("the two arms' folders share no seed in both dtypes: sweep seed=... the same in both")
    gaps = {d: compare(cell["small", d], cell["baseline", d], loss) for d in (REFERENCE, CANDIDATE)}
    return GapChange(arms, gaps[REFERENCE].diff, gaps[CANDIDATE].diff, c.diff, c.lo, c.hi, c.n,
                     [float(x) for x in (c.diffs or [])], c.settle_note)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m records.dtype_check", description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="a sweep folder over train.dtype=fp32,bf16 (sweeps/bf16_check)")
    p.add_argument("--small", type=Path, help="with it, SWEEP is the baseline arm's folder and this the recipe's "
                                              "(conf/experiment/bf16_gap.yaml): the change bf16 makes to their gap")
    p.add_argument("--json", type=Path, help="also write the numbers here")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    args = p.parse_args(argv)
    if args.small:
        return _gap_change_main(args)
    if not args.sweep.is_dir():
        print(f"dtype_check: sweep={args.sweep}: no such folder (a sweep over train.dtype=fp32,bf16, "
              f"e.g. sweeps/bf16_check)", file=sys.stderr)
        return 2
    try:
        sweep = load([args.sweep])
        result = dtype_gap(sweep.complete)
    except ReportError as e:
        print(f"dtype_check: {e}", file=sys.stderr)
        return 2
    print("\n".join(result.lines()))
    if args.json:
        stamp = {**provenance.record(), "results_sha256": {t.folder.name: t.sha256 for t in sweep.tables}}
        write_record(args.json, json.dumps({**asdict(result), "verdict": result.verdict, "inside_spread": result.inside_spread,
                                            "provenance": stamp}, indent=2) + "\n", "records.dtype_check", args.overwrite)
    return 0 if result.inside_spread else 1


def _gap_change_main(args) -> int:
    for folder in (args.sweep, args.small):
        if not folder.is_dir():
            print(f"dtype_check: {folder}: no such folder (an arm's sweep over train.dtype=fp32,bf16)", file=sys.stderr)
            return 2
    try:
        read = [load([args.sweep]), load([args.small])]
        result = gap_change(read[0].complete, read[1].complete)
    except ReportError as e:
        print(f"dtype_check: {e}", file=sys.stderr)
        return 2
    print("\n".join(result.lines()))
    if args.json:
        stamp = {**provenance.record(), "results_sha256": {t.folder.name: t.sha256 for s in read for t in s.tables}}
        body = {**asdict(result), "arms": {k: {**asdict(v), "verdict": v.verdict} for k, v in result.arms.items()},
                "verdict": result.verdict, "provenance": stamp}
        write_record(args.json, json.dumps(body, indent=2) + "\n", "records.dtype_check", args.overwrite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
