"""The results table (`results.parquet` in a sweep folder): its columns, in one place.

sweeper/results/results.py writes one row per trial (one per budget for a train.budgets trial) in this order; experiments/data/sweep_records.py reads it; the
docs/sweeps.md ("The results table") documents it. A row holds plain Python values (None where a
trial has no value) and pandas infers the storage type, so an int column with a missing value
is stored as float64.

Each value has one name. Every setting of a trial is a `config/<key>` column, `<key>` being the
key as typed on the command line (`config/init.gamma`, `config/optim.lr`, `config/model.d_model`),
swept or not, a list or an empty mapping as its JSON text; a swept key that is no config value
(`seed`, `arm`) is one too. `swept` names the keys the sweep varied. Besides the fixed columns a
row may carry the final probe means (finished trials) and `anchor_*` accuracies (data=anchor).
`results.csv` beside the table holds the same rows.

Tables written before this naming (`param.<key>`, the short `gamma`/`lr`/... columns,
`config/model.init.gamma`) read as this one through `upgrade` (the rename map, RENAMED);
the analysis reads the settings it compares under short names (`analysis_names`, SHORT_NAMES).
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

CONFIG_PREFIX = "config/"
ANCHOR_PREFIX = "anchor_"
SWEPT = "swept"


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
    Column(SWEPT, str, "the keys the sweep varied, comma-separated (their values: config/<key>)"),
)
OUTCOME_COLUMNS = (
    Column("n_params", int, "parameter count (finished trials)"),
    Column("workers", int, "the worker count that trained the trial (part of its identity above 1); "
                           "1 where its folder does not record one (trials run before it was recorded)"),
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
FIXED_COLUMNS = (*LEAD_COLUMNS, *OUTCOME_COLUMNS, *ARTIFACT_COLUMNS)
COLUMNS = {c.name: c for c in (*FIXED_COLUMNS, *PROBE_COLUMNS)}


def config_column(key: str) -> str:
    """The column of a setting, by the key a user types: `init.gamma` -> `config/init.gamma`."""
    return f"{CONFIG_PREFIX}{key}"


def new_row(params: dict) -> dict:
    """A row in table order, every fixed column None, the swept keys named (their values as
    config/<key> columns after the fixed ones)."""
    row: dict = {c.name: None for c in FIXED_COLUMNS}
    row[SWEPT] = ",".join(params) if params else None
    row.update({config_column(k): v for k, v in params.items()})
    return row


def swept_keys(df) -> list[str]:
    """The keys a table's sweep varied, in the order first named."""
    keys: dict[str, None] = {}
    for cell in (df[SWEPT] if SWEPT in df else []):
        if isinstance(cell, str) and cell:
            keys.update(dict.fromkeys(cell.split(",")))
    return list(keys)


def probe_metric(column: Column) -> str:
    """The metrics key a probe column holds the final value of."""
    return f"{column.name}/mean"


def anchor_column(metric: str) -> str:
    """`anchor/acc_x` -> `anchor_acc_x`."""
    return metric.replace("/", "_")


def is_known_column(name: str) -> bool:
    return name in COLUMNS or name.startswith((ANCHOR_PREFIX, CONFIG_PREFIX))


def budget_identity(identity: str, budget_tokens: int) -> str:
    return f"{identity}{BUDGET_SEP}{budget_tokens}"


def trial_identity(identity: str) -> str:
    """The trial's identity of a row's identity (budget rows carry @<budget_tokens>)."""
    return identity.split(BUDGET_SEP, 1)[0]


