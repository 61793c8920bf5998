"""Chapter 04: GRPO (Group Relative Policy Optimization), critic-free RL for language models.

PPO (chapter 03) needs a value head to say how good a half-written text is. GRPO drops it: for each
prompt it samples a **group** of G completions, scores each one once (an outcome reward), and uses
the group itself as the baseline. A completion's advantage is how much better it did than its
siblings, shared by all its tokens::

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)

The loss is PPO's clipped surrogate per token, with the KL to a frozen reference inside the loss
(the k3 estimator) instead of inside the reward. The pieces, in the order the chapter builds them:

1. ``group_relative_advantages``  A from the rewards of each group ("group", "batch" or "none" scaling)
2. ``calc_grpo_objective``        clipped surrogate - beta * k3, aggregated as GRPO, DAPO or Dr. GRPO
3. ``completion_mask``            which generated tokens count: up to and including the first EOS
4. ``sample_group``               G completions of one prompt and their completion mask
5. ``reward_fn_rule``             a verifiable, rule-based reward (mention an aspect, stop within N sentences)
6. ``collect_rollout``            p groups: sample, score, advantages, old and reference log-probs;
                                  dynamic sampling drops groups whose rewards are all equal
7. ``grpo_step``                  one optimizer step on (a minibatch of) a rollout
8. ``train``                      the loop; ``ref_refresh_every`` gives the iterative variant

No value head, no GAE: the "old policy" is simply the policy at rollout time (its log-probs are
stored with the rollout), the reference is a frozen copy of the starting policy.

``train`` can run a learner's versions of the exercises in place of the reference ones:
``train(args, **learner_functions(globals()))`` from the notebook (see ``PLUGGABLE``).

``python -m rlhf_tutorial train-grpo --world tiny --direction neg --seed 0`` trains and prints a JSON
summary on its last line.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial.dpo import gspo_sequence_ratio, rloo_advantages
from rlhf_tutorial.rewards import ngram_repetition
from rlhf_tutorial.rlhf import approx_kl, get_logprobs
from rlhf_tutorial.speed import PhaseClock, can_fast_sample, fast_sample, forward_logits, harness_speedups
from rlhf_tutorial.trainer_args import add_flags, arg, gpt2_size_presets, learner_functions_for

COURSE_PROMPT = "This movie was really"

#: The prompts of a rule-reward run (``reward="rule"``): review openings of which none mentions the
#: default aspect ("acting"), so the policy has to write it. ``--prompts`` takes any list of strings.
RULE_PROMPTS = ("This movie was really", "I watched this film", "The plot was")

# ----------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------


@dataclass
class GRPOArgs:
    """Every knob of the GRPO trainer. The defaults are the tiny world's; ``GRPOArgs.preset("gpt2")``
    gives the GPT-2 world's (see ``PRESETS``).

    Sizes: one phase samples ``groups_per_phase`` groups (p) of ``group_size`` completions (G) of at
    most ``max_new_tokens`` tokens, B = p * G rows. The learning phase then makes
    ``updates_per_phase`` passes (mu) over the rollout in ``num_minibatches`` minibatches of whole
    groups: ``mu * num_minibatches`` optimizer steps per phase. Group ``i`` of phase ``k`` uses prompt
    ``prompts[(k * p + i) % len(prompts)]``.
    """

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds sampling and the minibatch order")
    # task
    reward: str = arg("sentiment", "'sentiment' (the classifier's probability) or 'rule' (reward_fn_rule)")
    direction: str = arg("neg", "sentiment the classifier reward asks for: 'neg' or 'pos'")
    aspect: str = arg("acting", "rule reward: the aspect the review must mention")
    max_sentences: int = arg(3, "rule reward: the review must end within this many sentences")
    prompts: tuple[str, ...] = arg((COURSE_PROMPT,), "prompts the groups cycle through")
    prepend_bos: bool = arg(True, "put the BOS token before each prompt")
    # sampling
    groups_per_phase: int = arg(8, "p: groups (prompts) sampled per phase")
    group_size: int = arg(8, "G: completions sampled per prompt")
    max_new_tokens: int = arg(16, "most tokens a completion may have (it ends earlier at EOS)")
    temperature: float = arg(1.0, "sampling temperature; log-probs are taken of logits / temperature")
    top_k: int | None = arg(None, "sample from the top k tokens only (None: the full distribution)")
    # phases and optimisation
    num_phases: int = arg(40, "rollout + learning phases")
    updates_per_phase: int = arg(2, "mu: passes over each rollout (only the first minibatch of the first pass has ratio 1 exactly)")
    num_minibatches: int = arg(4, "minibatches (of whole groups) per pass")
    learning_rate: float = arg(3e-4, "AdamW learning rate (constant; no weight decay)")
    max_grad_norm: float = arg(1.0, "clip the global gradient norm to this")
    # objective
    clip_eps: float = arg(0.2, "lower clip: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high]")
    clip_eps_high: float | None = arg(None, "upper clip (DAPO's clip-higher uses 0.28); None: clip_eps")
    beta: float = arg(0.1, "weight of the k3 KL to the reference inside the loss (DeepSeekMath: 0.04)")
    loss_type: str = arg("grpo", "aggregation over tokens: 'grpo', 'dapo' or 'dr_grpo'")
    scale: str = arg("group", "advantage scaling: 'group' (GRPO), 'batch', 'none' (Dr. GRPO)")
    adv_eps: float = arg(1e-4, "eps added to the std of the advantage scaling")
    advantage_estimator: str = arg("group", "'group' (group_relative_advantages with `scale`) or 'rloo' "
                                   "(chapter 06's rloo_advantages: leave-one-out baseline, no std)")
    importance_level: str = arg("token", "'token' (GRPO: clip every token's ratio) or 'sequence' (chapter 06's "
                                "GSPO: clip one length-normalised ratio per completion)")
    # variants
    dynamic_sampling: bool = arg(False, "DAPO: drop groups whose rewards are all equal, sample more")
    max_sampling_rounds: int = arg(3, "dynamic sampling: most sampling rounds per phase")
    zero_std_tol: float = arg(1e-6, "a group whose reward std is below this counts as all equal")
    ref_refresh_every: int = arg(0, "iterative GRPO: copy the policy into the reference every k phases (0: never)")
    # evaluation and logging
    eval_samples: int = arg(128, "samples drawn before and after training to measure the reward")
    n_logged_samples: int = arg(6, "samples kept per phase for the tables")
    # harness speed (what a learner's functions compute is unchanged)
    fast: bool = arg(True, "harness speed-ups (speed.py): a hook-free forward, and with the reference "
                     "sample_group our own sampler, whose log-probs are pi_old's (no second forward)")

    @classmethod
    def preset(cls, world: str, **overrides: Any) -> GRPOArgs:
        """The preset of ``world`` ('tiny' or 'gpt2'; in the GPT-2 world, of the chosen size) with ``overrides`` applied. With
        ``reward="rule"``, the prompts default to ``RULE_PROMPTS`` and completions may be 40 tokens
        long (room for a few sentences and the EOS)."""
        rule = {"prompts": RULE_PROMPTS, "max_new_tokens": 40} if overrides.get("reward") == "rule" else {}
        from rlhf_tutorial.worlds import preset_key

        return cls(**{**PRESETS[preset_key(world)], **rule, "world": world, **overrides})


#: Per-world settings. The tiny preset (the dataclass defaults) is the one measured in this repository:
#: 40 phases of 8 groups of 8 (30 reached 0.92-0.98 depending on the seed, 40 gives more margin),
#: learning rate 3e-4, beta 0.1 (0.04 let the KL climb past 0.6 per token and garbled more words),
#: 4 minibatches x 2 passes = 8 steps per phase like chapter 03's PPO.
#: The GPT-2 preset scales chapter 03's GPT-2 settings to GRPO (learning rate of the same order as
#: PPO's 8e-6 base rate, beta = 0.04 and clip 0.2 as in DeepSeekMath, 30 new tokens): it has not
#: been tuned here (no GPT-2 weights offline), treat it as a starting point.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "gpt2": dict(
        groups_per_phase=8, group_size=8, max_new_tokens=30, num_phases=200, updates_per_phase=2,
        num_minibatches=4, learning_rate=1e-5, max_grad_norm=0.5, clip_eps=0.2, beta=0.04,
    ),
}
#: gpt2-medium, gpt2-large, gpt2-xl: the gpt2 preset scaled by ``trainer_args.GPT2_SCALING`` (sources
#: there); GRPO has no warm-up and no KL threshold.
PRESETS.update(gpt2_size_presets(PRESETS["gpt2"], dict(
    lr_scale=("learning_rate",), max_grad_norm=("max_grad_norm",), clip_scale=("clip_eps",), kl_scale=("beta",),
    phases=("num_phases",),
)))

# ----------------------------------------------------------------------------------------------------
# Advantages and the objective
# ----------------------------------------------------------------------------------------------------


def group_relative_advantages(
    rewards: Float[Tensor, "p G"], scale: str = "group", eps: float = 1e-4
) -> Float[Tensor, "p G"]:
    """Advantages of G completions of each of p prompts, relative to their own group.

        A[i, j] = r[i, j] - mean_j r[i, :]                      "none"  (Dr. GRPO)
                  ... / (std_j r[i, :] + eps)                   "group" (GRPO)
                  ... / (std of all p * G rewards + eps)        "batch"

    std is torch's default (unbiased, divides by n - 1). A group whose rewards are all equal gets
    A = 0 for every member: it carries no learning signal.
    """
    # >>> exercise
    centred = rewards - rewards.mean(dim=-1, keepdim=True)  # [p G]
    if scale == "group":
        return centred / (rewards.std(dim=-1, keepdim=True) + eps)
    if scale == "batch":
        return centred / (rewards.std() + eps)
    if scale == "none":
        return centred
    raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    # <<< exercise


def calc_grpo_objective(
    logprobs: Float[Tensor, "B g"],
    old_logprobs: Float[Tensor, "B g"],
    ref_logprobs: Float[Tensor, "B g"],
    advantages: Float[Tensor, "B"],
    mask: Bool[Tensor, "B g"],
    clip_eps: float = 0.2,
    beta: float = 0.04,
    loss_type: str = "grpo",
    clip_eps_high: float | None = None,
    max_completion_len: int | None = None,
) -> Float[Tensor, ""]:
    """The GRPO objective (to maximise): a clipped surrogate minus a KL penalty, per token.

        ratio[b, t] = exp(logprobs - old_logprobs)                       = pi_theta / pi_old
        surr[b, t]  = min(ratio * A[b], clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * A[b])
        k3[b, t]    = exp(ref - logprobs) - 1 - (ref - logprobs)         (approx_kl, "k3")
        obj[b, t]   = surr - beta * k3

    Only tokens with ``mask`` True count (masked ones contribute nothing, whatever their values).
    ``clip_eps_high`` defaults to ``clip_eps``. With n_b = mask[b].sum():

        "grpo":    mean_b ( sum_t obj[b, t] / n_b )           each sequence weighs the same
        "dapo":    sum_{b, t} obj[b, t] / sum_b n_b            each token weighs the same
        "dr_grpo": sum_{b, t} obj[b, t] / (B * L)              L = max_completion_len (default g)
    """
    # >>> exercise
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)  # [B g]
    adv = advantages[:, None]  # [B 1]: one advantage for all tokens of a completion
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + high) * adv)
    per_token = surrogate - beta * approx_kl(logprobs, ref_logprobs, "k3")  # [B g]
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    tokens_per_seq = mask.sum(dim=-1)  # [B]
    if loss_type == "grpo":
        return (per_token.sum(dim=-1) / tokens_per_seq.clamp(min=1)).mean()
    if loss_type == "dapo":
        return per_token.sum() / tokens_per_seq.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        length = logprobs.shape[1] if max_completion_len is None else max_completion_len
        return per_token.sum() / (logprobs.shape[0] * length)
    raise ValueError(f"loss_type must be 'grpo', 'dapo' or 'dr_grpo', got {loss_type!r}")
    # <<< exercise


def calc_gspo_objective(
    logprobs: Float[Tensor, "B g"],
    old_logprobs: Float[Tensor, "B g"],
    ref_logprobs: Float[Tensor, "B g"],
    advantages: Float[Tensor, "B"],
    mask: Bool[Tensor, "B g"],
    clip_eps: float = 0.2,
    beta: float = 0.04,
    loss_type: str = "grpo",
    clip_eps_high: float | None = None,
    max_completion_len: int | None = None,
) -> Float[Tensor, ""]:
    """GSPO's objective (to maximise), with ``calc_grpo_objective``'s signature: one importance ratio
    per *sequence* (chapter 06's ``gspo_sequence_ratio``, the geometric mean of its token ratios),
    clipped once per sequence; the KL term stays per token, averaged over each sequence:

        s[b]   = exp( mean_t (logprobs - old_logprobs)[b, t] )          (masked mean)
        obj[b] = min(s[b] * A[b], clip(s[b], 1 - clip_eps, 1 + clip_eps_high) * A[b])
                 - beta * mean_t k3[b, t]
        mean_b obj[b]

    ``loss_type`` and ``max_completion_len`` are accepted and ignored: the sequence is the unit.
    (GSPO's paper clips its length-normalised ratio to a much narrower range, ~3e-4 / 4e-4, than
    token-level GRPO's 0.2.) ``train`` uses it when ``importance_level="sequence"``.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = gspo_sequence_ratio(logprobs, old_logprobs, mask)  # [B]
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + high) * advantages)  # [B]
    k3 = torch.where(mask, approx_kl(logprobs, ref_logprobs, "k3"), torch.zeros_like(logprobs))  # [B g]
    kl = k3.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # [B]
    return (surrogate - beta * kl).mean()


