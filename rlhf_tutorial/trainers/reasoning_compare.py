"""``compare-reasoning``: chapter 07's notebook run as one command, with the reference functions.

The chapter's text quotes this run's summary (``figures.RUNS["compare"]``) and the notebook checks its own
output against it (``figures.agree``). It lives apart from :mod:`rlhf_tutorial.trainers.reasoning` because it
runs chapter 04's GRPO trainer too, which itself uses that module for the arithmetic task (one module
importing the other both ways would be a cycle).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from rlhf_tutorial import reasoning
from rlhf_tutorial.tiny import arith
from rlhf_tutorial.trainers.args import arg, documented, given_flags, parse_command
from rlhf_tutorial.trainers.reasoning import (
    PASS_KS,
    SFTArgs,
    arithmetic_reward_fn,
    binary_best_of_n_kl,
    evaluate,
    split_problems,
    train_rejection_sampling,
    train_sft,
)


@documented
@dataclass
class CompareArgs:
    """The ``compare-reasoning`` command: chapter 07's notebook run with the reference functions. The
    defaults are the notebook's sizes in the tiny world (its text quotes this run); the SFT and rejection
    sampling runs use ``SFTArgs.preset`` with the measurement's problems, samples and length."""

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds every run (SFT, rejection sampling, both GRPO runs)")
    eval_problems: int = arg(32, "fresh problems of each difficulty (the 'eval' split)")
    eval_samples: int = arg(16, "samples per problem for the before / after pass@1 (sampling seed 1)")
    max_new_tokens: int = arg(24, "most tokens of a sampled solution (training difficulty)")
    pass_samples: int = arg(64, "samples per problem for pass@k, k up to this (sampling seed 3)")
    held_out_samples: int = arg(8, "samples per held-out problem (48 tokens, sampling seed 4)")
    hack_phases: int = arg(30, "GRPO phases against the lenient verifier")
    hack_groups: int = arg(16, "groups per phase of that run")
    num_phases: int = arg(40, "GRPO phases against the strict verifier (from the base model)")
    groups_per_phase: int = arg(32, "groups per phase of that run")


