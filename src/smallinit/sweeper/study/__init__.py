"""The Optuna study that remembers a sweep (study), rebuilt from the trial folders (study_rebuild),
the Tune searcher over it (searcher), what a sweep will run against it (plan), and
optuna-dashboard on it (dashboard).

May import: config, runtime, worker
"""