# ----------------------------------------------------------------------------------------------------
# Sampling groups
# ----------------------------------------------------------------------------------------------------


def completion_mask(completions: Int[Tensor, "b g"], eos_token_id: int) -> Bool[Tensor, "b g"]:
    """Which generated tokens belong to the completion: every token up to and including the first EOS.

        mask[b, t] = True  iff  no EOS among completions[b, :t]

    The EOS itself counts (the policy chose to stop: that choice gets the credit or the blame);
    tokens after it are padding. A row without EOS is all True (cut off at the length limit).
    """
    # >>> exercise
    is_eos = (completions == eos_token_id).long()  # [b g]
    eos_before = is_eos.cumsum(dim=-1) - is_eos  # [b g]: EOS tokens strictly before t
    return eos_before == 0
    # <<< exercise


def sample_group(
    model: HookedTransformer,
    prompt_tokens: Int[Tensor, "prompt_len"],
    group_size: int,
    max_new_tokens: int,
    eos_token_id: int,
    temperature: float = 1.0,
    top_k: int | None = None,
) -> tuple[Int[Tensor, "G s"], Bool[Tensor, "G g"]]:
    """G completions of one prompt and their completion mask (s = prompt_len + g, g = max_new_tokens).

    Sample with ``model.generate`` from G copies of the prompt, stopping at ``eos_token_id``; a row
    that stopped early is padded with EOS, and when every row stopped before ``max_new_tokens`` the
    output is padded on the right up to g = ``max_new_tokens`` (so every group has the same g).
    ``generate`` runs under ``torch.inference_mode``: clone its output. The mask covers the
    completion only (``completion_mask`` of ``tokens[:, prompt_len:]``).
    """
    prompt_len = prompt_tokens.shape[0]
    # >>> exercise
    tokens = model.generate(
        prompt_tokens[None].expand(group_size, -1),  # [G prompt_len]
        max_new_tokens=max_new_tokens,
        stop_at_eos=True,
        eos_token_id=eos_token_id,
        temperature=temperature,
        top_k=top_k,
        verbose=False,
        return_type="tokens",
    ).clone()
    missing = prompt_len + max_new_tokens - tokens.shape[1]  # > 0 when every row stopped early
    tokens = nn.functional.pad(tokens, (0, missing), value=eos_token_id)  # [G s]
    mask = completion_mask(tokens[:, prompt_len:], eos_token_id)  # [G g]
    # <<< exercise
    return tokens, mask


