"""The results table (`results.parquet` in a sweep folder): its columns, in one place.

sweeper/results/results.py writes one row per trial (one per budget for a train.budgets trial) in this order; experiments/data/load.py reads it; the
docs/sweeps.md ("The results table") documents it. A row holds plain Python values (None where a
trial has no value) and pandas infers the storage type, so an int column with a missing value
is stored as float64: tables written before this module existed read back unchanged.

Besides the fixed columns a row may carry `param.<key>` (each swept value, after the lead
columns), the final probe means (finished trials), `anchor_*` accuracies (data=anchor) and, last,
`config/<key>`: every key of the trial's resolved config (trial.json's `config`), swept or not,
flattened with dotted keys (`config/model.init.gamma`, `config/optim.lr`), a list or an empty
mapping as its JSON text. `results.csv` beside the table holds the same rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

RESULTS_FILE = "results.parquet"
RESULTS_CSV = "results.csv"  # the same rows, written beside it whenever it is

# Trial states. A study's Optuna state name passes through (PRUNED from ASHA, FAIL from the
# study); the trial folder overrides it (result.json: COMPLETE, failure.json: FAIL).
COMPLETE, PRUNED, FAIL, INTERRUPTED, RUNNING = "COMPLETE", "PRUNED", "FAIL", "INTERRUPTED", "RUNNING"

# The columns code branches on, named once.
TRIAL_NUMBER, IDENTITY, STATE, FAIL_REASON = "trial_number", "identity", "state", "fail_reason"
TRIAL_IDENTITY, BUDGET_TOKENS = "trial_identity", "budget_tokens"
FINAL_VAL_LOSS = "final_val_loss"
BUDGET_SEP = "@"  # a budget row's identity: <trial identity>@<budget_tokens>
ROLE = "role"

PARAM_PREFIX = "param."
CONFIG_PREFIX = "config/"
ANCHOR_PREFIX = "anchor_"


@dataclass(frozen=True)
class Column:
    name: str
    kind: type  # int, float or str: what a row holds when the value is known
    meaning: str


LEAD_COLUMNS = (
    Column(TRIAL_NUMBER, int, "the Optuna trial number"),
    Column(IDENTITY, str, "the row's identity: the trial's, plus @<budget_tokens> on each budget of a train.budgets trial"),
    Column(TRIAL_IDENTITY, str, "hash of the resolved config (minus hardware and paths; plus the worker count "
                           "above 1); the trial folder's name"),
    Column(STATE, str, "COMPLETE, PRUNED, FAIL or INTERRUPTED"),
    Column(FAIL_REASON, str, "why a FAIL failed"),
    Column(ROLE, str, "tune or confirm: its seed's role under hydra.sweeper.protocol (None without one)"),
)
# param.<key> columns go here.
SETTING_COLUMNS = (
    Column("model", str, "the preset"),
    Column("n_params", int, "parameter count (finished trials)"),
    Column("d_model", int, "width"),
    Column("n_layers", int, "depth"),
    Column("gamma", float, "init.gamma"),
    Column("init_seed", int, "init.seed"),
    Column("eps", float, "norm.eps"),
    Column("norm", str, "norm.type"),
    Column("gate", str, "attn.gate"),
    Column("ffn", str, "ffn.type"),
    Column("task", str, "data.task"),
    Column("train_seed", int, "train.seed"),
    Column("lr", float, "optim.lr"),
    Column("weight_decay", float, "optim.weight_decay"),
    Column("workers", int, "the worker count that trained the trial (part of its identity above 1); "
                           "1 where its folder does not record one (trials run before it was recorded)"),
)
OUTCOME_COLUMNS = (
    Column("dtype", str, "what train.dtype resolved to on the machine that ran the trial"),
    Column(BUDGET_TOKENS, int, "the token budget the row is for: its budget (train.budgets), else the trial's planned tokens"),
    Column("tokens", int, "training tokens seen"),
    Column("corpus_tokens", int, "training tokens of the trial's corpus (passes = tokens / corpus_tokens)"),
    Column(FINAL_VAL_LOSS, float, "validation loss (nats/token) at the end"),
    Column("best_val_loss", float, "validation loss at its best"),
    Column("unigram_entropy", float, "entropy of the validation tokens' unigram distribution"),
    Column("wall_s", float, "wall time"),
    Column("tokens_per_s", float, "training throughput"),
    Column("mfu", float, "model FLOPs utilisation (GPU)"),
    Column("node_id", str, "the Ray node that ran the last attempt"),
    Column("attempts", int, "how many attempts the trial took"),
)
ARTIFACT_COLUMNS = (
    Column("trial_dir", str, "the trial folder"),
    Column("metrics_path", str, "its metrics.jsonl"),
    Column("per_token_losses_path", str, "its per_token_losses.npz (None when not written)"),
    Column("probes_dir", str, "its probes/ folder"),
)
# Finished trials only: the final `<name>/mean` probe metric.
PROBE_COLUMNS = (
    Column("attn_sink", float, "final probe mean"),
    Column("stable_rank", float, "final probe mean"),
    Column("row_cosine", float, "final probe mean"),
    Column("saturation", float, "final probe mean"),
    Column("residual_ratio", float, "final probe mean"),
)
FIXED_COLUMNS = (*LEAD_COLUMNS, *SETTING_COLUMNS, *OUTCOME_COLUMNS, *ARTIFACT_COLUMNS)
COLUMNS = {c.name: c for c in (*FIXED_COLUMNS, *PROBE_COLUMNS)}


def new_row(params: dict) -> dict:
    """A row in table order, every fixed column None, the swept params after the lead columns."""
    row: dict = {c.name: None for c in LEAD_COLUMNS}
    row.update({f"{PARAM_PREFIX}{k}": v for k, v in params.items()})
    row.update({c.name: None for c in (*SETTING_COLUMNS, *OUTCOME_COLUMNS, *ARTIFACT_COLUMNS)})
    return row


def probe_metric(column: Column) -> str:
    """The metrics key a probe column holds the final value of."""
    return f"{column.name}/mean"


def anchor_column(metric: str) -> str:
    """`anchor/acc_x` -> `anchor_acc_x`."""
    return metric.replace("/", "_")


def is_known_column(name: str) -> bool:
    return name in COLUMNS or name.startswith((PARAM_PREFIX, ANCHOR_PREFIX, CONFIG_PREFIX))


def budget_identity(identity: str, budget_tokens: int) -> str:
    return f"{identity}{BUDGET_SEP}{budget_tokens}"


def trial_identity(identity: str) -> str:
    """The trial's identity of a row's identity (budget rows carry @<budget_tokens>)."""
    return identity.split(BUDGET_SEP, 1)[0]


def results_path(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / RESULTS_FILE


def csv_path(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / RESULTS_CSV


def config_columns(config: dict, prefix: str = CONFIG_PREFIX) -> dict:
    """A trial's resolved config as flat `config/<dotted key>` columns: every leaf, swept or
    not; a list (or an empty mapping) as its JSON text, so each cell is one plain value."""
    out: dict = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(config_columns(value, f"{name}."))
        elif isinstance(value, list | tuple | dict):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = value
    return out


# Artifact paths are stored relative to the sweep folder, so a folder moved or copied (cluster
# to laptop) still reports in full; a path outside the folder (a trial another folder of the
# same study ran) stays absolute.
PATH_COLUMNS = ("trial_dir", "metrics_path", "per_token_losses_path", "probes_dir")


def to_stored_path(path: str | Path | None, sweep_dir: str | Path) -> str | None:
    if path is None:
        return None
    path, root = Path(path).resolve(), Path(sweep_dir).resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def to_local_path(stored: str | None, sweep_dir: str | Path, identity: str | None = None) -> str | None:
    """Where a stored artifact path is now: relative ones under sweep_dir; an absolute one from
    an older table is looked for at the same place in this sweep folder, and taken from there
    when it is there: a copied folder reads its own files, even while the original exists."""
    if not isinstance(stored, str) or not stored:
        return None
    path = Path(stored)
    if not path.is_absolute():
        return str(Path(sweep_dir) / path)
    identity = trial_identity(identity) if identity else identity
    if identity and identity in path.parts:
        moved = Path(sweep_dir) / Path(*path.parts[path.parts.index(identity) - 1:])
        if moved.exists():
            return str(moved)
    return stored
