"""Build the tiny calculator world (chapter 09) from one seed: ``python -m rlhf_tutorial build-calc
[--seed 0] [--out DIR]``.

Steps (each seeded from ``--seed``, sub-seeds as in ``build-tiny``):

1. corpus     ``n_train`` pretraining texts ``prompt + solution`` by the writers of
              :class:`rlhf_tutorial.tiny.calc.CalcWriter` (a few solutions call the calculator, the
              others are worked in the head, more often wrong the harder the problem), plus a
              validation set;
2. tokenizer  byte-level BPE with every digit a token of its own, ``<|endoftext|>`` as bos, eos, unk
              and pad -> ``tokenizer/``;
3. policy     a small GPT-2 (the tiny world's trainer, ``build.train_policy``, chapter 07's shape)
              trained on ``BOS text EOS``, converted to a ``HookedTransformer`` -> ``policy/``;
4. measure    per difficulty, the base model's accuracy and calls per problem with the calculator in
              the loop (``trainers.agent.evaluate``), at temperature 1;
5. ``metadata.json`` (those numbers, corpus statistics, seconds, how it was built) and ``manifest.json``
   (sha256 of every other file).

Load the result with :func:`rlhf_tutorial.worlds.load_agent_policy` (tiny world).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlhf_tutorial.buildinfo import build_info
from rlhf_tutorial.tiny import calc
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

ARTIFACTS = Path(__file__).resolve().parent / "artifacts_calc"


@documented
@dataclass
class CalcBuildArgs:
    """Everything the calculator world's build depends on. Changing any value changes the artifacts."""

    seed: int = arg(0, "master seed; the corpus, validation and measurement sets derive from it")
    out: str = arg(str(ARTIFACTS), "output folder (its previous content is replaced; default: the package's artifacts_calc)")
    threads: int = arg(1, "torch CPU threads (the result can depend on it: matmul reductions are split per thread)")
    n_train: int = arg(30_000, "pretraining texts (problem + a writer's solution)")
    n_val: int = arg(1_000, "held-out texts for the validation loss")
    tool_rate: float = arg(0.2, "writers: chance that a solution calls the calculator (every difficulty)")
    head_error_easy: float = arg(0.05, "writers: chance that an easy problem worked in the head is wrong")
    head_error_medium: float = arg(0.3, "writers: the same for a medium problem")
    head_error_hard: float = arg(0.75, "writers: the same for a hard problem")
    bpe_vocab: int = arg(320, "byte-level BPE vocabulary cap (256 bytes + merges + <|endoftext|>); digits never merge")
    # policy (field names as build-tiny's, which trains it; chapter 07's shape)
    n_layers: int = arg(2, "policy: transformer layers")
    d_model: int = arg(128, "policy: residual stream width")
    n_heads: int = arg(4, "policy: attention heads per layer")
    d_mlp: int = arg(512, "policy: MLP hidden width")
    n_ctx: int = arg(64, "policy: context length (positions)")
    policy_epochs: int = arg(5, "policy: passes over the corpus (2 leave the copy of a 4-digit result into the answer "
                             "line unreliable: right about one time in three; see tiny.calc)")
    policy_batch: int = arg(32, "policy: texts per optimizer step")
    policy_lr: float = arg(3e-3, "policy: peak AdamW learning rate (warm-up then cosine to 0.1x)")
    # measurement
    eval_problems: int = arg(64, "problems per difficulty for the base model's measurement")
    eval_samples: int = arg(4, "trajectories per problem for the base model's measurement")

    def writer(self) -> calc.CalcWriter:
        return calc.CalcWriter(tool_rate=self.tool_rate, head_error={
            "easy": self.head_error_easy, "medium": self.head_error_medium, "hard": self.head_error_hard})


def parse_args(argv: list[str]) -> CalcBuildArgs:
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial build-calc", description=__doc__.split("\n")[0])
    add_flags(p, CalcBuildArgs, from_preset=False)
    return CalcBuildArgs(**vars(p.parse_args(argv)))


def build(args: CalcBuildArgs) -> dict:
    """Run every step into ``args.out`` and return the summary (also in ``metadata.json``)."""
    with torch_threads(args.threads):
        return _build(args)


def measure(model, seed: int, eval_problems: int, eval_samples: int) -> dict[str, dict[str, float]]:
    """Per difficulty: the accuracy and calls per problem of ``model`` with the calculator in the loop."""
    from rlhf_tutorial.trainers.agent import AgentArgs, evaluate

    args = AgentArgs(world="tiny", seed=seed, eval_problems=eval_problems, eval_samples=eval_samples)
    result = evaluate(model, args)
    return {d: {k: round(v, 4) for k, v in r.items() if k in ("accuracy", "calls_per_problem", "call_rate")}
            for d, r in result.items()}


def _build(args: CalcBuildArgs) -> dict:
    from rlhf_tutorial.worlds import _load_tiny_policy

    out, seconds, lap = start_build(args.out)
    writer = args.writer()
    train_texts = calc.corpus(args.n_train, sub_seed(args.seed, "calc-train"), writer)
    val_texts = calc.corpus(args.n_val, sub_seed(args.seed, "calc-val"), writer)
    lap("corpus")

    bpe = train_bpe_tokenizer(train_texts, args.bpe_vocab, out / "tokenizer", split_digits=True)
    lap("tokenizer")

    policy, policy_stats = train_policy(args, bpe, train_texts, val_texts)
    config = {**policy_config(args, len(bpe)), "model_name": "tiny-calculator-gpt2"}
    save_policy(policy, config, out / "policy")
    lap("policy")

    model = _load_tiny_policy(out, "cpu")  # as the course loads it (LayerNorm folded)
    measured = measure(model, sub_seed(args.seed, "calc-measure") % 10_000, args.eval_problems, args.eval_samples)
    lap("measure")

    metadata = {
        "seed": args.seed,
        "build_args": {k: v for k, v in asdict(args).items() if k != "out"},
        "torch_version": torch.__version__,
        "build_info": build_info(),
        "corpus": {
            "n_train": len(train_texts),
            "difficulties": dict(calc.CORPUS_DIFFICULTIES),
            "tool_solutions": round(sum(calc.CALL_OPEN in t for t in train_texts) / len(train_texts), 4),
            "example": train_texts[0],
        },
        "tokenizer": {"vocab_size": len(bpe)},
        "policy": {**policy_stats, "n_params": sum(p.numel() for p in policy.parameters())},
        "base_with_tool": measured,
        "seconds": seconds,
    }
    metadata["build_seconds"] = lap(None)
    (out / "metadata.json").write_text(json.dumps(metadata, indent=1, sort_keys=True) + "\n")
    manifest = write_manifest(out)
    return {
        "out": str(out),
        "seed": args.seed,
        "val_loss": round(policy_stats["val_loss"], 4),
        "base_with_tool": measured,
        "n_files": len(manifest),
        # the built files' digests (metadata.json's changes with the timings): the shipped manifest's on the
        # shipping machine's kernels, which tests/test_agent_world.py compares with the recorded rebuild
        "sha256": {name: digest for name, digest in manifest.items() if name != "metadata.json"},
        "size_bytes": (size := sum(p.stat().st_size for p in out.rglob("*") if p.is_file())),
        "size_mb": round(size / 1e6, 2),
        "build_seconds": metadata["build_seconds"],
        "seconds": seconds,
    }


def main(argv: list[str]) -> dict:
    """CLI entry point of ``build-calc``; returns the JSON summary."""
    return build(parse_args(argv))