_SAMPLE_GROUP_CODE = sample_group.__code__  # collect_rollout samples faster when this is the one bound

#: Wall time per section of a phase (``speed.SECTIONS``); ``train`` reads it after every phase.
CLOCK = PhaseClock()


def group_token_logprobs(
    model: HookedTransformer,
    tokens: Sequence[Int[Tensor, "G s"]],
    prefix_lens: Sequence[int],
    temperature: float = 1.0,
    max_rows: int | None = None,
) -> Float[Tensor, "B g"]:
    """Log-probs of the generated tokens of every group under ``model``, groups concatenated in order.

    Groups whose rows have the same prompt length are stacked into one forward pass (no padding is
    ever needed), in chunks of at most ``max_rows`` rows (None: no limit) so that the
    ``[rows, seq, vocab]`` logits stay small. Log-probs are of ``logits / temperature`` (the
    distribution the tokens were sampled from), from chapter 03's ``get_logprobs`` with
    ``prefix_len`` = the prompt length. Gradients flow if enabled. The forward is
    ``speed.forward_logits`` (the model's own function, without hook points when it can), and only
    the positions that predict generated tokens are unembedded.
    """
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, (group_tokens, prefix_len) in enumerate(zip(tokens, prefix_lens)):
        by_shape.setdefault((group_tokens.shape[1], prefix_len), []).append(i)
    out: list[Tensor | None] = [None] * len(tokens)
    for (_, prefix_len), groups in by_shape.items():
        stacked = torch.cat([tokens[i] for i in groups])  # [rows s]
        chunks = stacked.split(max_rows) if max_rows else [stacked]
        # Only the positions that predict generated tokens are needed: logits from prefix_len - 1 on,
        # whose log-probs are those of tokens[:, prefix_len - 1:] from their second token (prefix 1).
        keep = prefix_len - 1
        logprobs = torch.cat([
            get_logprobs(forward_logits(model, chunk, keep) / temperature, chunk[:, keep:], 1)  # [rows g]
            for chunk in chunks
        ])
        for i, part in zip(groups, logprobs.split([tokens[i].shape[0] for i in groups])):
            out[i] = part
    return torch.cat(out)  # [B g]


# ----------------------------------------------------------------------------------------------------
# Rewards
# ----------------------------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"[.!?]+")


