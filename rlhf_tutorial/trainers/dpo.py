"""Chapter 06's trainer: DPO (and IPO, hinge, label smoothing) on pairs of completions, and KTO and ORPO
on the same completions (``DPOArgs.loss_type``).

``loss_type="kto"`` reads the pairs as unpaired labels: every chosen completion is a desirable example,
every rejected one an undesirable example (``kto_loss``); the reference point z0 of a step is the mean
of ``policy_logps - ref_logps`` over all the step's completions, which ``kto_loss`` takes without its
graph and clamps at 0. (The paper averages over mismatched prompt-completion pairs, so as not to
measure a completion on its own prompt; the course's runs have one prompt, where the mismatched pairs
are the batch's own completions.) ``loss_type="orpo"`` trains with ``orpo_loss`` (no reference model in
the loss; the completions' lengths are their mask's token counts); the reference is still used to
measure the KL the frontier plots.

Where the pairs come from (``DPOArgs.pairs``):

- ``"reference"``: for each of ``num_pairs`` prompts, sample G = ``group_size`` completions from the
  reference policy, score them with the sentiment classifier (towards ``direction``, as in chapter
  03) and keep the best and the worst (``best_worst_pairs``); groups whose best and worst differ by
  less than ``min_reward_gap`` are dropped (no preference in them). The classifier labels the pairs
  once; it is never asked again during training.
- ``"preferences"``: chapter 02's preference pairs (``load_preference_pairs``). They prefer positive,
  less repetitive reviews; with ``direction="neg"`` the pairs of kind "sentiment" are flipped.

Offline (the default) the pairs are drawn once and ``rounds`` passes of ``epochs`` epochs are made over
them; ``online=True`` draws new pairs from the *current* policy at the start of every round (the
reference stays the frozen starting policy in the loss). After every round the policy is measured on
fresh samples (``policy_eval.evaluate_policy``: held-out classifier reward, sequence KL to the
reference) next to the training statistics of the round (loss, implicit reward margin, accuracy).

``python -m rlhf_tutorial train-dpo --world tiny --seed 0`` trains and prints a JSON summary last.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial import dpo, speed
from rlhf_tutorial.devices import device_of
from rlhf_tutorial.grpo import decode_completions, eos_id, sample_group
from rlhf_tutorial.trainers.args import add_flags, arg, documented, given_flags
from rlhf_tutorial.trainers.plug import bind, learner_functions_for
from rlhf_tutorial.trainers.policy_eval import evaluate_policy
from rlhf_tutorial.trainers.records import add_stats, mean_stats
from rlhf_tutorial.trainers.runtime import PeakMemory
from rlhf_tutorial.worlds import PROMPT

# ----------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------


@documented
@dataclass
class DPOArgs:
    """Every knob of the DPO trainer. The defaults are the tiny world's (``DPOArgs.preset``).

    One round: (offline: in the first round only) draw the pairs, then ``epochs`` passes over them in
    minibatches of ``batch_size`` pairs; then evaluate on ``eval_samples_per_round`` fresh samples.
    """

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds sampling, the pair order and the evaluations")
    direction: str = arg("neg", "sentiment the classifier labels as preferred: 'neg' or 'pos'")
    prompts: tuple[str, ...] = arg((PROMPT,), "prompts the pairs (reference) and evaluations cycle through")
    prepend_bos: bool = arg(True, "put the BOS token before each prompt")
    # pairs
    pairs: str = arg("reference", "'reference' (best/worst of G samples, classifier-labelled) or 'preferences' (chapter 02)")
    online: bool = arg(False, "draw new pairs from the current policy at the start of every round")
    num_pairs: int = arg(384, "pairs per round (reference: groups sampled per round)")
    group_size: int = arg(16, "G: samples per prompt, of which the best and the worst make a pair")
    min_reward_gap: float = arg(0.05, "drop groups whose best and worst reward differ by less than this")
    max_new_tokens: int = arg(16, "most tokens of a sampled completion (it ends earlier at EOS)")
    temperature: float = arg(1.0, "sampling temperature of the pairs and evaluations")
    # optimisation
    rounds: int = arg(5, "rounds (offline: passes over the same pairs; online: new pairs each round)")
    epochs: int = arg(1, "epochs over the round's pairs")
    batch_size: int = arg(32, "pairs per optimizer step")
    learning_rate: float = arg(2e-4, "AdamW learning rate (constant, no weight decay)")
    max_grad_norm: float = arg(1.0, "clip the global gradient norm to this")
    # loss
    beta: float = arg(0.1, "the KL strength of DPO's implied objective (dpo_loss's beta; IPO: target h = 1 / (2 beta))")
    loss_type: str = arg("sigmoid", "'sigmoid' (DPO), 'ipo', 'hinge', 'kto' (kto_loss on the pairs' completions "
                         "as unpaired labels) or 'orpo' (orpo_loss)")
    label_smoothing: float = arg(0.0, "probability that a pair's label is wrong (cDPO; sigmoid only)")
    kto_lambda_d: float = arg(1.0, "KTO: weight of the desirable (chosen) completions")
    kto_lambda_u: float = arg(1.0, "KTO: weight of the undesirable (rejected) completions")
    orpo_lambda: float = arg(0.1, "ORPO: weight of the odds-ratio term against the chosen completions' NLL")
    # evaluation and logging
    eval_samples: int = arg(128, "samples drawn before and after training to measure reward and KL")
    eval_samples_per_round: int = arg(64, "samples drawn after each round for the held-out curves")
    n_logged_samples: int = arg(4, "samples kept per round for the tables")
    # harness speed (what a learner's functions compute is unchanged)
    fast: bool = arg(True, "harness speed-ups (speed.py): with the reference sequence_logprobs, the policy's and the "
                     "reference's log-probs by a hook-free forward that unembeds only the completion's positions "
                     "(the same numbers to float rounding); a fused AdamW (the same update)")

    @classmethod
    def preset(cls, world: str, **overrides: Any) -> DPOArgs:
        """The preset of ``world`` ('tiny' or 'gpt2') with ``overrides`` applied."""
        return cls(**{**PRESETS[world], "world": world, **overrides})


#: Per-world settings. The tiny preset is the one measured in this repository (see README): 384 pairs,
#: each the best and worst of 16 samples (G = 8 gave pairs with smaller reward gaps and a slower
#: climb), learning rate 2e-4 (5e-4 overfit the pairs: loss near 0, KL past 30 nats, garbled text;
#: 1e-4 needed twice the rounds), 5 passes (4 reached 0.795 with seed 0, 512 pairs x 4 passes
#: 0.836 for more sampling). Offline DPO keeps raising its implicit margin on the fixed pairs after
#: the held-out reward has levelled off (about 0.8 here), so its KL keeps growing: more rounds buy
#: little reward for much KL (chapter 06 shows this on the frontier). The GPT-2
#: preset follows common DPO practice on GPT-2-sized models (learning rate 1e-6 .. 5e-6, beta 0.1,
#: 30 new tokens as chapter 03); it has not been tuned here (no GPT-2 weights offline).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "gpt2": dict(num_pairs=256, max_new_tokens=30, rounds=4, epochs=1, batch_size=16, learning_rate=3e-6),
}

# ----------------------------------------------------------------------------------------------------
# Pairs
# ----------------------------------------------------------------------------------------------------


@dataclass
class PairBatch:
    """n preference pairs as token rows: ``chosen[i]`` / ``rejected[i]`` (prompt + completion, right-
    padded) with masks True on the completion tokens, and the reference's sequence log-probs of both.
    Every tensor is on the models' device (``reward_gap`` too)."""

    chosen: Int[Tensor, "n s"]
    chosen_mask: Bool[Tensor, "n s"]
    rejected: Int[Tensor, "n s"]
    rejected_mask: Bool[Tensor, "n s"]
    ref_chosen_logps: Float[Tensor, "n"]
    ref_rejected_logps: Float[Tensor, "n"]
    reward_gap: Float[Tensor, "n"]  # classifier reward of chosen minus rejected (NaN: unknown)
    texts: list[tuple[str, str]]

    def __len__(self) -> int:
        return self.chosen.shape[0]

    def select(self, rows: Tensor) -> PairBatch:
        idx = rows.tolist()
        return PairBatch(self.chosen[rows], self.chosen_mask[rows], self.rejected[rows], self.rejected_mask[rows],
                         self.ref_chosen_logps[rows], self.ref_rejected_logps[rows], self.reward_gap[rows],
                         [self.texts[i] for i in idx])


