"""Build the offline tiny world from one seed: ``python -m rlhf_tutorial build-tiny [--seed 0] [--out DIR]``.

Steps (each seeded from ``--seed``; on one machine with the same thread count the weights are
byte-identical from run to run, see ``manifest.json``):

1. corpus      ``ReviewGenerator(seed)`` reviews (:mod:`rlhf_tutorial.tiny.corpus`), plus a validation set
               from another seed;
2. tokenizer   byte-level BPE (the GPT-2 scheme) trained on the corpus, ``<|endoftext|>`` as bos, eos, unk
               and pad, saved in Hugging Face format -> ``tokenizer/``;
3. policy      a 2-layer GPT-2 (LayerNorm, gelu_new, learned positions) trained on ``BOS review EOS``,
               converted to a TransformerLens ``HookedTransformer`` -> ``policy/``;
4. classifier  a tiny ``DistilBertForSequenceClassification`` with its own WordPiece tokenizer (as
               ``lvwerra/distilbert-imdb`` has its own), trained on whole reviews and on prefixes of
               reviews (the policy's samples are short) -> ``classifier/``;
5. preferences (prompt, chosen, rejected) pairs labelled by the rule in
               :func:`rlhf_tutorial.tiny.corpus.preference_pairs` -> ``preferences/{train,test}.jsonl``;
6. ``metadata.json`` (validation loss, accuracies, pair counts, seconds, and how it was built: library
   versions, torch build, CPU and kernel level, :func:`rlhf_tutorial.buildinfo.build_info`) and ``manifest.json``
   (sha256 of every other file).

The policy is trained as a Hugging Face ``GPT2LMHeadModel`` (its fused attention is about twice as fast on
a CPU as the hooked model's) and converted with TransformerLens's own GPT-2 weight conversion; the build
checks that both give the same logits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from rlhf_tutorial.buildinfo import build_info
from rlhf_tutorial.tiny import corpus
from rlhf_tutorial.trainers.args import add_flags, arg, documented
from rlhf_tutorial.trainers.runtime import torch_threads
from rlhf_tutorial.trainers.schedules import warmup_then_cosine

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
SPECIAL = "<|endoftext|>"
LABELS = {0: "NEGATIVE", 1: "POSITIVE"}


@documented
@dataclass
class BuildArgs:
    """Everything the build depends on. Changing any value changes the artifacts."""

    seed: int = arg(0, "master seed; sub-seeds for the corpus, validation, held-out and pair sets derive from it")
    out: str = arg(str(ARTIFACTS), "output folder (its previous content is replaced; default: the package's artifacts)")
    threads: int = arg(1, "torch CPU threads (the result can depend on it: matmul reductions are split per thread)")
    n_train_reviews: int = arg(12_000, "reviews the policy and classifier learn from")
    n_val_reviews: int = arg(600, "held-out reviews for the policy's validation loss")
    n_eval_reviews: int = arg(2_000, "held-out reviews (fresh seed) for the classifier's accuracy")
    bpe_vocab: int = arg(2048, "byte-level BPE vocabulary cap (256 bytes + merges + <|endoftext|>; the corpus "
                         "runs out of merges a little below 2048, so nearly every corpus word is one token)")
    wordpiece_vocab: int = arg(1024, "classifier WordPiece vocabulary cap (the corpus needs about 700)")
    # policy
    n_layers: int = arg(2, "policy: transformer layers")
    d_model: int = arg(128, "policy: residual stream width")
    n_heads: int = arg(4, "policy: attention heads per layer")
    d_mlp: int = arg(512, "policy: MLP hidden width")
    n_ctx: int = arg(128, "policy: context length (positions)")
    policy_epochs: int = arg(2, "policy: passes over the training reviews")
    policy_batch: int = arg(32, "policy: reviews per optimizer step")
    policy_lr: float = arg(3e-3, "policy: peak AdamW learning rate (warm-up then cosine to 0.1x)")
    # classifier
    clf_dim: int = arg(64, "classifier: hidden size")
    clf_layers: int = arg(2, "classifier: transformer layers")
    clf_heads: int = arg(4, "classifier: attention heads per layer")
    clf_hidden: int = arg(256, "classifier: MLP hidden width")
    clf_epochs: int = arg(3, "classifier: passes over the training texts")
    clf_batch: int = arg(64, "classifier: texts per optimizer step")
    clf_lr: float = arg(2e-3, "classifier: peak AdamW learning rate (warm-up then cosine to 0.1x)")
    clf_sentences: bool = arg(True, "classifier: also train on single sentences (phrase meanings, negations)")
    # preference pairs
    n_pairs_train: int = arg(4_000, "preference pairs in the training split")
    n_pairs_test: int = arg(500, "preference pairs in the test split")


def sub_seed(seed: int, name: str) -> int:
    """A stable sub-seed per purpose (sha256 of ``"{seed}:{name}"``), so adding one never shifts another."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:4], "little")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(out: Path) -> dict[str, str]:
    """sha256 of every file under ``out`` except the manifest itself, keyed by the relative posix path."""
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    manifest = {p.relative_to(out).as_posix(): sha256(p) for p in files}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def train_step(loss: torch.Tensor, model: torch.nn.Module, opt, sched, bar) -> None:
    """One optimizer step of the builder's training loops: backward, clip the gradient norm to 1, step
    the optimizer and the schedule, clear the gradients; the loss goes to the progress bar."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    bar.update(1)
    bar.set_postfix(loss=f"{loss.item():.3f}")


def length_batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped into batches of similar length (little padding), batches in random order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def pad_right(seqs: list[list[int]], pad_id: int) -> tuple[Int[Tensor, "b s"], Int[Tensor, "b s"]]:
    """Right-pad token lists; returns (tokens, mask with 1 on real tokens)."""
    width = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return tokens, mask


# --- 2. tokenizer -----------------------------------------------------------------------------------------
def train_bpe_tokenizer(texts: list[str], vocab_size: int, folder: Path, split_digits: bool = False):
    """Byte-level BPE as GPT-2 uses, saved with ``save_pretrained`` and reloaded from the folder.

    Reloading matters: TransformerLens rebuilds a tokenizer from ``tokenizer.name_or_path``. With
    ``split_digits`` every digit is a token of its own (no merge crosses or joins digits), as the
    arithmetic world needs: a model computes digit by digit.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    hf = GPT2TokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL, unk_token=SPECIAL, pad_token=SPECIAL,
        model_max_length=1024,
    )
    hf.save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))