def reward_fn_rule(samples: list[str], aspect: str = "plot", max_sentences: int = 2) -> Float[Tensor, "batch"]:
    """A verifiable reward: 1.0 when the review mentions ``aspect`` and has ended within
    ``max_sentences`` sentences, else 0.0.

    - mentions: ``aspect`` appears as a whole word (case-insensitive);
    - ended: the text, stripped, ends with '.', '!' or '?' (a completion cut off by the length
      limit mid-sentence has not ended), and it holds at most ``max_sentences`` sentence endings.

    No model is involved: the reward is a rule anyone can check, so it cannot be fooled the way a
    classifier can; but it is binary, so whole groups often get the same reward (see
    ``frac_reward_zero_std``).
    """
    word = re.compile(rf"\b{re.escape(aspect)}\b", re.IGNORECASE)
    out = []
    for text in samples:
        text = text.strip()
        ended = bool(text) and text[-1] in ".!?" and len(_SENTENCE_END.findall(text)) <= max_sentences
        out.append(1.0 if ended and word.search(text) else 0.0)
    return torch.tensor(out, dtype=torch.float32)


def make_reward_fn(args: GRPOArgs) -> Callable[[list[str]], Float[Tensor, "batch"]]:
    """The task reward of ``args``: the world's sentiment classifier, or the rule."""
    if args.reward == "rule":
        return lambda texts: reward_fn_rule(texts, args.aspect, args.max_sentences)
    if args.reward == "sentiment":
        from rlhf_tutorial.rlhf import make_reward_fn as sentiment_reward

        return sentiment_reward(args.world, args.direction)
    raise ValueError(f"reward must be 'sentiment' or 'rule', got {args.reward!r}")


# ----------------------------------------------------------------------------------------------------
# Rollouts
# ----------------------------------------------------------------------------------------------------


@dataclass
class GroupRollout:
    """One phase's experience: p groups of G completions, B = p * G rows, each group's rows together.

    ``tokens[i]`` holds group i's rows (prompt + completion, ``prefix_lens[i]`` prompt tokens);
    the other tensors are indexed by row ``b = i * G + j``. ``old_logprobs`` are the policy's at
    rollout time (pi_old), ``ref_logprobs`` the frozen reference's, both of the generated tokens.
    """

    tokens: list[Int[Tensor, "G s"]]
    prefix_lens: list[int]
    prompts: list[str]
    mask: Bool[Tensor, "B g"]
    rewards: Float[Tensor, "p G"]
    advantages: Float[Tensor, "B"]
    old_logprobs: Float[Tensor, "B g"]
    ref_logprobs: Float[Tensor, "B g"]
    texts: list[str]

    @property
    def num_groups(self) -> int:
        return len(self.tokens)

    def select(self, groups: Sequence[int]) -> GroupRollout:
        """The rollout restricted to the given groups (a minibatch)."""
        size = self.rewards.shape[1]
        rows = torch.cat([torch.arange(i * size, (i + 1) * size) for i in groups])
        return GroupRollout(
            tokens=[self.tokens[i] for i in groups],
            prefix_lens=[self.prefix_lens[i] for i in groups],
            prompts=[self.prompts[i] for i in groups],
            mask=self.mask[rows],
            rewards=self.rewards[list(groups)],
            advantages=self.advantages[rows],
            old_logprobs=self.old_logprobs[rows],
            ref_logprobs=self.ref_logprobs[rows],
            texts=[self.texts[r] for r in rows.tolist()],
        )

    def minibatches(self, num_minibatches: int, generator: torch.Generator) -> list[GroupRollout]:
        """The groups in a random order, cut into ``num_minibatches`` minibatches of whole groups."""
        order = torch.randperm(self.num_groups, generator=generator).tolist()
        n = max(1, min(num_minibatches, self.num_groups))
        return [self.select(order[k::n]) for k in range(n)]


def decode_completions(
    model: HookedTransformer, tokens: Int[Tensor, "G s"], mask: Bool[Tensor, "G g"], prompt: str
) -> list[str]:
    """The texts the reward sees: the prompt, then each completion's tokens up to (not including) EOS."""
    prefix_len = tokens.shape[1] - mask.shape[1]
    eos = model.tokenizer.eos_token_id
    texts = []
    for row, row_mask in zip(tokens[:, prefix_len:], mask):
        ids = [t for t in row[row_mask].tolist() if t != eos]
        texts.append(prompt + model.tokenizer.decode(ids))
    return texts


