"""This repository's record builders: docs/results.md, the record of the CPU experiments
(results_doc, with results_budgets' block), the checks a record names: bf16 against fp32
(dtype_check), a WSD branch against a cosine run (wsd_check), the recipe's effective size at the
crossover record's width (crossover_size), train against held-out loss in the crossover record
(train_val), the lead per schedule from whole runs (whole_runs), the record's claims judged again
from its own numbers (record_claims), and the docs' quoted numbers held to their records (quoted).

They are the paper's one-off scripts over committed records, not the analysis library, so they sit
outside the installed package (src/smallinit): run them from the repository root as
`python -m records.<name>`. They import the library (`smallinit.experiments` and the floors it
stands on); nothing under src/ imports them (tests/test_architecture.py holds both to the line
below).

May import: core, model, experiments
"""

import sys
from pathlib import Path

# This checkout's src/ first, as sweep.py does: a record is built by the library beside it, even
# where the venv's editable install points at another checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