def _pad_rows(rows: list[Tensor], value: int) -> Tensor:
    width = max(len(r) for r in rows)
    return torch.stack([nn.functional.pad(r, (0, width - len(r)), value=value) for r in rows])


SAMPLE_ROWS = 512


def pairs_from_samples(
    model: HookedTransformer,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]],
    args: DPOArgs,
    best_worst_pairs: Callable = dpo.best_worst_pairs,
) -> tuple[list[tuple[Tensor, Tensor, Tensor, Tensor, str, str, float]], dict[str, float]]:
    """Sample ``num_pairs`` groups of G from ``model`` (prompts cycling), score them, keep each group's
    (best, worst) when their rewards differ by at least ``min_reward_gap``. Returns the pairs as
    (chosen row, chosen mask, rejected row, rejected mask, texts, gap), rows and masks on the model's
    device, and sampling statistics."""
    eos = eos_id(model)
    out, all_rewards = [], []
    counts = {p: 0 for p in args.prompts}
    for k in range(args.num_pairs):
        counts[args.prompts[k % len(args.prompts)]] += 1
    for prompt, n_groups in counts.items():
        if n_groups == 0:
            continue
        prompt_tokens = model.to_tokens(prompt, prepend_bos=args.prepend_bos)[0]
        plen = len(prompt_tokens)
        chunks = []  # at most SAMPLE_ROWS rows per generate call: its KV cache grows with the rows
        for start in range(0, n_groups, max(1, SAMPLE_ROWS // args.group_size)):
            n = min(max(1, SAMPLE_ROWS // args.group_size), n_groups - start)
            with torch.no_grad():
                chunks.append(sample_group(model, prompt_tokens, n * args.group_size, args.max_new_tokens, eos,
                                           args.temperature))
        tokens = torch.cat([c[0] for c in chunks])  # [groups * G, s]
        mask = torch.cat([c[1] for c in chunks])
        texts = decode_completions(model, tokens, mask, prompt)
        rewards = reward_fn(texts).float().cpu().view(n_groups, args.group_size)  # [groups G]
        all_rewards.append(rewards)
        prompt_part = torch.zeros(len(tokens), plen, dtype=torch.bool, device=mask.device)  # where the mask is
        full_mask = torch.cat([prompt_part, mask], dim=1)  # [rows s]
        for i, (best, worst) in enumerate(best_worst_pairs(rewards).tolist()):
            gap = float(rewards[i, best] - rewards[i, worst])
            if gap < args.min_reward_gap:
                continue
            b, w = i * args.group_size + best, i * args.group_size + worst
            out.append((tokens[b], full_mask[b], tokens[w], full_mask[w], texts[b], texts[w], gap))
    rewards = torch.cat(all_rewards)
    return out, {"sample_reward": rewards.mean().item(), "pairs_kept": len(out), "groups": rewards.shape[0]}


def pairs_from_preferences(model: HookedTransformer, args: DPOArgs, split: str = "train") -> list[tuple]:
    """Chapter 02's preference pairs as token rows (at most ``num_pairs``, in file order), on the model's
    device. With ``direction="neg"`` the "sentiment" pairs are flipped (they prefer the more positive
    review)."""
    from rlhf_tutorial.rewards import pair_texts
    from rlhf_tutorial.worlds import load_preference_pairs

    out = []
    limit = model.cfg.n_ctx
    for pair in load_preference_pairs(args.world, split)[: args.num_pairs]:
        chosen, rejected = pair_texts(pair)
        if args.direction == "neg" and pair.get("kind") == "sentiment":
            chosen, rejected = rejected, chosen
        plen = model.to_tokens(pair.get("prompt", ""), prepend_bos=args.prepend_bos).shape[1]
        rows = []
        for text in (chosen, rejected):
            tokens = model.to_tokens(text, prepend_bos=args.prepend_bos)[0, :limit].to(device_of(model))
            mask = torch.arange(len(tokens), device=tokens.device) >= plen
            rows += [tokens, mask]
        out.append((*rows, chosen, rejected, float("nan")))
    return out


@torch.no_grad()
def to_batch(
    pairs: list[tuple], reference: HookedTransformer, sequence_logprobs: Callable = dpo.sequence_logprobs,
    max_rows: int = 64,
) -> PairBatch:
    """Stack pairs into a ``PairBatch`` (right-padded with EOS, masks False there) on the reference's
    device and compute the reference's sequence log-probs of both sides (in chunks of ``max_rows``)."""
    eos, device = eos_id(reference), device_of(reference)
    pairs = [(p[0].to(device), p[1].to(device), p[2].to(device), p[3].to(device), *p[4:]) for p in pairs]
    chosen, rejected = _pad_rows([p[0] for p in pairs], eos), _pad_rows([p[2] for p in pairs], eos)
    chosen_mask, rejected_mask = _pad_rows([p[1] for p in pairs], 0).bool(), _pad_rows([p[3] for p in pairs], 0).bool()

    def one(t: Tensor, m: Tensor) -> Tensor:  # the reference function: the harness's forward (speed.harness_speedups)
        return speed.sequence_logprobs(reference, t, m) if sequence_logprobs is dpo.sequence_logprobs else (
            sequence_logprobs(reference(t), t, m))

    def logps(tokens: Tensor, mask: Tensor) -> Tensor:
        return torch.cat([one(t, m) for t, m in zip(tokens.split(max_rows), mask.split(max_rows))])

    return PairBatch(
        chosen, chosen_mask, rejected, rejected_mask, logps(chosen, chosen_mask), logps(rejected, rejected_mask),
        torch.tensor([p[6] for p in pairs], device=device), [(p[4], p[5]) for p in pairs],
    )


# ----------------------------------------------------------------------------------------------------
# One step
# ----------------------------------------------------------------------------------------------------


def dpo_step(
    policy: HookedTransformer, optimizer: torch.optim.Optimizer, batch: PairBatch, args: DPOArgs,
    fns: dict[str, Callable], own_logprobs: bool = False,
) -> dict[str, float]:
    """One optimizer step on the DPO loss of ``batch``; the chosen and rejected rows go through the
    policy in one forward pass. Returns the loss, the implicit reward margin (mean of
    r_hat(chosen) - r_hat(rejected)), the accuracy (fraction of pairs with a positive margin) and the
    gradient norm before clipping. ``own_logprobs``: ``fns["sequence_logprobs"]`` is the learner's, so
    it gets the policy's logits; otherwise the harness's ``speed.sequence_logprobs`` computes the same."""
    optimizer.zero_grad()  # first: the last step's gradients are freed before this forward's activations are made
    width = max(batch.chosen.shape[1], batch.rejected.shape[1])
    eos = eos_id(policy)
    tokens = torch.cat([nn.functional.pad(batch.chosen, (0, width - batch.chosen.shape[1]), value=eos),
                        nn.functional.pad(batch.rejected, (0, width - batch.rejected.shape[1]), value=eos)])
    mask = torch.cat([nn.functional.pad(batch.chosen_mask, (0, width - batch.chosen_mask.shape[1])),
                      nn.functional.pad(batch.rejected_mask, (0, width - batch.rejected_mask.shape[1]))])
    logps = (fns["sequence_logprobs"](policy(tokens), tokens, mask) if own_logprobs
             else speed.sequence_logprobs(policy, tokens, mask))  # [2n]
    chosen_logps, rejected_logps = logps.split(len(batch))
    if args.loss_type == "kto":  # the pairs' completions as unpaired labels: chosen desirable, rejected undesirable
        ref_logps = torch.cat([batch.ref_chosen_logps, batch.ref_rejected_logps])
        desirable = torch.arange(len(logps), device=logps.device) < len(batch)
        z0 = (logps - ref_logps).mean()  # the batch's KL estimate; kto_loss detaches it and clamps it at 0
        loss = fns["kto_loss"](logps, ref_logps, desirable, z0, beta=args.beta, lambda_d=args.kto_lambda_d,
                               lambda_u=args.kto_lambda_u)
    elif args.loss_type == "orpo":
        loss = fns["orpo_loss"](chosen_logps, rejected_logps, batch.chosen_mask[:, 1:].sum(-1).clamp(min=1),
                                batch.rejected_mask[:, 1:].sum(-1).clamp(min=1), lam=args.orpo_lambda)
    else:
        loss = fns["dpo_loss"](chosen_logps, rejected_logps, batch.ref_chosen_logps, batch.ref_rejected_logps,
                               beta=args.beta, loss_type=args.loss_type, label_smoothing=args.label_smoothing)
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
    optimizer.step()
    with torch.no_grad():
        margin = (fns["implicit_reward"](chosen_logps, batch.ref_chosen_logps, args.beta)
                  - fns["implicit_reward"](rejected_logps, batch.ref_rejected_logps, args.beta))
    return {"loss": loss.item(), "margin": margin.mean().item(), "accuracy": (margin > 0).float().mean().item(),
            "grad_norm": float(grad_norm)}


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------

#: The chapter 06 exercises the trainer runs; any can be replaced by keyword (``learner_functions``).
PLUGGABLE = ("sequence_logprobs", "dpo_loss", "implicit_reward", "best_worst_pairs", "kto_loss", "orpo_loss")

learner_functions = learner_functions_for(PLUGGABLE)


@dataclass
class DPOResult:
    """What ``train`` returns: the models, one record per round, the evaluations before and after."""

    policy: HookedTransformer
    reference: HookedTransformer | None  # None: none was needed (``train``: given pairs, no evaluations)
    history: list[dict[str, Any]]
    eval_initial: dict[str, Any] | None
    eval_final: dict[str, Any] | None
    wall_seconds: float
    peak_memory_mb: float
    note: str | None = None  # set when some round kept no pair (that round trained nothing)


#: The training statistics of a round that kept no pair: not a number (nothing was trained).
UNTRAINED = {"loss": math.nan, "margin": math.nan, "accuracy": math.nan, "grad_norm": math.nan}


def train(
    args: DPOArgs,
    *,
    policy: HookedTransformer | None = None,
    reference: HookedTransformer | None = None,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]] | None = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
    pairs: PairBatch | None = None,
    evaluate: bool = True,
    progress: bool = True,
    **overrides: Callable,
) -> DPOResult:
    """Train ``policy`` (default: the world's policy) with DPO against the frozen ``reference`` (default:
    a copy of the policy as it starts). ``reward_fn`` (default: the world's classifier towards
    ``args.direction``) labels the sampled pairs and scores the evaluations. ``callback(record)`` gets
    each round's record. ``pairs`` (offline runs only) are used instead of drawing new ones (the
    frontier shares one set between its runs). ``evaluate=False`` skips the evaluations before, during
    and after training (then ``eval_initial`` / ``eval_final`` are None). Given ``pairs`` (which carry
    their reference log-probs) and ``evaluate=False``, nothing reads a reference: without one given,
    none is made (``DPOResult.reference`` is None), which saves a copy of the model (as TRL's
    ``precompute_ref_log_probs`` does). Wall time and peak memory cover everything after the models
    are loaded; memory is measured on the policy's device."""
    fns = bind(dpo, PLUGGABLE, overrides)
    if pairs is not None and args.online:
        raise ValueError("pairs given to an online run: online runs draw their own pairs every round")
    if args.pairs not in ("reference", "preferences"):
        raise ValueError(f"pairs must be 'reference' or 'preferences', got {args.pairs!r}")
    if policy is None:
        from rlhf_tutorial.worlds import load_policy

        policy = load_policy(args.world)
    if reference is None and (pairs is None or evaluate):
        reference = copy.deepcopy(policy)
    if reference is not None:
        reference.eval().requires_grad_(False)
    if reward_fn is None:
        from rlhf_tutorial.rewards import sentiment_reward_fn

        reward_fn = sentiment_reward_fn(args.world, args.direction)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    # fused (one kernel for all parameters, the same update) when the speed-ups are on, as in chapter 04's trainer
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=0.0,
                                  fused=args.fast or None)
    own_logprobs = "sequence_logprobs" in overrides

    def measure(n: int) -> dict[str, Any]:
        return evaluate_policy(policy, reference, reward_fn, args.prompts, n, args.max_new_tokens,
                               seed=args.seed + 1, temperature=args.temperature, prepend_bos=args.prepend_bos)

    history: list[dict[str, Any]] = []
    empty_rounds: list[int] = []
    start = time.perf_counter()
    with PeakMemory(device_of(policy)) as memory, speed.harness_speedups(args.fast):
        eval_initial = measure(args.eval_samples) if evaluate else None
        batch = pairs
        bar = tqdm(range(args.rounds), desc="DPO rounds", disable=not progress, file=sys.stderr)
        for round_ in bar:
            record: dict[str, Any] = {"round": round_}
            if batch is None or args.online:
                policy.eval()
                if args.pairs == "reference":
                    source = policy if args.online else reference
                    raw, stats = pairs_from_samples(source, reward_fn, args, fns["best_worst_pairs"])
                    record.update(stats)
                else:
                    raw = pairs_from_preferences(policy, args)
                    record["pairs_kept"] = len(raw)
                batch = to_batch(raw, reference, overrides.get("sequence_logprobs", dpo.sequence_logprobs)) if raw else None
            if batch is None:  # no pair kept: nothing to train on this round (an offline run samples again)
                empty_rounds.append(round_)
                record.update(UNTRAINED)
            else:
                policy.train()
                steps = []
                for _ in range(args.epochs):
                    order = torch.randperm(len(batch), generator=generator)
                    for rows in order.split(args.batch_size):
                        steps.append(dpo_step(policy, optimizer, batch.select(rows), args, fns, own_logprobs))
                add_stats(record, mean_stats(steps), prefix="update_")
            if evaluate:
                held_out = measure(args.eval_samples_per_round)
                add_stats(record, {k: held_out[k] for k in ("reward", "reward_se", "kl", "kl_se")}, prefix="held_out_")
                record["samples"] = list(zip(held_out["texts"], held_out["rewards"]))[: args.n_logged_samples]
            history.append(record)
            if callback is not None:
                callback(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.2f}")
        policy.eval()
        eval_final = measure(args.eval_samples) if evaluate else None
    note = None
    if empty_rounds:
        what = "any round: the policy was not updated" if len(empty_rounds) == args.rounds else (
            f"rounds {empty_rounds}: they trained nothing (their loss, margin and accuracy are NaN)")
        note = (f"no pair was kept in {what}. A group makes a pair only when its best and worst rewards differ by at "
                f"least min_reward_gap = {args.min_reward_gap:g}; try a smaller min_reward_gap, larger groups "
                "(group_size) or a reward that separates the samples.")
        print(f"DPO: {note}", file=sys.stderr)
    return DPOResult(policy, reference, history, eval_initial, eval_final, time.perf_counter() - start,
                     memory.peak_mb, note)


# ----------------------------------------------------------------------------------------------------
# Command line: python -m rlhf_tutorial train-dpo --world tiny --seed 0
# ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial train-dpo",
        description="DPO (chapter 06): tune the world's policy on preference pairs, no reward model in the loop. "
        "Flags not given keep the world's preset (DPOArgs.preset).",
    )
    add_flags(parser, DPOArgs, from_preset=True)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the tiny model runs fastest on one)")
    parser.add_argument("--report", default=None, help="write an HTML report (curves, samples) here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def args_from_namespace(ns: argparse.Namespace, world: str) -> DPOArgs:
    """The preset of ``world`` with every flag that was given."""
    given = given_flags(DPOArgs, ns)
    given.pop("world", None)
    return DPOArgs.preset(world, **given)


def _number(x: float) -> float | None:
    """``x`` rounded for a JSON summary; None for NaN (a round that trained nothing)."""
    return None if math.isnan(x) else round(x, 4)


def main(argv: list[str]) -> dict:
    """Train, evaluate before and after on ``eval_samples`` fresh samples, summarise as a dict:
    mean classifier reward before/after (with standard errors), sequence KL to the reference after,
    the pair accuracy and margin of the last round, wall time and peak memory (of the policy's device,
    where it ran: ``device``)."""
    from rlhf_tutorial.trainers.runtime import peak_memory_mb
    from rlhf_tutorial.worlds import resolve_world

    ns = _parser().parse_args(argv)
    torch.set_num_threads(ns.threads)
    world = resolve_world(ns.world)
    args = args_from_namespace(ns, world)
    start = time.perf_counter()
    result = train(args, progress=not ns.no_progress)
    wall = time.perf_counter() - start
    before, after, last = result.eval_initial, result.eval_final, result.history[-1]
    summary: dict[str, Any] = {
        "world": world,
        "seed": args.seed,
        "direction": args.direction,
        "pairs": args.pairs,
        "online": args.online,
        "loss_type": args.loss_type,
        "beta": args.beta,
        **({"kto_lambda_d": args.kto_lambda_d, "kto_lambda_u": args.kto_lambda_u} if args.loss_type == "kto" else {}),
        **({"orpo_lambda": args.orpo_lambda} if args.loss_type == "orpo" else {}),
        "mean_reward_initial": round(before["reward"], 4),
        "mean_reward_final": round(after["reward"], 4),
        "reward_se_final": round(after["reward_se"], 4),
        "kl_final": round(after["kl"], 4),
        "kl_se_final": round(after["kl_se"], 4),
        "kl_per_token_final": round(after["kl_per_token"], 4),
        "pair_accuracy_final": _number(last["accuracy"]),
        "reward_margin_final": _number(last["margin"]),
        "loss_final": _number(last["loss"]),
        "pairs_per_round": [r.get("pairs_kept") for r in result.history],
        "reward_per_round": [round(r["reward"], 4) for r in result.history],
        "kl_per_round": [round(r["kl"], 4) for r in result.history],
        "repetition_final": round(after["repetition"], 4),
        "samples_initial": before["texts"][:4],
        "samples_final": after["texts"][:4],
        "wall_seconds": round(wall, 1),
        "peak_memory_mb": round(peak_memory_mb(device_of(result.policy)), 1),
        "peak_memory_training_mb": round(result.peak_memory_mb, 1),
        "device": str(device_of(result.policy)),
        "torch_threads": ns.threads,
        "args": asdict(args),
    }
    if result.note:
        summary["note"] = result.note
    if ns.report:
        from rlhf_tutorial.widgets.dpo import write_report

        path = write_report(ns.report, summary, result.history)
        print(f"report written to {path}", file=sys.stderr)
        summary["report"] = str(path)
    return summary


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(main(sys.argv[1:]), default=float))