def eos_id(model: HookedTransformer) -> int:
    """The model's end-of-text token id."""
    eos = getattr(model.tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError("the policy's tokenizer has no eos_token_id: GRPO needs completions that can end")
    return int(eos)


def collect_rollout(
    policy: HookedTransformer,
    reference: HookedTransformer,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]],
    args: GRPOArgs,
    phase: int = 0,
) -> tuple[GroupRollout | None, dict[str, Any]]:
    """Sample p groups, score them, compute advantages and the old / reference log-probs.

    1. ``sample_group`` for the prompts of the phase (see ``GRPOArgs``; the groups of one prompt are
       drawn in one call), texts cut at EOS;
    2. rewards ``reward_fn(texts)`` as [p, G]; a group whose reward std is below ``zero_std_tol`` has
       only zero advantages (``frac_reward_zero_std`` is the fraction of such groups);
    3. with ``dynamic_sampling``, such groups are dropped and new prompts sampled, for at most
       ``max_sampling_rounds`` rounds, until p groups are kept (fewer if the rounds run out);
    4. ``group_relative_advantages`` over the kept groups (``rloo_advantages`` with
       ``advantage_estimator="rloo"``), repeated over each completion's tokens by the objective;
    5. without gradients, the log-probs of the policy (pi_old: the policy *at rollout time*) and of
       the frozen reference.

    Speed (harness only): when ``sample_group`` is the reference one and the policy is GPT-2-shaped,
    the groups are drawn by ``speed.fast_sample`` (a cache of our own), whose per-token log-probs are
    pi_old's, so step 5 runs the reference forward only. Sections are timed on ``CLOCK``.

    Returns the rollout (None if every group was dropped) and the phase's rollout statistics.
    """
    p, size = args.groups_per_phase, args.group_size
    eos = eos_id(policy)
    fast = args.fast and sample_group.__code__ is _SAMPLE_GROUP_CODE and can_fast_sample(policy)
    # tokens, mask, prompt, texts, rewards, sampler log-probs (None: not kept by the sampler)
    kept: list[tuple[Tensor, Tensor, str, list[str], Tensor, Tensor | None]] = []
    all_rewards, zero_std, n_sampled, next_prompt = [], 0, 0, phase * p
    rounds = 0
    while len(kept) < p and rounds < max(1, args.max_sampling_rounds if args.dynamic_sampling else 1):
        rounds += 1
        prompts = [args.prompts[(next_prompt + k) % len(args.prompts)] for k in range(p - len(kept))]
        next_prompt += len(prompts)
        # One sample_group call per distinct prompt draws all its groups at once (n * G rows).
        sampled: dict[str, list[tuple[Tensor, Tensor, Tensor | None]]] = {}
        with CLOCK("sampling"):
            for prompt in dict.fromkeys(prompts):
                n = prompts.count(prompt)
                prompt_tokens = policy.to_tokens(prompt, prepend_bos=args.prepend_bos)[0]  # [prompt_len]
                if fast:
                    tokens, logprobs = fast_sample(policy, prompt_tokens[None].expand(n * size, -1),
                                                   args.max_new_tokens, eos, args.temperature, args.top_k)
                    mask = completion_mask(tokens[:, len(prompt_tokens):], eos)
                    logprob_groups: list = list(logprobs.split(size))
                else:
                    with torch.no_grad():
                        tokens, mask = sample_group(
                            policy, prompt_tokens, n * size, args.max_new_tokens, eos, args.temperature, args.top_k
                        )
                    logprob_groups = [None] * n
                # n groups of [G s], [G g], [G g]
                sampled[prompt] = list(zip(tokens.split(size), mask.split(size), logprob_groups))
            batch = []
            for prompt in prompts:
                tokens, mask, logprobs = sampled[prompt].pop(0)
                batch.append((tokens, mask, prompt, decode_completions(policy, tokens, mask, prompt), logprobs))
        texts = [t for group in batch for t in group[3]]
        with CLOCK("scoring"):
            rewards = reward_fn(texts).float().cpu().view(len(batch), size)  # [groups G]
        all_rewards.append(rewards)
        n_sampled += len(batch)
        for (tokens, mask, prompt, group_texts, logprobs), group_rewards in zip(batch, rewards):
            flat = bool(group_rewards.std() < args.zero_std_tol)
            zero_std += flat
            if not (args.dynamic_sampling and flat):
                kept.append((tokens, mask, prompt, group_texts, group_rewards, logprobs))

    sampled_rewards = torch.cat(all_rewards)  # [n_sampled G]
    stats: dict[str, Any] = {
        "reward": sampled_rewards.mean().item(),
        "reward_std": sampled_rewards.std().item(),
        "frac_reward_zero_std": zero_std / n_sampled,
        "groups_sampled": n_sampled,
        "groups_kept": len(kept),
        "sampling_rounds": rounds,
    }
    if not kept:
        return None, stats

    rewards = torch.stack([k[4] for k in kept])  # [p G], on the CPU
    tokens = [k[0] for k in kept]
    device = tokens[0].device
    if args.advantage_estimator == "rloo":
        advantages = rloo_advantages(rewards).flatten().to(device)  # [B]
    elif args.advantage_estimator == "group":
        advantages = group_relative_advantages(rewards, args.scale, args.adv_eps).flatten().to(device)  # [B]
    else:
        raise ValueError(f"advantage_estimator must be 'group' or 'rloo', got {args.advantage_estimator!r}")
    prefix_lens = [k[0].shape[1] - k[1].shape[1] for k in kept]
    rows = max(1, p * size // args.num_minibatches)  # the rows of one minibatch: never more logits at once
    with torch.no_grad(), CLOCK("old_logprobs"):
        if fast:  # the sampler's own: the same numbers (to ~1e-6) without a second forward
            old_logprobs = torch.cat([k[5] for k in kept])
        else:
            old_logprobs = group_token_logprobs(policy, tokens, prefix_lens, args.temperature, rows)
    with torch.no_grad(), CLOCK("ref_logprobs"):
        ref_logprobs = group_token_logprobs(reference, tokens, prefix_lens, args.temperature, rows)
    rollout = GroupRollout(
        tokens=tokens,
        prefix_lens=prefix_lens,
        prompts=[k[2] for k in kept],
        mask=torch.cat([k[1] for k in kept]),
        rewards=rewards,
        advantages=advantages,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        texts=[t for k in kept for t in k[3]],
    )
    m = rollout.mask.float()
    stats.update(
        kl=((approx_kl(old_logprobs, ref_logprobs, "k3") * m).sum() / m.sum()).item(),
        completion_len=m.sum(-1).mean().item(),
        frac_finished=_frac_finished(rollout, eos),
    )
    return rollout, stats


def _frac_finished(rollout: GroupRollout, eos: int) -> float:
    """The fraction of completions that emitted EOS (rather than being cut off)."""
    finished = [
        ((tok[:, plen:] == eos) & m).any(-1)
        for tok, plen, m in zip(rollout.tokens, rollout.prefix_lens, rollout.mask.split(rollout.rewards.shape[1]))
    ]
    return torch.cat(finished).float().mean().item()


# ----------------------------------------------------------------------------------------------------
# The learning step
# ----------------------------------------------------------------------------------------------------


def grpo_step(
    policy: HookedTransformer, optimizer: torch.optim.Optimizer, batch: GroupRollout, args: GRPOArgs
) -> dict[str, float]:
    """One optimizer step of gradient *ascent* on the GRPO objective of ``batch``.

    1. log-probs of the batch's generated tokens under the current policy, with gradients
       (``group_token_logprobs``, at ``args.temperature``);
    2. ``calc_grpo_objective`` against the batch's ``old_logprobs`` (pi_old) and ``ref_logprobs``,
       with its advantages and mask and the args' ``clip_eps``, ``beta``, ``loss_type``,
       ``clip_eps_high`` and ``max_completion_len = args.max_new_tokens``;
    3. zero the gradients, backpropagate, clip the global gradient norm to ``args.max_grad_norm``,
       step the optimizer (built with ``maximize=True``).

    Returns diagnostics: the objective, the clip fraction, the k3 KL to pi_old and to the reference,
    the gradient norm before clipping (computed after the exercise from the names ``logprobs``,
    ``objective`` and ``grad_norm``).
    """
    # >>> exercise
    logprobs = group_token_logprobs(policy, batch.tokens, batch.prefix_lens, args.temperature)  # [B g]
    objective = calc_grpo_objective(
        logprobs, batch.old_logprobs, batch.ref_logprobs, batch.advantages, batch.mask,
        clip_eps=args.clip_eps, beta=args.beta, loss_type=args.loss_type,
        clip_eps_high=args.clip_eps_high, max_completion_len=args.max_new_tokens,
    )
    optimizer.zero_grad()
    objective.backward()
    grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
    optimizer.step()
    # <<< exercise
    stats = grpo_diagnostics(logprobs.detach(), batch, args)
    stats.update(objective=objective.item(), grad_norm=float(grad_norm))
    return stats


def clipped_tokens(
    logprobs: Float[Tensor, "B g"],
    old_logprobs: Float[Tensor, "B g"],
    advantages: Float[Tensor, "B"],
    mask: Bool[Tensor, "B g"],
    clip_eps: float,
    clip_eps_high: float | None = None,
) -> Bool[Tensor, "B g"]:
    """Tokens whose ratio left the clip range on the side where the clipped branch of the min wins
    (ratio > 1 + eps_high with A > 0, ratio < 1 - eps with A < 0): their gradient is zero."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages[:, None]
    return mask & (((ratio > 1 + high) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0)))


def grpo_diagnostics(logprobs: Float[Tensor, "B g"], batch: GroupRollout, args: GRPOArgs) -> dict[str, float]:
    """Masked means of: the clip fraction, the k3 KL to pi_old and to the reference, the ratio."""
    m = batch.mask.float()
    n = m.sum().clamp(min=1)
    clipped = clipped_tokens(logprobs, batch.old_logprobs, batch.advantages, batch.mask, args.clip_eps, args.clip_eps_high)
    return {
        "clipfrac": (clipped.float().sum() / n).item(),
        "approx_kl_old": ((approx_kl(logprobs, batch.old_logprobs, "k3") * m).sum() / n).item(),
        "kl_ref": ((approx_kl(logprobs, batch.ref_logprobs, "k3") * m).sum() / n).item(),
        "ratio_mean": ((torch.exp(logprobs - batch.old_logprobs) * m).sum() / n).item(),
    }


# ----------------------------------------------------------------------------------------------------
# Evaluation, the group record for the viewer, memory
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    policy: HookedTransformer,
    reference: HookedTransformer,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]],
    args: GRPOArgs,
    n_samples: int,
    seed: int,
) -> dict[str, Any]:
    """Sample ``n_samples`` completions spread over ``args.prompts`` (its own RNG stream: the same
    seed gives the same draws) and measure the mean reward, the per-token k3 KL to ``reference``
    (``train`` passes the starting policy) and the n-gram repetition."""
    eos = eos_id(policy)
    texts, kls, masks = [], [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        per_prompt = math.ceil(n_samples / len(args.prompts))
        for prompt in args.prompts:
            prompt_tokens = policy.to_tokens(prompt, prepend_bos=args.prepend_bos)[0]
            tokens, mask = sample_group(
                policy, prompt_tokens, per_prompt, args.max_new_tokens, eos, args.temperature, args.top_k
            )
            texts += decode_completions(policy, tokens, mask, prompt)
            lp = group_token_logprobs(policy, [tokens], [len(prompt_tokens)], args.temperature)
            ref = group_token_logprobs(reference, [tokens], [len(prompt_tokens)], args.temperature)
            kls.append(approx_kl(lp, ref, "k3"))
            masks.append(mask)
    texts = texts[:n_samples]
    rewards = reward_fn(texts).float().cpu()
    mask = torch.cat(masks)[:n_samples].float()
    kl = (torch.cat(kls)[:n_samples] * mask).sum() / mask.sum()
    return {
        "reward": rewards.mean().item(),
        "kl": kl.item(),
        "repetition": ngram_repetition(texts).mean().item(),
        "completion_len": mask.sum(-1).mean().item(),
        "texts": texts,
        "rewards": rewards.tolist(),
    }


@torch.no_grad()
def group_record(policy: HookedTransformer, rollout: GroupRollout, args: GRPOArgs) -> list[dict[str, Any]]:
    """What the group viewer shows, one dict per group: the prompt, and per completion its tokens
    (as strings, the completion only, up to EOS), reward, advantage, and per token the ratio
    pi_theta / pi_old under the *current* policy and whether it is clipped."""
    logprobs = group_token_logprobs(policy, rollout.tokens, rollout.prefix_lens, args.temperature)
    ratio = torch.exp(logprobs - rollout.old_logprobs)
    clipped = clipped_tokens(
        logprobs, rollout.old_logprobs, rollout.advantages, rollout.mask, args.clip_eps, args.clip_eps_high
    )
    size = rollout.rewards.shape[1]
    groups = []
    for i, (tokens, plen) in enumerate(zip(rollout.tokens, rollout.prefix_lens)):
        completions = []
        for j in range(size):
            b = i * size + j
            n = int(rollout.mask[b].sum())
            completions.append({
                "text": rollout.texts[b],
                "tokens": [policy.tokenizer.decode([t]) for t in tokens[j, plen : plen + n].tolist()],
                "reward": float(rollout.rewards[i, j]),
                "advantage": float(rollout.advantages[b]),
                "ratio": ratio[b, :n].tolist(),
                "clipped": clipped[b, :n].tolist(),
            })
        groups.append({"prompt": rollout.prompts[i], "completions": completions})
    return groups


class PeakMemory:
    """Peak memory used while a ``with`` block runs, above what was in use when it started, in MB.

    On a GPU: ``torch.cuda.max_memory_allocated`` (reset on entry). On Linux CPUs: the process's
    peak resident set (VmHWM), reset on entry by writing 5 to ``/proc/self/clear_refs``; where that
    is not allowed, a thread samples the resident set every 20 ms. Measured this way, two trainers
    run one after the other in the same process can be compared (``ru_maxrss`` cannot be reset).
    """

    def __init__(self) -> None:
        self.peak_mb = float("nan")
        self._thread: threading.Thread | None = None

    @staticmethod
    def _rss_kb(field: str = "VmRSS") -> int:
        with open("/proc/self/status") as f:
            match = re.search(rf"{field}:\s+(\d+)", f.read())
        return int(match.group(1)) if match else 0

    def __enter__(self) -> PeakMemory:
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base = self._rss_kb()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.mode = "hwm"
        except OSError:
            self.mode = "poll"
            self._max, self._stop = self.base, threading.Event()

            def poll() -> None:
                while not self._stop.wait(0.02):
                    self._max = max(self._max, self._rss_kb())

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.peak_mb = (torch.cuda.max_memory_allocated() - self.base) / 2**20
        elif self.mode == "hwm":
            self.peak_mb = (self._rss_kb("VmHWM") - self.base) / 1024
        else:
            self._stop.set()
            self._thread.join()
            self.peak_mb = (max(self._max, self._rss_kb()) - self.base) / 1024


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------

#: The functions ``train`` lets you replace by keyword (your own version from the notebook).
PLUGGABLE = (
    "group_relative_advantages",
    "calc_grpo_objective",
    "completion_mask",
    "sample_group",
    "collect_rollout",
    "grpo_step",
    "rloo_advantages",  # chapter 06
    "gspo_sequence_ratio",  # chapter 06
    "calc_gspo_objective",  # not an exercise: built on gspo_sequence_ratio
)


learner_functions = learner_functions_for(PLUGGABLE)


def _bind(overrides: dict[str, Callable], sequence_level: bool = False) -> dict[str, Callable]:
    """The pluggable functions, with the reference ones calling each other through one shared
    namespace in which the overrides replace them (so the reference ``collect_rollout`` calls *your*
    ``sample_group``, which the reference ``sample_group`` would call ``completion_mask`` through).

    With ``sequence_level`` (GSPO), the name ``calc_grpo_objective`` in that namespace is the
    sequence-level ``calc_gspo_objective``: the reference ``grpo_step`` then optimises GSPO's
    objective. A learner's own ``grpo_step`` calls the objective of its own notebook, so it cannot be
    combined with ``sequence_level``."""
    if sequence_level and "grpo_step" in overrides and overrides["grpo_step"] is not globals()["grpo_step"]:
        raise ValueError(
            "importance_level='sequence' (GSPO) needs the reference grpo_step: yours calls your token-level "
            "calc_grpo_objective. Leave grpo_step out of the overrides for a GSPO run."
        )
    # A reference function handed back as an override (imported into a notebook, say) is no override.
    overrides = {name: fn for name, fn in overrides.items() if fn is not globals()[name]}
    shared = dict(globals())
    bound: dict[str, Callable] = {}
    for name in PLUGGABLE:
        fn = overrides.get(name, globals()[name])
        if name not in overrides and isinstance(fn, types.FunctionType):
            fn = types.FunctionType(fn.__code__, shared, fn.__name__, fn.__defaults__, fn.__closure__)
            fn.__kwdefaults__ = globals()[name].__kwdefaults__
        bound[name] = fn
    shared.update(bound)
    if sequence_level:
        shared["calc_grpo_objective"] = bound["calc_gspo_objective"]
    return bound


@dataclass
class GRPOResult:
    """What ``train`` returns: the models, every phase's record, and the evaluations."""

    policy: HookedTransformer
    reference: HookedTransformer
    history: list[dict[str, Any]]
    eval_initial: dict[str, Any] | None
    eval_final: dict[str, Any] | None
    last_rollout: GroupRollout | None
    wall_seconds: float
    peak_memory_mb: float

    @property
    def reward_per_phase(self) -> list[float]:
        return [r["reward"] for r in self.history]


def train(
    args: GRPOArgs,
    *,
    policy: HookedTransformer | None = None,
    reference: HookedTransformer | None = None,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]] | None = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
    evaluate_before_after: bool = True,
    progress: bool = True,
    **overrides: Callable,
) -> GRPOResult:
    """Train the policy with GRPO; any function named in ``PLUGGABLE`` can be replaced by keyword.

    ``policy`` defaults to the world's policy, ``reference`` to a frozen copy of the policy as it is
    at the start, ``reward_fn`` to ``make_reward_fn(args)``. Each phase: ``collect_rollout`` (the
    policy at this moment is pi_old), then ``updates_per_phase`` passes of ``grpo_step`` over
    ``num_minibatches`` minibatches; with ``ref_refresh_every = k > 0`` the reference becomes a copy
    of the policy every k phases (the iterative variant; the phases' ``kl`` is then to the current
    reference, the evaluations' to the starting policy). ``callback(record)`` gets each phase's
    record. Wall time and peak memory cover everything after the models are loaded, evaluations
    included.
    """
    unknown = set(overrides) - set(PLUGGABLE)
    if unknown:
        raise TypeError(f"train() cannot replace {sorted(unknown)}; replaceable: {PLUGGABLE}")
    if args.importance_level not in ("token", "sequence"):
        raise ValueError(f"importance_level must be 'token' or 'sequence', got {args.importance_level!r}")
    fns = _bind(overrides, sequence_level=args.importance_level == "sequence")
    torch.manual_seed(args.seed)
    if policy is None:
        from rlhf_tutorial.worlds import load_policy

        policy = load_policy(args.world)
    if reference is None:
        reference = copy.deepcopy(policy)
    reference.eval().requires_grad_(False)
    # What the evaluations measure the KL against: the starting policy. The iterative variant moves
    # its reference, so it keeps a copy of the start for that.
    anchor = copy.deepcopy(reference) if args.ref_refresh_every else reference
    reward_fn = reward_fn or make_reward_fn(args)
    # fused (one kernel for all parameters, the same update) when the speed-ups are on: 5x faster on a CPU
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate, weight_decay=0.0, maximize=True,
                                  fused=args.fast or None)
    generator = torch.Generator().manual_seed(args.seed)

    history: list[dict[str, Any]] = []
    rollout = None
    eval_initial = eval_final = None
    start = time.perf_counter()
    with PeakMemory() as memory, harness_speedups(args.fast):
        if evaluate_before_after:
            eval_initial = evaluate(policy, anchor, reward_fn, args, args.eval_samples, seed=args.seed + 1)
        bar = tqdm(range(args.num_phases), desc="GRPO phases", disable=not progress, file=sys.stderr)
        for phase in bar:
            phase_start = time.perf_counter()
            CLOCK.take()
            policy.eval()
            rollout_k, record = fns["collect_rollout"](policy, reference, reward_fn, args, phase)
            record["phase"] = phase
            if rollout_k is not None:
                rollout = rollout_k
                n = args.n_logged_samples
                record["samples"] = [
                    (t, float(r)) for t, r in zip(rollout.texts[:n], rollout.rewards.flatten()[:n].tolist())
                ]
                policy.train()
                steps = []
                with CLOCK("optimisation"):
                    for _ in range(args.updates_per_phase):
                        for minibatch in rollout.minibatches(args.num_minibatches, generator):
                            steps.append(fns["grpo_step"](policy, optimizer, minibatch, args))
                record.update({k: sum(s[k] for s in steps) / len(steps) for k in steps[0]})
            if args.ref_refresh_every and (phase + 1) % args.ref_refresh_every == 0:
                reference.load_state_dict(policy.state_dict())
                record["reference_refreshed"] = True
            record.update(CLOCK.take(), seconds_phase=time.perf_counter() - phase_start)
            history.append(record)
            if callback is not None:
                callback(record)
            bar.set_postfix(reward=f"{record['reward']:.3f}", kl=f"{record.get('kl', float('nan')):.3f}")
        policy.eval()
        if evaluate_before_after:
            eval_final = evaluate(policy, anchor, reward_fn, args, args.eval_samples, seed=args.seed + 1)
    return GRPOResult(
        policy=policy,
        reference=reference,
        history=history,
        eval_initial=eval_initial,
        eval_final=eval_final,
        last_rollout=rollout,
        wall_seconds=time.perf_counter() - start,
        peak_memory_mb=memory.peak_mb,
    )


