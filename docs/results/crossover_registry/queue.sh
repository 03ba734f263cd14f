#!/bin/bash
# The queue of crossover_registry's sweeps (README "How it runs"), each from a clone of the
# repository at $CODE into $RECORDS/<name>, $CPUS trials at a time (one thread each), in the order given:
#   CPUS=2 queue.sh registry cosine4m cosine8m widths repeat
# A sweep another driver holds is refused in one line and the queue goes on; a finished one has
# nothing to run. Every trial keeps only what the record reads (no weights, probes or per-token
# losses), so records/keep.py can carry the finished ones to the next machine.
CODE=${CODE:-$HOME/records/code}
RECORDS=${RECORDS:-$HOME/records}
cd "$CODE" || exit 1
run() { echo "== $(date -u +%FT%TZ) start $1"; shift; .venv/bin/python sweep.py -m "$@" ray.num_cpus=${CPUS:-1}; rc=$?
        echo "== $(date -u +%FT%TZ) exit $rc"; }
SMALL="train.keep_weights=false train.probe_every=0 train.per_token_eval_tokens=0 train.log_every=64"
registry() { run registry +experiment=crossover_registry hydra.sweep.dir=$RECORDS/crossover_registry; }
repeat()   { run repeat +experiment=crossover_registry data.train_fraction=0.0525 train.max_epochs=7 \
                 name=crossover_registry_repeat hydra.sweep.dir=$RECORDS/crossover_registry_repeat; }
cosine4m() { run cosine4m +experiment=crossover_whole data=registry name=registry_cosine_4m train.max_tokens=4194304 \
                 optim.warmup_frac=0.025 train.dtype=fp32 $SMALL hydra.sweep.dir=$RECORDS/registry_cosine_4m; }
cosine8m() { run cosine8m +experiment=crossover_whole data=registry name=registry_cosine_8m train.max_tokens=8388608 \
                 optim.warmup_frac=0.0125 train.dtype=fp32 $SMALL hydra.sweep.dir=$RECORDS/registry_cosine_8m; }
widths()   { run widths +experiment=registry_widths hydra.sweep.dir=$RECORDS/registry_widths; }
for job in "$@"; do $job; done
