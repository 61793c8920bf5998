#!/usr/bin/env bash
# make test-gpu: the suites with every model on a CUDA GPU (RLHF_TUTORIAL_DEVICE=cuda), in parallel, one
# line of counts per suite; the logs and a JSON summary go to $GPU_REPORT_DIR (default reports/gpu).
#
#   unit        pytest tests (less what never touches a device: install, packaging, lab/CLI, browser, and
#               the cpu_only tests: CPU kernel rebuilds, the simulated GPU's own tests)
#   nbval-tiny  every solution notebook, tiny world
#   nbval-gpt2  every solution notebook, GPT-2 world on the stand-in cache, smoke size
#   cli         every CLI command once at a small size with --device cuda (scripts/gpu_cli.py)
#   figures     GPT-2-small-sized phases (random weights, fp32), the GRPO race against TRL at that size on the
#               GPU, and the tiny world's phase time on the GPU against the CPU (what the tiny world's default
#               device should be); run after the suites, on a quiet machine
#
# The suites run at once, each process with OMP_NUM_THREADS=2 (GPU_THREADS), the unit suite on GPU_UNIT_WORKERS
# xdist workers and each world's notebooks on GPU_NBVAL_WORKERS (one notebook per worker: --dist loadfile).
#
# Runs in the Python that has torch with CUDA ($PYTHON, default python3): a CUDA image plus the packages in
# ../shared/gpu-wheels.txt. Exit status: 0 when every suite passed.
set -u
PY=${PYTHON:-python3}
OUTDIR=${GPU_REPORT_DIR:-reports/gpu}
mkdir -p "$OUTDIR"
export RLHF_TUTORIAL_DEVICE=${RLHF_TUTORIAL_DEVICE:-cuda} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  RLHF_TUTORIAL_PROGRESS_FILE=off PYTHONUNBUFFERED=1
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "test-gpu: torch sees no CUDA GPU here ($PY); run it on a machine with one" >&2
  exit 2
fi
"$PY" -c "import torch; print('test-gpu on', torch.cuda.get_device_name(0), 'torch', torch.__version__)"

STAND_IN=$(mktemp -d)/hf

IGNORE="--ignore=tests/test_install.py --ignore=tests/test_packaging.py --ignore=tests/test_browser.py
  --deselect tests/test_lab_and_cli.py::test_make_lab_serves_the_lab_rooted_at_the_repository"
UNIT_XDIST="" NBVAL_XDIST=""
if "$PY" -c "import xdist" 2>/dev/null; then
  UNIT_XDIST="-n ${GPU_UNIT_WORKERS:-6}" NBVAL_XDIST="-n ${GPU_NBVAL_WORKERS:-4} --dist loadfile"
fi
NBVAL="--nbval-lax --nbval-current-env -p no:cacheprovider $NBVAL_XDIST solutions"
export OMP_NUM_THREADS=${GPU_THREADS:-2}

RLHF_TUTORIAL_WORLD=tiny "$PY" -m pytest tests -m "not browser and not cpu_only" $IGNORE -p no:cacheprovider -q $UNIT_XDIST \
  > "$OUTDIR/unit.log" 2>&1 &
RLHF_TUTORIAL_WORLD=tiny RLHF_TUTORIAL_STRICT=1 "$PY" -m pytest $NBVAL -q > "$OUTDIR/nbval-tiny.log" 2>&1 &
{ "$PY" -m rlhf_tutorial build-stand-in-hub "$STAND_IN" --device cpu > "$OUTDIR/stand-in-hub.log" 2>&1
  HF_HOME="$STAND_IN" RLHF_TUTORIAL_WORLD=gpt2 RLHF_TUTORIAL_SMOKE=1 "$PY" -m pytest $NBVAL -q \
    > "$OUTDIR/nbval-gpt2.log" 2>&1; } &
"$PY" scripts/gpu_cli.py --device cuda --jobs 3 --timeout "${GPU_CLI_TIMEOUT:-900}" > "$OUTDIR/cli.log" 2>&1 &
wait

unset OMP_NUM_THREADS
# GPU_FIGURES: which figures (default all: tiny memory race; see scripts/gpu_figures.py)
"$PY" scripts/gpu_figures.py ${GPU_FIGURES:-} > "$OUTDIR/figures.log" 2>&1
status=0
for suite in unit nbval-tiny nbval-gpt2; do
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed)|[0-9]+ (passed|failed|error)" "$OUTDIR/$suite.log" | tail -n 1 | sed 's/=//g')
  echo "test-gpu $suite: ${counts:-no result (see $OUTDIR/$suite.log)}"
  echo "$counts" | grep -qE "failed|error" && status=1
  [ -z "$counts" ] && status=1
done
cli=$(tail -n 1 "$OUTDIR/cli.log")
echo "test-gpu cli: $(echo "$cli" | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["passed"], "passed,", d["failed"], "failed:", " ".join(k for k, v in d["commands"].items() if not v["ok"]))' 2>/dev/null || echo "no result (see $OUTDIR/cli.log)")"
echo "$cli" | grep -q '"failed": 0' || status=1
echo "test-gpu figures: $(tail -n 1 "$OUTDIR/figures.log")"
exit $status
