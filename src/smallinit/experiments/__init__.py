"""The report and the paper's analyses, read from what the sweeper wrote (never through it).

Folders by concern, each importing only the folders below it (its __init__ says which;
tests/test_architecture.py enforces the `May import:` line):

    data      reading sweep folders into frames (load), each setting at its tuned optimiser
              settings (tuning), Optuna importances, compare two sweep folders
    output    figures (saved only with titled, labelled axes), blocks rendered to Markdown and
              HTML, Markdown tables
    stats     paired statistics: t-interval, sign-flip p, Holm; validation-sampling noise; curves
              of the gap over training; token-level comparisons
    fits      fitted laws: L(N), L(N, D), effective size and width, where the gap crosses 0
    claims    the paper's claims with a verdict each (claims.py) and the analyses that make them
              (mechanism, width trend, anchor phase, token budgets)
    report    `make report`: the page (report.py) built from sections over a shared Context,
              its lead (findings), the headless-browser check (screenshot)

    output, data  <  stats  <  fits  <  claims  <  report

docs/results.md and the checks a record names (dtype_check, wsd_check, crossover_size, ...) are
built by the repository's records/ (`python -m records.<name>`), outside the installed package:
they import this library, and nothing here imports them.
"""
