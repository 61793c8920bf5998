"""Running chapter 07: sampling and measuring pass@k, supervised fine-tuning (SFT) on demonstrations,
rejection-sampling fine-tuning (expert iteration), and the commands ``train-sft``,
``train-rejection-sampling`` and ``pass-at-k``. GRPO on arithmetic is chapter 04's trainer with
``--task arithmetic`` (``trainers.grpo``), which uses this module's reward and measurements.

The pieces a learner writes (the verifier, the SFT loss, pass@k, the selection of correct samples)
live in ``rlhf_tutorial.reasoning``; ``train_sft(args, **learner_functions(globals()))`` runs a
notebook's versions in place of the reference ones (``trainers.plug``).

Every command prints a JSON summary on its last line with ``pass_at_1_initial``,
``pass_at_1_final`` and ``pass_at_k`` (k -> value, the final policy), measured on
``eval_problems`` fresh problems of the training difficulty with ``eval_samples`` samples each::

    python -m rlhf_tutorial train-sft --world tiny --seed 0
    python -m rlhf_tutorial train-rejection-sampling --world tiny --seed 0
    python -m rlhf_tutorial pass-at-k --world tiny --samples 64

``compare-reasoning`` runs the chapter's notebook end to end at its sizes (base, SFT, rejection
sampling, GRPO against the lenient and the strict verifier, pass@k up to 64, held-out difficulties,
best-of-N), so that the figures its text quotes come from a command.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial import reasoning
from rlhf_tutorial.devices import device_of, rng_devices
from rlhf_tutorial.grpo import completion_mask, decode_completions, eos_id, sample_group
from rlhf_tutorial.speed import can_fast_sample, fast_sample
from rlhf_tutorial.tiny import arith
from rlhf_tutorial.trainers.args import arg, documented, given_flags, parse_command
from rlhf_tutorial.trainers.lora import ALPHA_HELP, RANK_HELP, apply_lora, trainable
from rlhf_tutorial.trainers.lora import summary as lora_summary
from rlhf_tutorial.trainers.plug import bind, learner_functions_for

#: The exercises the trainers here run (a notebook's versions replace them by keyword).
PLUGGABLE = ("extract_answer", "verifiable_reward", "sft_loss", "pass_at_k", "select_correct")
learner_functions = learner_functions_for(PLUGGABLE)

#: The k of every pass@k table (those above the number of samples are left out).
PASS_KS = (1, 2, 4, 8, 16, 32, 64)

#: Sub-seeds of the problem sets, apart from one another and from the corpus.
SPLITS = {"sft": 1, "train": 2, "eval": 3}


def split_problems(split: str, n: int, difficulty: int = arith.TRAIN_DIFFICULTY, seed: int = 0) -> list[arith.Problem]:
    """``n`` problems of a named split ('sft': the demonstrations, 'train': RL's and rejection
    sampling's prompts, 'eval': the measurements), the same for the same arguments."""
    return arith.problems(n, seed=1000 * seed + SPLITS[split], difficulty=difficulty)


# ----------------------------------------------------------------------------------------------------
# Sampling and measuring
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def sample_completions(
    model: HookedTransformer,
    prompts: Sequence[str],
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    max_rows: int = 1024,
) -> list[list[str]]:
    """``n`` sampled completions of every prompt (text after the prompt, cut before EOS).

    Prompts of the same token length are sampled together, in chunks of at most ``max_rows`` rows
    (``speed.fast_sample``, or chapter 04's ``sample_group`` for a model it cannot run); the random
    stream is its own (``seed``), so the same call gives the same samples.
    """
    eos = eos_id(model)
    out: list[list[str]] = [[] for _ in prompts]
    tokenised = [model.to_tokens(p, prepend_bos=True)[0] for p in prompts]
    by_len: dict[int, list[int]] = {}
    for i, t in enumerate(tokenised):
        by_len.setdefault(len(t), []).append(i)
    fast = can_fast_sample(model)
    per_chunk = max(1, max_rows // n)  # prompts per chunk
    with torch.random.fork_rng(devices=rng_devices(device_of(model))):
        torch.manual_seed(seed)
        for plen, idx in sorted(by_len.items()):
            for start in range(0, len(idx), per_chunk):
                chunk = idx[start : start + per_chunk]
                if fast:
                    rows = torch.stack([tokenised[i] for i in chunk]).repeat_interleave(n, dim=0)  # [c*n plen]
                    tokens, _ = fast_sample(model, rows, max_new_tokens, eos, temperature)
                    mask = completion_mask(tokens[:, plen:], eos)
                else:
                    groups = [sample_group(model, tokenised[i], n, max_new_tokens, eos, temperature) for i in chunk]
                    tokens, mask = torch.cat([g[0] for g in groups]), torch.cat([g[1] for g in groups])
                texts = decode_completions(model, tokens, mask, "")
                for j, i in enumerate(chunk):
                    out[i] = texts[j * n : (j + 1) * n]
    return out


def pass_at_k_table(
    correct: Sequence[int], n: int, ks: Sequence[int] = PASS_KS, pass_at_k: Callable = reasoning.pass_at_k
) -> dict[int, float]:
    """Mean over problems of ``pass_at_k(n, c, k)`` for each k <= n (c: a problem's correct samples)."""
    return {k: sum(pass_at_k(n, c, k) for c in correct) / len(correct) for k in ks if k <= n}


def evaluate(
    model: HookedTransformer,
    problems: Sequence[arith.Problem],
    n: int,
    max_new_tokens: int,
    seed: int = 0,
    temperature: float = 1.0,
    ks: Sequence[int] = PASS_KS,
    extract_answer: Callable[[str], int | None] = reasoning.extract_answer,
    pass_at_k: Callable = reasoning.pass_at_k,
) -> dict[str, Any]:
    """Sample ``n`` completions of each problem and measure: ``pass_at_k`` (k -> value),
    ``pass_at_1``, ``pass_at_1_lenient`` (the same samples read by ``lenient_extract_answer``), ``correct`` (per problem, how many of the n were right by ``extract_answer``),
    ``completion_chars`` (mean length) and a few ``samples``."""
    completions = sample_completions(model, [p.prompt for p in problems], n, max_new_tokens, temperature, seed)
    correct = [sum(extract_answer(c) == p.answer for c in comps) for p, comps in zip(problems, completions)]
    lenient = [sum(reasoning.lenient_extract_answer(c) == p.answer for c in comps)
               for p, comps in zip(problems, completions)]
    table = pass_at_k_table(correct, n, ks, pass_at_k)
    texts = [c for comps in completions for c in comps]
    return {
        "pass_at_k": table,
        "pass_at_1": table[1],
        "pass_at_1_lenient": sum(lenient) / (n * len(problems)),
        "correct": correct,
        "n": n,
        "completion_chars": sum(len(t) for t in texts) / len(texts),
        "samples": [problems[0].prompt + c for c in completions[0][:3]],
        "completions": completions,
    }


def arithmetic_reward_fn(
    extract_answer: Callable[[str], int | None] = reasoning.extract_answer,
) -> Callable[[list[str]], Float[Tensor, "batch"]]:
    """The verifiable reward of texts ``prompt + completion`` (what chapter 04's trainer scores): the
    true answer is read from the prompt line (``arith.parse_prompt``), the completion's answer by
    ``extract_answer`` (``reasoning.lenient_extract_answer`` for the hackable one); 1.0 when they agree."""

    def reward_fn(texts: list[str]) -> Float[Tensor, "batch"]:
        out = []
        for text in texts:
            parsed = arith.parse_prompt(text)
            if parsed is None:
                raise ValueError(f"not a problem's prompt followed by a completion: {text[:40]!r}")
            prompt, answer = parsed
            out.append(1.0 if extract_answer(text[len(prompt):]) == answer else 0.0)
        return torch.tensor(out, dtype=torch.float32)

    return reward_fn


# ----------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------


@documented
@dataclass
class SFTArgs:
    """Every knob of supervised fine-tuning (``train-sft``: on demonstrations) and of rejection-sampling
    fine-tuning (``train-rejection-sampling``: on the model's own verified samples). The defaults are the
    tiny world's; ``SFTArgs.preset("gpt2")`` gives the GPT-2 world's (see ``PRESETS``)."""

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds the problem sets, the batch order and the sampling")
    difficulty: int = arg(arith.TRAIN_DIFFICULTY, "operations per problem (the training difficulty)")
    # supervised fine-tuning on demonstrations
    n_demonstrations: int = arg(512, "SFT: correct worked solutions (prompt, completion) to learn from")
    epochs: int = arg(1, "SFT: passes over the demonstrations")
    batch_size: int = arg(16, "sequences per optimizer step")
    learning_rate: float = arg(3e-4, "AdamW learning rate (constant; no weight decay)")
    max_grad_norm: float = arg(1.0, "clip the global gradient norm to this")
    # rejection sampling (expert iteration)
    rs_rounds: int = arg(3, "rejection sampling: rounds of sample -> verify -> fine-tune on the correct ones")
    rs_prompts: int = arg(128, "rejection sampling: fresh problems per round")
    rs_samples: int = arg(8, "rejection sampling: samples per problem (G)")
    rs_max_per_prompt: int = arg(2, "rejection sampling: most correct samples kept per problem (select_correct)")
    rs_epochs: int = arg(1, "rejection sampling: passes over each round's kept samples")
    # sampling and measuring
    max_new_tokens: int = arg(40, "most tokens of a sampled solution")
    temperature: float = arg(1.0, "sampling temperature (the measurements' too)")
    eval_problems: int = arg(64, "fresh problems of the training difficulty that pass@k is measured on")
    eval_samples: int = arg(16, "samples per problem for pass@k (k up to this)")
    # chapter 08
    lora_rank: int = arg(0, RANK_HELP)
    lora_alpha: float = arg(16.0, ALPHA_HELP)

    @classmethod
    def preset(cls, world: str, **overrides: Any) -> SFTArgs:
        """The preset of ``world`` ('tiny' or 'gpt2', any GPT-2 size) with ``overrides`` applied."""
        from rlhf_tutorial.worlds import preset_key

        return cls(**{**PRESETS[preset_key(world).split("-")[0]], "world": world, **overrides})


#: Per-world settings. The tiny preset is the one measured here (see the README's table): 512
#: demonstrations, one pass at 3e-4 (two passes at 1e-3 on 128 or 512 of them lowered pass@1: the model
#: forgets more than it learns from a handful of steps at that rate). The GPT-2
#: preset fine-tunes GPT-2 itself on the generator's demonstrations (it has never seen the format, so
#: it needs more of them and a smaller learning rate); untuned here (no GPT-2 weights offline).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "gpt2": dict(n_demonstrations=1024, epochs=3, batch_size=16, learning_rate=5e-5, max_new_tokens=40),
}


# ----------------------------------------------------------------------------------------------------
# Supervised fine-tuning
# ----------------------------------------------------------------------------------------------------


def sft_batch(
    model: HookedTransformer, pairs: Sequence[tuple[str, str]]
) -> tuple[Int[Tensor, "b s"], Bool[Tensor, "b s"]]:
    """Token rows ``BOS prompt completion EOS`` (right-padded with EOS) and the loss mask: True on the
    completion's tokens and its EOS (what SFT learns), False on BOS, the prompt and the padding."""
    eos = eos_id(model)
    rows, masks = [], []
    for prompt, completion in pairs:
        p = model.to_tokens(prompt, prepend_bos=True)[0]
        c = model.to_tokens(completion, prepend_bos=False)[0]
        rows.append(torch.cat([p, c, torch.tensor([eos], device=p.device)]))
        masks.append(torch.cat([torch.zeros(len(p), dtype=torch.bool), torch.ones(len(c) + 1, dtype=torch.bool)]))
    width = max(len(r) for r in rows)
    device = rows[0].device
    tokens = torch.full((len(rows), width), eos, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
    for i, (r, m) in enumerate(zip(rows, masks)):
        tokens[i, : len(r)] = r
        mask[i, : len(m)] = m.to(device)
    return tokens, mask


def fine_tune(
    policy: HookedTransformer,
    pairs: Sequence[tuple[str, str]],
    args: SFTArgs,
    epochs: int,
    sft_loss: Callable,
    generator: torch.Generator,
    progress: bool = True,
    desc: str = "SFT",
    adapters: nn.ModuleDict | None = None,
) -> list[float]:
    """Minimise ``sft_loss`` over ``pairs`` (prompt, completion) for ``epochs`` passes in shuffled
    minibatches of ``args.batch_size`` (AdamW, no weight decay, gradient norm clipped). Returns the
    loss of every step. With ``adapters`` (``lora_rank > 0``, attached by ``apply_lora``) only their
    A and B are trained."""
    params = list(trainable(policy, adapters))
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    losses: list[float] = []
    steps = epochs * math.ceil(len(pairs) / args.batch_size)
    bar = tqdm(total=steps, desc=desc, disable=not progress, file=sys.stderr, leave=False)
    policy.train()
    for _ in range(epochs):
        order = torch.randperm(len(pairs), generator=generator).tolist()
        for start in range(0, len(order), args.batch_size):
            tokens, mask = sft_batch(policy, [pairs[i] for i in order[start : start + args.batch_size]])
            loss = sft_loss(policy(tokens), tokens, mask)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the SFT loss is {loss.item()} at step {len(losses)}: check sft_loss")
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    policy.eval()
    return losses


@dataclass
class SFTResult:
    """What ``train_sft`` and ``train_rejection_sampling`` return."""

    policy: HookedTransformer
    losses: list[float]
    rounds: list[dict[str, Any]]  # rejection sampling: one record per round (empty for SFT)
    eval_initial: dict[str, Any] | None
    eval_final: dict[str, Any] | None
    wall_seconds: float
    adapters: nn.ModuleDict | None = None  # lora_rank > 0: the trained adapters, attached to `policy` by hooks


def _measure(policy: HookedTransformer, args: SFTArgs, fns: dict[str, Callable]) -> dict[str, Any]:
    problems = split_problems("eval", args.eval_problems, args.difficulty, args.seed)
    return evaluate(policy, problems, args.eval_samples, args.max_new_tokens, seed=args.seed + 1,
                    temperature=args.temperature, extract_answer=fns["extract_answer"], pass_at_k=fns["pass_at_k"])


def _start(args: SFTArgs, policy: HookedTransformer | None, overrides: dict) -> tuple[HookedTransformer, dict]:
    fns = bind(reasoning, PLUGGABLE, overrides)
    torch.manual_seed(args.seed)
    if policy is None:
        from rlhf_tutorial.worlds import load_reasoning_policy

        policy = load_reasoning_policy(args.world)
    return policy, fns


def train_sft(
    args: SFTArgs,
    *,
    policy: HookedTransformer | None = None,
    evaluate_before_after: bool = True,
    progress: bool = True,
    lora_functions: dict[str, Callable] | None = None,
    **overrides: Callable,
) -> SFTResult:
    """Supervised fine-tuning on ``args.n_demonstrations`` correct worked solutions of the training
    difficulty (``arith.demonstrations`` of the 'sft' split), the prompt masked out of the loss:
    ``fns["sft_loss"]``. ``policy`` defaults to the world's base model (``load_reasoning_policy``),
    trained in place. Any function of ``PLUGGABLE`` can be replaced by keyword; with ``args.lora_rank > 0``
    LoRA adapters are trained instead of the weights (``lora_functions``: the learner's LoRA pieces, as
    ``trainers.lora.learner_functions`` gives them)."""
    policy, fns = _start(args, policy, overrides)
    start = time.perf_counter()
    before = _measure(policy, args, fns) if evaluate_before_after else None
    adapters = apply_lora(policy, args.lora_rank, args.lora_alpha, seed=args.seed, **(lora_functions or {}))
    pairs = arith.demonstrations(split_problems("sft", args.n_demonstrations, args.difficulty, args.seed))
    generator = torch.Generator().manual_seed(args.seed)
    losses = fine_tune(policy, pairs, args, args.epochs, fns["sft_loss"], generator, progress, adapters=adapters)
    after = _measure(policy, args, fns) if evaluate_before_after else None
    return SFTResult(policy, losses, [], before, after, time.perf_counter() - start, adapters)


def train_rejection_sampling(
    args: SFTArgs,
    *,
    policy: HookedTransformer | None = None,
    evaluate_before_after: bool = True,
    progress: bool = True,
    callback: Callable[[dict[str, Any]], None] | None = None,
    **overrides: Callable,
) -> SFTResult:
    """Rejection-sampling fine-tuning (expert iteration), ``args.rs_rounds`` rounds of:

    1. sample ``rs_samples`` (G) solutions of each of ``rs_prompts`` fresh problems (round r's own
       problems) from the current policy;
    2. score them with ``fns["verifiable_reward"]`` as [p, G];
    3. keep ``fns["select_correct"](rewards, rs_max_per_prompt)``, and fine-tune on the kept
       (prompt, completion) pairs with ``fns["sft_loss"]`` for ``rs_epochs`` passes.

    No demonstration is used: the model learns from its own verified-correct samples. ``callback``
    gets each round's record (the samples' pass rate, how many were kept, the mean loss)."""
    policy, fns = _start(args, policy, overrides)
    start = time.perf_counter()
    before = _measure(policy, args, fns) if evaluate_before_after else None
    adapters = apply_lora(policy, args.lora_rank, args.lora_alpha, seed=args.seed)  # chapter 08; None at rank 0
    generator = torch.Generator().manual_seed(args.seed)
    losses, rounds = [], []
    for r in range(args.rs_rounds):
        problems = arith.problems(args.rs_prompts, seed=1000 * args.seed + 100 + r, difficulty=args.difficulty)
        completions = sample_completions(policy, [p.prompt for p in problems], args.rs_samples, args.max_new_tokens,
                                         args.temperature, seed=args.seed * 7919 + r)
        flat = [c for comps in completions for c in comps]
        answers = [p.answer for p in problems for _ in range(args.rs_samples)]
        rewards = fns["verifiable_reward"](flat, answers).float().view(len(problems), args.rs_samples)
        chosen = fns["select_correct"](rewards, args.rs_max_per_prompt).tolist()
        pairs = [(problems[i // args.rs_samples].prompt, flat[i]) for i in chosen]
        round_losses = fine_tune(policy, pairs, args, args.rs_epochs, fns["sft_loss"], generator, progress,
                                 desc=f"round {r + 1}", adapters=adapters) if pairs else []
        losses += round_losses
        record = {
            "round": r,
            "sample_pass_rate": rewards.mean().item(),
            "kept": len(pairs),
            "prompts_with_a_correct_sample": int((rewards.max(-1).values > 0).sum()),
            "loss": sum(round_losses) / len(round_losses) if round_losses else None,
        }
        rounds.append(record)
        if callback is not None:
            callback(record)
    after = _measure(policy, args, fns) if evaluate_before_after else None
    return SFTResult(policy, losses, rounds, before, after, time.perf_counter() - start, adapters)


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------


def pass_summary(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """The summary keys every chapter 07 command shares: ``pass_at_1_initial``, ``pass_at_1_final``,
    ``pass_at_k`` (k -> value, of the final policy) and ``pass_at_k_initial`` (the starting policy's),
    rounded to 4 places."""
    out = {"pass_at_1_final": round(after["pass_at_1"], 4),
           "pass_at_k": {str(k): round(v, 4) for k, v in after["pass_at_k"].items()},
           "samples_final": after["samples"]}
    if before is not None:
        out["pass_at_1_initial"] = round(before["pass_at_1"], 4)
        out["pass_at_k_initial"] = {str(k): round(v, 4) for k, v in before["pass_at_k"].items()}
    return out


def _parse(prog: str, description: str, argv: list[str]) -> tuple[SFTArgs, argparse.Namespace]:
    from rlhf_tutorial.worlds import resolve_world

    ns = parse_command(prog, SFTArgs, argv, description=description, from_preset=True)
    world = resolve_world(ns.world)
    given = given_flags(SFTArgs, ns)
    given.pop("world", None)
    return SFTArgs.preset(world, **given), ns


def _summary(args: SFTArgs, result: SFTResult, wall: float) -> dict[str, Any]:
    return {
        "world": args.world,
        "seed": args.seed,
        **pass_summary(result.eval_initial, result.eval_final),
        **lora_summary(result.policy, result.adapters, args.lora_rank, args.lora_alpha),
        "loss_first": round(result.losses[0], 4) if result.losses else None,
        "loss_last": round(result.losses[-1], 4) if result.losses else None,
        "steps": len(result.losses),
        "wall_seconds": round(wall, 1),
        "args": asdict(args),
    }


def sft_main(argv: list[str]) -> dict:
    """``train-sft``: supervised fine-tuning on demonstrations; JSON summary with pass@1 before and after."""
    args, ns = _parse("train-sft", "SFT (chapter 07): fine-tune the base model on correct worked solutions, "
                      "prompt masked. Flags not given keep the world's preset (SFTArgs.preset).", argv)
    start = time.perf_counter()
    result = train_sft(args, progress=not ns.no_progress)
    return _summary(args, result, time.perf_counter() - start)


def rejection_sampling_main(argv: list[str]) -> dict:
    """``train-rejection-sampling``: expert iteration on the model's own verified samples."""
    args, ns = _parse("train-rejection-sampling", "Rejection-sampling fine-tuning (chapter 07): rounds of "
                      "SFT on the model's own verified-correct samples.", argv)
    start = time.perf_counter()
    result = train_rejection_sampling(args, progress=not ns.no_progress)
    summary = _summary(args, result, time.perf_counter() - start)
    summary["rounds"] = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in result.rounds]
    return summary


@documented
@dataclass
class PassAtKArgs:
    """The ``pass-at-k`` command: measure pass@k (k = 1, 2, 4, ... up to ``samples``) of the base model,
    or of the model after SFT or rejection sampling (their presets, the same seed), on the training
    difficulty and the held-out ones."""

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds the problems, the sampling and the method's run")
    method: str = arg("base", "'base', 'sft' (train-sft first) or 'rejection-sampling' (train-rejection-sampling first)")
    samples: int = arg(64, "samples per problem (n; k goes up to it)")
    problems: int = arg(64, "fresh problems per difficulty (the 'eval' split)")
    max_new_tokens: int = arg(48, "most tokens of a sampled solution")
    temperature: float = arg(1.0, "sampling temperature")


def pass_at_k_main(argv: list[str]) -> dict:
    """``pass-at-k``: pass@k per difficulty; ``pass_at_k`` is the training difficulty's (k -> value),
    ``pass_at_k_by_difficulty`` every difficulty's; ``pass_at_1_initial`` is the base model's."""
    from rlhf_tutorial.worlds import load_reasoning_policy, resolve_world

    ns = parse_command("pass-at-k", PassAtKArgs, argv, description=pass_at_k_main.__doc__, from_preset=False)
    args = PassAtKArgs(**given_flags(PassAtKArgs, ns))
    args.world = resolve_world(args.world)
    start = time.perf_counter()
    policy = load_reasoning_policy(args.world)

    def measure(model: HookedTransformer) -> dict[int, dict[str, Any]]:
        return {d: evaluate(model, split_problems("eval", args.problems, d, args.seed), args.samples,
                            args.max_new_tokens, seed=args.seed + 1, temperature=args.temperature)
                for d in (arith.TRAIN_DIFFICULTY, *arith.HELD_OUT_DIFFICULTIES)}

    before = measure(policy)
    after = before
    if args.method != "base":
        run = {"sft": train_sft, "rejection-sampling": train_rejection_sampling}.get(args.method)
        if run is None:
            raise ValueError(f"method must be 'base', 'sft' or 'rejection-sampling', got {args.method!r}")
        run(SFTArgs.preset(args.world, seed=args.seed), policy=policy, evaluate_before_after=False,
            progress=not ns.no_progress)
        after = measure(policy)
    train_at = arith.TRAIN_DIFFICULTY
    return {
        "world": args.world,
        "method": args.method,
        "seed": args.seed,
        "difficulty": train_at,
        "pass_at_1_initial": round(before[train_at]["pass_at_1"], 4),
        **pass_summary(before[train_at], after[train_at]),
        "pass_at_k_by_difficulty": {str(d): {str(k): round(v, 4) for k, v in r["pass_at_k"].items()}
                                    for d, r in after.items()},
        "samples": args.samples,
        "problems": args.problems,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "args": asdict(args),
    }


# ----------------------------------------------------------------------------------------------------
# The chapter's notebook as one command
# ----------------------------------------------------------------------------------------------------


def binary_best_of_n_kl(p: float, n: int) -> float:
    """KL(best-of-n || pi_ref) in nats for a binary reward, when the reference is right with probability ``p``:
    best-of-n is right with probability ``q = 1 - (1 - p)^n`` and, among right (or wrong) answers, samples as
    the reference does, so the KL is that of the two outcomes:

        KL = q log(q / p) + (1 - q) log((1 - q) / (1 - p))        (0 when p is 0 or 1)
    """
    if p in (0.0, 1.0):
        return 0.0
    q = 1 - (1 - p) ** n
    return q * math.log(q / p) + ((1 - q) * math.log((1 - q) / (1 - p)) if q < 1 else 0.0)
