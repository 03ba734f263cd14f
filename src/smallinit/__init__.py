"""smallinit: test, reproduce and extend "Small Initialization Matters for Large Language Models".

One installable package (src layout). `python sweep.py ...` at the repository root, or the
`smallinit-sweep` console script once installed, runs `smallinit.cli.main`. Its sub-packages,
by concern:

    core         the ground floor: ConfigError and require, atomic writes, the trial folder
                 (TrialDir), the results table's columns, provenance of records
    model        the decoder, the init rule, gated attention; probes attach from outside
    data         typed data settings, the corpus reader, tokenizer and checked cache, token
                 shards, batches; the anchor task
    trainer      the training loop, tasks, checkpoints, several processes, export to
                 transformers; machine/ for dtype, allocator and memory plan
    sweeper      Hydra multirun -> Ray Tune trials: the driver and tuner over runtime/, worker/,
                 config/, study/ and results/ (its __init__ has the map)
    experiments  the report and the paper's analyses, read from what the sweeper wrote, in data/,
                 output/, stats/, fits/, claims/ and report/ (its __init__ has the map); the
                 repository's record builders import it from records/, outside this package
    bench        what the instrument costs, with base/, cpu/ and gpu/ (its records stay in the
                 repository's bench/)
    conf         Hydra's presets and experiments (CONF_DIR); not a Python package
    cli          sweep.py's body: the Hydra main, --show, the stop signals

Hydra's plugin (the smallinit sweeper) is hydra_plugins.smallinit_sweeper, beside this package
in src/: Hydra finds plugins in the hydra_plugins namespace.

The import floors (tests/test_architecture.py enforces them, lazy imports included; no private
name crosses between packages): core -> model -> data -> trainer -> sweeper and bench; experiments
stands on core and model alone.

    core         the standard library only
    model        core
    data         core, model
    trainer      core, model, data
    experiments  core, model (it reads sweeps through core's schema, not through the sweeper)
    sweeper      core, model, data, trainer
    bench        core, model, data, trainer, sweeper
    hydra_plugins  core, sweeper

Importing this package imports nothing else (the sweep driver must not pay for torch).
"""

from pathlib import Path

CONF_DIR = Path(__file__).parent / "conf"