def results_path(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / RESULTS_FILE


def csv_path(sweep_dir: str | Path) -> Path:
    return Path(sweep_dir) / RESULTS_CSV


# Where the trial's resolved config (trial.json's `config`, trainer/config.py TrialConfig) keeps
# a setting the command line names otherwise: the init, norm and attention groups live inside
# the model, and the preset's name at the top.
_CONFIG_TO_KEY = (("model.init.", "init."), ("model.norm.", "norm."), ("model.attn.", "attn."), ("preset", "model.preset"))


def key_of(config_path: str) -> str:
    """The command-line key of a dotted path in the resolved config: `model.init.gamma` -> `init.gamma`."""
    for inside, key in _CONFIG_TO_KEY:
        if config_path == inside or (inside.endswith(".") and config_path.startswith(inside)):
            return key + config_path.removeprefix(inside)
    return config_path


def config_columns(config: dict, prefix: str = "") -> dict:
    """A trial's resolved config as flat `config/<key>` columns, each by its command-line key:
    every leaf, swept or not; a list (or an empty mapping) as its JSON text, so each cell is one
    plain value."""
    out: dict = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(config_columns(value, f"{path}."))
        else:
            out[config_column(key_of(path))] = (json.dumps(value, default=str) if isinstance(value, list | tuple | dict)
                                                else value)
    return out


# The settings the analysis compares, under the short names its code and labels use
# (experiments/data/load.py); `analysis_names` renames, so no value is there twice either.
SHORT_NAMES = {
    "model": "model.preset", "d_model": "model.d_model", "n_layers": "model.n_layers", "ffn": "model.ffn.type",
    "gamma": "init.gamma", "init_seed": "init.seed", "eps": "norm.eps", "norm": "norm.type", "gate": "attn.gate",
    "task": "data.task", "train_seed": "train.seed", "lr": "optim.lr", "weight_decay": "optim.weight_decay",
}


def analysis_names(df):
    """The table with its compared settings under their short names (config/init.gamma -> gamma)."""
    return df.rename(columns={config_column(key): short for short, key in SHORT_NAMES.items()})


_SHORT_OF = {key: short for short, key in SHORT_NAMES.items()}


def analysis_column(key: str) -> str:
    """A command-line key's column in a table under analysis_names: `init.gamma` -> `gamma`,
    `arm` -> `config/arm`."""
    return _SHORT_OF.get(key, config_column(key))


# Tables written before each value had one name: each short setting column's name now. (Their
# `param.<key>` columns are config/<key>; their config/ columns followed the resolved config's
# nesting, `config/model.init.gamma`, which key_of maps.)
RENAMED = {short: config_column(key) for short, key in SHORT_NAMES.items()}
OLD_PARAM_PREFIX = "param."


def _name_now(column: str) -> str:
    if column.startswith(OLD_PARAM_PREFIX):
        return config_column(column.removeprefix(OLD_PARAM_PREFIX))
    if column.startswith(CONFIG_PREFIX):
        return config_column(key_of(column.removeprefix(CONFIG_PREFIX)))
    return RENAMED.get(column, column)


def upgrade(df):
    """A table as this module names it, from any earlier naming (today's tables pass as they are):
    `param.<key>` -> config/<key> (and `swept`), `config/model.init.<k>` -> config/init.<k>,
    `config/preset` -> config/model.preset, each short setting column -> its config/<key>. Where
    an old table held one value under several names, the trial's config/ column comes first and
    the others fill only its empty cells."""
    names = {column: _name_now(column) for column in df.columns}
    if all(old == new for old, new in names.items()):
        return df
    params = [c.removeprefix(OLD_PARAM_PREFIX) for c in df.columns if c.startswith(OLD_PARAM_PREFIX)]
    rank = {c: (0 if c.startswith(CONFIG_PREFIX) else 2 if c.startswith(OLD_PARAM_PREFIX) else 1) for c in df.columns}
    out: dict = {}
    for column in df.columns:
        new = names[column]
        sources = sorted((c for c in df.columns if names[c] == new), key=rank.get)
        if new in out:
            continue
        value = df[sources[0]]
        for other in sources[1:]:
            value = value.combine_first(df[other])
        out[new] = value
    upgraded = df.__class__(out, index=df.index)
    if params and SWEPT not in upgraded:
        at = upgraded.columns.get_loc(ROLE) + 1 if ROLE in upgraded else 0
        upgraded.insert(at, SWEPT, ",".join(params))
    return in_table_order(upgraded)


def in_table_order(df):
    """The table's column order: the settings (config/<key>) last, the swept ones first among them."""
    first = [config_column(k) for k in swept_keys(df) if config_column(k) in df]
    settings = first + [c for c in df.columns if c.startswith(CONFIG_PREFIX) and c not in first]
    return df[[c for c in df.columns if not c.startswith(CONFIG_PREFIX)] + settings]


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
