"""Hydra multirun -> Ray Tune trials. The driver (driver.py: the sweep, start to end) and the
Tune wiring (tuner.py) sit here, over folders by concern, each importing only the folders below
it (its __init__ says which; tests/test_architecture.py enforces the `May import:` line):

    runtime   the Ray cluster (up, down, its private names), what a trial asks of it, the
              reaper, the sweep folder's lock, how the driver stops
    worker    what runs in a Ray worker (trainable) and why a trial failed (failures)
    config    the schema, the sweeper's settings, the sweep space, prechecks, grid points,
              fixed overrides, compose, the select-then-confirm protocol
    study     the Optuna study, its rebuild from trial folders, the searcher, the plan,
              the dashboard
    results   the results table, the closing summary, live progress, --show and its estimate

    runtime  <  worker  <  config  <  study  <  results  <  driver.py, tuner.py
"""
