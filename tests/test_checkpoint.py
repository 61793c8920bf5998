"""A saved tuned policy records the stand-in GPT-2 it was trained on, and is reused only with that one.

The stand-in hub's ``gpt2`` carries GPT-2's real BPE (50,257 tokens) or, without its files, a BPE trained
on the tiny corpus (about 1,800 tokens); its ``STAND_IN.json`` says which. A run trained on one means
nothing under the other: chapter 05 retrains (``interp_report.reuse_or_train_tuned``) and
``load_tuned_policy`` refuses, with a message that says why. Here the cache's marker is faked
(``worlds._stand_in_marker``), so no hub is built and nothing heavy is trained.
"""

from __future__ import annotations

import json

import pytest

from rlhf_tutorial import worlds
from rlhf_tutorial.trainers import checkpoint, interp_report
from rlhf_tutorial.trainers.checkpoint import CONFIG_FILE, WEIGHTS_FILE, stand_in_mismatch

REAL = {"stand_in": True, "repo": "gpt2", "tokenizer": "real", "stand_in_size": {"vocab_size": 50257, "n_embd": 64}}
TRAINED = {"stand_in": True, "repo": "gpt2", "tokenizer": "trained", "stand_in_size": {"vocab_size": 1758, "n_embd": 64}}
OLD_CACHE = {"stand_in": True, "repo": "gpt2", "stand_in_size": {"vocab_size": 1758}}  # before markers named it


@pytest.fixture
def cache(monkeypatch):
    """``cache(marker)``: this machine's gpt2 is the stand-in ``marker`` describes (None: the real GPT-2)."""
    monkeypatch.delenv(worlds.GPT2_MODEL_ENV_VAR, raising=False)

    def set_marker(marker):
        monkeypatch.setattr(worlds, "_stand_in_marker", lambda repo: marker if repo == "gpt2" else None)

    return set_marker


def small_policy(d_vocab: int = 30):
    """A small random policy on the CPU (these tests only save and load it)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    return HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=16, d_head=4, n_heads=4,
                                                     d_vocab=d_vocab, act_fn="gelu", device="cpu", seed=0))


def saved_run(folder, world="gpt2", **record):
    """A run folder as ``save_tuned_policy`` writes it (the weights file a placeholder)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WEIGHTS_FILE).write_bytes(b"not read")
    (folder / CONFIG_FILE).write_text(json.dumps({"world": world, "args": {}, **record}))
    return folder


def test_the_record_names_tokenizer_and_vocabulary(cache):
    cache(REAL)
    assert worlds.policy_stand_in("gpt2") == {"repo": "gpt2", "tokenizer": "real", "vocab_size": 50257}
    cache(OLD_CACHE)
    assert worlds.policy_stand_in("gpt2") == {"repo": "gpt2", "tokenizer": "unrecorded", "vocab_size": 1758}
    cache(None)
    assert worlds.policy_stand_in("gpt2") is None
    assert worlds.policy_stand_in("tiny") is None


def test_save_records_the_stand_in_it_was_trained_on(cache, tmp_path):
    from rlhf_tutorial.rlhf import TransformerWithValueHead
    from rlhf_tutorial.trainers.rlhf import RLHFArgs

    cache(TRAINED)
    model = TransformerWithValueHead(small_policy())
    folder = checkpoint.save_tuned_policy(model, tmp_path / "run", RLHFArgs(world="gpt2"))
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert config["stand_in"] == {"repo": "gpt2", "tokenizer": "trained", "vocab_size": 1758}
    assert stand_in_mismatch(folder) is None
    cache(REAL)
    problem = stand_in_mismatch(folder)
    assert "the BPE trained on the tiny corpus (1758 tokens)" in problem and "GPT-2's real BPE (50257 tokens)" in problem
    tiny = checkpoint.save_tuned_policy(model, tmp_path / "tiny", RLHFArgs(world="tiny"))
    assert json.loads((tiny / CONFIG_FILE).read_text())["stand_in"] is None and stand_in_mismatch(tiny) is None


