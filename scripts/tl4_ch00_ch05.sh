#!/usr/bin/env bash
# An experiment (docs/TRANSFORMERLENS4.md): chapter 00's and chapter 05's tiny-world tests on TransformerLens 4.x,
# through the shim in scripts/tl4_shim/ (it stands for the one adapter module a port would add).
# Usage: scripts/tl4_ch00_ch05.sh /path/to/side-venv/bin/python [pytest args]
# The side venv: torch==2.13.0 first, then transformer-lens==4.3.*, then the course's other dependencies
# (pytest, nbval, plotly, anywidget, ipywidgets, gymnasium ...) at the locked versions; never the course's .venv.
# The course is imported from this checkout (PYTHONPATH), not installed there.
set -u
PY=${1:?the side venv python}; shift
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/scripts/tl4_shim:$PWD" RLHF_TUTORIAL_TL4_SHIM=1 HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=tiny \
  RLHF_TUTORIAL_STRICT=1 RLHF_TUTORIAL_PROGRESS_FILE=off
"$PY" -c "import transformer_lens, importlib.metadata as m; print('transformer-lens', m.version('transformer-lens'), \
  'HookedTransformer ->', transformer_lens.HookedTransformer)"
"$PY" -m pytest -p no:cacheprovider -q --timeout=900 tests/checks/test_ch00_tour.py tests/checks/test_ch05_interp.py \
  tests/test_interp.py "$@"
"$PY" -m pytest -p no:cacheprovider -q --nbval-lax --nbval-current-env --nbval-cell-timeout=300 --timeout=360 \
  solutions/00_setup_and_tour.ipynb solutions/05_interpretability.ipynb "$@"
