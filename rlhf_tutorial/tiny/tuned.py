"""The tiny world's tuned policy: chapter 03's RLHF run towards negative reviews, shipped for chapter 05.

``python -m rlhf_tutorial build-tuned --world tiny`` runs the reference ``RLHFTrainer`` with the tiny
preset (``RLHFArgs.preset("tiny", direction="neg", seed=0)``, one torch thread: the same seed gives the
same weights on CPU), evaluates it, and saves the policy with its value head (safetensors) to
``tiny/artifacts/tuned_neg/``, then rewrites the artifacts' ``manifest.json``. About 30-60 s on one
CPU thread. ``rlhf_config.json`` records the sha256 of the base policy it was tuned from: after
``build-tiny`` (which rebuilds the folder without it) run ``build-tuned`` again.

Chapter 05 loads it with :func:`tuned_dir` + ``trainers.rlhf.load_tuned_policy``, so it never depends on
another notebook having been run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

TUNED_NAME = "tuned_neg"


def tuned_dir() -> Path:
    """The shipped tuned checkpoint of the tiny world (``$RLHF_TUTORIAL_TINY_DIR`` is honoured)."""
    from rlhf_tutorial.worlds import WorldUnavailable, tiny_dir

    folder = tiny_dir() / TUNED_NAME
    if not (folder / "policy.safetensors").exists():
        raise WorldUnavailable(f"The tiny world's tuned policy is missing from {folder}. Rebuild it with "
                               "`python -m rlhf_tutorial build-tuned --world tiny` (about a minute).")
    return folder


def build(out: Path | None = None, seed: int = 0, progress: bool = True) -> dict:
    """Train the tiny policy towards negative sentiment with chapter 03's trainer and save it to ``out``
    (default: the package's artifacts, whose manifest is then rewritten). Returns a summary."""
    import torch

    from rlhf_tutorial.tiny.build import sha256, write_manifest
    from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer, save_tuned_policy
    from rlhf_tutorial.worlds import tiny_dir

    torch.set_num_threads(1)  # determinism and speed: the tiny matrices gain nothing from more threads
    start = time.perf_counter()
    args = RLHFArgs.preset("tiny", direction="neg", seed=seed)
    trainer = RLHFTrainer(args)
    before = trainer.evaluate(args.eval_samples, seed=seed + 1)
    history = trainer.train(progress=progress)
    after = trainer.evaluate(args.eval_samples, seed=seed + 1)
    base_dir = tiny_dir()
    folder = Path(out) if out is not None else base_dir / TUNED_NAME
    save_tuned_policy(
        trainer.model, folder, args,
        base_policy_sha256=sha256(base_dir / "policy" / "model.safetensors"),
        mean_reward_initial=round(before["reward"], 4), mean_reward_final=round(after["reward"], 4),
        kl_final=round(after["kl"], 4), phases=len(history),
    )
    if out is None:
        write_manifest(base_dir)
    return {
        "saved_to": str(folder),
        "seed": seed,
        "mean_reward_initial": round(before["reward"], 4),
        "mean_reward_final": round(after["reward"], 4),
        "kl_final": round(after["kl"], 4),
        "phases": len(history),
        "size_bytes": sum(p.stat().st_size for p in folder.iterdir()),
        "wall_seconds": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial build-tuned --world tiny [--seed 0] [--out DIR]``"""
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial build-tuned",
                                description="train and ship the tiny world's tuned policy (chapter 05 reads it)")
    p.add_argument("--world", default="tiny", choices=["tiny"], help="only the tiny world ships a tuned policy")
    p.add_argument("--seed", type=int, default=0, help="seed of the RLHF run (default 0: the shipped one)")
    p.add_argument("--out", default=None, help="write here instead of the package's artifacts")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ns = p.parse_args(argv)
    return build(Path(ns.out) if ns.out else None, ns.seed, progress=not ns.no_progress)
