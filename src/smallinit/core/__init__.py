"""The ground floor: what every smallinit package shares (errors, input checks, atomic files,
provenance, the markdown-table writer).

It imports nothing from the other packages and nothing heavier than the standard library and
numpy (core/flops.py counts FLOPs over arrays), so model, trainer, sweeper, experiments and bench
can all build on it.
"""
