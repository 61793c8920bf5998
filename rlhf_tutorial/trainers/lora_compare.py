"""``compare-lora``: chapter 08's experiments as one command, with the reference functions.

- ``--task sentiment``: GRPO (chapter 04's trainer and tiny preset, shortened) at LoRA ranks 1, 4, 16 and
  full fine-tuning (rank 0): reward, KL, trained parameters, optimizer state, peak memory and time to a
  mean reward of 0.9, each rank at its learning rate (``LEARNING_RATES``; ``--lr-multipliers`` scans
  around it); with ``--seeds S ...`` each rank at each seed instead, summarised as the spread of its final
  reward and KL (``over_seeds``: the text quotes it, and a learner's run on another CPU is held to it), and
  with ``--seeds`` and several ``--lr-multipliers`` that spread at each multiple of the rank's rate;
- ``--task arithmetic``: SFT on chapter 07's demonstrations at the same ranks: pass@1 after one pass;
- ``--task spectrum``: the singular values of chapter 03's full fine-tune's weight change (the shipped
  tuned policy against the base, tiny world) per matrix, beside chapter 05's "how much moved".

The chapter's text quotes these runs (``figures.RUNS["lora_*"]``) and its notebook runs the first two at
the same sizes for ranks 0 and 1 (``run_grpo`` / ``run_sft``), checking its numbers with ``figures.agree``.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformer_lens import HookedTransformer

from rlhf_tutorial import interp, lora
from rlhf_tutorial.speed import REWARD_TARGET, time_to_reward
from rlhf_tutorial.trainers.args import add_flags, arg, documented, given_flags

#: The learning rate of each task at full fine-tuning (rank 0: the trainers' tiny presets) and under LoRA
#: (any rank, alpha = 16). Scanned with ``compare-lora --task sentiment --lr-multipliers 1 3 --num-phases 12``
#: (``figures.RUNS["lora_scan"]``, seed 0): every LoRA rank did better at 3e-3 than at 9e-3, where it broke down
#: (KL of 1 to 7 nats per token), while full fine-tuning did better at 9e-4 than at its preset's 3e-4 over those
#: 12 phases (the preset is tuned for 40 stable phases). Two rates each: no best rate is bracketed by that scan;
#: ``figures.RUNS["lora_scan_seeds"]`` and ``["lora_scan_seeds_full"]`` bracket them at three seeds.
LEARNING_RATES: dict[str, dict[str, float]] = {
    "sentiment": {"full": 3e-4, "lora": 3e-3},
    "arithmetic": {"full": 3e-4, "lora": 3e-3},
}


@documented
@dataclass
class CompareLoRAArgs:
    """The ``compare-lora`` command. The defaults are the chapter's sizes in the tiny world."""

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    task: str = arg("sentiment", "'sentiment' (GRPO, chapter 04), 'arithmetic' (SFT, chapter 07) or 'spectrum'")
    seed: int = arg(0, "seeds every run (the same seed at every rank: the same adapters' A, the same samples)")
    seeds: tuple[int, ...] = arg((), "sentiment: run each rank at each of these seeds (in place of --seed, at the "
                                 "rank's own rate) and summarise the spread of its final reward and KL")
    ranks: tuple[int, ...] = arg((0, 1, 4, 16), "LoRA ranks to compare; 0 is full fine-tuning")
    lora_alpha: float = arg(16.0, "alpha of every LoRA run (scale alpha / rank)")
    lr_multipliers: tuple[float, ...] = arg((1.0,), "run each rank at these multiples of its learning rate "
                                            "(LEARNING_RATES); the summary names the best per rank")
    # sentiment (GRPO)
    num_phases: int = arg(20, "sentiment: GRPO phases per run")
    groups_per_phase: int = arg(8, "sentiment: groups (prompts) per phase")
    eval_samples: int = arg(64, "sentiment: samples of the final evaluation (reward, KL)")
    # arithmetic (SFT)
    n_demonstrations: int = arg(2048, "arithmetic: demonstrations, one pass (the world has 162 distinct one-step problems: repeats)")
    eval_problems: int = arg(32, "arithmetic: fresh problems for pass@1")
    pass_samples: int = arg(8, "arithmetic: samples per problem for pass@1")


def learning_rate(task: str, rank: int, multiplier: float = 1.0) -> float:
    """The learning rate of ``task`` at ``rank`` (``LEARNING_RATES``) times ``multiplier``."""
    return LEARNING_RATES[task]["lora" if rank else "full"] * multiplier


