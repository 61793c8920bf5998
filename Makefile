# Two commands do all set-up on a fresh machine with Python >= 3.10 and make:
#   make lab    creates .venv, installs, starts JupyterLab at the repository, showing chapters/
#   make test   the same environment, then the whole suite (ruff, unit and checker tests, nbval, and
#               the browser test: JupyterLab driven by headless Chromium, installed by `make chromium`)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH_SPEC ?= torch==2.13.0
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told to (containers, CI machines).
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
PYTEST_ARGS ?=

.PHONY: lab test lint unit nbval browser chromium notebooks tiny demo clean help

help:
	@echo "make lab | make test | make demo | make notebooks | make tiny | make clean"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: an unpinned torch pulls several GB of CUDA packages.
	$(BIN)/python -m pip install --quiet --progress-bar off "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --progress-bar off -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# Rooted at the repository so that both chapters/ and solutions/ are in the file browser; it opens on
# chapters/. jupyterlab-settings/overrides.json turns on saving widget state with the notebook, so that
# explorers' controls come back when a notebook is reopened (their views are saved outputs anyway).
LAB_FLAGS = --notebook-dir=. --LabApp.default_url=/lab/tree/chapters \
	--LabApp.app_settings_dir=$(CURDIR)/jupyterlab-settings
lab: $(STAMP)
	$(BIN)/jupyter lab $(LAB_FLAGS) $(ROOT_FLAG) $(LAB_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check --no-cache rlhf_tutorial tests course

unit: $(STAMP)
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny $(BIN)/python -m pytest tests -m "not browser" $(PYTEST_ARGS)

# RLHF_TUTORIAL_PROGRESS_FILE=off: running the solutions must not mark a learner's exercises as passed.
nbval: $(STAMP)
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny RLHF_TUTORIAL_STRICT=1 RLHF_TUTORIAL_PROGRESS_FILE=off \
	  $(BIN)/python -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider solutions $(PYTEST_ARGS)

# Debian's chromium for the browser test (Playwright's own browser download is not used). As root with
# apt-get it is installed; otherwise this fails and says what to do (the test would fail anyway).
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	   || [ -n "$$RLHF_TUTORIAL_CHROMIUM" ]; then exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
	  echo "Chromium is missing and cannot be installed here (needs root and apt-get): install the"; \
	  echo "'chromium' package, or set RLHF_TUTORIAL_CHROMIUM to a Chromium/Chrome binary."; exit 1; \
	fi

# JupyterLab in headless Chromium: run solution notebooks, move a slider, save, reopen (tests/test_browser.py).
# Screenshots land in reports/browser/.
browser: $(STAMP) chromium
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny $(BIN)/python -m pytest tests/test_browser.py -m browser $(PYTEST_ARGS)

test: lint unit nbval browser

notebooks: $(STAMP)
	$(BIN)/python -m rlhf_tutorial build-notebooks

tiny: $(STAMP)
	$(BIN)/python -m rlhf_tutorial build-tiny

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m rlhf_tutorial train-rlhf --world tiny --direction neg --seed 0 --report reports/demo.html

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
