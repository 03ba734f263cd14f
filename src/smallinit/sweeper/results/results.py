"""The results table: `results.parquet` in the sweep folder (and its CSV twin `results.csv`), one row per trial, or per budget
for a trial with train.budgets (identity `<trial>@<budget_tokens>`, from budgets/<tokens>.json).

Built from what the trials wrote (core.trial_dir: trial.json, result.json, failure.json) and
the study's states, so it can always be rebuilt and never drops a finished trial. Written
atomically. Its columns are core.results_schema, documented in docs/sweeps.md ("The results table").
"""

from __future__ import annotations

import io
import json
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from smallinit.core import results_schema as schema
from smallinit.core import written
from smallinit.core.trial_dir import DamagedFile, TrialDir, unusable
from smallinit.sweeper.config import protocol

from . import summary

if TYPE_CHECKING:
    from smallinit.sweeper.study.study import Study


def trial_rows(trial_dir: TrialDir, study_state: dict[str, Any] | None = None,
               sweep_dir: Path | None = None) -> list[dict[str, Any]]:
    """The trial's row, or one row per budget of a train.budgets trial; [] before it is planned."""
    meta = trial_dir.read_trial(damaged_ok=True)
    plan = trial_dir.read_sweep_plan()
    own = trial_dir.own_identity()
    if isinstance(meta, dict) and own is not None and meta.get("identity") != own:
        meta = None  # another trial's trial.json copied in: the row stays this folder's (its reason below)
    if isinstance(plan, dict) and own is not None and plan.get("identity") not in (None, own):
        plan = {}
    if not _has_config(meta) and _has_config(plan):  # planned, never started, or trial.json damaged
        meta = {"identity": plan.get("identity", trial_dir.identity), "config": plan["config"]}
    if not _has_config(meta):
        return _unreadable_settings_row(trial_dir, study_state or {}, sweep_dir)
    cfg = meta["config"]
    train = cfg["train"]
    result, failure = trial_dir.read_result(damaged_ok=True), trial_dir.read_failure(damaged_ok=True)
    damage = trial_dir.damaged_result()
    study_state = study_state or {}
    if result is not None and damage is None:
        state = schema.COMPLETE
    elif failure is not None or damage is not None:
        state = schema.FAIL
    else:
        state = study_state.get("state") or schema.INTERRUPTED
        if state == schema.RUNNING:
            state = schema.INTERRUPTED
        elif state == schema.COMPLETE:  # the study says so, the folder cannot show it
            state = schema.FAIL
            damage = "missing"
    if damage is not None:  # never a COMPLETE row without the numbers that make it one
        what = "missing" if damage == "missing" else unusable(damage)
        failure, result = {"reason": f"{trial_dir.result_json.name} is {what}: the next run of the sweep "
                                     "trains the trial again"}, None
    attempts = trial_dir.read_attempts(damaged_ok=True)
    row = schema.new_row(plan.get("params", {}))
    row.update(
        trial_number=study_state.get("number"),
        identity=meta["identity"],
        trial_identity=meta["identity"],
        state=state,
        role=study_state.get("role"),
        # Only a failed row has a reason: a trial that ran again and completed carries none.
        fail_reason=((failure or {}).get("reason") or study_state.get("fail_reason")) if state == schema.FAIL else None,
        workers=trial_dir.recorded_workers(),
        node_id=attempts[-1].get("node_id") if attempts else None,
        attempts=len(attempts),
        trial_dir=str(trial_dir.path),
        metrics_path=str(trial_dir.metrics),
        probes_dir=str(trial_dir.probes),
        budget_tokens=_planned_tokens(train),
    )
    if result is not None:
        row.update(_outcome(result, trial_dir))
    elif state == schema.PRUNED:
        try:
            last = trial_dir.last_metrics()
        except DamagedFile:  # one trial's damaged log leaves its losses blank, not the whole table unwritten
            last = {}
        row.update(final_val_loss=last.get("val/loss"), best_val_loss=last.get("val/best_loss"), tokens=last.get("tokens"))
    swept = {schema.config_column(k): v for k, v in plan.get("params", {}).items()}
    row.update(schema.config_columns(cfg))  # every setting, swept or not; build_table puts them last
    # A swept key the trial's build resolves away (train.budgets_per_param into tokens) keeps what was swept.
    row.update({c: v for c, v in swept.items() if row.get(c) is None})
    # The budgets it trains: up to train.stop_after, which set max_tokens (TrainConfig.budgets_trained).
    trained = [b for b in train.get("budgets") or [] if b <= train["max_tokens"]]
    rows = _budget_rows(row, trial_dir, trained) if trained else [row]
    if sweep_dir is not None:
        for r in rows:
            for column in schema.PATH_COLUMNS:
                r[column] = schema.to_stored_path(r[column], sweep_dir)
    return rows


