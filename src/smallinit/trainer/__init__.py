"""Training one trial: the loop (loop.Trainer, with observer for evaluation and probes and
schedule for the learning rates and train.budgets' cooldown branches, folder_checks for whose
a folder is), the trial's
typed settings (config), what it learns (tasks: language modelling or the anchor task, on the
data package's batches), the check that a trial fits its corpus (data_check), checkpoints,
several processes (distributed), metrics (reporting), and export to transformers. machine/
holds what depends on the hardware: the compute dtype, the CPU allocator setting, and the
per-device memory plan.

It imports core, model and data only; a sweep's worker and a single run both enter through
`entry.train_trial`, and nothing here knows a sweep exists.
"""
