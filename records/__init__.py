"""This repository's record builders: docs/results.md, the record of the CPU experiments
(results_doc, with results_budgets' block), the checks a record names: bf16 against fp32
(dtype_check), a WSD branch against a cosine run (wsd_check), the recipe's effective size at the
crossover record's width (crossover_size), train against held-out loss in the crossover record
(train_val), the lead per schedule from whole runs (whole_runs), the record's claims judged again
from its own numbers (record_claims), the docs' quoted numbers held to their records (quoted), and
a long record's finished trials carried between machines in git (keep).

They are the paper's one-off scripts over committed records, not the analysis library, so they sit
outside the installed package (src/smallinit): run them from the repository root as
`python -m records.<name>`. They import the library (`smallinit.experiments` and the floors it
stands on); nothing under src/ imports them (tests/test_architecture.py holds both to the line
below).

May import: core, model, experiments
"""

import contextlib
import sys
from pathlib import Path

# This checkout's src/ first, as sweep.py does: a record is built by the library beside it, even
# where the venv's editable install points at another checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

OVERWRITE_HELP = "replace a file no smallinit command wrote, or one edited since (smallinit.core.written)"


@contextlib.contextmanager
def refusals():
    """A refusal from the rule every output of ours follows (smallinit.core.written) as one line on
    stderr and exit status 2: nothing has been written when it is raised."""
    from smallinit.core.errors import ConfigError

    try:
        yield
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def write_record(path: Path, text: str, by: str, overwrite: bool = False) -> None:
    """Write one record file under that rule: never over a file no command of ours wrote, or one
    edited since, unless `overwrite`."""
    from smallinit.core import written

    with refusals():
        written.write_outputs(Path(path).parent, {Path(path).name: text}, by=by, adopt=overwrite)


def sweep_table(folder: Path, columns: list[str] | None = None):
    """A sweep's results table through the library's one reader of a sweep folder
    (smallinit.experiments.data.sweep_records), its compared settings under their short names
    (gamma, lr, train_seed); a missing or damaged one ends the command in one line."""
    from smallinit.experiments.data.sweep_records import ReportError, read_table

    try:
        return read_table(Path(folder), columns=columns, short_names=True)
    except ReportError as e:
        raise SystemExit(f"error: {e}") from None


def sweep_protocol(folder: Path) -> dict:
    """A sweep's protocol.json through the same reader: {} where it has none; a damaged one ends the command."""
    from smallinit.experiments.data.sweep_records import PROTOCOL, ReportError, require_record

    try:
        return require_record(Path(folder), PROTOCOL) or {}
    except ReportError as e:
        raise SystemExit(f"error: {e}") from None