def run_grpo(args: CompareLoRAArgs, rank: int, lr: float, policy: HookedTransformer | None = None,
             callback=None, progress: bool = False, **overrides: Any) -> dict[str, Any]:
    """One GRPO run on the sentiment task at ``rank`` (0: full fine-tuning) and ``lr``; ``overrides``: the
    learner's LoRA pieces (``trainers.lora.learner_functions``) or GRPO's. Returns its record."""
    from rlhf_tutorial.trainers import grpo as grpo_trainer
    from rlhf_tutorial.trainers import lora as lora_trainer

    grpo_args = grpo_trainer.GRPOArgs.preset(
        args.world, seed=args.seed, num_phases=args.num_phases, groups_per_phase=args.groups_per_phase,
        eval_samples=args.eval_samples, learning_rate=lr, lora_rank=rank, lora_alpha=args.lora_alpha)
    lora_fns = {k: v for k, v in overrides.items() if k in lora_trainer.PLUGGABLE}
    grpo_fns = {k: v for k, v in overrides.items() if k not in lora_trainer.PLUGGABLE}
    result = grpo_trainer.train(grpo_args, policy=policy, callback=callback, progress=progress,
                                lora_functions=lora_fns, **grpo_fns)
    history = result.history
    return {
        "rank": rank,
        "learning_rate": lr,
        "mean_reward_initial": round(result.eval_initial["reward"], 4),
        "mean_reward_final": round(result.eval_final["reward"], 4),
        "kl_final": round(result.eval_final["kl"], 4),
        "mean_reward_last_5": round(sum(r["reward"] for r in history[-5:]) / len(history[-5:]), 4),
        **lora_trainer.summary(result.policy, result.adapters, rank, args.lora_alpha),
        "optimizer_state_mb": round(result.optimizer_state_mb, 4),
        "peak_memory_training_mb": round(result.peak_memory_mb, 1),
        **{k: v for k, v in time_to_reward(history, REWARD_TARGET).items() if k != "reward_target"},
        "train_wall_seconds": round(result.wall_seconds, 1),
        "reward_per_phase": [round(r["reward"], 4) for r in history],
        "kl_per_phase": [round(r["kl"], 4) if "kl" in r else None for r in history],
        "samples_final": result.eval_final["texts"][:3],
        "_result": result,
    }


def run_sft(args: CompareLoRAArgs, rank: int, lr: float, base: HookedTransformer | None = None,
            progress: bool = False, **overrides: Any) -> dict[str, Any]:
    """One pass of SFT on chapter 07's demonstrations at ``rank`` and ``lr``, then pass@1 on fresh problems
    (the same problems and sampling seed for every rank)."""
    from rlhf_tutorial.trainers import lora as lora_trainer
    from rlhf_tutorial.trainers import reasoning as run
    from rlhf_tutorial.worlds import load_reasoning_policy

    policy = copy.deepcopy(base) if base is not None else load_reasoning_policy(args.world)
    sft_args = run.SFTArgs.preset(args.world, seed=args.seed, n_demonstrations=args.n_demonstrations,
                                  learning_rate=lr, lora_rank=rank, lora_alpha=args.lora_alpha)
    lora_fns = {k: v for k, v in overrides.items() if k in lora_trainer.PLUGGABLE}
    sft_fns = {k: v for k, v in overrides.items() if k not in lora_trainer.PLUGGABLE}
    result = run.train_sft(sft_args, policy=policy, evaluate_before_after=False, progress=progress,
                           lora_functions=lora_fns, **sft_fns)
    problems = run.split_problems("eval", args.eval_problems, sft_args.difficulty, args.seed)
    after = run.evaluate(result.policy, problems, args.pass_samples, 24, seed=args.seed + 1)
    losses = result.losses
    return {
        "rank": rank,
        "learning_rate": lr,
        "pass_at_1_final": round(after["pass_at_1"], 4),
        "loss_first": round(losses[0], 4),
        "loss_last_5": round(sum(losses[-5:]) / len(losses[-5:]), 4),
        "steps": len(losses),
        **lora_trainer.summary(result.policy, result.adapters, rank, args.lora_alpha),
        "train_wall_seconds": round(result.wall_seconds, 1),
        "_result": result,
    }