def compare_reasoning(args: CompareArgs, progress: bool = False) -> dict[str, Any]:
    """What chapter 07's notebook does, in its order and with its seeds, as a summary: the base model's
    pass@1, SFT, rejection sampling, GRPO hacked through the lenient verifier, GRPO with the strict one,
    then pass@k (``pass_at_k``: model -> k -> value), pass@1 per difficulty (``held_out_pass_at_1``:
    model -> difficulty -> value) and best-of-N's pass rate and KL (``best_of_n``: N -> values)."""
    import copy

    from rlhf_tutorial.trainers.grpo import GRPOArgs
    from rlhf_tutorial.trainers.grpo import train as train_grpo
    from rlhf_tutorial.worlds import load_reasoning_policy

    world = args.world
    base = load_reasoning_policy(world)
    difficulty = arith.TRAIN_DIFFICULTY
    problems = split_problems("eval", args.eval_problems, difficulty)
    n, max_new = args.eval_samples, args.max_new_tokens
    base_eval = evaluate(base, problems, n, max_new, seed=1)

    sft_args = SFTArgs.preset(world, seed=args.seed, eval_problems=len(problems), eval_samples=n, max_new_tokens=max_new)
    sft = train_sft(sft_args, policy=copy.deepcopy(base), progress=progress)
    rs = train_rejection_sampling(sft_args, policy=copy.deepcopy(base), progress=progress)

    hack_args = GRPOArgs.preset(world, task="arithmetic", seed=args.seed, verifier="lenient",
                                num_phases=args.hack_phases, groups_per_phase=args.hack_groups)
    hacked = train_grpo(hack_args, policy=copy.deepcopy(base), reward_fn=arithmetic_reward_fn(reasoning.lenient_extract_answer),
                        evaluate_before_after=False, progress=progress)
    hacked_eval = evaluate(hacked.policy, problems, n, max_new, seed=1)

    grpo_args = GRPOArgs.preset(world, task="arithmetic", seed=args.seed, num_phases=args.num_phases,
                                groups_per_phase=args.groups_per_phase)
    grpo_start = copy.deepcopy(sft.policy if grpo_args.init == "sft" else base)  # GPT-2 needs SFT on the format first
    grpo = train_grpo(grpo_args, policy=grpo_start, reward_fn=arithmetic_reward_fn(),
                      evaluate_before_after=False, progress=progress)
    grpo_eval = evaluate(grpo.policy, problems, n, max_new, seed=1)

    models = {"base": base, "sft": sft.policy, "rejection_sampling": rs.policy, "grpo": grpo.policy}
    big = {name: evaluate(model, problems, args.pass_samples, max_new, seed=3) for name, model in models.items()}
    held_out = {name: {str(difficulty): r["pass_at_1"]} for name, r in big.items()}
    for d in arith.HELD_OUT_DIFFICULTIES:
        harder = split_problems("eval", args.eval_problems, d)
        for name, model in models.items():
            held_out[name][str(d)] = evaluate(model, harder, args.held_out_samples, 48, seed=4)["pass_at_1"]
    p_hat = [c / args.pass_samples for c in big["base"]["correct"]]
    best_of_n = {str(k): {"reward": sum(1 - (1 - p) ** k for p in p_hat) / len(p_hat),
                          "kl_measured": sum(binary_best_of_n_kl(p, k) for p in p_hat) / len(p_hat),
                          "kl_analytic": reasoning.best_of_n_kl(k)}
                 for k in PASS_KS if k <= args.pass_samples}
    entropy = [r["entropy"] for r in grpo.history if "entropy" in r]  # none in a phase that kept no group
    zero = [r["frac_reward_zero_std"] for r in grpo.history]

    def r6(x: Any) -> Any:  # 6 places: the text's 3 decimals round as the notebook's prints do
        if isinstance(x, dict):
            return {str(k): r6(v) for k, v in x.items()}
        if isinstance(x, list):
            return [r6(v) for v in x]
        return round(x, 6) if isinstance(x, float) else x

    return r6({
        "world": world,
        "seed": args.seed,
        "base_pass_at_1": base_eval["pass_at_1"],
        "base_pass_at_1_lenient": base_eval["pass_at_1_lenient"],
        "sft": {"steps": len(sft.losses), "loss_first": sft.losses[0], "loss_last": sft.losses[-1],
                "pass_at_1_initial": sft.eval_initial["pass_at_1"], "pass_at_1_final": sft.eval_final["pass_at_1"]},
        "rejection_sampling": {"sample_pass_rate": [r["sample_pass_rate"] for r in rs.rounds],
                               "kept": [r["kept"] for r in rs.rounds],
                               "pass_at_1_initial": rs.eval_initial["pass_at_1"],
                               "pass_at_1_final": rs.eval_final["pass_at_1"]},
        "hacked": {"lenient_reward_first": hacked.history[0]["reward"], "lenient_reward_last": hacked.history[-1]["reward"],
                   "pass_at_1": hacked_eval["pass_at_1"], "pass_at_1_lenient": hacked_eval["pass_at_1_lenient"],
                   "samples": hacked_eval["samples"]},
        "grpo": {"phases": len(grpo.history), "pass_at_1": grpo_eval["pass_at_1"],
                 "frac_reward_zero_std": sum(zero) / len(zero),
                 "entropy_first": entropy[0] if entropy else None, "entropy_last": entropy[-1] if entropy else None},
        "pass_at_k": {name: r["pass_at_k"] for name, r in big.items()},
        "held_out_pass_at_1": held_out,
        "best_of_n": best_of_n,
        "args": asdict(args),
    })


def compare_main(argv: list[str]) -> dict:
    """``compare-reasoning``: chapter 07's notebook run as one command (see ``compare_reasoning``)."""
    from rlhf_tutorial.worlds import resolve_world

    ns = parse_command("compare-reasoning", CompareArgs, argv, description=compare_main.__doc__, from_preset=False,
                       threads_help="torch CPU threads (the notebook runs on 1)")
    args = CompareArgs(**given_flags(CompareArgs, ns))
    args.world = resolve_world(args.world)
    start = time.perf_counter()
    torch.manual_seed(0)  # as the notebook's first cell
    summary = compare_reasoning(args, progress=not ns.no_progress)
    return {**summary, "wall_seconds": round(time.perf_counter() - start, 1)}