def _has_config(meta: Any) -> bool:
    """meta (trial.json, or sweep.json) holds a config with the parts a row reads."""
    cfg = meta.get("config") if isinstance(meta, dict) else None
    return isinstance(cfg, dict) and all(isinstance(cfg.get(k), dict) for k in ("model", "train", "optim", "data"))


def _planned_tokens(train: dict[str, Any]) -> int:
    """The tokens a finished trial trains: whole steps of its budget (TrainConfig.total_steps)."""
    per_step = train["batch_size"] * train["seq_len"] * train["grad_accum"]
    steps = train["max_steps"] if train.get("max_steps") is not None else train["max_tokens"] // per_step
    return steps * per_step


def _unreadable_settings_row(trial_dir: TrialDir, study_state: dict[str, Any], sweep_dir: Path | None) -> list[dict[str, Any]]:
    """A FAIL row naming the files whose settings cannot be read, for a trial that started
    (trial.json, result.json or failure.json is there): one that ran or finished is never
    dropped from the table without a word. [] for one only planned: its sweep.json is
    rewritten when it is planned again (and folders of older sweeps held no config there)."""
    records = (trial_dir.sweep_json, trial_dir.trial_json, trial_dir.result_json, trial_dir.failure_json)
    if not any(p.exists() for p in records[1:]):
        return []
    bad = " and ".join(f"{p.name} is {'missing' if not p.exists() else 'damaged'}" for p in records[:2])
    failure = trial_dir.read_failure(damaged_ok=True) or {}
    reason = failure.get("reason") or (
        f"{bad}: the trial's settings cannot be read, so its result cannot be reported; restore "
        f"either file, or move {trial_dir.path} aside and rerun the sweep to train the trial again")
    row = schema.new_row(study_state.get("params") or {})  # the folder lost them; the study kept them
    row.update(
        trial_number=study_state.get("number"), identity=trial_dir.identity, trial_identity=trial_dir.identity,
        state=schema.FAIL, role=study_state.get("role"), trial_dir=str(trial_dir.path),
        fail_reason=reason,  # a failure the trial recorded (its folder removed under it) says it best
    )
    if sweep_dir is not None:
        row["trial_dir"] = schema.to_stored_path(row["trial_dir"], sweep_dir)
    return [row]


def _outcome(result: dict[str, Any], trial_dir: TrialDir) -> dict[str, Any]:
    """The outcome columns of a result (result.json, or a budget's budgets/<tokens>.json); its
    artifact paths resolved in trial_dir (an old absolute one is this folder's file when it is here)."""
    final = result.get("final_metrics", {})
    per_token = trial_dir.artifact(result.get("artifacts", {}).get("per_token_losses"))
    out = dict(
        n_params=result["n_params"], tokens=result["tokens"], final_val_loss=result["final_val_loss"],
        best_val_loss=result["best_val_loss"], unigram_entropy=result["unigram_entropy"], wall_s=result["wall_s"],
        tokens_per_s=result["tokens_per_s"], mfu=result["mfu"], dtype=result.get("dtype"),
        corpus_tokens=result.get("corpus_tokens"),
        per_token_losses_path=str(per_token) if per_token is not None else None,
    )
    for column in schema.PROBE_COLUMNS:
        out[column.name] = final.get(schema.probe_metric(column))
    for key, value in final.items():
        if key.startswith("anchor/"):
            out[schema.anchor_column(key)] = value
    return out


def _budget_rows(row: dict[str, Any], trial_dir: TrialDir, budgets: list[int]) -> list[dict[str, Any]]:
    """One row per budget. A budget whose branch has been evaluated is COMPLETE with its own
    numbers, even while the trial runs on; the others carry the trial's state and no numbers
    (a PRUNED trial's last numbers go to the largest budget, the run they came from). Only the
    largest budget's row names metrics.jsonl, probes/ and per-token losses: they follow the
    main run, not the other budgets' cooldowns."""
    per_trial = ("n_params", "workers", "node_id", "attempts", schema.BUDGET_TOKENS)  # the same for every budget
    outcome = {c.name: None for c in schema.OUTCOME_COLUMNS if c.name not in per_trial}
    outcome.update({c.name: None for c in schema.PROBE_COLUMNS}, per_token_losses_path=None)
    rows = []
    for tokens in budgets:
        largest = tokens == budgets[-1]
        out = dict(row, identity=schema.budget_identity(row[schema.IDENTITY], tokens), budget_tokens=tokens)
        branch = trial_dir.read_budget_result(tokens, damaged_ok=True)
        why = trial_dir.damaged_budget(tokens)  # damaged, or another trial's or budget's copied in
        if branch is not None and why is None:
            out.update(outcome, state=schema.COMPLETE, fail_reason=None)
            out.update(_outcome(branch, trial_dir))
        elif row[schema.STATE] == schema.COMPLETE:  # result.json without its budget file: study_rebuild.reconcile heals it
            heal = "rewrites it from result.json" if largest else "trains the trial again"
            out.update(outcome, state=schema.FAIL, fail_reason=f"{trial_dir.budget_json(tokens)} is "
                       f"{'missing' if why is None else unusable(why)}: the next run of the sweep {heal}")
        elif not largest:
            out.update(outcome)
        if not largest:
            out.update(metrics_path=None, probes_dir=None, per_token_losses_path=None)
        rows.append(out)
    return rows


