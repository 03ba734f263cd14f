"""`make report`: what a sweep says about gamma, effective model size and the paper's claims.

    python -m smallinit.experiments.report.report                              # the newest sweeps/*/results.parquet
    python -m smallinit.experiments.report.report --sweep sweeps/a,sweeps/b    # several sweeps (one per size) together
    python -m smallinit.experiments.report.report --arms 'gamma=1,eps=1e-12' 'gamma=0.5,eps=1e-5' --baseline-gamma 0.5

Writes reports/<sweep-name>/: index.html (self-contained), report.md, the figures as PNG and
summary.json (best gamma per (size, setting), the effective-size fit and gains, the claims table;
with several token budgets the L(N, D) fit per cell and the crossover surface, experiments/claims/budgets.py).
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

from smallinit.core import provenance, written
from smallinit.core.errors import ConfigError
from smallinit.experiments.data.load import (
    LOSS,
    ReportError,
    default_sweep,
    load_report,
    resolve_dirs,
)
from smallinit.experiments.data.sweep_records import Table
from smallinit.experiments.output.figures import Figures
from smallinit.experiments.output.render import Block, to_html, to_markdown

from . import sections as S
from . import sections_mechanism as M
from .context import Context

DEFAULT_WIDTHS = (64, 128, 256, 512, 1024, 2048)
DEFAULT_GAMMAS = (0.5, 0.75, 1.0, 1.25)

# The page, top to bottom: what the sweep found and the claims first, how it was run after.
SECTIONS = (S.title, S.lead, S.verdicts, S.header, S.crossover_by_budget, S.tuning, S.failures, S.budget, S.loss_vs_gamma, S.anchor, S.width,
            S.effective_size, S.tokens, M.mechanism, M.residual_balance, S.optuna_importances, S.evidence)
# summary.json keeps one key order, so that a rebuilt report diffs cleanly against the
# committed docs/results/*/summary.json.
SUMMARY_KEYS = ("sweep", "dirs", "metric", "dtype", "generated", "findings", "scale", "best_gamma", "cells",
                "token_crossover", "effective_size", "crossover", "tokens", "residual_balance", "importances", "anchor", "tuning", "budget", "width_trend", "claims",
                "figures", "build_s", "provenance")


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


def build(dirs: list[Path], out_root: Path = Path("reports"), baseline_gamma: float = 0.5,
          baseline: dict[str, str] | None = None, arms: list[str] | None = None, metric: str = LOSS,
          widths=DEFAULT_WIDTHS, gammas=DEFAULT_GAMMAS, n_boot: int = 500, log=print, overwrite: bool = False) -> Path:
    """Write OUT_ROOT/<sweep-name>/: report.md, index.html, the figures and summary.json. The folder
    is the report's own: one holding a file no smallinit command wrote, or one edited since, is
    refused before anything is written (core/written.py), unless `overwrite`.

    `arms`: the two variant selectors of the token-level comparison (A then B); by default the
    paper's recipe against the effective-size baseline."""
    t0 = time.time()
    sweep, budget_sweep = load_report(dirs, metric)
    for line in [*sweep.left_out, *sweep.damaged_records]:
        log(line)
    out = Path(out_root) / sweep.name
    for path in (Path(out_root), out):
        if path.exists() and not path.is_dir():
            raise ReportError(f"--out={out_root} is invalid: {path} is a file; give a folder (nothing was written)")
    try:
        written.require_own(out, adopt=overwrite)
    except ConfigError as e:
        raise ReportError(str(e)) from None
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # the last report's figures (require_own: ours); this one writes its own
        old.unlink()
    ctx = Context(sweep, Figures(out), metric, baseline_gamma, baseline, arms, tuple(widths), tuple(gammas), n_boot, log,
                  budget_sweep)
    ctx.analyse()
    blocks: list[Block] = []
    parts: dict = {}
    for section in SECTIONS:
        section_blocks, part = section(ctx)
        blocks += section_blocks
        parts.update(part)
    tables = write_results_tables(sweep.tables, out)
    parts.update(dtype=ctx.dtype, figures=ctx.figs.as_dicts(), build_s=time.time() - t0,
                 provenance=_provenance(sweep.tables, tables))
    summary = dict(sorted(parts.items(), key=lambda kv: SUMMARY_KEYS.index(kv[0])))
    written.write_outputs(out, {"report.md": to_markdown(blocks),
                                "index.html": to_html(blocks, f"smallinit report: {sweep.name}", out),
                                "summary.json": json.dumps(_jsonable(summary), indent=1, ensure_ascii=False)},
                          by=REPORT, adopt=True)  # the whole folder was checked before the first write
    return out