def spectrum(base: HookedTransformer, tuned: HookedTransformer, fractions: tuple[float, ...] = (0.5, 0.9)
             ) -> dict[str, Any]:
    """Per weight matrix of ``lora.weight_matrices`` (what an adapter can change): the singular values of
    tuned - base (the largest 8), their count, and ``update_rank_profile``'s k at each fraction; with the
    medians over matrices and chapter 05's ``param_change`` / ``fraction_changed`` of the same pair."""
    before, after = lora.weight_matrices(base), lora.weight_matrices(tuned)
    per_matrix = {}
    for key in before:
        delta = (after[key] - before[key]).float()
        values, _ = lora.update_rank_profile(delta)
        per_matrix[key] = {
            "shape": list(delta.shape),
            "singular_values_top": [round(float(v), 5) for v in values[:8]],
            **{f"k_{int(f * 100)}": lora.update_rank_profile(delta, f)[1] for f in fractions},
            "top1_share": round(float(values[0] ** 2 / values.square().sum()), 4) if float(values.sum()) else 0.0,
        }

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[len(ordered) // 2]

    base_params, tuned_params = dict(base.named_parameters()), dict(tuned.named_parameters())
    g = torch.Generator().manual_seed(0)  # a baseline: a Gaussian matrix of each shape has no preferred direction
    random_k = [lora.update_rank_profile(torch.randn(*m["shape"], generator=g), 0.9)[1] for m in per_matrix.values()]
    return {
        "matrices": per_matrix,
        **{f"median_k_{int(f * 100)}": median([m[f"k_{int(f * 100)}"] for m in per_matrix.values()]) for f in fractions},
        "max_k_90": max(m["k_90"] for m in per_matrix.values()),
        "random_median_k_90": median(random_k),
        "median_top1_share": median([m["top1_share"] for m in per_matrix.values()]),
        "min_dim_median": median([min(m["shape"]) for m in per_matrix.values()]),
        "fraction_changed": round(interp.fraction_changed(base_params, tuned_params), 4),
    }


def shipped_pair(world: str) -> tuple[HookedTransformer, HookedTransformer]:
    """Chapter 03's full fine-tune as chapter 05 reads it: the base policy and the shipped tuned policy
    (tiny world only: the GPT-2 world ships none)."""
    from rlhf_tutorial.tiny.tuned import tuned_dir
    from rlhf_tutorial.trainers.checkpoint import load_tuned_policy
    from rlhf_tutorial.worlds import load_policy

    if world != "tiny":
        raise ValueError("the spectrum of chapter 03's shipped fine-tune exists in the tiny world only")
    return load_policy(world), load_tuned_policy(tuned_dir()).base_model


def compare_lora(args: CompareLoRAArgs, progress: bool = False) -> dict[str, Any]:
    """The summary of ``args.task`` (see the module docstring): ``runs`` maps a rank (as a string) to its
    record at the rank's own learning rate; with several ``lr_multipliers``, ``scan`` holds every (rank,
    multiplier) record and ``best_multiplier`` the best per rank (final mean reward, or pass@1)."""
    from rlhf_tutorial.worlds import resolve_world

    world = resolve_world(args.world)
    args = CompareLoRAArgs(**{**asdict(args), "world": world})
    if args.task == "spectrum":
        base, tuned = shipped_pair(world)
        return {"world": world, "task": args.task, **spectrum(base, tuned)}
    if args.task not in ("sentiment", "arithmetic"):
        raise ValueError(f"task must be 'sentiment', 'arithmetic' or 'spectrum', got {args.task!r}")
    if args.seeds:
        if args.task != "sentiment":
            raise ValueError("--seeds is for --task sentiment (the GRPO runs)")
        return {"world": world, "task": args.task, **over_seeds(args, progress=progress), "args": asdict(args)}
    run = run_grpo if args.task == "sentiment" else run_sft
    score = "mean_reward_final" if args.task == "sentiment" else "pass_at_1_final"
    scan: dict[str, dict[str, Any]] = {}
    for rank in args.ranks:
        for m in args.lr_multipliers:
            record = run(args, rank, learning_rate(args.task, rank, m), progress=progress)
            record.pop("_result")
            scan.setdefault(str(rank), {})[f"{m:g}"] = record
    best = {rank: max(by_m, key=lambda m: (by_m[m][score], -(by_m[m].get("phases_to_target") or 10**6)))
            for rank, by_m in scan.items()}
    out: dict[str, Any] = {
        "world": world,
        "task": args.task,
        "seed": args.seed,
        "runs": {rank: by_m["1"] if "1" in by_m else by_m[best[rank]] for rank, by_m in scan.items()},
        "learning_rates": {k: v for k, v in LEARNING_RATES[args.task].items()},
        "lora_lr_ratio": round(LEARNING_RATES[args.task]["lora"] / LEARNING_RATES[args.task]["full"], 2),
        "args": asdict(args),
    }
    if len(args.lr_multipliers) > 1:
        out["scan"] = {rank: {m: {k: r[k] for k in (score, "kl_final", "phases_to_target") if k in r}
                              for m, r in by_m.items()} for rank, by_m in scan.items()}
        out["best_multiplier"] = best
    return out


#: What :func:`over_seeds` summarises per rank.
SEED_KEYS = ("mean_reward_final", "kl_final", "mean_reward_last_5")


def _spread(values: list[float]) -> dict[str, Any]:
    """``per_seed``, ``min``, ``max``, ``mean`` and the sample standard deviation ``std`` = sqrt(sum_i (x_i -
    mean)^2 / (n - 1)) (0 for one value) of ``values``."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return {"per_seed": values, "min": min(values), "max": max(values), "mean": round(mean, 4),
            "std": round(var ** 0.5, 4)}


def over_seeds(args: CompareLoRAArgs, progress: bool = False) -> dict[str, Any]:
    """Each rank's GRPO run at its own rate (``learning_rate(..., 1)``) once per seed of ``args.seeds``: per rank
    and key of :data:`SEED_KEYS`, ``per_seed`` (in ``args.seeds``' order), ``min``, ``max``, ``mean`` and the
    sample standard deviation ``std`` = sqrt(sum_i (x_i - mean)^2 / (n - 1)) (0 for one seed); with each seed's
    reward and KL per phase (``curves``), to see where a run went its own way.

    With several ``lr_multipliers``, a learning-rate scan over seeds: every rank at every multiple of its rate
    at every seed; ``scan`` holds, per rank and multiplier (``f"{m:g}"``), the same statistics (no curves) and
    the rate, and ``best_multiplier`` the multiplier of the best mean final reward per rank; ``runs`` then holds
    each rank's statistics at multiplier 1 when it was run, else at its best."""
    runs: dict[str, dict[str, Any]] = {}
    scan: dict[str, dict[str, Any]] = {}
    for rank in args.ranks:
        for m in args.lr_multipliers:
            records = []
            for seed in args.seeds:
                record = run_grpo(CompareLoRAArgs(**{**asdict(args), "seed": seed}), rank,
                                  learning_rate(args.task, rank, m), progress=progress)
                record.pop("_result")
                records.append(record)
            stats: dict[str, Any] = {key: _spread([r[key] for r in records]) for key in SEED_KEYS}
            stats["learning_rate"] = learning_rate(args.task, rank, m)
            scan.setdefault(str(rank), {})[f"{m:g}"] = stats
            if len(args.lr_multipliers) == 1 or m == 1.0:
                stats = {**stats, "curves": {str(seed): {"reward_per_phase": r["reward_per_phase"],
                                                         "kl_per_phase": r["kl_per_phase"]}
                                             for seed, r in zip(args.seeds, records)}}
                runs[str(rank)] = stats
    out: dict[str, Any] = {"seeds": list(args.seeds), "runs": runs}
    if len(args.lr_multipliers) > 1:
        best = {rank: max(by_m, key=lambda m: by_m[m]["mean_reward_final"]["mean"]) for rank, by_m in scan.items()}
        runs.update({rank: scan[rank][best[rank]] for rank in scan if rank not in runs})
        out.update(scan=scan, best_multiplier=best)
    return out


def compare_main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial compare-lora [--task sentiment|arithmetic|spectrum] [--ranks R ...]``"""
    parser = argparse.ArgumentParser(prog="python -m rlhf_tutorial compare-lora",
                                     description="Chapter 08: LoRA ranks against full fine-tuning (GRPO on the "
                                     "sentiment task, SFT on arithmetic) and the spectrum of a full fine-tune.")
    add_flags(parser, CompareLoRAArgs, from_preset=False)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    ns = parser.parse_args(argv)
    torch.set_num_threads(ns.threads)
    given = given_flags(CompareLoRAArgs, ns)
    given["ranks"] = tuple(int(r) for r in given.get("ranks", CompareLoRAArgs.ranks))
    given["lr_multipliers"] = tuple(float(m) for m in given.get("lr_multipliers", CompareLoRAArgs.lr_multipliers))
    given["seeds"] = tuple(int(s) for s in given.get("seeds", CompareLoRAArgs.seeds))
    return compare_lora(CompareLoRAArgs(**given), progress=not ns.no_progress)
