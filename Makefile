# The two set-up commands (see README):  `make demo`  and  `make test`.
# Both create .venv from nothing with the machine's Python 3.11; VENV=... reuses another one.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.camkit-installed

.PHONY: install demo test bench lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
	$(PY) -m pip install --quiet -e ".[dev]"
	# zennit-crp 0.6.0 pins an older zennit but works with 0.5.1: installed without its pins
	$(PY) -m pip install --quiet --no-deps "zennit-crp==0.6.0"
	# lxt 2.1 (AttnLRP's reference functions) declares GPU-only extras it does not need here
	$(PY) -m pip install --quiet --no-deps "lxt==2.1"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/camkit demo --out demo-out

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) benchmarks/run.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/ruff format --check src tests benchmarks examples
