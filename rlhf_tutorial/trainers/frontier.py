"""Chapter 06: every method of the course on one plane, mean reward against KL(policy || reference).

The DPO paper's IMDb figure plots, for each method and several KL strengths, the reward a tuned policy
earns against how far it moved from the reference. This module rebuilds it in the tiny world: for
each method and each strength, train from the same starting policy with the same seed, then measure
the tuned policy with ``policy_eval.evaluate_policy`` (the same sampler, prompt, number of samples and
seed for every method: mean classifier reward and sequence KL from the policy's own samples, each with
its standard error).

| method | trainer | KL strength swept |
|---|---|---|
| ``ppo``  | chapter 03's ``RLHFTrainer`` (value head, GAE, KL in the reward) | ``kl_coef`` |
| ``grpo`` | chapter 04's ``grpo.train`` | ``kl_coef`` (beta of the k3 KL in the loss) |
| ``rloo`` | the same, ``advantage_estimator="rloo"``: GRPO with RLOO's leave-one-out advantages (not Ahmadian et al.'s REINFORCE) | ``kl_coef`` |
| ``gspo`` | the same, ``importance_level="sequence"`` | ``kl_coef`` |
| ``reinforce_pp`` | the same, ``advantage_estimator="reinforce_pp"``: REINFORCE++ (the KL in the per-token rewards, no KL term in the loss; not in the default grid) | ``kl_coef`` (the weight of the k1 KL in the reward: its own flag) |
| ``cispo`` | the same, ``policy_loss="cispo"``: CISPO's clipped, detached weight on every token's log-prob (not in the default grid) | ``kl_coef`` |
| ``dpo``  | ``dpo_trainer.train`` (offline pairs from the reference), ``loss_type="sigmoid"`` | ``beta`` |
| ``ipo``  | the same, ``loss_type="ipo"`` | ``beta`` |
| ``kto``  | the same, ``loss_type="kto"`` (the pairs' completions as unpaired labels; not in the default grid) | ``beta`` |
| ``orpo`` | the same, ``loss_type="orpo"`` (no reference in the loss; not in the default grid) | ``lambda`` (the odds-ratio weight) |

DPO, IPO, KTO and ORPO points share one set of pairs (sampled and labelled once per process). Wall time and
peak memory (``PeakMemory``: above what was in use before the run) are recorded per run and summed /
maxed per method; the command runs each method in its own process (``--isolate``, the default), so
that a method's peak memory is not hidden by memory an earlier method freed, and reports each
process's peak resident set too. ``python -m rlhf_tutorial frontier --world tiny`` runs the default grid and writes an HTML
report (interactive figure, table of every point) and prints the JSON summary last.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial.devices import device_of
from rlhf_tutorial.rewards import sentiment_reward_fn
from rlhf_tutorial.trainers import dpo as dpo_trainer
from rlhf_tutorial.trainers import grpo, rlhf
from rlhf_tutorial.trainers.args import add_flags, arg, documented
from rlhf_tutorial.trainers.policy_eval import evaluate_policy
from rlhf_tutorial.trainers.runtime import PeakMemory
from rlhf_tutorial.worlds import PROMPT

METHODS = ("ppo", "grpo", "rloo", "gspo", "dpo", "ipo")
#: Every method ``--methods`` accepts: the default grid's and the ones run only when named.
ALL_METHODS = (*METHODS, "reinforce_pp", "cispo", "kto", "orpo")
#: The methods trained by chapter 04's GRPO trainer, with the options that make each one.
GRPO_METHODS = {"grpo": {}, "rloo": {"advantage_estimator": "rloo"}, "gspo": {"importance_level": "sequence"},
                "reinforce_pp": {"advantage_estimator": "reinforce_pp"}, "cispo": {"policy_loss": "cispo"}}
#: The methods trained by the DPO trainer, on the shared pairs.
PAIR_METHODS = ("dpo", "ipo", "kto", "orpo")


@documented
@dataclass
class FrontierArgs:
    """The sweep: which methods, which KL strengths, how long each run trains, how points are measured.

    Every run starts from the world's policy with ``seed``; each method keeps its own trainer's preset
    for everything not named here.
    """

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seed of every run and of the evaluation samples")
    direction: str = arg("neg", "sentiment the classifier reward asks for")
    methods: tuple[str, ...] = arg(METHODS, "methods to run: any of ppo grpo rloo gspo reinforce_pp cispo dpo ipo kto orpo")
    ppo_kl_coefs: tuple[float, ...] = arg((0.03, 0.1, 0.3), "PPO (chapter 03): kl_coef of each point")
    grpo_kl_coefs: tuple[float, ...] = arg((0.01, 0.1, 0.5), "GRPO, GRPO + RLOO advantages, GSPO, CISPO: kl_coef (beta of the k3 KL in the loss) of each point")
    reinforce_pp_kl_coefs: tuple[float, ...] = arg((0.03, 0.1, 0.3), "REINFORCE++: kl_coef (weight of the k1 KL in the "
                                                   "per-token rewards) of each point")
    dpo_betas: tuple[float, ...] = arg((0.03, 0.1, 0.5), "DPO: beta of each point")
    ipo_betas: tuple[float, ...] = arg((0.02, 0.1, 0.5), "IPO: beta of each point (its target h = 1 / (2 beta))")
    kto_betas: tuple[float, ...] = arg((0.1,), "KTO: beta of each point")
    orpo_lambdas: tuple[float, ...] = arg((0.1,), "ORPO: lambda (weight of the odds-ratio term) of each point")
    rl_phases: int = arg(20, "phases of each PPO / GRPO / GRPO + RLOO advantages / GSPO / REINFORCE++ / CISPO run (64 samples each)")
    dpo_rounds: int = arg(4, "rounds (passes over the pairs) of each DPO / IPO / KTO / ORPO run")
    dpo_pairs: int = arg(256, "pairs sampled (once) from the reference for DPO, IPO, KTO and ORPO")
    dpo_min_reward_gap: float = arg(0.05, "DPO / IPO / KTO / ORPO pairs: drop groups whose best and worst differ by less")
    eval_samples: int = arg(128, "samples each point is measured on")
    max_new_tokens: int = arg(16, "most tokens of an evaluation sample")
    n_samples_shown: int = arg(3, "samples kept per point for the report's hover")


def _floats(values: tuple[str | float, ...]) -> list[float]:
    return [float(v) for v in values]


def strengths(args: FrontierArgs, method: str) -> list[float]:
    """The KL strengths of ``method`` in ``args``."""
    if method == "ppo":
        return _floats(args.ppo_kl_coefs)
    if method == "reinforce_pp":
        return _floats(args.reinforce_pp_kl_coefs)
    if method in GRPO_METHODS:
        return _floats(args.grpo_kl_coefs)
    if method in PAIR_METHODS:
        return _floats({"dpo": args.dpo_betas, "ipo": args.ipo_betas, "kto": args.kto_betas,
                        "orpo": args.orpo_lambdas}[method])
    raise ValueError(f"unknown method {method!r}: choose from {ALL_METHODS}")


def train_one(
    method: str,
    strength: float,
    args: FrontierArgs,
    world: str,
    base: HookedTransformer,
    reference: HookedTransformer,
    reward_fn: Callable,
    pairs: dpo_trainer.PairBatch | None = None,
) -> tuple[HookedTransformer, dict[str, Any]]:
    """Train a copy of ``base`` with ``method`` at KL strength ``strength``; return the tuned policy and
    the settings used (for the report)."""
    policy = copy.deepcopy(base).train()
    if method == "ppo":
        run_args = rlhf.RLHFArgs.preset(world, direction=args.direction, seed=args.seed, kl_coef=strength,
                                        num_phases=args.rl_phases, early_stopping=False)
        trainer = rlhf.RLHFTrainer(run_args, model=policy, ref_model=reference, reward_fn=reward_fn)
        trainer.train(progress=False)
        tuned = trainer.model.base_model
    elif method in GRPO_METHODS:
        run_args = grpo.GRPOArgs.preset(world, direction=args.direction, seed=args.seed, kl_coef=strength,
                                        num_phases=args.rl_phases, **GRPO_METHODS[method])
        grpo.train(run_args, policy=policy, reference=reference, reward_fn=reward_fn, evaluate_before_after=False,
                   progress=False)
        tuned = policy
    else:
        loss = {"dpo": {"loss_type": "sigmoid", "beta": strength}, "ipo": {"loss_type": "ipo", "beta": strength},
                "kto": {"loss_type": "kto", "beta": strength}, "orpo": {"loss_type": "orpo", "orpo_lambda": strength}}
        run_args = dpo_trainer.DPOArgs.preset(world, direction=args.direction, seed=args.seed, **loss[method],
                                              rounds=args.dpo_rounds, num_pairs=args.dpo_pairs)
        dpo_trainer.train(run_args, policy=policy, reference=reference, reward_fn=reward_fn, pairs=pairs,
                          evaluate=False, progress=False)
        tuned = policy
    tuned.eval()
    settings = {k: v for k, v in asdict(run_args).items() if k not in ("world", "prompts", "prefix")}
    return tuned, settings


def run_frontier(args: FrontierArgs, progress: bool = True, callback: Callable | None = None) -> dict[str, Any]:
    """Run the sweep; returns ``{"points": [...], "methods": {...}, "base": {...}}``. Each point holds the
    method, its KL strength, reward / reward_se, kl / kl_se (sequence KL), kl_per_token, wall time and
    peak memory of its run (on the models' device, ``device``), its settings and a few samples.
    ``callback(point)`` gets each point."""
    from rlhf_tutorial.worlds import load_policy, resolve_world

    world = resolve_world(args.world)
    for method in args.methods:
        strengths(args, method)  # fail early on an unknown method
    base = load_policy(world).eval()
    reference = copy.deepcopy(base).requires_grad_(False)
    reward_fn = sentiment_reward_fn(world, args.direction)

    def measure(policy: HookedTransformer) -> dict[str, Any]:
        return evaluate_policy(policy, reference, reward_fn, (PROMPT,), args.eval_samples,
                               args.max_new_tokens, seed=args.seed + 1)

    base_eval = measure(base)
    pairs, pairs_seconds = None, 0.0
    if set(PAIR_METHODS) & set(args.methods):
        start = time.perf_counter()
        torch.manual_seed(args.seed)
        pair_args = dpo_trainer.DPOArgs.preset(world, direction=args.direction, seed=args.seed, num_pairs=args.dpo_pairs,
                                               min_reward_gap=args.dpo_min_reward_gap)
        raw, _ = dpo_trainer.pairs_from_samples(reference, reward_fn, pair_args)
        pairs = dpo_trainer.to_batch(raw, reference)
        pairs_seconds = time.perf_counter() - start

    runs = [(m, s) for m in args.methods for s in strengths(args, m)]
    points, per_method = [], {}
    for method, strength in tqdm(runs, desc="frontier runs", disable=not progress, file=sys.stderr):
        start = time.perf_counter()
        with PeakMemory(device_of(base)) as memory:
            tuned, settings = train_one(method, strength, args, world, base, reference, reward_fn, pairs)
        seconds = time.perf_counter() - start
        stats = measure(tuned)
        point = {
            "method": method,
            "strength": strength,
            "strength_name": {"orpo": "lambda"}.get(method, "beta" if method in PAIR_METHODS else "kl_coef"),
            "reward": stats["reward"], "reward_se": stats["reward_se"],
            "kl": stats["kl"], "kl_se": stats["kl_se"], "kl_per_token": stats["kl_per_token"],
            "repetition": stats["repetition"], "completion_len": stats["completion_len"],
            "train_seconds": seconds, "peak_memory_mb": memory.peak_mb,
            "samples": list(zip(stats["texts"], stats["rewards"]))[: args.n_samples_shown],
            "settings": settings,
        }
        points.append(point)
        summary = per_method.setdefault(method, {"points": 0, "train_seconds": 0.0, "peak_memory_mb": 0.0})
        summary["points"] += 1
        summary["train_seconds"] += seconds
        summary["peak_memory_mb"] = max(summary["peak_memory_mb"], memory.peak_mb)
        if callback is not None:
            callback(point)
        del tuned
    for method in PAIR_METHODS:
        if method in per_method:
            per_method[method]["pairs_seconds_shared"] = pairs_seconds
    base_point = {k: base_eval[k] for k in ("reward", "reward_se", "kl", "kl_se", "repetition", "completion_len")}
    base_point["samples"] = list(zip(base_eval["texts"], base_eval["rewards"]))[: args.n_samples_shown]
    return {"world": world, "device": str(device_of(base)), "points": points, "methods": per_method,
            "base": base_point}


def rewards_at_common_kl(result: dict[str, Any], methods: tuple[str, ...] | None = None) -> tuple[float, dict[str, float]]:
    """Each method's reward at one sequence KL that every method of ``result`` (``run_frontier``'s) reached
    (every method of ``methods`` only, when given).

    A method's curve starts at the base policy, (0, base reward), and joins its points in order of KL;
    the common KL is the smallest of the methods' largest KLs, ``min_m max_i KL_{m,i}``, and a method's
    reward there is read on the straight line between the two points around it:
    ``r = r_0 + (r_1 - r_0) (KL - KL_0) / (KL_1 - KL_0)``. Returns (the common KL, {method: reward}).
    """
    curves: dict[str, list[tuple[float, float]]] = {}
    for point in result["points"]:
        if methods is not None and point["method"] not in methods:
            continue
        curves.setdefault(point["method"], [(0.0, result["base"]["reward"])]).append((point["kl"], point["reward"]))
    common = min(max(kl for kl, _ in curve) for curve in curves.values())
    rewards = {}
    for method, curve in curves.items():
        curve = sorted(curve)
        rewards[method] = curve[-1][1]
        for (kl0, r0), (kl1, r1) in zip(curve, curve[1:]):
            if kl0 <= common <= kl1:
                rewards[method] = r0 + (r1 - r0) * (common - kl0) / max(kl1 - kl0, 1e-9)
                break
    return common, rewards


# ----------------------------------------------------------------------------------------------------
# Command line: python -m rlhf_tutorial frontier --world tiny
# ----------------------------------------------------------------------------------------------------


def run_isolated(args: FrontierArgs, threads: int = 1, progress: bool = True) -> dict[str, Any]:
    """``run_frontier`` with each method in a fresh Python process (``frontier --methods m``), so that
    each method's peak memory is its own: in one process, memory freed by an earlier run is reused by
    the next and hides its cost. The processes run one after the other; their results are merged
    (the base policy's point is the first process's: every process measures it the same way)."""
    import subprocess
    import tempfile

    merged: dict[str, Any] = {"points": [], "methods": {}}
    flags = []
    for f in fields(FrontierArgs):
        if f.name in ("methods", "world"):
            continue
        value = getattr(args, f.name)
        flags += [f"--{f.name.replace('_', '-')}", *map(str, value)] if isinstance(value, tuple) else \
            [f"--{f.name.replace('_', '-')}", str(value)]
    with tempfile.TemporaryDirectory() as tmp:
        for method in tqdm(args.methods, desc="frontier methods", disable=not progress, file=sys.stderr):
            out = f"{tmp}/{method}.json"
            cmd = [sys.executable, "-m", "rlhf_tutorial", "frontier", "--methods", method, "--no-isolate",
                   "--report", "", "--json", out, "--no-progress", "--threads", str(threads), *flags]
            if args.world:
                cmd += ["--world", args.world]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"frontier --methods {method} failed:\n{done.stderr[-3000:]}")
            with open(out) as f:
                part = json.load(f)
            merged["points"] += part["points"]
            merged["methods"].update(part["methods"])
            merged.setdefault("base", part["base"])
            merged.setdefault("world", part["world"])
            merged.setdefault("device", part.get("device"))
    return merged


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial frontier",
        description="Chapter 06: PPO, GRPO, GRPO with RLOO advantages, GSPO, DPO and IPO (and, when named, REINFORCE++, "
        "CISPO, KTO and ORPO) at several KL strengths, each point measured the same way (mean classifier reward, sequence KL to the reference from the policy's own samples).",
    )
    add_flags(parser, FrontierArgs, from_preset=False)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the tiny model runs fastest on one)")
    parser.add_argument("--report", default="reports/frontier.html", help="write the HTML report here ('' for none)")
    parser.add_argument("--json", default=None, help="also write the full summary (every point) to this file")
    parser.add_argument("--isolate", default=True, action=argparse.BooleanOptionalAction,
                        help="run each method in its own process (its own peak memory; default)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _round(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 4)
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_round(v) for v in obj]
    return obj


def main(argv: list[str]) -> dict:
    """Run the sweep and summarise: every point (method, strength, reward +- se, KL +- se, train
    seconds, peak memory, samples), per method its number of points, total train seconds and peak
    memory, the base policy's point, and the wall time of the whole command."""
    ns = _parser().parse_args(argv)
    torch.set_num_threads(ns.threads)
    given = {f.name: getattr(ns, f.name) for f in fields(FrontierArgs)}
    args = FrontierArgs(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
    for name in ("ppo_kl_coefs", "grpo_kl_coefs", "reinforce_pp_kl_coefs", "dpo_betas", "ipo_betas", "kto_betas",
                 "orpo_lambdas"):
        setattr(args, name, tuple(_floats(getattr(args, name))))
    start = time.perf_counter()
    if ns.isolate and len(args.methods) > 1:
        result = run_isolated(args, ns.threads, progress=not ns.no_progress)
    else:
        result = run_frontier(args, progress=not ns.no_progress)
        from rlhf_tutorial.trainers.runtime import peak_memory_mb

        for summary in result["methods"].values():
            summary["process_peak_memory_mb"] = peak_memory_mb(result["device"])
    result["wall_seconds"] = time.perf_counter() - start
    result["torch_threads"] = ns.threads
    result["args"] = asdict(args)
    summary = _round(result)
    for point in summary["points"]:
        point.pop("settings")  # in the report and the --json file; the printed line stays readable
    if ns.report:
        from rlhf_tutorial.widgets.dpo import write_frontier_report

        path = write_frontier_report(ns.report, _round(result))
        print(f"report written to {path}", file=sys.stderr)
        summary["report"] = str(path)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(_round(result), f, indent=1)
    return summary


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(main(sys.argv[1:]), default=float))