# ----------------------------------------------------------------------------------------------------
# Command line: python -m rlhf_tutorial train-grpo --world tiny --direction neg --seed 0
# ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial train-grpo",
        description="GRPO (chapter 04): tune the world's policy with group-relative advantages and no "
        "value head. Flags not given keep the world's preset (GRPOArgs.preset).",
    )
    add_flags(parser, GRPOArgs, from_preset=True)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (the tiny model runs fastest on one, above all on a busy machine)")
    parser.add_argument("--compare", default=None,
                        help="a JSON file holding train-rlhf's summary (its last line): with --report, "
                        "the PPO-vs-GRPO figure is written")
    parser.add_argument("--report", default=None, help="write an HTML report (curves, groups) here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv: list[str]) -> dict:
    """Train, evaluate before and after on ``eval_samples`` fresh samples, summarise as a dict.

    ``mean_reward_initial`` / ``_final`` and ``kl_final`` (per token, k3, to the starting policy) come
    from those evaluations; ``frac_reward_zero_std`` is the mean over phases of the fraction of
    sampled groups whose rewards were all equal (``_final``: the last phase's); ``peak_memory_mb`` is
    the process's peak resident set (as ``train-rlhf`` reports it), ``peak_memory_training_mb`` the
    peak above what was in use when training started (``PeakMemory``).
    """
    from rlhf_tutorial.rlhf import peak_memory_mb
    from rlhf_tutorial.speed import REWARD_TARGET, time_split, time_to_reward
    from rlhf_tutorial.worlds import resolve_world

    ns = _parser().parse_args(argv)
    torch.set_num_threads(ns.threads)
    world = resolve_world(ns.world)
    given = {f.name: getattr(ns, f.name) for f in fields(GRPOArgs)
             if getattr(ns, f.name) is not None and f.name != "world"}
    if "prompts" in given:
        given["prompts"] = tuple(given["prompts"])
    args = GRPOArgs.preset(world, **given)

    start = time.perf_counter()
    result = train(args, progress=not ns.no_progress)
    wall = time.perf_counter() - start
    history, before, after = result.history, result.eval_initial, result.eval_final
    zero_std = [r["frac_reward_zero_std"] for r in history]
    summary: dict[str, Any] = {
        "world": world,
        "reward": args.reward,
        "direction": args.direction,
        "seed": args.seed,
        "mean_reward_initial": round(before["reward"], 4),
        "mean_reward_final": round(after["reward"], 4),
        "kl_final": round(after["kl"], 4),
        "frac_reward_zero_std": round(sum(zero_std) / len(zero_std), 4),
        "frac_reward_zero_std_final": round(zero_std[-1], 4),
        "repetition_initial": round(before["repetition"], 4),
        "repetition_final": round(after["repetition"], 4),
        "completion_len_initial": round(before["completion_len"], 2),
        "completion_len_final": round(after["completion_len"], 2),
        "phases": len(history),
        "samples_per_phase": args.groups_per_phase * args.group_size,
        "reward_per_phase": [round(r["reward"], 4) for r in history],
        "kl_per_phase": [round(r["kl"], 4) if "kl" in r else None for r in history],  # None: no group kept
        "frac_reward_zero_std_per_phase": [round(z, 4) for z in zero_std],
        "samples_initial": before["texts"][:4],
        "samples_final": after["texts"][:4],
        "wall_seconds": round(wall, 1),
        "train_wall_seconds": round(result.wall_seconds, 1),
        "seconds_per_phase": time_split(history),
        **time_to_reward(history, REWARD_TARGET),
        "peak_memory_mb": round(peak_memory_mb(), 1),
        "peak_memory_training_mb": round(result.peak_memory_mb, 1),
        "torch_threads": ns.threads,
        "args": asdict(args),
    }
    if ns.report:
        from rlhf_tutorial.widgets.grpo import write_report

        ppo = json.loads(open(ns.compare).read().strip().splitlines()[-1]) if ns.compare else None
        groups = group_record(result.policy, result.last_rollout, args) if result.last_rollout else []
        path = write_report(ns.report, summary, groups, ppo_summary=ppo)
        print(f"report written to {path}", file=sys.stderr)
        summary["report"] = str(path)
    return summary


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(main(sys.argv[1:]), default=float))