REPORT = "smallinit.experiments.report"


def write_results_tables(tables: list[Table], out: Path, by: str = REPORT, adopt: bool = True) -> dict[str, dict[str, str]]:
    """Each sweep's results table beside the summary, as CSV (rows with their trial identities),
    so that a committed summary keeps the table it was built from: {sweep: {file, sha256}}. The
    rows are those the analysis read (one read of each file: Table). `adopt=False`: refused where
    `out` holds such a file that we did not write (core/written.py)."""
    files = {f"results-{t.folder.name}.csv": t.rows.to_csv(index=False) for t in tables}
    paths = written.write_outputs(out, files, by=by, adopt=adopt)
    return {t.folder.name: {"file": path.name, "sha256": provenance.file_sha256(path)} for t, path in zip(tables, paths)}


def _provenance(read: list[Table], tables: dict[str, dict[str, str]]) -> dict:
    """The analysis code, packages and machine that built this summary, the sha256 of each
    results table it read (of the bytes it parsed), and the CSV copy of each written beside it
    (the trials themselves name their own provenance in their folders)."""
    return {**provenance.record(), "results_sha256": {t.folder.name: t.sha256 for t in read}, "results_tables": tables}


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
    p = argparse.ArgumentParser(prog="python -m smallinit.experiments.report.report", description=__doc__.split("\n")[0])
    p.add_argument("--sweep", help="sweep folder(s), comma-separated (default: sweeps/smallinit, `make sweep`'s, else the newest "
                                    "sweeps/*/results.parquet)")
    p.add_argument("--sweeps-root", default="sweeps", help="where to look for the default sweep")
    p.add_argument("--out", default="reports", help="reports are written to OUT/<sweep-name>/")
    p.add_argument("--baseline-gamma", type=float, default=0.5, help="gamma of the effective-size baseline")
    p.add_argument("--baseline", help="the baseline's other settings, e.g. 'eps=1e-5,gate=none'")
    p.add_argument("--arms", nargs=2, metavar=("A", "B"), help="token-level arms, e.g. 'gamma=1,eps=1e-12' 'gamma=0.5'")
    p.add_argument("--metric", default=LOSS, choices=(LOSS, "best_val_loss"))
    p.add_argument("--widths", default=",".join(map(str, DEFAULT_WIDTHS)), help="residual-balance widths")
    p.add_argument("--boot", type=int, default=500, help="bootstrap replicates for the effective-size intervals")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files in OUT/<sweep-name>/ that no smallinit command wrote, or that were edited since")
    a = p.parse_args(argv)
    try:
        widths = tuple(int(w) for w in a.widths.split(",") if w.strip())
        if not widths or any(w < 8 for w in widths):
            raise ReportError(f"--widths {a.widths!r}: give integers >= 8, e.g. 64,128,256")
        if a.sweep:
            dirs = resolve_dirs(a.sweep, Path(a.sweeps_root))
        else:
            folder, which = default_sweep(Path(a.sweeps_root))
            print(f"report of {which}", file=sys.stderr)
            dirs = [folder]
        out = build(dirs, Path(a.out), a.baseline_gamma, _parse_kv(a.baseline),
                    a.arms, a.metric, widths=widths, n_boot=a.boot, log=lambda m: print(m, file=sys.stderr),
                    overwrite=a.overwrite)
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
