#!/usr/bin/env bash
# make test-gpu: the suites with every model on a CUDA GPU (RLHF_TUTORIAL_DEVICE=cuda), in parallel, one
# line of counts per suite; the logs and a JSON summary go to $GPU_REPORT_DIR (default reports/gpu).
#
#   unit        pytest tests (less what never touches a device: install, packaging, lab/CLI, browser, and
#               the cpu_only tests: CPU kernel rebuilds, the simulated GPU's own tests)
#   nbval-tiny  every solution notebook, tiny world
#   nbval-gpt2  every solution notebook, GPT-2 world on the stand-in cache, smoke size
#   figures     GPT-2-small-sized phases (random weights, fp32) and the tiny world's phase time on the GPU
#               against the CPU (what the tiny world's default device should be)
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
"$PY" -m rlhf_tutorial build-stand-in-hub "$STAND_IN" --device cpu > "$OUTDIR/stand-in-hub.log" 2>&1

IGNORE="--ignore=tests/test_install.py --ignore=tests/test_packaging.py --ignore=tests/test_lab_and_cli.py --ignore=tests/test_browser.py"
XDIST=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 4")
NBVAL="--nbval-lax --nbval-current-env -p no:cacheprovider solutions"

RLHF_TUTORIAL_WORLD=tiny "$PY" -m pytest tests -m "not browser and not cpu_only" $IGNORE -p no:cacheprovider -q $XDIST \
  > "$OUTDIR/unit.log" 2>&1 &
RLHF_TUTORIAL_WORLD=tiny RLHF_TUTORIAL_STRICT=1 "$PY" -m pytest $NBVAL -q > "$OUTDIR/nbval-tiny.log" 2>&1 &
HF_HOME="$STAND_IN" RLHF_TUTORIAL_WORLD=gpt2 RLHF_TUTORIAL_SMOKE=1 "$PY" -m pytest $NBVAL -q \
  > "$OUTDIR/nbval-gpt2.log" 2>&1 &
wait

"$PY" scripts/gpu_figures.py > "$OUTDIR/figures.log" 2>&1
status=0
for suite in unit nbval-tiny nbval-gpt2; do
  counts=$(grep -E "^(=+ )?[0-9]+ (passed|failed)|[0-9]+ (passed|failed|error)" "$OUTDIR/$suite.log" | tail -n 1 | sed 's/=//g')
  echo "test-gpu $suite: ${counts:-no result (see $OUTDIR/$suite.log)}"
  echo "$counts" | grep -qE "failed|error" && status=1
  [ -z "$counts" ] && status=1
done
echo "test-gpu figures: $(tail -n 1 "$OUTDIR/figures.log")"
exit $status
