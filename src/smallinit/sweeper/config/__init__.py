"""What a sweep is asked to run: conf/'s schema and the sweeper's settings (schema, config), the
sweep space from Hydra's override grammar (space), one-line prechecks, grid points without a
compose each (points), the fixed overrides a folder was made with, what the driver hands a
worker (spec: the TrialSpec, its identity computed once), overrides -> validated TrialSpec
(compose), and select-then-confirm (protocol).

May import: runtime
"""
