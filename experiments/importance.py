"""Optuna parameter importances for sweeps that searched a space (any interval parameter).

The study lives in sweeps/<name>/optuna.db; its name is the folder's name unless the sweep
set hydra.sweeper.study_name, in which case the study whose trials carry the results'
identities is used. A grid (every distribution categorical) or fewer than two completed
trials gets a sentence instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from core.errors import first_line


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
    from optuna.distributions import CategoricalDistribution

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
    dists = {k: v for t in done for k, v in t.distributions.items()}
    if dists and all(isinstance(d, CategoricalDistribution) for d in dists.values()):
        return None, f"{sweep_dir.name}: a grid (no interval to search), so no parameter importances."
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
    return ({k: float(v) for k, v in imp.items()},
            f"{sweep_dir.name} (study {study.study_name!r}): importances of {len(imp)} parameter(s) over {len(done)} "
            f"completed trials ({evaluator_name or 'Optuna default'} evaluator). With one parameter its importance is 1 "
            "by construction; with few trials the ranking is rough.")
