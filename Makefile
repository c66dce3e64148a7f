# make train | make test | make bench | make docs   (each creates .venv on first use)
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= cartpole/ppo_ewma

.PHONY: train test bench docs install clean

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PY) >/dev/null 2>&1 || { echo "error: $(PY) not found (Python 3.11 is required)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: the CPU wheel; a looser pin would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev,hf,mujoco,atari,docs,studies]"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	$(BIN)/ppo-lightning fit --config $(CONFIG)

# Two test workers (pytest-xdist): most tests train in one thread, so a single worker leaves a core idle.
# --dist worksteal: a worker that runs out takes tests from the other's queue, so no single long file
# (test_robust, test_training, test_cluster take minutes each) decides when the run ends. TEST_WORKERS=1 for one worker.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests

bench: $(STAMP)
	$(BIN)/python benchmarks/cartpole.py

# The documentation site into site/ (--strict: a broken link, anchor or API reference fails).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs mlflow.db mlruns MUJOCO_LOG.TXT site
