"""Compare two sweep folders: `python -m smallinit.experiments.data.compare DIR_A DIR_B` (`make compare A=... B=...`).

Prints which fixed overrides differ (each folder's fixed_overrides.json), which keys each
sweeps, and how many trial identities are in both, only in A and only in B (each folder's
results.parquet). Before `make report SWEEP=A,B`: trials in both are refused there, as they
would be counted twice (experiments/data/load.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from smallinit.core import results_schema as schema

from .load import ReportError, trial_identities
from .sweep_records import read_record, read_table

# The sweeper writes it (sweeper/config/fixed_overrides.py); experiments reads files, not the sweeper.
FIXED_RECORD = "fixed_overrides.json"


@dataclass
class Folder:
    path: Path
    fixed: dict[str, str] | None  # key -> "key=value"; None without fixed_overrides.json
    swept: list[str]
    trials: set[str]


def read_folder(path: Path) -> Folder:
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"sweep folder {path} does not exist")
    table = schema.results_path(path)
    if not table.exists():
        raise ReportError(f"{table} is missing: not a finished sweep folder (rerun its command to rebuild it)")
    df = read_table(path, local_paths=False)
    trials = {i for i in trial_identities(df) if i is not None}
    data, why = read_record(path, FIXED_RECORD)
    if why is None and data is not None and (not isinstance(data.get("fixed", {}), dict)
                                             or not isinstance(data.get("swept", []), list)):
        why = "not a mapping with 'fixed' and 'swept'"
    if why is not None:
        raise ReportError(f"{path / FIXED_RECORD} cannot be read ({why}): restore it")
    if data is None:
        return Folder(path, None, [], trials)
    return Folder(path, {str(k): str(v) for k, v in data.get("fixed", {}).items()},
                  sorted(map(str, data.get("swept", []))), trials)


def compare(a: Folder, b: Folder) -> list[str]:
    """The comparison, as lines."""
    lines = [f"A: {a.path}", f"B: {b.path}"]
    if a.fixed is None or b.fixed is None:
        missing = " and ".join(f"{f.path}" for f in (a, b) if f.fixed is None)
        lines.append(f"fixed overrides: unknown ({missing} has no {FIXED_RECORD}: a folder from before it was recorded)")
    else:
        differ = sorted(k for k in a.fixed.keys() | b.fixed.keys() if a.fixed.get(k) != b.fixed.get(k))
        same = len(a.fixed.keys() & b.fixed.keys()) - len([k for k in differ if k in a.fixed and k in b.fixed])
        if differ:
            lines.append(f"fixed overrides that differ ({len(differ)}; {same} the same):")
            lines += [f"  {k}: A {a.fixed.get(k, '(not set)')}, B {b.fixed.get(k, '(not set)')}" for k in differ]
        else:
            lines.append(f"fixed overrides: the same ({same}: {' '.join(a.fixed[k] for k in sorted(a.fixed)) or 'none'})")
    both = sorted(set(a.swept) & set(b.swept))
    lines.append(f"swept keys: A {', '.join(a.swept) or '(none recorded)'}; B {', '.join(b.swept) or '(none recorded)'}")
    lines.append(f"  in both: {', '.join(both) or 'none'}; only A: {', '.join(k for k in a.swept if k not in both) or 'none'}; "
                 f"only B: {', '.join(k for k in b.swept if k not in both) or 'none'}")
    shared = a.trials & b.trials
    lines.append(f"trial identities: {len(shared)} in both, {len(a.trials - shared)} only in A, {len(b.trials - shared)} only in B")
    if shared:
        lines.append(f"  `make report SWEEP={a.path},{b.path}` refuses the {len(shared)} in both unless each is one trial "
                     "folder both list (a shared study): e.g. " + ", ".join(sorted(shared)[:3]))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m smallinit.experiments.data.compare", description=__doc__.split("\n")[0])
    p.add_argument("a", metavar="DIR_A", help="a sweep folder (holding results.parquet)")
    p.add_argument("b", metavar="DIR_B", help="another sweep folder")
    args = p.parse_args(argv)
    try:
        lines = compare(read_folder(Path(args.a)), read_folder(Path(args.b)))
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
