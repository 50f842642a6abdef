# Two commands: `make train` and `make test`. Both create .venv (pinned dependencies) when it is missing.
PYTHON ?= python3.11
PY := .venv/bin/python
CONFIG ?= configs/digits.yaml
ARGS ?=

.PHONY: train test lint clean

.venv/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv .venv
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

train: .venv/.installed
	$(PY) train.py fit --config $(CONFIG) $(ARGS)

test: .venv/.installed
	$(PY) -m pytest

lint: .venv/.installed
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

clean:
	rm -rf logs checkpoints/*/ .pytest_cache