@pytest.mark.parametrize("recorded, current, reusable", [
    ({"stand_in": {"repo": "gpt2", "tokenizer": "trained", "vocab_size": 1758}}, TRAINED, True),
    ({"stand_in": {"repo": "gpt2", "tokenizer": "trained", "vocab_size": 1758}}, REAL, False),
    ({"stand_in": {"repo": "gpt2", "tokenizer": "real", "vocab_size": 50257}}, TRAINED, False),
    ({"stand_in": {"repo": "gpt2", "tokenizer": "trained", "vocab_size": 2048}}, TRAINED, False),  # same kind, other size
    ({"stand_in": {"repo": "gpt2", "tokenizer": "real", "vocab_size": 50257}}, None, False),  # stand-in run, real GPT-2
    ({"stand_in": None}, REAL, False),  # a real GPT-2 run, a stand-in cache
    ({"stand_in": None}, None, True),
    ({}, TRAINED, False),  # saved before runs recorded it: cannot be vouched for on a stand-in
    ({}, None, True),
], ids=["same", "trained-then-real", "real-then-trained", "other-vocab", "stand-in-then-real", "real-then-stand-in",
        "real-real", "unrecorded-stand-in", "unrecorded-real"])
def test_chapter_05_reuses_a_run_only_on_its_own_stand_in(cache, tmp_path, monkeypatch, capsys, recorded, current,
                                                          reusable):
    cache(current)
    folder = saved_run(tmp_path / "tuned_gpt2_neg_smoke", **recorded)
    trained = []
    monkeypatch.setattr(interp_report, "train_tuned", lambda world, out, smoke=False, **kw: trained.append((world, out, smoke)))
    assert interp_report.reuse_or_train_tuned("gpt2", folder, smoke=True) == folder
    out = capsys.readouterr().out
    if reusable:
        assert trained == [] and out == ""
    else:
        assert trained == [("gpt2", folder, True)]
        assert "not reusing it" in out and str(folder) in out


def test_chapter_05_trains_when_there_is_no_run(cache, tmp_path, monkeypatch):
    cache(TRAINED)
    trained = []
    monkeypatch.setattr(interp_report, "train_tuned", lambda world, out, smoke=False, **kw: trained.append(out))
    interp_report.reuse_or_train_tuned("gpt2", tmp_path / "none", smoke=True)
    assert trained == [tmp_path / "none"]


def test_loading_a_run_of_another_stand_in_is_refused_with_what_to_do(cache, tmp_path, monkeypatch):
    cache(REAL)
    folder = saved_run(tmp_path / "run", stand_in={"repo": "gpt2", "tokenizer": "trained", "vocab_size": 1758})
    loaded = []
    monkeypatch.setattr(worlds, "load_policy", lambda *a, **k: loaded.append(a))
    with pytest.raises(worlds.WorldUnavailable) as err:
        checkpoint.load_tuned_policy(folder)
    message = str(err.value)
    assert "trained on the stand-in gpt2 with the BPE trained on the tiny corpus (1758 tokens)" in message
    assert "GPT-2's real BPE (50257 tokens)" in message and "train-rlhf --world gpt2 --save" in message
    assert loaded == []  # refused before any model is built


def test_weights_that_do_not_fit_get_a_message_not_a_state_dict_traceback(cache, tmp_path, monkeypatch):
    """A run saved before runs recorded their stand-in, whose vocabulary differs from the cache's: the
    shapes do not fit, and the message says so (and why it may be)."""
    from safetensors.torch import save_model

    from rlhf_tutorial.rlhf import TransformerWithValueHead

    cache(REAL)
    folder = saved_run(tmp_path / "old")
    save_model(TransformerWithValueHead(small_policy(d_vocab=30)), str(folder / WEIGHTS_FILE))
    monkeypatch.setattr(worlds, "load_policy", lambda *a, **k: small_policy(d_vocab=37))
    with pytest.raises(worlds.WorldUnavailable, match="do not fit the gpt2 world's policy here") as err:
        checkpoint.load_tuned_policy(folder)
    assert "does not record which GPT-2 it was trained on" in str(err.value)
    # weights that fit, unrecorded: loaded as asked (nothing tells them apart), though chapter 05 retrains
    monkeypatch.setattr(worlds, "load_policy", lambda *a, **k: small_policy(d_vocab=30))
    assert checkpoint.load_tuned_policy(folder).base_model.cfg.d_vocab == 30
