"""Shared test settings."""

import os
import tempfile

import torch

# check() records verdicts for progress(): never into the developer's own cache directory.
os.environ["RLHF_TUTORIAL_PROGRESS_FILE"] = os.path.join(tempfile.mkdtemp(prefix="rlhf-progress-"), "progress.json")

# One intra-op thread: on a busy 2-core machine two threads contend and make small ops many times slower.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Browser tests run only when selected (``-m browser``, as ``make browser`` does): they need Chromium
    and take minutes, so a plain ``pytest tests`` leaves them out, visibly (reported as skipped)."""
    import pytest

    if "browser" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="browser test: run `make browser` (or pytest -m browser)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)
