"""Training one trial: typed data settings (data_config), corpora and their cache (corpus, data,
shards, make_shards), the anchor task, the loop (loop.Trainer, with observer for evaluation and
probes and budget_forks for train.budgets' cooldown branches), precision, checkpoints,
distributed workers, and export to transformers.

It imports core and model only; the sweeper calls `loop.run_trial`, and nothing here knows a
sweep exists.
"""
