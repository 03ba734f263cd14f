"""Each setting at its own best optimiser settings: what the report compares.

The init scale changes how large an Adam step is relative to the weights (update ~ lr,
weights ~ d^-gamma), so comparing two inits at one shared learning rate mixes the init's
effect with the lr's. As in muP and the scaling-law literature, every variant is compared at its
own tuned lr (and weight decay, when swept): per (size, setting, gamma) the optimiser settings
with the lowest seed-mean loss are chosen, and only those trials enter the comparisons, which
are then paired by seed at that choice. A choice at the smallest or largest value tried is
flagged: the optimum may lie outside the grid. The kept trials carry the flag (EDGE_COL), so a
comparison can tell when the arm behind might close the gap on a wider grid (stats.py).

Select, then confirm: where the results carry a `role` column (sweeper/config/protocol.py), each cell's
choice is made on its role=tune trials only and the comparisons keep only its role=confirm trials
at that choice, so the seeds that chose the lr are not the seeds that are compared. The kept
trials carry the seeds that chose (TUNE_SEEDS_COL). Without the column (older records) the
choice is made on the compared seeds themselves, as before. A train.budgets trial trains every
budget at one lr, and the protocol chose it on the trial's largest budget: with roles each budget
row is judged by its trial's largest-budget loss (CHOICE_COL), so every budget of a cell keeps
the confirm trials the protocol ran (judged by its own budget's loss, the smaller budgets would
choose values that have no confirm trial).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from smallinit.core import results_schema as schema

# The optimiser axes tuned per cell (size, setting, gamma); the init is what is compared.
OPTIM_COLS = ("lr", "weight_decay")
CELL = ("size", "setting", "gamma")
# On each kept trial: why its cell's choice sits at the edge of the grid ("" when inside it).
EDGE_COL = "optim_edge"
# Select-then-confirm roles (sweeper/config/protocol.py writes them), and on each kept trial the seeds
# ("init/train", or one number where they agree) whose tune trials chose its cell's settings.
ROLE_COL, TUNE, CONFIRM = "role", "tune", "confirm"
TUNE_SEEDS_COL = "tune_seeds"
CHOICE_COL = "_choice_loss"


def has_roles(df: pd.DataFrame) -> bool:
    return ROLE_COL in df and df[ROLE_COL].notna().any()


def seed_label(init_seed, train_seed) -> str:
    return f"{int(init_seed)}" if int(init_seed) == int(train_seed) else f"{int(init_seed)}/{int(train_seed)}"


@dataclass
class Tuning:
    axes: list[str]  # the optimiser columns that vary within some cell (empty: one setting)
    chosen: pd.DataFrame  # per cell: the chosen value of each axis, its loss, the grid, edge flags
    all_trials: pd.DataFrame  # every complete trial, every lr (for the per-lr figure)
    roles: bool = False  # chosen on role=tune trials, compared on role=confirm ones
    unassigned: int = 0  # with roles: complete trials with neither role (left out)

    @property
    def edges(self) -> pd.DataFrame:
        return self.chosen[self.chosen["at_edge"]] if not self.chosen.empty else self.chosen

    def describe(self) -> str:
        """One sentence on how the variants were compared."""
        if not self.axes:
            fixed, varies = [], False
            for col in OPTIM_COLS:
                values = sorted(self.all_trials[col].dropna().unique()) if col in self.all_trials else []
                if values:
                    fixed.append(f"{col} = {', '.join(f'{v:g}' for v in values)}")
                    varies |= len(values) > 1
            if varies:  # several lrs, but each (size, setting, γ) ran at one: nothing to choose from
                return (f"Each (size, setting, γ) ran at one optimiser setting, not all at the same one "
                        f"({'; '.join(fixed)}), so no arm's lr was chosen, and a comparison across different lrs "
                        "mixes the init's effect with the lr's. Run every setting at the same 3+ lrs over 10x to "
                        "compare each at its own best lr.")
            return (f"No learning-rate axis: every comparison is at one optimiser setting ({'; '.join(fixed) or 'unknown'}), "
                    "which mixes the init's effect with the lr's. Sweep optim.lr (3+ values over 10x) to compare each "
                    "setting at its own best lr.")
        n_edge = int(self.chosen["at_edge"].sum())
        if self.roles:
            tune = sorted({s for v in self.chosen[TUNE_SEEDS_COL] for s in v}, key=_seed_key)
            txt = (f"Each (size, setting, γ) is compared at its own best {' and '.join(self.axes)}, chosen on the "
                   f"tuning seed(s) {', '.join(tune) or 'none'} (lowest seed mean among the values where every "
                   f"tuning seed completed); the comparisons use only the confirm seeds at that choice, paired by "
                   f"seed, so no compared seed chose its lr.")
            missing = int((self.chosen["n_confirm"] == 0).sum())
            if missing:
                txt += f" {missing} of {len(self.chosen)} choices have no confirm trial at the chosen value yet."
            if self.unassigned:
                txt += f" {self.unassigned} complete trial(s) with neither role are left out."
        else:
            txt = (f"Each (size, setting, γ) is compared at its own best {' and '.join(self.axes)} (lowest seed mean "
                   f"among the values where every seed completed); comparisons are paired by seed at that choice. "
                   f"The choice is made on the same seeds it is then compared on, which flatters every arm a "
                   f"little, each by the same rule.")
        if n_edge:
            txt += f" {n_edge} of {len(self.chosen)} choices sit at the edge of the grid: widen it."
        return txt


# Optimiser values are compared after rounding to this many significant digits, so that
# 0.003 and 0.0030000000000000005 (a value that went through arithmetic) are one grid point.
DIGITS = 6
# A missing value (a results table from before the column existed) is its own grid point.
MISSING = -1.0


def _key(col: str) -> str:
    return f"_grid_{col}"


def _with_keys(df: pd.DataFrame) -> pd.DataFrame:
    """df plus one grouping key per optimiser column: the value rounded, MISSING for NaN."""
    out = df.copy()
    for col in OPTIM_COLS:
        values = out[col] if col in out else pd.Series(np.nan, index=out.index)
        out[_key(col)] = [MISSING if pd.isna(v) else float(f"{float(v):.{DIGITS}g}") for v in values]
    return out


def _axes(df: pd.DataFrame) -> list[str]:
    present = [c for c in OPTIM_COLS if (df[_key(c)] != MISSING).any()]
    return [c for c in present if df.groupby(list(CELL))[_key(c)].nunique().max() > 1]


def _seed_key(label: str):
    return tuple(int(x) for x in label.split("/"))


def largest_budget_loss(df: pd.DataFrame, results: pd.DataFrame, metric: str) -> pd.Series:
    """Per row of df: the loss of its trial's largest budget in `results` (every row, any
    state), NaN where that row did not complete; the row's own loss where the trial has one budget."""
    if not all(schema.TRIAL_IDENTITY in t and schema.BUDGET_TOKENS in t for t in (df, results)):
        return df[metric]
    res = results.dropna(subset=[schema.TRIAL_IDENTITY, schema.BUDGET_TOKENS])
    last = res.loc[res.groupby(schema.TRIAL_IDENTITY)[schema.BUDGET_TOKENS].idxmax()].set_index(schema.TRIAL_IDENTITY)
    done = last[schema.STATE] == schema.COMPLETE
    final = pd.to_numeric(last[metric], errors="coerce").where(done)
    return df[schema.TRIAL_IDENTITY].map(final).where(df[schema.TRIAL_IDENTITY].notna(), df[metric])


