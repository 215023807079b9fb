# Every target sets up the virtual environment first, so a fresh clone needs only `make demo`
# or `make test` (Python >= 3.10 and make on the PATH).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: setup demo test bench build upload clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(PY) -m nkisim.examples.demo

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) -m pytest -q bench

clean:
	rm -rf build bench/out .pytest_cache .benchmarks
