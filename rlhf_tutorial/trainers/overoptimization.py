"""Reward over-optimisation as a curve (Gao, Schulman & Hilton 2022), in the tiny world.

A **proxy** reward model (chapter 02's Bradley-Terry ``RewardModel``, trained on a small number of the
world's preference pairs, so it is an imperfect copy of the rater) is optimised by chapter 03's PPO,
while a **gold** reward that the policy never sees is measured on the same samples: the world's
sentiment classifier's P(POSITIVE), the quantity the rater's preferences mostly follow (between two
fluent texts the rater prefers the more positive one; ``worlds.tiny_metadata()["preference_rule"]``).

Every phase records, on that phase's rollout (``batch_size`` samples):

    proxy   mean raw score of the reward model (what PPO climbs; the trainer whitens it)
    gold    mean P(POSITIVE) of the classifier (what we actually wanted)
    kl_seq  KL(policy || reference) in nats per sequence: the k1 estimate, the mean over the rollout of
            sum_t (log pi - log pi_ref), as the per-token rewards charge it (k3's mean is unbiased too,
            but a policy far from the reference gives it rare huge values: r = pi_ref / pi explodes at
            tokens the policy has made unlikely)

Plotted against sqrt(kl_seq) (Gao et al.'s x-axis, the "distance" from the initial policy), the proxy
keeps rising while the gold reward rises, peaks and falls: Goodhart's law with numbers. Both rewards
are noisy per phase (a mean over ``batch_size`` samples), so the summary also gives ``smooth``-phase
moving averages, and the peak is taken on those.

``python -m rlhf_tutorial overoptimization --world tiny --seed 0`` prints a JSON summary. Chapter 03's
exercises (the trainer, the reward model) are the package's reference versions here.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from rlhf_tutorial.trainers.args import add_flags, arg, documented


@documented
@dataclass
class OveroptimizationArgs:
    """The proxy reward model's training and the PPO run that optimises it (everything else: the
    world's ``RLHFArgs`` preset)."""

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds the reward model's training and the PPO run")
    rm_train_pairs: int = arg(1000, "preference pairs the proxy reward model is trained on (a quarter: an imperfect proxy)")
    rm_epochs: int = arg(1, "passes of the proxy reward model over its pairs")
    rm_test_pairs: int = arg(400, "held-out pairs to measure the proxy's accuracy on")
    num_phases: int = arg(50, "PPO phases against the proxy")
    batch_size: int = arg(64, "completions per phase (the gold and proxy means of a phase are over these)")
    kl_coef: float = arg(0.02, "beta of the PPO run, per token (small: little to stop the over-optimisation)")
    learning_rate: float = arg(7e-4, "learning rate of the transformer (the tiny preset's)")
    head_lr: float = arg(3e-3, "learning rate of the value head")
    smooth: int = arg(5, "phases in the moving average the summary's peak is taken on")


