#!/bin/bash
# Every 20 minutes, pack each of the record's sweep folders that exists into carry/ beside this
# script (records/keep.py: finished trials only; a pack is never written over by one that holds
# fewer). Commit carry/ to keep them; the next machine unpacks them (README "How it runs").
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
RECORDS=${RECORDS:-$HOME/records}
while true; do
  for name in crossover_registry crossover_registry_repeat registry_cosine_4m registry_cosine_8m registry_widths; do
    [ -d "$RECORDS/$name" ] || continue
    (cd "$REPO" && .venv/bin/python -m records.keep pack "$RECORDS/$name" "$HERE/carry/$name.tgz")
  done
  sleep ${EVERY:-1200}
done
