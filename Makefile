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
	$(PY) -m demo.vit_demo

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) -m pytest -q bench

# Hub artifact: build/torch-neuron, build/torch-cpu, build/CARD.md (hubtools/build.py).
# REPO_ID (default: build.toml's [general.hub] repo-id) is the repo the card points to.
build: setup
	$(PY) -m hubtools.build $(if $(REPO_ID),--repo-id $(REPO_ID))

# make upload REPO_ID=<org>/neuron-vit-attn [VERSION=1] [DRY_RUN=1]: builds, then publishes build/ to branch
# v<VERSION> of the kernel repo and the card to main (hubtools/upload.py). DRY_RUN=1 prints the plan only.
upload: build
	$(PY) -m hubtools.upload $(if $(REPO_ID),--repo-id $(REPO_ID)) $(if $(VERSION),--version $(VERSION)) \
		$(if $(filter 1 true yes,$(DRY_RUN)),--dry-run)

clean:
	rm -rf build bench/out .pytest_cache .benchmarks
