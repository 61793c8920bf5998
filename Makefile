# Two commands do all set-up on a fresh machine with Python >= 3.10 and make:
#   make lab    creates .venv, installs, starts JupyterLab on chapters/
#   make test   the same environment, then the whole suite (ruff, unit and checker tests, nbval)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH_SPEC ?= torch==2.13.0
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told to (containers, CI machines).
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
PYTEST_ARGS ?=
# HF_HOME of the stand-in GPT-2 cache (random weights: it tests the GPT-2 world's code path, not quality)
STAND_IN_HF ?= .stand-in-hf

.PHONY: lab test lint unit nbval nbval-gpt2 stand-in-hub notebooks tiny demo clean help

help:
	@echo "make lab | make test | make nbval-gpt2 | make demo | make notebooks | make tiny | make clean"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build from PyTorch's CPU index when there is no NVIDIA GPU and that
	# index answers, else the default index (scripts/install_torch.py says which and why).
	$(BIN)/python scripts/install_torch.py --spec "$(TORCH_SPEC)"
	@echo "[install] the course and its dependencies (torch is kept as installed above)"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# TRL, only for the tests (bench-trl races our GRPO against it); nothing else in the course needs it.
TRL_STAMP := $(VENV)/.trl-stamp
$(TRL_STAMP): $(STAMP)
	$(BIN)/python -m pip install --progress-bar on -e ".[dev,trl]"
	@touch $(TRL_STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --notebook-dir=chapters $(ROOT_FLAG) $(LAB_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check --no-cache rlhf_tutorial tests course scripts

unit: $(STAMP) $(TRL_STAMP)
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny $(BIN)/python -m pytest tests $(PYTEST_ARGS)

nbval: $(STAMP)
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny RLHF_TUTORIAL_STRICT=1 \
	  $(BIN)/python -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider solutions $(PYTEST_ARGS)

# Every solution notebook again in the GPT-2 world, against the stand-in cache, offline, with the runs
# shrunk to smoke size (RLHF_TUTORIAL_SMOKE=1): proves the GPT-2 code path runs, not that it learns.
stand-in-hub: $(STAMP)
	$(BIN)/python -m rlhf_tutorial build-stand-in-hub $(STAND_IN_HF) | tail -n 1 | cut -c1-160

nbval-gpt2: stand-in-hub
	HF_HOME=$(abspath $(STAND_IN_HF)) HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=gpt2 RLHF_TUTORIAL_SMOKE=1 \
	  $(BIN)/python -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider solutions $(PYTEST_ARGS)

test: lint unit nbval nbval-gpt2

notebooks: $(STAMP)
	$(BIN)/python -m rlhf_tutorial build-notebooks

tiny: $(STAMP)
	$(BIN)/python -m rlhf_tutorial build-tiny

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m rlhf_tutorial train-rlhf --world tiny --direction neg --seed 0 --report reports/demo.html

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(STAND_IN_HF)
