"""Reading sweep folders: the results table, metrics, probes and per-token losses as frames
(load), which trials each setting is compared on at its tuned optimiser settings (tuning),
Optuna parameter importances, and `compare` of two sweep folders.

May import: (none)
"""