def train_wordpiece_tokenizer(texts: list[str], vocab_size: int, folder: Path):
    """A lower-casing WordPiece tokenizer in the BERT format, for the classifier.

    Vocabulary: the special tokens, every character seen (alone and as a ``##`` continuation, so no word
    is ever unknown), then the corpus's words by decreasing count (ties alphabetical) up to
    ``vocab_size``. Built by counting rather than with the ``tokenizers`` WordPiece trainer, whose
    choice among equally frequent pieces changes from run to run.
    """
    from transformers import AutoTokenizer, DistilBertTokenizerFast

    # the BERT pre-tokenizer's split (after lower-casing): runs of word characters, single punctuation
    counts = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    chars = sorted({c for w in counts for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    words = [w for w in sorted(counts, key=lambda w: (-counts[w], w)) if len(w) > 1]
    vocab += words[: max(0, vocab_size - len(vocab))]
    hf = DistilBertTokenizerFast(vocab={tok: i for i, tok in enumerate(vocab)}, do_lower_case=True, model_max_length=128)
    hf.save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))


# --- 3. policy --------------------------------------------------------------------------------------------
def policy_config(args: BuildArgs, d_vocab: int) -> dict:
    """The ``HookedTransformerConfig`` fields of the tiny policy (saved as ``policy/config.json``)."""
    return dict(
        model_name="tiny-reviews-gpt2",
        n_layers=args.n_layers,
        d_model=args.d_model,
        n_heads=args.n_heads,
        d_head=args.d_model // args.n_heads,
        d_mlp=args.d_mlp,
        n_ctx=args.n_ctx,
        d_vocab=d_vocab,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="standard",
        default_prepend_bos=True,
        original_architecture="GPT2LMHeadModel",
    )


