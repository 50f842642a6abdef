# Two commands: `make train` and `make test`. Both create .venv (pinned dependencies) when it is missing.
PYTHON ?= python3.11
PY := .venv/bin/python
CONFIG ?= configs/digits.yaml
ARGS ?=
# RESUME=1: continue the newest run of CONFIG from its last checkpoint (last.ckpt or the mid-epoch last-step.ckpt)
RESUME ?=

.PHONY: train test lint clean

.venv/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv .venv
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

train: .venv/.installed
	$(PY) train.py fit --config $(CONFIG) $(if $(RESUME),--ckpt_path last) $(ARGS)

# Two workers (one torch thread each), a file's expensive fixture on one of them (--dist loadgroup): pytest 182-188 s
# on a 2-core EPYC with AVX-512 (871 tests), 290-353 s on an AVX2-only one (866 tests; the machine's speed moves 1.5x
# between hours: docs/testing.md); `pytest -x tests/test_x.py` for one file
# env -u PYTHONDONTWRITEBYTECODE: the workers, and the commands the tests start, read vit/ and the rewritten tests
# from __pycache__ instead of compiling them each time (a worker's collection: 18.5 s without, 12.5-14 s with)
test: .venv/.installed
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n 2 --dist loadgroup

lint: .venv/.installed
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

clean:
	rm -rf logs checkpoints/*/ .pytest_cache
