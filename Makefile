# Two commands on a fresh machine: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv demo lint test test-props test-bench test-fast bench clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# 3 workers on this machine, one emulated 3x slower: BSP, then LB-BSP, then a comparison.
demo: venv
	$(BIN)/python examples/demo.py

# ruff (pyflakes, pycodestyle, import order, bugbear) and import-linter's contracts: the
# layers, MXNet only in worker/ and models/, no import cycle (pyproject.toml). Seconds.
lint: venv
	$(BIN)/ruff check mxlbbsp launcher models benchmarks examples tests
	$(BIN)/lint-imports

test: venv
	$(BIN)/python -m pytest -q tests -m "not bench" --durations=25

# The property tests of the pure core (tests/test_props_*.py) on new examples: a new seed
# (printed; `make test-props SEED=N` draws the same again) and 10 to 25 times the examples
# of `make test`, which keeps one seed (tests/conftest.py). CI runs it after `make test`:
# about 3 minutes of CPU.
SEED ?= $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
test-props: venv
	$(BIN)/python -m pytest -q tests/test_props_*.py --hypothesis-profile=props \
		--hypothesis-seed=$(SEED) --hypothesis-show-statistics

# Every benchmark command README.md and benchmarks/README.md quote, at its --smoke size
# (tests/test_bench_commands.py): minutes; CI runs it after `make test`.
test-bench: venv
	$(BIN)/python -m pytest -q tests -m bench

# Unit tests only (no processes): seconds.
test-fast: venv
	$(BIN)/python -m pytest -q tests -m "not cluster and not ssh and not bench"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