def review_token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """``BOS review EOS`` token ids per review."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return [[bos, *ids, eos] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def lm_loss(logits: Float[Tensor, "b s v"], tokens: Int[Tensor, "b s"], mask: Int[Tensor, "b s"]) -> Tensor:
    """Mean next-token cross-entropy over real target tokens: -mean log p(x_{t+1} | x_{<=t})."""
    targets = tokens[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=-100)


@torch.no_grad()
def lm_eval_loss(model, seqs: list[list[int]], pad_id: int, batch: int = 64) -> float:
    """Token-weighted validation loss (nats per token) of a HF causal LM."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(seqs), batch):
        tokens, mask = pad_right(seqs[i : i + batch], pad_id)
        logits = model(tokens).logits
        n = int(mask[:, 1:].sum())
        total += float(lm_loss(logits, tokens, mask)) * n
        count += n
    model.train()
    return total / count


def train_policy(args: BuildArgs, tokenizer, train_texts: list[str], val_texts: list[str]):
    """Train a HF GPT-2 of the tiny shape on ``BOS review EOS`` and convert it to a HookedTransformer.

    Returns (hooked model, {"val_loss": ..., "train_tokens": ...}).
    """
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(sub_seed(args.seed, "policy-init"))
    hf_cfg = GPT2Config(
        vocab_size=len(tokenizer), n_positions=args.n_ctx, n_embd=args.d_model, n_layer=args.n_layers,
        n_head=args.n_heads, n_inner=args.d_mlp, activation_function="gelu_new", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(hf_cfg)
    model.train()
    train = review_token_ids(tokenizer, train_texts)
    val = review_token_ids(tokenizer, val_texts)
    assert max(len(s) for s in train + val) <= args.n_ctx, "a review does not fit in n_ctx"
    pad = tokenizer.pad_token_id
    rng = random.Random(sub_seed(args.seed, "policy-order"))
    lengths = [len(s) for s in train]
    steps_per_epoch = math.ceil(len(train) / args.policy_batch)
    total = steps_per_epoch * args.policy_epochs
    opt = torch.optim.AdamW(model.parameters(), lr=args.policy_lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_then_cosine(s, total, total // 20))
    bar = tqdm(total=total, desc="policy", leave=False)
    for _ in range(args.policy_epochs):
        for batch in length_batches(lengths, args.policy_batch, rng):
            tokens, mask = pad_right([train[i] for i in batch], pad)
            loss = lm_loss(model(tokens).logits, tokens, mask)
            train_step(loss, model, opt, sched, bar)
    bar.close()
    val_loss = lm_eval_loss(model, val, pad)

    # on the CPU, beside the GPT-2 it is converted from (the build runs on the CPU on every machine: the
    # config's default device would be a GPU where there is one)
    cfg = HookedTransformerConfig(**policy_config(args, len(tokenizer)), device="cpu")
    hooked = HookedTransformer(cfg, tokenizer=tokenizer)
    hooked.load_state_dict(convert_gpt2_weights(model, cfg), strict=False)
    hooked.eval()
    model.eval()
    with torch.no_grad():  # the conversion must not change the function
        tokens, _ = pad_right(val[:8], pad)
        diff = (hooked(tokens) - model(tokens).logits).abs().max().item()
    assert diff < 1e-3, f"HookedTransformer and GPT-2 logits differ by {diff}"
    return hooked, {"val_loss": val_loss, "train_tokens": sum(lengths) * args.policy_epochs}


def save_policy(model, config: dict, folder: Path) -> None:
    """``config.json`` (HookedTransformerConfig fields) + ``model.safetensors`` (float32 parameters)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    params = {k: v.detach().to(torch.float32).contiguous() for k, v in model.named_parameters()}
    save_file(params, str(folder / "model.safetensors"), metadata={"format": "pt"})


# --- 4. classifier ----------------------------------------------------------------------------------------
def classifier_examples(
    reviews: list[corpus.Review], rng: random.Random, sentences: bool = False
) -> list[tuple[str, int]]:
    """Each review whole, then one prefix cut at a random word boundary whose phrases give a non-zero
    score, then (with ``sentences``) one random sentence with a non-zero score.

    A prefix is labelled by the sign of :func:`corpus.prefix_score`, so short partial samples, like the
    policy's 20-token continuations, are scored by what they already say; single sentences teach what
    each phrase means ("not bad") with little else around it.
    """
    examples = []
    for r in reviews:
        if sentences:
            scored = [s for s in r.sentences if s.score != 0]
            if scored:
                s = rng.choice(scored)
                examples.append((s.text, int(s.score > 0)))
        examples.append((r.text, r.label))
        text = r.text
        cuts = [i for i, ch in enumerate(text) if ch == " "] + [len(text)]
        cuts = [c for c in cuts if corpus.prefix_score(r, c) != 0]
        if cuts:
            c = rng.choice(cuts[: max(1, len(cuts) // 2 + 1)]) if rng.random() < 0.5 else rng.choice(cuts)
            examples.append((text[:c], int(corpus.prefix_score(r, c) > 0)))
    return examples


@torch.no_grad()
def classifier_probs(model, tokenizer, texts: list[str], batch: int = 128) -> Float[Tensor, "n"]:
    """P(POSITIVE | text) for each text."""
    model.eval()
    out = []
    pos = model.config.label2id["POSITIVE"]
    for i in range(0, len(texts), batch):
        enc = tokenizer(texts[i : i + batch], padding=True, truncation=True, return_tensors="pt")
        out.append(model(**enc).logits.softmax(-1)[:, pos])
    return torch.cat(out)


def train_classifier(args: BuildArgs, tokenizer, reviews: list[corpus.Review]):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    torch.manual_seed(sub_seed(args.seed, "classifier-init"))
    cfg = DistilBertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=128, n_layers=args.clf_layers,
        n_heads=args.clf_heads, dim=args.clf_dim, hidden_dim=args.clf_hidden, dropout=0.0,
        attention_dropout=0.0, seq_classif_dropout=0.0, pad_token_id=tokenizer.pad_token_id,
        id2label=dict(LABELS), label2id={v: k for k, v in LABELS.items()},
    )
    model = DistilBertForSequenceClassification(cfg)
    model.train()
    rng = random.Random(sub_seed(args.seed, "classifier-data"))
    examples = classifier_examples(reviews, rng, sentences=args.clf_sentences)
    ids = tokenizer([t for t, _ in examples], truncation=True)["input_ids"]
    labels = torch.tensor([y for _, y in examples])
    lengths = [len(s) for s in ids]
    total = math.ceil(len(ids) / args.clf_batch) * args.clf_epochs
    opt = torch.optim.AdamW(model.parameters(), lr=args.clf_lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_then_cosine(s, total, total // 20))
    bar = tqdm(total=total, desc="classifier", leave=False)
    for _ in range(args.clf_epochs):
        for batch in length_batches(lengths, args.clf_batch, rng):
            tokens, mask = pad_right([ids[i] for i in batch], tokenizer.pad_token_id)
            loss = F.cross_entropy(model(input_ids=tokens, attention_mask=mask).logits, labels[batch])
            train_step(loss, model, opt, sched, bar)
    bar.close()
    model.eval()
    return model, {"train_examples": len(examples)}


def classifier_accuracy(model, tokenizer, reviews: list[corpus.Review], seed: int) -> dict:
    """Accuracy on whole held-out reviews, on those with a negation, and on labelled prefixes."""
    probs = classifier_probs(model, tokenizer, [r.text for r in reviews])
    pred = (probs > 0.5).long()
    labels = torch.tensor([r.label for r in reviews])
    neg = torch.tensor([r.has_negation for r in reviews])
    whole = {r.text for r in reviews}
    prefixes = [ex for ex in classifier_examples(reviews, random.Random(seed)) if ex[0] not in whole]
    prefix_pred = classifier_probs(model, tokenizer, [t for t, _ in prefixes]) > 0.5
    prefix_labels = torch.tensor([y for _, y in prefixes], dtype=torch.bool)
    return {
        "accuracy": (pred == labels).float().mean().item(),
        "accuracy_negation": (pred == labels)[neg].float().mean().item(),
        "n_negation": int(neg.sum()),
        "accuracy_prefixes": (prefix_pred == prefix_labels).float().mean().item(),
        "n": len(reviews),
    }


# --- 5. preference pairs ----------------------------------------------------------------------------------
def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


# --- main -------------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> BuildArgs:
    """``BuildArgs`` from the command line: one flag per field (the defaults build the shipped artifacts)."""
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial build-tiny", description=__doc__.split("\n")[0])
    add_flags(p, BuildArgs, from_preset=False)
    return BuildArgs(**vars(p.parse_args(argv)))


def build(args: BuildArgs) -> dict:
    """Run every step into ``args.out`` and return the summary (also in ``metadata.json``)."""
    with torch_threads(args.threads):
        return _build(args)


def start_build(out_dir: str) -> tuple[Path, dict[str, float], Callable[[str | None], float]]:
    """A build's preamble, shared by ``build-tiny`` and ``build-arith``: ``out_dir`` emptied (removed,
    then made again), and a stopwatch. Returns the folder, ``seconds`` (each step's seconds, by name) and
    ``lap(name)``, which records under ``name`` the seconds since the previous lap (or the start; no
    record for ``None``) and returns the seconds since the start."""
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    seconds: dict[str, float] = {}
    start = last = time.perf_counter()

    def lap(name: str | None) -> float:
        nonlocal last
        now = time.perf_counter()
        if name is not None:
            seconds[name] = round(now - last, 2)
        last = now
        return round(now - start, 2)

    return out, seconds, lap


def _build(args: BuildArgs) -> dict:
    out, seconds, lap = start_build(args.out)
    train_reviews = corpus.ReviewGenerator(sub_seed(args.seed, "train")).reviews(args.n_train_reviews)
    val_reviews = corpus.ReviewGenerator(sub_seed(args.seed, "val")).reviews(args.n_val_reviews)
    eval_reviews = corpus.ReviewGenerator(sub_seed(args.seed, "eval")).reviews(args.n_eval_reviews)
    texts = [r.text for r in train_reviews]
    lap("corpus")

    bpe = train_bpe_tokenizer(texts, args.bpe_vocab, out / "tokenizer")
    lap("tokenizer")

    policy, policy_stats = train_policy(args, bpe, texts, [r.text for r in val_reviews])
    save_policy(policy, policy_config(args, len(bpe)), out / "policy")
    lap("policy")

    wordpiece = train_wordpiece_tokenizer(texts, args.wordpiece_vocab, out / "classifier")
    classifier, clf_stats = train_classifier(args, wordpiece, train_reviews)
    classifier.save_pretrained(str(out / "classifier"), safe_serialization=True)
    clf_stats.update(classifier_accuracy(classifier, wordpiece, eval_reviews, sub_seed(args.seed, "eval-cut")))
    lap("classifier")

    pair_stats = {}
    for split, n in (("train", args.n_pairs_train), ("test", args.n_pairs_test)):
        pairs = corpus.preference_pairs(n, sub_seed(args.seed, f"pairs-{split}"))
        write_jsonl(pairs, out / "preferences" / f"{split}.jsonl")
        pair_stats[split] = corpus.pair_statistics(pairs)
    lap("preferences")

    metadata = {
        "seed": args.seed,
        "build_args": {k: v for k, v in asdict(args).items() if k != "out"},
        "torch_version": torch.__version__,
        "build_info": build_info(),
        "corpus": {
            "n_train_reviews": len(train_reviews),
            "positive_fraction": sum(r.label for r in train_reviews) / len(train_reviews),
            "negation_fraction": sum(r.has_negation for r in train_reviews) / len(train_reviews),
            "distinct_words": len(corpus.vocabulary(train_reviews)),
        },
        "tokenizer": {"vocab_size": len(bpe)},
        "policy": {**policy_stats, "n_params": sum(p.numel() for p in policy.parameters())},
        "classifier": clf_stats,
        "preferences": pair_stats,
        "preference_rule": corpus.PREFERENCE_RULE,
        "seconds": seconds,
    }
    metadata["build_seconds"] = lap(None)
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, sort_keys=True) + "\n")
    manifest = write_manifest(out)
    return {
        "out": str(out),
        "seed": args.seed,
        "val_loss": round(policy_stats["val_loss"], 4),
        "classifier_accuracy": round(clf_stats["accuracy"], 4),
        "classifier_accuracy_negation": round(clf_stats["accuracy_negation"], 4),
        "classifier_accuracy_prefixes": round(clf_stats["accuracy_prefixes"], 4),
        "pairs_train": pair_stats["train"]["n"],
        "pairs_test": pair_stats["test"]["n"],
        "n_files": len(manifest),
        "build_seconds": metadata["build_seconds"],
        "seconds": seconds,
    }


def main(argv: list[str]) -> dict:
    """CLI entry point of ``build-tiny``; returns the JSON summary."""
    return build(parse_args(argv))
