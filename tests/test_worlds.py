"""The world switch: resolving the world, failing fast without GPT-2, loading the tiny world."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rlhf_tutorial import worlds


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.delenv(worlds.ENV_VAR, raising=False)
    monkeypatch.delenv(worlds.TINY_DIR_ENV_VAR, raising=False)
    monkeypatch.setattr(worlds, "_auto_choice", None)
    monkeypatch.setattr(worlds, "_announced", False)


def no_gpt2_here(monkeypatch):
    """Simulate a machine without GPT-2 in the cache and without network."""
    monkeypatch.setattr(worlds, "_is_cached", lambda repo_id: False)
    monkeypatch.setattr(worlds, "_hub_reachable", lambda timeout=worlds.HUB_TIMEOUT_S: False)


def test_resolve_world_honours_argument_then_environment(monkeypatch):
    assert worlds.resolve_world("tiny") == "tiny"
    assert worlds.resolve_world("GPT2") == "gpt2"
    assert worlds.resolve_world("gpt-2") == "gpt2"
    monkeypatch.setenv(worlds.ENV_VAR, "tiny")
    assert worlds.resolve_world() == "tiny"
    assert worlds.is_tiny()
    assert worlds.resolve_world("gpt2") == "gpt2", "an explicit argument beats the environment"
    monkeypatch.setenv(worlds.ENV_VAR, " gpt2 ")
    assert worlds.resolve_world() == "gpt2"
    assert not worlds.is_tiny()


def test_unknown_world_is_rejected_with_a_clear_message(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown world 'gpt3'.*'tiny', 'gpt2'"):
        worlds.resolve_world("gpt3")
    monkeypatch.setenv(worlds.ENV_VAR, "huge")
    with pytest.raises(ValueError, match=r"RLHF_TUTORIAL_WORLD"):
        worlds.resolve_world()
    with pytest.raises(ValueError, match="unknown world"):
        worlds.load_policy("nope")


def test_automatic_choice_without_gpt2_is_tiny_and_says_so(monkeypatch, capsys):
    no_gpt2_here(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert worlds.resolve_world() == "tiny"
    out = capsys.readouterr().out
    assert "'tiny' world" in out and "RLHF_TUTORIAL_WORLD" in out
    assert worlds.resolve_world() == "tiny"
    assert capsys.readouterr().out == "", "the choice is printed once"


def test_is_tiny_is_silent_and_the_choice_is_announced_when_a_model_is_loaded(monkeypatch, capsys):
    no_gpt2_here(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert worlds.is_tiny()  # chapter 01 sizes its CartPole run with it: nothing to say there
    assert capsys.readouterr().out == ""
    worlds.load_sentiment_classifier()
    captured = capsys.readouterr()
    assert "'tiny' world" in captured.out
    assert "Loading weights" not in captured.err + captured.out, "transformers' loading bar is hidden"


def test_automatic_choice_with_gpt2_cached_is_gpt2(monkeypatch, capsys):
    monkeypatch.setattr(worlds, "_is_cached", lambda repo_id: True)
    assert worlds.resolve_world() == "gpt2"
    assert "'gpt2' world" in capsys.readouterr().out


def test_automatic_choice_offline_does_not_touch_the_network(monkeypatch):
    monkeypatch.setattr(worlds, "_is_cached", lambda repo_id: False)

    def boom(timeout=worlds.HUB_TIMEOUT_S):
        raise AssertionError("HF_HUB_OFFLINE is set: no connection attempt")

    monkeypatch.setattr(worlds, "_hub_reachable", boom)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert worlds.resolve_world() == "tiny"


@pytest.mark.parametrize("offline", [True, False])
@pytest.mark.parametrize("loader", ["load_policy", "load_sentiment_classifier", "load_tokenizer"])
def test_gpt2_without_network_fails_fast_with_a_pointer_to_tiny(monkeypatch, offline, loader):
    no_gpt2_here(monkeypatch)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(worlds.WorldUnavailable) as info:
        getattr(worlds, loader)("gpt2")
    message = str(info.value)
    assert "RLHF_TUTORIAL_WORLD=tiny" in message
    assert "load_policy('tiny')" in message
    assert ("HF_HUB_OFFLINE" in message) == offline
    assert isinstance(info.value, RuntimeError)


def test_hub_probe_gives_up_on_an_unresolvable_host(monkeypatch):
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # .invalid never resolves (RFC 6761)
    assert worlds._hub_reachable(timeout=1.0) is False


def _run_python(code: str, env_overrides: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    dropped = {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HF_ENDPOINT"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update({"HF_HOME": str(tmp_path / "hf-home"), "PYTHONUNBUFFERED": "1", **env_overrides})
    env.pop(worlds.ENV_VAR, None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    "env",
    [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "https://hub.invalid"}],
    ids=["HF_HUB_OFFLINE", "no-network"],
)
def test_gpt2_in_a_fresh_process_with_an_empty_cache_fails_with_help(tmp_path, env):
    """The real code path: an empty Hugging Face cache and either offline mode or a hub that cannot be
    reached. It must end in a WorldUnavailable that points at the tiny world, never hang."""
    code = (
        "from rlhf_tutorial.worlds import load_policy, WorldUnavailable\n"
        "try:\n    load_policy('gpt2', device='cpu')\n"
        "except WorldUnavailable as e:\n    print('UNAVAILABLE:', e)\n"
    )
    t0 = time.perf_counter()
    result = _run_python(code, env, tmp_path)
    elapsed = time.perf_counter() - t0
    assert result.returncode == 0, result.stderr
    assert "UNAVAILABLE:" in result.stdout and "RLHF_TUTORIAL_WORLD=tiny" in result.stdout
    print(f"load_policy('gpt2') gave up after {elapsed:.1f} s (process start included)")


def test_default_prompt():
    assert worlds.default_prompt() == "This movie was really"


def test_preference_pairs_loader(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    test = worlds.load_preference_pairs("tiny", "test")
    assert test and all({"prompt", "chosen", "rejected"} <= set(p) for p in test)
    assert worlds.load_preference_pairs("gpt2", "test") == test, "the gpt2 world shares the text pairs"
    with pytest.raises(ValueError, match="split"):
        worlds.load_preference_pairs("tiny", "validation")


def test_missing_tiny_artifacts_say_how_to_rebuild(monkeypatch, tmp_path):
    monkeypatch.setenv(worlds.TINY_DIR_ENV_VAR, str(tmp_path))
    with pytest.raises(worlds.WorldUnavailable, match="build-tiny"):
        worlds.load_policy("tiny")


def test_world_info_summary(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    summary = worlds.info_main(["--world", "tiny", "--samples", "16", "--new-tokens", "12", "--device", "cpu"])
    assert summary["world"] == "tiny"
    assert summary["classifier_id2label"] == {"0": "NEGATIVE", "1": "POSITIVE"}
    assert 0.0 <= summary["mean_positive_prob"] <= 1.0
    assert len(summary["samples"]) == 6
    assert all(s.startswith("This movie was really") for s in summary["samples"])
    assert summary["val_loss"] > 0 and summary["classifier_accuracy"] >= 0.95
    assert summary["load_seconds"] > 0
    import torch

    from rlhf_tutorial.buildinfo import NOT_RECORDED

    here = summary["build_info"]["this_machine"]
    assert here["torch_build"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert here["libraries"]["transformer-lens"] == "3.9.0" and here["torch_build"]["version"] == torch.__version__
    artifacts = summary["build_info"]["artifacts"]
    assert set(artifacts) == {"metadata.json", "tuned_neg/rlhf_config.json"}
    for record in artifacts.values():  # either what the builder recorded, or said to be unknown
        assert record.get("build_info") == NOT_RECORDED or record["torch_build"]["cpu_capability"]


def test_world_info_shows_what_a_builder_recorded(monkeypatch, tmp_path):
    """A tiny world whose metadata.json records build_info (what build-tiny now writes): world-info
    shows that record, not 'not recorded'."""
    import shutil

    from rlhf_tutorial.buildinfo import build_info

    shutil.copytree(worlds.tiny_dir(), tmp_path / "tiny")
    meta_path = tmp_path / "tiny" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["build_info"] = build_info()
    meta_path.write_text(json.dumps(meta))
    monkeypatch.setenv(worlds.TINY_DIR_ENV_VAR, str(tmp_path / "tiny"))
    assert worlds.artifact_build_info("tiny")["artifacts"]["metadata.json"] == meta["build_info"]


def test_cached_gpt2_without_network_reads_the_cache_only(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(worlds, "_is_cached", lambda repo_id: True)
    monkeypatch.setattr(worlds, "_hub_reachable", lambda timeout=worlds.HUB_TIMEOUT_S: False)
    with worlds._hub_access("gpt2", "the GPT-2 policy"):
        assert constants.HF_HUB_OFFLINE, "no download attempts (and their retries) without a hub"
    assert constants.HF_HUB_OFFLINE is False
    with pytest.raises(worlds.WorldUnavailable, match=r"OSError: not in the cache after all.*RLHF_TUTORIAL_WORLD=tiny"):
        with worlds._hub_access("gpt2", "the GPT-2 policy"):
            raise OSError("not in the cache after all")
    assert constants.HF_HUB_OFFLINE is False
