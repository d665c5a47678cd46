# The two commands (see README): `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo demo-serve test fuzz install install-test lint bench evaluate train clean \
	check-python venv

## Before anything else: stop with one line when PYTHON is older than 3.11 (naming its
## version and a PYTHON= to use), and make $(VENV) again when it no longer works (its
## Python gone or older than 3.11, no pip) if radserve made it: tools/check_python.sh.
check-python:
	@sh tools/check_python.sh "$(PYTHON)" "$(VENV)" "$(firstword $(MAKECMDGOALS) demo)"

## The virtual environment, made with PYTHON when there is none (marked as radserve's);
## a failed creation leaves none behind for the next run to reuse.
venv: check-python
	@if [ ! -e "$(BIN)/python" ]; then \
		echo "$(PYTHON) -m venv $(VENV)"; \
		$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }; \
		touch $(VENV)/.made-by-radserve; \
		$(BIN)/python -m pip install --quiet --upgrade pip; \
	fi

install: venv
	$(BIN)/python tools/one_onnxruntime.py
	$(BIN)/pip install --quiet -e .

install-test: venv
	$(BIN)/python tools/one_onnxruntime.py
	$(BIN)/pip install --quiet -e ".[test]"

## Install, generate a phantom CT study, run the reference pipeline, print where the report is.
demo: install
	$(BIN)/radserve demo --out out/demo

## The demo, then the web console on it at http://127.0.0.1:8000/ (prints a demo admin key;
## Ctrl-C stops it). PORT=0 takes any free port.
PORT ?= 8000
demo-serve: install
	$(BIN)/radserve demo --out out/demo --serve --port $(PORT)

## Install what the tests need and run lint (ruff, import layers) + the test suite (its
## log ends with the 30 slowest test phases and the 25 slowest test files, each file's
## summed wall and CPU-seconds, tests/file_durations.py: where CI time goes).
test: lint
	$(BIN)/python -m pytest -q --durations=30

## ruff (check and format) over src, tests and tools, as the landing command; import layers.
lint: install-test
	$(BIN)/ruff check src tests tools
	$(BIN)/ruff format --check src tests tools
	$(BIN)/lint-imports

## Fuzz every hostile-input surface with atheris for FUZZ_MINUTES each (docs/fuzzing.md);
## corpus, reproducers and logs under out/fuzz/<target>/, kept for the next run.
FUZZ_MINUTES ?= 10
fuzz: install-test
	$(BIN)/python -m tests.fuzz.long --minutes $(FUZZ_MINUTES) --out out/fuzz

bench: install-test
	$(BIN)/radserve bench --json out/bench.json

evaluate: install
	$(BIN)/radserve evaluate --json out/evaluate.json --markdown out/evaluate.md

## Retrain the reference models with PyTorch on the CPU (on two cores, each alone: organs
## ~40 min, lesions ~1 h; together they share the cores: see the README's accuracy section).
train: venv
	$(BIN)/pip install --quiet -e ".[train]"
	$(BIN)/python -m radserve.training --model all --seed 0 --out src/radserve/assets/models

clean:
	rm -rf $(VENV) out .pytest_cache
