"""What every benchmark shares: presets, the trial composer, the prepared corpus, medians and
the ABAB rotation, provenance (common); the bare training loop baselines are measured against
(bare); reading a process tree's CPU time and memory from /proc (cpu_account).

May import: (none)
"""
