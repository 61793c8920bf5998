"""The offline tiny world: shipped artifacts, corpus, tokenizer, policy, classifier, preference pairs."""

from __future__ import annotations

import hashlib
import json
import random
import re

import pytest
import torch

from rlhf_tutorial import worlds
from rlhf_tutorial.tiny import build, corpus

ARTIFACTS = build.ARTIFACTS
EXPECTED_FILES = {
    "metadata.json",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
    "policy/config.json",
    "policy/model.safetensors",
    "classifier/config.json",
    "classifier/model.safetensors",
    "classifier/tokenizer.json",
    "classifier/tokenizer_config.json",
    "preferences/train.jsonl",
    "preferences/test.jsonl",
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Everything here must work with no network and the shipped artifacts."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(worlds.TINY_DIR_ENV_VAR, raising=False)


@pytest.fixture(scope="module")
def metadata() -> dict:
    return json.loads((ARTIFACTS / "metadata.json").read_text())


@pytest.fixture(scope="module")
def policy():
    return worlds.load_policy("tiny", device="cpu")


@pytest.fixture(scope="module")
def classifier():
    return worlds.load_sentiment_classifier("tiny", device="cpu")


def positive_probs(classifier, tokenizer, texts: list[str]) -> torch.Tensor:
    with torch.no_grad():
        enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        return classifier(**enc).logits.softmax(-1)[:, classifier.config.label2id["POSITIVE"]]


# --- artifacts ------------------------------------------------------------------------------------------------
def test_manifest_lists_every_file_with_its_sha256():
    manifest = json.loads((ARTIFACTS / "manifest.json").read_text())
    on_disk = {p.relative_to(ARTIFACTS).as_posix() for p in ARTIFACTS.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest) == on_disk
    assert EXPECTED_FILES <= on_disk
    for name, digest in manifest.items():
        assert hashlib.sha256((ARTIFACTS / name).read_bytes()).hexdigest() == digest, f"{name} changed"


def test_weights_are_float32_safetensors():
    from safetensors import safe_open

    for name in ("policy/model.safetensors", "classifier/model.safetensors"):
        with safe_open(str(ARTIFACTS / name), framework="pt") as f:
            dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert dtypes == {"F32"}, (name, dtypes)
    total = sum(p.stat().st_size for p in ARTIFACTS.rglob("*") if p.is_file())
    assert total < 10 * 2**20, f"artifacts take {total / 2**20:.1f} MiB"


def test_metadata_reports_the_build(metadata):
    assert metadata["classifier"]["accuracy"] >= 0.95
    assert metadata["classifier"]["accuracy_negation"] >= 0.95
    assert 0 < metadata["policy"]["val_loss"] < 2.0
    assert metadata["build_seconds"] > 0
    assert metadata["preference_rule"] == corpus.PREFERENCE_RULE


def test_shipped_artifacts_match_the_corpus_code(metadata):
    """Editing corpus.py without rebuilding would leave stale artifacts: the training corpus the build
    saw must be what the code generates now from the recorded seed."""
    args = metadata["build_args"]
    reviews = corpus.ReviewGenerator(build.sub_seed(args["seed"], "train")).reviews(args["n_train_reviews"])
    stats = metadata["corpus"]
    assert sum(r.label for r in reviews) / len(reviews) == stats["positive_fraction"]
    assert len(corpus.vocabulary(reviews)) == stats["distinct_words"]
    pairs = corpus.preference_pairs(args["n_pairs_test"], build.sub_seed(args["seed"], "pairs-test"))
    assert pairs == worlds.load_preference_pairs("tiny", "test")


# --- corpus ---------------------------------------------------------------------------------------------------
def test_corpus_is_deterministic():
    a = [r.text for r in corpus.generate_reviews(200, seed=3)]
    b = [r.text for r in corpus.generate_reviews(200, seed=3)]
    c = [r.text for r in corpus.generate_reviews(200, seed=4)]
    assert a == b
    assert a != c


def test_corpus_statistics():
    reviews = corpus.generate_reviews(3000, seed=11)
    positive = sum(r.label for r in reviews) / len(reviews)
    assert 0.66 <= positive <= 0.74
    assert all(abs(r.score) >= corpus.MIN_MARGIN for r in reviews)
    assert all(r.label == int(r.score > 0) for r in reviews)
    assert len(corpus.vocabulary(reviews)) >= 400
    openers = sum(r.text.startswith(worlds.PROMPT) for r in reviews) / len(reviews)
    assert openers >= 0.4
    mixed = sum(len({sc > 0 for _, sc in r.marks}) == 2 for r in reviews) / len(reviews)
    assert mixed >= 0.3, "reviews should often mix praise and criticism"
    assert 0.2 <= sum(r.has_negation for r in reviews) / len(reviews) <= 0.8
    for r in reviews[:200]:
        assert corpus.prefix_score(r, len(r.text)) == r.score
        assert corpus.prefix_score(r, 0) == 0


def test_negation_flips_the_adjective():
    polarity = {w: s for s, words in corpus.ADJECTIVES.items() for w, _ in words}
    pattern = re.compile(r"^The [a-z ]+ (?:was|were) (not|never|hardly) ([a-z-]+)\.$")
    seen = 0
    for review in corpus.generate_reviews(1500, seed=5):
        for s in review.sentences:
            m = pattern.match(s.text)
            if m and m.group(2) in polarity:
                assert s.score == -polarity[m.group(2)], s.text
                assert s.negation
                seen += 1
    assert seen >= 20
    # "not bad" is mildly positive, "not good" mildly negative
    assert polarity["bad"] == -1 and polarity["good"] == 1


# --- tokenizer ------------------------------------------------------------------------------------------------
def test_tokenizer_round_trip():
    tok = worlds.load_tokenizer("tiny")
    assert 1000 <= len(tok) <= 2048
    assert tok.bos_token == tok.eos_token == tok.pad_token == tok.unk_token == "<|endoftext|>"
    texts = [r.text for r in corpus.generate_reviews(100, seed=8)] + ["Ünïcode 😀 and\ttabs, 12345!"]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text
    review_ids = tok(texts[:100])["input_ids"]
    assert max(len(ids) for ids in review_ids) <= 126, "a review with BOS and EOS must fit in n_ctx=128"
    assert sum(map(len, review_ids)) / sum(len(t) for t in texts[:100]) < 0.3, "BPE should merge most words"


# --- policy ---------------------------------------------------------------------------------------------------
def test_policy_prepends_bos_and_generates(policy):
    tokens = policy.to_tokens(worlds.default_prompt())
    assert tokens[0, 0].item() == policy.tokenizer.bos_token_id
    assert policy.to_string(tokens[0, 1:]) == "This movie was really"
    assert policy.cfg.n_ctx == 128 and policy.cfg.act_fn == "gelu_new" and policy.cfg.normalization_type == "LNPre"
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    torch.manual_seed(0)
    out = policy.generate(worlds.default_prompt(), max_new_tokens=10, verbose=False)
    assert out.startswith("This movie was really")


def test_policy_is_processed_like_gpt2_so_the_unembedding_reads_hook_normalized(policy):
    tokens = policy.to_tokens(worlds.default_prompt())
    logits, cache = policy.run_with_cache(tokens)
    rebuilt = cache["ln_final.hook_normalized"] @ policy.W_U + policy.b_U
    torch.testing.assert_close(rebuilt, logits, atol=1e-4, rtol=1e-4)


def test_policy_samples_read_as_reviews_and_lean_positive(policy, classifier):
    torch.manual_seed(0)
    tokens = policy.to_tokens(worlds.default_prompt()).repeat(64, 1)
    with torch.no_grad():
        out = policy.generate(tokens, max_new_tokens=20, verbose=False)
    texts = policy.tokenizer.batch_decode(out, skip_special_tokens=True)
    assert all(t.startswith("This movie was really") for t in texts)
    # almost every complete word is a corpus word
    vocab = corpus.vocabulary(corpus.generate_reviews(3000, seed=1))
    words = [w.strip(".,!").lower() for t in texts for w in t.split()[:-1]]
    assert sum(w in vocab for w in words) / len(words) >= 0.97
    assert sum("." in t[len("This movie was really") :] for t in texts) >= 48, "samples should finish sentences"
    mean_positive = positive_probs(*classifier, texts).mean().item()
    assert 0.55 <= mean_positive <= 0.85, mean_positive


# --- classifier -----------------------------------------------------------------------------------------------
def test_classifier_interface(classifier):
    model, tok = classifier
    assert model.config.id2label == {0: "NEGATIVE", 1: "POSITIVE"}
    assert model.config.label2id == {"NEGATIVE": 0, "POSITIVE": 1}
    assert tok.model_input_names == ["input_ids", "attention_mask"]
    enc = tok(["This movie was really awful.", "A real treat."], padding=True, truncation=True, return_tensors="pt")
    assert set(enc) == {"input_ids", "attention_mask"}
    logits = model(**enc).logits
    assert logits.shape == (2, 2) and logits.dtype == torch.float32
    assert not model.training


def test_classifier_accuracy_on_fresh_reviews(classifier):
    reviews = corpus.ReviewGenerator(seed=2024).reviews(1000)
    probs = positive_probs(*classifier, [r.text for r in reviews])
    correct = (probs > 0.5) == torch.tensor([r.label == 1 for r in reviews])
    negation = torch.tensor([r.has_negation for r in reviews])
    assert correct.float().mean().item() >= 0.95
    assert negation.sum() >= 200
    assert correct[negation].float().mean().item() >= 0.95
    flips = {"The acting was not bad.": 1, "The acting was not good.": 0}
    probs = positive_probs(*classifier, list(flips))
    assert [int(p > 0.5) for p in probs] == list(flips.values())


def test_classifier_scores_short_prefixes(classifier):
    reviews = corpus.ReviewGenerator(seed=77).reviews(500)
    whole = {r.text for r in reviews}
    prefixes = [ex for ex in build.classifier_examples(reviews, random.Random(0)) if ex[0] not in whole]
    assert len(prefixes) >= 400
    probs = positive_probs(*classifier, [t for t, _ in prefixes])
    accuracy = ((probs > 0.5).long() == torch.tensor([y for _, y in prefixes])).float().mean().item()
    assert accuracy >= 0.9


# --- preference pairs -----------------------------------------------------------------------------------------
def test_preference_pairs_follow_the_documented_rule(metadata):
    for split in ("train", "test"):
        pairs = worlds.load_preference_pairs("tiny", split)
        assert len(pairs) == metadata["preferences"][split]["n"]
        assert len(pairs) >= (2000 if split == "train" else 300)
        for p in pairs:
            assert {"prompt", "chosen", "rejected"} <= set(p)
            assert p["chosen"] != p["rejected"]
            rep_c, rep_r = corpus.ngram_repetition(p["chosen"]), corpus.ngram_repetition(p["rejected"])
            if p["kind"] == "repetition":
                assert rep_c <= corpus.FLUENT_MAX_REPETITION < corpus.DEGENERATE_MIN_REPETITION <= rep_r
            else:
                assert max(rep_c, rep_r) <= corpus.FLUENT_MAX_REPETITION
                assert p["chosen_score"] - p["rejected_score"] >= corpus.MIN_PAIR_GAP
        stats = corpus.pair_statistics(pairs)
        # neither cue alone explains the preferences
        assert stats["accuracy_of_sentiment_alone"] < 0.8
        assert stats["accuracy_of_repetition_alone"] < 0.8


@pytest.mark.slow
def test_build_is_deterministic(tmp_path):
    """Two builds from the same seed (here a miniature one) write byte-identical files; only
    metadata.json (which records the seconds taken) may differ."""
    small = dict(n_train_reviews=200, n_val_reviews=20, n_eval_reviews=40, policy_epochs=1, clf_epochs=1,
                 n_pairs_train=20, n_pairs_test=10)
    manifests = []
    for name in ("a", "b"):
        summary = build.build(build.BuildArgs(out=str(tmp_path / name), **small))
        assert summary["n_files"] == len(EXPECTED_FILES)
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        manifest.pop("metadata.json")
        info = json.loads((tmp_path / name / "metadata.json").read_text())["build_info"]  # how it was built
        assert info["torch_build"]["threads"] == 1 and info["libraries"]["torch"] and info["cpu"]
        manifests.append(manifest)
    assert manifests[0] == manifests[1]