def moving_average(xs: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    return [sum(xs[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def run_overoptimization(args: OveroptimizationArgs, progress: bool = True) -> dict[str, Any]:
    """Train the proxy reward model, run PPO against it, and record proxy, gold and KL per phase."""
    from rlhf_tutorial.rewards import score_texts, sentiment_reward_fn
    from rlhf_tutorial.trainers.rewards import RewardModelArgs, train_reward_model
    from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer
    from rlhf_tutorial.worlds import load_preference_pairs, resolve_world

    world = resolve_world(args.world)
    start = time.perf_counter()
    rm_args = RewardModelArgs(
        world=world, seed=args.seed, epochs=args.rm_epochs, max_train_pairs=args.rm_train_pairs,
        max_test_pairs=args.rm_test_pairs, progress=progress, threads=None,
    )
    train_pairs = load_preference_pairs(world, "train")[: args.rm_train_pairs]
    test_pairs = load_preference_pairs(world, "test")[: args.rm_test_pairs]
    proxy_model, rm_history = train_reward_model(rm_args, train_pairs=train_pairs, test_pairs=test_pairs)
    proxy_model.eval().requires_grad_(False)
    rm_seconds = time.perf_counter() - start
    gold_fn = sentiment_reward_fn(world, "pos")

    log: list[dict[str, float]] = []
    recording = {"on": False}

    def proxy_fn(texts: list[str]) -> Float[Tensor, "batch"]:
        proxy = score_texts(proxy_model, texts)
        if recording["on"]:  # the rollout of a phase: measure the gold reward on the same texts
            log.append({"proxy": proxy.mean().item(), "gold": gold_fn(texts).float().mean().item()})
        return proxy

    ppo_args = RLHFArgs.preset(
        world, direction="pos", seed=args.seed, num_phases=args.num_phases, batch_size=args.batch_size,
        kl_coef=args.kl_coef, learning_rate=args.learning_rate, head_lr=args.head_lr, early_stopping=False,
    )
    trainer = RLHFTrainer(ppo_args, reward_fn=proxy_fn)
    recording["on"] = True
    history = trainer.train(progress=progress)
    recording["on"] = False
    wall = time.perf_counter() - start

    kl_seq = [r["kl_seq"] for r in history]  # k1, nats per sequence
    gold = [entry["gold"] for entry in log]
    proxy = [entry["proxy"] for entry in log]
    gold_smooth, proxy_smooth = moving_average(gold, args.smooth), moving_average(proxy, args.smooth)
    kl_smooth = moving_average(kl_seq, args.smooth)
    peak = max(range(len(gold_smooth)), key=gold_smooth.__getitem__)
    return {
        "command": "overoptimization",
        "world": world,
        "seed": args.seed,
        "proxy_heldout_accuracy": round(rm_history["heldout_accuracy"][-1], 4),
        "proxy_heldout_accuracy_initial": round(rm_history["heldout_accuracy"][0], 4),
        "phases": len(history),
        "gen_len": ppo_args.gen_len,
        "gold_initial": round(gold[0], 4),
        "gold_peak_smoothed": round(gold_smooth[peak], 4),
        "gold_peak_phase": peak,
        "kl_seq_at_gold_peak": round(kl_smooth[peak], 3),
        "gold_final_smoothed": round(gold_smooth[-1], 4),
        "proxy_initial": round(proxy[0], 4),
        "proxy_at_gold_peak_smoothed": round(proxy_smooth[peak], 4),
        "proxy_final_smoothed": round(proxy_smooth[-1], 4),
        "kl_per_token_k3_final": round(history[-1]["kl"], 4),
        "kl_seq_final_smoothed": round(kl_smooth[-1], 3),
        "gold_per_phase": [round(g, 4) for g in gold],
        "proxy_per_phase": [round(p, 4) for p in proxy],
        "kl_seq_per_phase": [round(k, 3) for k in kl_seq],
        # the moving averages (over `smooth` phases) that the peak and final figures read
        "gold_smoothed_per_phase": [round(g, 4) for g in gold_smooth],
        "proxy_smoothed_per_phase": [round(p, 4) for p in proxy_smooth],
        "kl_seq_smoothed_per_phase": [round(k, 3) for k in kl_smooth],
        "repetition_per_phase": [round(r["repetition"], 4) for r in history],
        "samples_final": [text for text, _ in history[-1]["samples"][:4]],
        "rm_seconds": round(rm_seconds, 1),
        "wall_seconds": round(wall, 1),
        "torch_threads": torch.get_num_threads(),
        "args": asdict(args),
    }


def figure(summary: dict[str, Any], title: str | None = None):
    """Gold and proxy reward against sqrt(KL per sequence): the over-optimisation curve.

    Faint markers: every phase; lines: the ``smooth``-phase moving averages of reward and KL. The proxy
    (a reward model's raw score, arbitrary units) has its own axis on the right."""
    import plotly.graph_objects as go

    window = summary["args"]["smooth"]
    kl = moving_average(summary["kl_seq_per_phase"], window)
    x_raw = [math.sqrt(max(k, 0.0)) for k in summary["kl_seq_per_phase"]]  # k1 per sequence, clipped at 0
    x = [math.sqrt(max(k, 0.0)) for k in kl]
    fig = go.Figure()
    for key, name, colour, axis in [("gold_per_phase", "gold: classifier P(POSITIVE)", "#1a7f37", "y"),
                                    ("proxy_per_phase", "proxy: reward model score", "#8250df", "y2")]:
        fig.add_scatter(x=x_raw, y=summary[key], mode="markers", marker=dict(color=colour, opacity=0.3, size=5),
                        yaxis=axis, showlegend=False, hoverinfo="skip")
        fig.add_scatter(x=x, y=moving_average(summary[key], window), mode="lines", line=dict(color=colour),
                        name=f"{name} ({window}-phase average)", yaxis=axis)
    fig.update_layout(
        title=title or "Reward over-optimisation: the proxy climbs, the gold reward peaks",
        xaxis_title="sqrt(KL(policy || reference)), nats per sequence",
        yaxis=dict(title="gold reward"),
        yaxis2=dict(title="proxy reward", overlaying="y", side="right"),
        height=400,
    )
    return fig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial overoptimization",
        description="Optimise chapter 02's proxy reward model with chapter 03's PPO and measure the gold "
        "classifier: reward over-optimisation as a curve against KL (Gao et al. 2022).",
    )
    add_flags(parser, OveroptimizationArgs, from_preset=False)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser


def main(argv: list[str]) -> dict:
    ns = _parser().parse_args(argv)
    torch.set_num_threads(ns.threads)
    args = OveroptimizationArgs(**{f.name: getattr(ns, f.name) for f in fields(OveroptimizationArgs)})
    return run_overoptimization(args, progress=not ns.no_progress)


if __name__ == "__main__":  # pragma: no cover
    import json

    print(json.dumps(main(sys.argv[1:]), default=float))
