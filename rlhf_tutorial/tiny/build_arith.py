"""Build the tiny arithmetic world (chapter 07) from one seed: ``python -m rlhf_tutorial build-arith
[--seed 0] [--out DIR]``.

Steps (each seeded from ``--seed``, sub-seeds as in ``build-tiny``):

1. corpus     ``n_train`` pretraining texts ``prompt + solution`` written by fallible writers
              (:class:`rlhf_tutorial.tiny.arith.Writer`: slips in a step, badly formatted final lines,
              unworked one-sentence answers), difficulties 1 to 3, plus a validation set;
2. tokenizer  byte-level BPE with every digit a token of its own, ``<|endoftext|>`` as bos, eos, unk
              and pad -> ``tokenizer/``;
3. policy     a small GPT-2 (the tiny world's trainer, ``build.train_policy``) trained on
              ``BOS text EOS``, converted to a ``HookedTransformer`` -> ``policy/``;
4. measure    pass@1 and pass@k of the base model on fresh problems of the training difficulty and of
              the held-out ones (the chapter's starting point), at temperature 1;
5. ``metadata.json`` (those numbers, corpus statistics, seconds, how it was built) and ``manifest.json``
   (sha256 of every other file).

Load the result with :func:`rlhf_tutorial.worlds.load_reasoning_policy` (tiny world).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlhf_tutorial.buildinfo import build_info
from rlhf_tutorial.tiny import arith
from rlhf_tutorial.tiny.build import (
    policy_config,
    save_policy,
    start_build,
    sub_seed,
    train_bpe_tokenizer,
    train_policy,
    write_manifest,
)
from rlhf_tutorial.trainers.args import add_flags, arg, documented
from rlhf_tutorial.trainers.runtime import torch_threads

ARTIFACTS = Path(__file__).resolve().parent / "artifacts_arith"


@documented
@dataclass
class ArithBuildArgs:
    """Everything the arithmetic build depends on. Changing any value changes the artifacts."""

    seed: int = arg(0, "master seed; the corpus, validation and measurement sets derive from it")
    out: str = arg(str(ARTIFACTS), "output folder (its previous content is replaced; default: the package's artifacts_arith)")
    threads: int = arg(1, "torch CPU threads (the result can depend on it: matmul reductions are split per thread)")
    n_train: int = arg(30_000, "pretraining texts (problem + a fallible writer's solution)")
    n_val: int = arg(1_000, "held-out texts for the validation loss")
    step_error: float = arg(0.25, "writers: chance that a step goes wrong (carry, off by one or ten, swapped digits)")
    bad_format: float = arg(0.1, "writers: chance that the final line is not 'Answer: N'")
    no_working: float = arg(0.08, "writers: chance of a one-sentence answer with no working")
    bpe_vocab: int = arg(320, "byte-level BPE vocabulary cap (256 bytes + merges + <|endoftext|>); digits never merge")
    # policy (field names as build-tiny's, which trains it)
    n_layers: int = arg(2, "policy: transformer layers")
    d_model: int = arg(128, "policy: residual stream width")
    n_heads: int = arg(4, "policy: attention heads per layer")
    d_mlp: int = arg(512, "policy: MLP hidden width")
    n_ctx: int = arg(96, "policy: context length (positions)")
    policy_epochs: int = arg(2, "policy: passes over the corpus")
    policy_batch: int = arg(32, "policy: texts per optimizer step")
    policy_lr: float = arg(3e-3, "policy: peak AdamW learning rate (warm-up then cosine to 0.1x)")
    # measurement
    eval_problems: int = arg(64, "problems per difficulty for the base model's pass@k")
    eval_samples: int = arg(16, "samples per problem for the base model's pass@k")
    max_new_tokens: int = arg(48, "most tokens of a sampled solution")


def parse_args(argv: list[str]) -> ArithBuildArgs:
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial build-arith", description=__doc__.split("\n")[0])
    add_flags(p, ArithBuildArgs, from_preset=False)
    return ArithBuildArgs(**vars(p.parse_args(argv)))


def build(args: ArithBuildArgs) -> dict:
    """Run every step into ``args.out`` and return the summary (also in ``metadata.json``)."""
    with torch_threads(args.threads):
        return _build(args)


def _build(args: ArithBuildArgs) -> dict:
    from rlhf_tutorial.trainers.reasoning import evaluate
    from rlhf_tutorial.worlds import _load_tiny_policy

    out, seconds, lap = start_build(args.out)
    writer = arith.Writer(step_error=args.step_error, bad_format=args.bad_format, no_working=args.no_working)
    train_texts = arith.corpus(args.n_train, sub_seed(args.seed, "arith-train"), writer)
    val_texts = arith.corpus(args.n_val, sub_seed(args.seed, "arith-val"), writer)
    lap("corpus")

    bpe = train_bpe_tokenizer(train_texts, args.bpe_vocab, out / "tokenizer", split_digits=True)
    lap("tokenizer")

    policy, policy_stats = train_policy(args, bpe, train_texts, val_texts)
    config = {**policy_config(args, len(bpe)), "model_name": "tiny-arithmetic-gpt2"}
    save_policy(policy, config, out / "policy")
    lap("policy")

    model = _load_tiny_policy(out, "cpu")  # as the course loads it (LayerNorm folded)
    measured = {}
    for difficulty in (arith.TRAIN_DIFFICULTY, *arith.HELD_OUT_DIFFICULTIES):
        problems = arith.problems(args.eval_problems, sub_seed(args.seed, "arith-measure"), difficulty)
        result = evaluate(model, problems, args.eval_samples, args.max_new_tokens, seed=sub_seed(args.seed, "arith-sample"))
        measured[str(difficulty)] = {f"pass_at_{k}": round(v, 4) for k, v in result["pass_at_k"].items()}
    lap("measure")

    metadata = {
        "seed": args.seed,
        "build_args": {k: v for k, v in asdict(args).items() if k != "out"},
        "torch_version": torch.__version__,
        "build_info": build_info(),
        "corpus": {
            "n_train": len(train_texts),
            "difficulties": {str(k): v for k, v in arith.CORPUS_DIFFICULTIES.items()},
            "train_difficulty": arith.TRAIN_DIFFICULTY,
            "held_out_difficulties": list(arith.HELD_OUT_DIFFICULTIES),
            "example": train_texts[0],
        },
        "tokenizer": {"vocab_size": len(bpe)},
        "policy": {**policy_stats, "n_params": sum(p.numel() for p in policy.parameters())},
        "base_pass_at_k": measured,
        "seconds": seconds,
    }
    metadata["build_seconds"] = lap(None)
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, sort_keys=True) + "\n")
    manifest = write_manifest(out)
    return {
        "out": str(out),
        "seed": args.seed,
        "val_loss": round(policy_stats["val_loss"], 4),
        "base_pass_at_k": measured,
        "n_files": len(manifest),
        "size_bytes": (size := sum(p.stat().st_size for p in out.rglob("*") if p.is_file())),
        "size_mb": round(size / 1e6, 2),
        "build_seconds": metadata["build_seconds"],
        "seconds": seconds,
    }


def main(argv: list[str]) -> dict:
    """CLI entry point of ``build-arith``; returns the JSON summary."""
    return build(parse_args(argv))