def build_table(sweep_dir: Path, study_states: dict[str, dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per trial (per budget of a train.budgets trial), in trial-number order: every trial folder under sweep_dir/trials,
    plus the study's trials whose folders live elsewhere (a study shared between sweep
    folders), each identity once."""
    study_states = study_states or {}
    dirs = {d.identity: d for d in TrialDir.all_in_sweep(sweep_dir)}
    for ident, state in study_states.items():
        if ident not in dirs and state.get("trial_dir"):
            dirs[ident] = TrialDir(state["trial_dir"])
    rows = [row for ident, d in dirs.items() for row in trial_rows(d, study_states.get(ident), sweep_dir)]
    rows.sort(key=lambda r: (r[schema.TRIAL_NUMBER] is None, r[schema.TRIAL_NUMBER] or 0))  # swept keys in trial order
    _fill_unswept_params(rows, sweep_dir)
    _fill_roles(rows, sweep_dir)
    df = pd.DataFrame(rows)
    if not df.empty:
        df = df.sort_values(schema.TRIAL_NUMBER, na_position="last", kind="stable").reset_index(drop=True)
        df = schema.in_table_order(df)
        config = [c for c in df.columns if c.startswith(schema.CONFIG_PREFIX)]
        for column in config:
            df[column] = _one_kind(df[column])
    return df


def _one_kind(values: pd.Series) -> pd.Series:
    """A config column whose trials hold values of different kinds (a number in one, a string
    or a flag in another) as text, each value as its JSON spelling: Parquet stores one type per
    column. Numbers alone (int and float) and one kind alone stay as they are."""
    kinds = {type(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))}
    if len(kinds) <= 1 or kinds <= {int, float}:
        return values
    return values.map(lambda v: v if v is None or isinstance(v, str) or (isinstance(v, float) and pd.isna(v))
                      else json.dumps(v))


def _fill_unswept_params(rows: list[dict[str, Any]], sweep_dir: Path) -> None:
    """The keys the folder's sweep varied (`swept` on every row). A folder's grid may grow by a
    key (optim.lr swept in a folder first run at the default lr), and a swept key may be no config
    value (`seed`, `arm`): a row without one takes the value its composed config
    (.hydra/config.yaml) gave it, so every row names its whole setting. A key the config cannot
    give as one value (a config group's choice, a preset's null) stays empty."""
    keys = list(dict.fromkeys(k for r in rows for k in (r.get(schema.SWEPT) or "").split(",") if k))
    configs: dict[str, Any] = {}
    for row in rows:
        row[schema.SWEPT] = ",".join(keys) or None
        missing = [k for k in keys if (v := row.get(schema.config_column(k))) is None or (isinstance(v, float) and pd.isna(v))]
        if not missing:
            continue
        folder = schema.to_local_path(row.get("trial_dir"), sweep_dir)
        if folder is None:
            continue
        if folder not in configs:
            try:
                configs[folder] = OmegaConf.load(Path(folder) / ".hydra" / "config.yaml")
            except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):  # none or damaged: cells stay empty
                configs[folder] = None
        if configs[folder] is None:
            continue
        for key in missing:
            try:
                value = OmegaConf.select(configs[folder], key)
            except OmegaConfBaseException:  # an interpolation that no longer resolves
                continue
            if isinstance(value, (bool, int, float, str)):
                row[schema.config_column(key)] = value


def _fill_roles(rows: list[dict[str, Any]], sweep_dir: Path) -> None:
    """A protocol trial the study lacks the role of (restored from its folder) takes it from
    its seed, as protocol.json assigns them."""
    path = Path(sweep_dir) / protocol.RECORD
    if not path.exists():
        return
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return  # the study's roles stand; the record is rewritten when stage 1 is next settled
    seed_column = schema.config_column(record.get("seed_key", "seed"))
    for row in rows:
        if row.get(schema.ROLE) is None:
            row[schema.ROLE] = protocol.role_of(row.get(seed_column), record)


TABLE_WRITER = "the sweep (results table)"  # how the folder's .written.json names the tables' writer
_TABLE_WRITE = threading.Lock()


def write_table(sweep_dir: Path, df: pd.DataFrame) -> Path:
    """results.parquet, then its CSV twin results.csv (the same rows and columns), each atomically
    and listed with its sha256 in the folder's .written.json (core/written.py). A table edited
    since the sweep wrote it (a results.csv annotated in a spreadsheet) is not written over: it is
    set aside beside itself as <name>.edited-<time>, said in one line, and a new one written. A
    table from before the list is the sweep's own and is replaced as before."""
    sweep_dir = Path(sweep_dir)
    parquet, csv = io.BytesIO(), io.StringIO()
    df.to_parquet(parquet, index=False)
    df.to_csv(csv, index=False)
    tables = {schema.results_path(sweep_dir).name: parquet.getvalue(), schema.csv_path(sweep_dir).name: csv.getvalue()}
    with _TABLE_WRITE:  # the driver's end, run from a watcher thread (stop.py), may meet a refresh
        for name, why in written.blocked(sweep_dir, list(tables)).items():
            if why.startswith("changed since"):
                aside = sweep_dir / f"{name}.edited-{time.strftime('%Y%m%d-%H%M%S')}"
                (sweep_dir / name).rename(aside)
                print(f"{sweep_dir / name} was {why}: kept as {aside.name}; the sweep writes its table anew")
        written.write_outputs(sweep_dir, tables, by=TABLE_WRITER, adopt=True)
    return schema.results_path(sweep_dir)


def refresh_table(sweep_dir: Path, study: Study) -> pd.DataFrame:
    """Rebuild the table from the trial folders and the study, and write it. The driver calls
    this as each trial ends, so a sweep that runs for days (or is killed with its machine) has a
    table as current as its last ended trial, and again when the sweep ends."""
    states = {
        ident: {"number": t.number, "state": t.state.name, "fail_reason": t.user_attrs.get("fail_reason"),
                "trial_dir": t.user_attrs.get("trial_dir"), "role": t.user_attrs.get("role"), "params": t.params}
        for ident, t in study.by_identity().items()
    }
    df = build_table(sweep_dir, states)
    write_table(sweep_dir, df)
    return df


class TableRefresher:
    """refresh_table as each trial ends, at most ~10% of the driver's time: a rebuild that took
    t seconds is not repeated for 9 t (5 ms a trial: a 1,000-trial search waits ~45 s between
    rewrites, a 24-trial sweep ~1 s). A skipped ending is in the next rewrite or the sweep's last."""

    def __init__(self, sweep_dir: Path, study: Study, clock=time.monotonic):
        self.sweep_dir, self.study, self.clock, self.next_at = sweep_dir, study, clock, float("-inf")

    def __call__(self) -> None:
        start = self.clock()
        if start < self.next_at:
            return
        refresh_table(self.sweep_dir, self.study)
        end = self.clock()
        self.next_at = end + 9 * (end - start)


def _unset(value: Any) -> bool:
    """A swept key this trial did not set (a protocol's confirm-only key on a tuning trial)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def write_results(sweep_dir: Path, study: Study) -> pd.DataFrame:
    """The table as the sweep ends (refresh_table); print the counts, the lowest single trial
    and, with seeds swept, the best setting over its seeds."""
    df = refresh_table(sweep_dir, study)
    path = schema.results_path(sweep_dir)
    print(f"results: {path} ({summary.state_counts(df)})")
    for line in summary.failure_lines(df, sweep_dir):
        print(line)
    done = df[df[schema.STATE] == schema.COMPLETE].dropna(subset=[schema.FINAL_VAL_LOSS]) if not df.empty else df
    if not done.empty:
        best = done.loc[done[schema.FINAL_VAL_LOSS].idxmin()]
        params = {k: best[c].item() if hasattr(best[c], "item") else best[c]
                  for k in schema.swept_keys(df) if (c := schema.config_column(k)) in df and not _unset(best[c])}
        folder = schema.to_local_path(best["trial_dir"], sweep_dir)
        # Named for what it is: with seeds swept, the lowest single run is one seed's draw and can
        # name another setting than the seed means below (the one to read).
        print(f"lowest single trial: trial {int(best[schema.TRIAL_NUMBER])} {params} val loss "
              f"{best[schema.FINAL_VAL_LOSS]:.4f} -> {folder}")
        setting = summary.best_setting_line(done)
        if setting:
            print(setting)
    return df
