"""Optuna parameter importances for sweeps that searched a space (any interval parameter).

The study lives in sweeps/<name>/optuna.db; its name is the folder's name unless the sweep
set hydra.sweeper.study_name, in which case the study whose trials carry the results'
identities is used. A grid gets none (None, with no sentence: the report leaves the section
out): its points were fixed, not sampled, and the report's tables already compare them. Its
values are recorded as ranges, so a grid is told by the study's `sampled` attribute (False on
every trial), or in a study from before that attribute, by every distribution being
categorical. Fewer than two completed trials get a sentence instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from smallinit.core.errors import first_line


def _find_study(db: Path, name: str, identities: set[str]):
    import optuna

    url = f"sqlite:///{db.resolve()}"
    names = [s.study_name for s in optuna.study.get_all_study_summaries(url)]
    if not names:
        return None, "the study database holds no study"
    if name in names:
        return optuna.load_study(study_name=name, storage=url), None
    best, overlap = None, 0
    for n in names:
        st = optuna.load_study(study_name=n, storage=url)
        k = sum(t.user_attrs.get("identity") in identities for t in st.get_trials(deepcopy=False))
        if k > overlap:
            best, overlap = st, k
    if best is None:
        return None, f"no study in {db} holds this sweep's trials (studies: {', '.join(names)})"
    return best, None


def importances(sweep_dir: Path, results: pd.DataFrame) -> tuple[dict[str, float] | None, str]:
    """({param: importance} or None, a sentence saying what was done or why not)."""
    import optuna

    db = Path(sweep_dir) / "optuna.db"
    if not db.exists():
        return None, f"{sweep_dir.name}: no optuna.db (the study may live in another storage): importances skipped."
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    ids = set(results.get("identity", pd.Series(dtype=str)).dropna())
    study, why = _find_study(db, sweep_dir.name, ids)
    if study is None:
        return None, f"{sweep_dir.name}: {why}: importances skipped."
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    # Trials whose folders lost them, trained again as new trials (sweeper/study/study.py SUPERSEDED).
    gone = {k.removeprefix("superseded:") for k in study.user_attrs if k.startswith("superseded:")}
    done = [t for t in done if str(t.number) not in gone]
    dists = {k: v for t in done for k, v in t.distributions.items()}
    if is_grid(done, dists):
        return None, ""
    if len(done) < 2:
        return None, f"{sweep_dir.name}: {len(done)} completed trial(s); importances need at least 2."
    if not dists:
        return None, f"{sweep_dir.name}: the completed trials have no parameters."
    evaluator = evaluator_name = None
    if hasattr(optuna.importance, "PedAnovaImportanceEvaluator"):  # Optuna 5's default, named explicitly
        evaluator, evaluator_name = optuna.importance.PedAnovaImportanceEvaluator(), "PED-ANOVA"
    try:
        imp = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except Exception as e:  # evaluators raise on degenerate data (one distinct value, ...)
        return None, f"{sweep_dir.name}: Optuna could not rank the parameters ({type(e).__name__}: {first_line(e)})."
    caveat = "With one parameter its importance is 1 by construction." if len(imp) == 1 else ""
    if len(done) < 10 * len(imp):
        caveat += " With few trials per parameter the ranking is rough."
    return ({k: float(v) for k, v in imp.items()},
            f"{sweep_dir.name} (study {study.study_name!r}): importances of {len(imp)} parameter(s) over {len(done)} "
            f"completed trials ({evaluator_name or 'Optuna default'} evaluator). {caveat.strip()}".strip())


def is_grid(trials, dists) -> bool:
    """Every point fixed in advance: recorded so (sampled=False), or, in a study from before the
    attribute, every distribution categorical."""
    from optuna.distributions import CategoricalDistribution

    marks = [t.user_attrs["sampled"] for t in trials if "sampled" in t.user_attrs]
    if marks:
        return not any(marks)
    return bool(dists) and all(isinstance(d, CategoricalDistribution) for d in dists.values())