def tune(df: pd.DataFrame, metric: str, results: pd.DataFrame | None = None) -> tuple[pd.DataFrame, Tuning]:
    """df (complete trials, labelled) -> (the trials at each cell's best optimiser settings,
    the record of what was chosen). With roles: chosen on tune trials, confirm trials kept;
    results (every row, any state) gives a budget row its trial's largest-budget loss."""
    roles = has_roles(df)
    if roles:
        bad = sorted({str(v) for v in df[ROLE_COL].dropna().unique()} - {TUNE, CONFIRM})
        if bad:
            raise ValueError(f"results column {ROLE_COL}={bad[0]!r} is invalid: must be {TUNE!r} or {CONFIRM!r}")
    choice = largest_budget_loss(df, results, metric) if roles and results is not None else df[metric]
    keyed = _with_keys(df.assign(**{CHOICE_COL: choice}))
    axes = _axes(keyed)
    unassigned = int(df[ROLE_COL].isna().sum()) if roles else 0
    if not axes:
        kept = df[df[ROLE_COL] == CONFIRM] if roles else df
        return kept, Tuning(axes=[], chosen=pd.DataFrame(), all_trials=df, roles=roles, unassigned=unassigned)
    keys = [_key(c) for c in axes]
    keep, rows = [], []
    for cell, cell_rows in keyed.groupby(list(CELL), sort=False):
        # With roles the choice is made on the tune trials and the confirm trials are compared;
        # a cell without tune trials cannot choose and keeps nothing.
        g = cell_rows[cell_rows[ROLE_COL] == TUNE] if roles else cell_rows
        g = g[g[CHOICE_COL].notna()]  # a budget row whose trial's largest budget did not complete
        confirm = cell_rows[cell_rows[ROLE_COL] == CONFIRM] if roles else cell_rows
        if g.empty:
            continue
        stats = g.groupby(keys).agg(loss=(CHOICE_COL, "mean"), seeds=("seed", "nunique")).reset_index()
        # An option where some seeds did not complete (diverged, failed) is not comparable on
        # its surviving seeds' mean: a high lr that kills one seed in three is not "best".
        # Options are compared on the cell's full seed set; if none has it, on the most seeds any has.
        want = g["seed"].nunique()
        full = stats[stats["seeds"] == (want if (stats["seeds"] == want).any() else stats["seeds"].max())]
        best = full.sort_values("loss", kind="stable").iloc[0]
        mask = np.ones(len(confirm), dtype=bool)
        row = dict(zip(CELL, cell), loss=float(best["loss"]), seeds=int(best["seeds"]), at_edge=False, edge="")
        for col in axes:
            tried = sorted(v for v in stats[_key(col)].unique() if v != MISSING)
            value = float(best[_key(col)])
            mask &= (confirm[_key(col)] == value).to_numpy()
            row[col] = None if value == MISSING else value
            row[f"{col}_tried"] = [float(v) for v in tried]
            # Weight decay 0 is the bottom of its range, not the edge of a grid.
            low_edge = bool(tried) and value == tried[0] and not (col == "weight_decay" and value == 0)
            if len(tried) > 1 and value != MISSING and (low_edge or value == tried[-1]):
                side = "smallest" if value == tried[0] else "largest"
                row["at_edge"] = True
                row["edge"] += f"{col} = {value:g} is the {side} tried; "
        row["excluded_options"] = int(len(stats) - len(full))
        row["edge"] = row["edge"].rstrip("; ")
        if roles:
            at = g
            for col in axes:
                at = at[at[_key(col)] == (MISSING if row[col] is None else row[col])]
            row[TUNE_SEEDS_COL] = sorted({seed_label(i, t) for i, t in zip(at["init_seed"], at["train_seed"])},
                                         key=_seed_key)
            row["n_confirm"] = int(confirm[mask]["seed"].nunique())
        rows.append(row)
        kept = df.loc[confirm.index[mask]].assign(**{EDGE_COL: row["edge"]})
        if roles:
            kept[TUNE_SEEDS_COL] = ", ".join(row[TUNE_SEEDS_COL])
        keep.append(kept)
    chosen = pd.DataFrame(rows)
    if not keep:
        return df.iloc[:0], Tuning(axes=axes, chosen=chosen, all_trials=df, roles=roles, unassigned=unassigned)
    return pd.concat(keep).sort_index(), Tuning(axes=axes, chosen=chosen, all_trials=df, roles=roles,
                                                unassigned=unassigned)


def chosen_label(row, axes: list[str]) -> str:
    return ", ".join(f"{c}={row[c]:g}" if row[c] is not None and pd.notna(row[c]) else f"{c}=?" for c in axes)
