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
8. ``reinforce_pp_advantages``    REINFORCE++: per-token returns (reward - KL to go), whitened over the batch
9. ``cispo_objective``            CISPO: a clipped, detached importance weight on every token's log-prob
10. ``truncated_is_weights``      the correction for a sampler whose probabilities differ from the trainer's

No value head, no GAE: the "old policy" is simply the policy at rollout time (its log-probs are
stored with the rollout), the reference is a frozen copy of the starting policy.

``group_record`` gives, per group, what the group viewer widget shows (tokens, rewards, advantages,
ratios and which tokens are clipped).

The loop that runs these pieces (``GRPOArgs``, ``train``, evaluation, the ``train-grpo`` command) is
running code: it lives in ``rlhf_tutorial.trainers.grpo``, and can run a learner's versions of the
exercises in place of the reference ones: ``train(args, **learner_functions(globals()))``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import HookedTransformer

from rlhf_tutorial.dpo import gspo_sequence_ratio, rloo_advantages
from rlhf_tutorial.ppo import clip_diagnostics, masked_mean
from rlhf_tutorial.rlhf import approx_kl
from rlhf_tutorial.speed import PhaseClock, can_fast_sample, fast_sample, token_logprobs

if TYPE_CHECKING:
    from rlhf_tutorial.trainers.grpo import GRPOArgs

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
    A = 0 for every member: it carries no learning signal. Any other ``scale`` raises ValueError.
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

    Only tokens with ``mask`` True count (masked ones contribute nothing, whatever their finite values);
    every row has at least one True (``completion_mask`` always keeps the first generated token).
    ``clip_eps_high`` defaults to ``clip_eps``. With n_b = mask[b].sum():

        "grpo":    mean_b ( sum_t obj[b, t] / n_b )           each sequence weighs the same
        "dapo":    sum_{b, t} obj[b, t] / sum_b n_b            each token weighs the same
        "dr_grpo": sum_{b, t} obj[b, t] / (B * L)              L = max_completion_len (default g)

    Any other ``loss_type`` raises ValueError.
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


def calc_token_advantage_objective(
    logprobs: Float[Tensor, "B g"],
    old_logprobs: Float[Tensor, "B g"],
    ref_logprobs: Float[Tensor, "B g"],
    advantages: Float[Tensor, "B g"],
    mask: Bool[Tensor, "B g"],
    clip_eps: float = 0.2,
    beta: float = 0.04,
    loss_type: str = "grpo",
    clip_eps_high: float | None = None,
    max_completion_len: int | None = None,
) -> Float[Tensor, ""]:
    """``calc_grpo_objective`` with one advantage per *token* (``[B, g]``): PPO's clipped surrogate per
    token with that token's advantage, minus ``beta`` times k3, aggregated as ``loss_type`` says. ``train``
    uses it when ``tis_cap > 0`` (the advantages times the truncated importance weights of the tokens).
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - old_logprobs)  # [B g]
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + high) * advantages)
    per_token = surrogate - beta * approx_kl(logprobs, ref_logprobs, "k3")
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    tokens_per_seq = mask.sum(dim=-1)
    if loss_type == "grpo":
        return (per_token.sum(dim=-1) / tokens_per_seq.clamp(min=1)).mean()
    if loss_type == "dapo":
        return per_token.sum() / tokens_per_seq.sum().clamp(min=1)
    if loss_type == "dr_grpo":
        length = logprobs.shape[1] if max_completion_len is None else max_completion_len
        return per_token.sum() / (logprobs.shape[0] * length)
    raise ValueError(f"loss_type must be 'grpo', 'dapo' or 'dr_grpo', got {loss_type!r}")


def calc_reinforce_pp_objective(
    logprobs: Float[Tensor, "B g"],
    old_logprobs: Float[Tensor, "B g"],
    ref_logprobs: Float[Tensor, "B g"],
    advantages: Float[Tensor, "B g"],
    mask: Bool[Tensor, "B g"],
    clip_eps: float = 0.2,
    beta: float = 0.04,
    loss_type: str = "grpo",
    clip_eps_high: float | None = None,
    max_completion_len: int | None = None,
) -> Float[Tensor, ""]:
    """REINFORCE++'s objective: ``calc_token_advantage_objective`` with its per-token advantages
    (``reinforce_pp_advantages``) and ``beta`` ignored, since the KL to the reference is already in the
    advantages (in the per-token rewards). ``train`` uses it when ``advantage_estimator="reinforce_pp"``.
    """
    return calc_token_advantage_objective(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, 0.0,
                                          loss_type, clip_eps_high, max_completion_len)


def calc_cispo_grpo_objective(
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
    """CISPO's objective with ``calc_grpo_objective``'s signature: ``cispo_objective`` with
    ``eps_low = clip_eps`` and ``eps_high = clip_eps_high`` (default ``clip_eps``), minus ``beta`` times
    the token-level mean of k3 to the reference (the same mean over all unmasked tokens as CISPO's).
    ``loss_type`` and ``max_completion_len`` are accepted and ignored: CISPO's mean is over tokens.
    ``train`` uses it when ``policy_loss="cispo"``.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    k3 = torch.where(mask, approx_kl(logprobs, ref_logprobs, "k3"), torch.zeros_like(logprobs))
    return cispo_objective(logprobs, old_logprobs, advantages, mask, clip_eps, high) - beta * k3.sum() / mask.sum()


# ----------------------------------------------------------------------------------------------------
# The rest of the field: REINFORCE++, CISPO, and the sampler/trainer mismatch
# ----------------------------------------------------------------------------------------------------


def reinforce_pp_advantages(
    rewards: Float[Tensor, "B"],
    logprobs: Float[Tensor, "B g"],
    ref_logprobs: Float[Tensor, "B g"],
    mask: Bool[Tensor, "B g"],
    beta: float = 0.01,
    eps: float = 1e-8,
) -> Float[Tensor, "B g"]:
    """REINFORCE++ (Hu 2025): per-token advantages with no critic and no group baseline.

    The KL to the reference goes into the reward, one penalty per token (k1 of the sampling policy's
    log-probs ``logprobs`` against ``ref_logprobs``), and the sequence reward R[b] comes at the end.
    With gamma = 1 a token's return is everything from it to the end of its completion:

        kl[b, t] = logprobs[b, t] - ref_logprobs[b, t]                        (k1)
        G[b, t]  = R[b] - beta * sum_{s >= t} mask[b, s] * kl[b, s]           (return-to-go, gamma = 1)

    The returns are then whitened over *every* unmasked token of the batch at once (not per sequence,
    not per group), as the course's ``whiten`` does, with the mean and the biased variance (divide by
    N) of the N returns where the mask is True:

        A[b, t] = (G[b, t] - mu) / sqrt(sigma^2 + eps)      where mask[b, t]
        A[b, t] = 0                                         elsewhere

    Masked positions (they may hold any finite values) count for nothing: not in the returns, not in
    mu or sigma^2. Every row has at least one True; ``beta = 0.0`` is a value (no KL term). The result
    has ``logprobs``' shape and dtype.
    """
    # >>> exercise
    kl = torch.where(mask, logprobs - ref_logprobs, torch.zeros_like(logprobs))  # [B g]
    to_go = kl.flip(-1).cumsum(-1).flip(-1)  # [B g]: sum over s >= t
    returns = rewards[:, None] - beta * to_go  # [B g]
    n = mask.sum()
    mean = torch.where(mask, returns, torch.zeros_like(returns)).sum() / n
    var = torch.where(mask, (returns - mean) ** 2, torch.zeros_like(returns)).sum() / n  # biased: / N
    advantages = (returns - mean) * torch.rsqrt(var + eps)
    return torch.where(mask, advantages, torch.zeros_like(advantages))
    # <<< exercise


def cispo_objective(
    logprobs: Float[Tensor, "B g"],
    old_logprobs: Float[Tensor, "B g"],
    advantages: Float[Tensor, "B"],
    mask: Bool[Tensor, "B g"],
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> Float[Tensor, ""]:
    """CISPO's objective (MiniMax 2025, to maximise): clip the importance *weight*, not the update.

        ratio[b, t] = exp(logprobs - old_logprobs)                             = pi_theta / pi_old
        w[b, t]     = sg( clip(ratio, 1 - eps_low, 1 + eps_high) )             a constant weight
        objective   = sum_{b, t} mask * w * A[b] * logprobs  /  sum_{b, t} mask

    sg is stop-gradient: w is a number, so the gradient at every unmasked token is w * A[b] / N,
    clipped or not (PPO's clip instead zeroes the gradient of a token whose ratio left the range on
    the side that would raise the objective). The mean is over all unmasked tokens of the batch
    (every token weighs the same, as DAPO's), not per sequence. Masked positions (any finite values)
    count for nothing; every row has at least one True. No KL term. The ratio is exact for any
    log-probs, however small (a token of probability e^-120 has a ratio too).
    """
    # >>> exercise
    ratio = torch.exp(logprobs - old_logprobs)  # [B g]
    weight = ratio.clamp(1 - eps_low, 1 + eps_high).detach()
    per_token = weight * advantages[:, None] * logprobs  # [B g]
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    return per_token.sum() / mask.sum()
    # <<< exercise


def truncated_is_weights(
    train_logprobs: Float[Tensor, "B g"],
    sampler_logprobs: Float[Tensor, "B g"],
    mask: Bool[Tensor, "B g"],
    cap: float = 2.0,
) -> Float[Tensor, "B g"]:
    """Truncated importance sampling: the correction for a sampler that is not the trainer.

    The tokens were drawn by the sampler (another engine, another precision: here bfloat16), whose
    log-probs ``sampler_logprobs`` differ a little from those the trainer computes for the same
    tokens, ``train_logprobs``. The per-token weight that makes the trainer's update an update for
    its own distribution, truncated at ``cap`` so that no token weighs too much:

        w[b, t] = min( exp(train_logprobs - sampler_logprobs), cap )     where mask[b, t]
        w[b, t] = 0                                                      elsewhere

    The weights are constants (detached: no gradient flows through them, whatever the inputs carry),
    exact for any log-probs (tiny probabilities, log-ratios of hundreds: a weight above ``cap`` is
    ``cap``), 0 on masked positions whatever they hold. Same shape and dtype as ``train_logprobs``.
    """
    # >>> exercise
    with torch.no_grad():
        weights = torch.exp(train_logprobs - sampler_logprobs).clamp(max=cap)  # [B g]
        return torch.where(mask, weights, torch.zeros_like(weights))
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Sampling groups
# ----------------------------------------------------------------------------------------------------


def completion_mask(completions: Int[Tensor, "b g"], eos_token_id: int) -> Bool[Tensor, "b g"]:
    """Which generated tokens belong to the completion: every token up to and including the first EOS.

        mask[b, t] = True  iff  no EOS among completions[b, :t]

    The EOS itself counts (the policy chose to stop: that choice gets the credit or the blame);
    tokens after it are padding. A row without EOS is all True (cut off at the length limit). The
    mask is on ``completions.device`` (build any new tensor there: ``device=completions.device``).
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
    ``generate`` runs under ``torch.inference_mode``: clone its output. The mask (``completion_mask``,
    ``[G, g]``) covers the generated tokens only: the prompt may hold the EOS id too (it is also BOS),
    and that must not end a completion. Both outputs are on the model's device, where ``generate``
    returns its tokens (a GPU when the model is on one).
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

#: Harness switches (``harness``): ``reference_kl`` False lets ``collect_rollout`` skip the reference's forward
#: where nothing learns from it (``reference_unused``; ``trainers.grpo.train(reference_kl=False)``, for a run
#: that reports no KL). A dict, not a global flag: ``trainers.plug.bind`` runs these functions in a
#: copy of this module's namespace, which shares the dict.
#: ``batched_prompts`` True: the harness's sampler draws the groups of every prompt of a token length in one
#: call (``_fast_sample_prompts``) rather than one call per prompt.
HARNESS = {"reference_kl": True, "batched_prompts": False}


@contextmanager
def harness(**settings: bool) -> Iterator[None]:
    """Within the block, ``HARNESS`` has ``settings``."""
    saved = dict(HARNESS)
    HARNESS.update(settings)
    try:
        yield
    finally:
        HARNESS.update(saved)


def reference_unused(args: GRPOArgs) -> bool:
    """Whether this phase's reference log-probs would only be reported (``HARNESS["reference_kl"]`` off, ``kl_coef`` = 0
    outside REINFORCE++): then pi_old's log-probs stand in for them. The objective weighs its KL term by
    beta = 0, so the loss and the gradients are the same numbers (the term is 0 times a finite number either
    way); the phase records no ``kl`` and its steps no ``kl_ref``."""
    return not HARNESS["reference_kl"] and args.kl_coef == 0 and args.advantage_estimator != "reinforce_pp"


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
    distribution the tokens were sampled from), chapter 03's ``get_logprobs`` with ``prefix_len`` =
    the prompt length, computed by ``speed.token_logprobs`` (the model's own function; without hook
    points, and only where a generated token is predicted, when it can). Gradients flow if enabled.
    """
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, (group_tokens, prefix_len) in enumerate(zip(tokens, prefix_lens)):
        by_shape.setdefault((group_tokens.shape[1], prefix_len), []).append(i)
    out: list[Tensor | None] = [None] * len(tokens)
    for (_, prefix_len), groups in by_shape.items():
        stacked = torch.cat([tokens[i] for i in groups])  # [rows s]
        chunks = stacked.split(max_rows) if max_rows else [stacked]
        logprobs = torch.cat([
            token_logprobs(model, chunk, prefix_len, temperature)  # [rows g]
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


# ----------------------------------------------------------------------------------------------------
# Rollouts
# ----------------------------------------------------------------------------------------------------


@dataclass
class GroupRollout:
    """One phase's experience: p groups of G completions, B = p * G rows, each group's rows together.

    ``tokens[i]`` holds group i's rows (prompt + completion, ``prefix_lens[i]`` prompt tokens);
    the other tensors are indexed by row ``b = i * G + j``. ``old_logprobs`` are the policy's at
    rollout time (pi_old), ``ref_logprobs`` the frozen reference's, both of the generated tokens.
    Devices: ``rewards`` stay on the CPU, where the reward function returns them; every other tensor
    is on the policy's device.
    """

    tokens: list[Int[Tensor, "G s"]]
    prefix_lens: list[int]
    prompts: list[str]
    mask: Bool[Tensor, "B g"]
    rewards: Float[Tensor, "p G"]
    advantages: Float[Tensor, "B"]  # [B g] (one per token) with advantage_estimator="reinforce_pp"
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
       ``advantage_estimator="rloo"``), repeated over each completion's tokens by the objective; with
       ``advantage_estimator="reinforce_pp"``, ``reinforce_pp_advantages`` per token instead (after step 5:
       it needs pi_old's and the reference's log-probs; ``kl_coef`` weighs the KL in its rewards);
    5. without gradients, the log-probs of the policy (pi_old: the policy *at rollout time*) and of
       the frozen reference.

    With ``sampler_dtype="bfloat16"`` a bfloat16 copy of the policy samples (and so the harness's own
    sampler is not used), pi_old's log-probs are the float32 policy's, and the phase records the per-token
    mismatch between the two (``mismatch_*``); with ``tis_cap > 0`` each token's advantage is multiplied
    by ``truncated_is_weights(pi_old, sampler, mask, tis_cap)`` (the advantages become ``[B, g]``).

    Speed (harness only): when ``sample_group`` is the reference one and the policy is GPT-2-shaped,
    the groups are drawn by ``speed.fast_sample`` (a cache of our own), whose per-token log-probs are
    pi_old's, so step 5 runs the reference forward only. Sections are timed on ``CLOCK``.

    Returns the rollout (None if every group was dropped) and the phase's rollout statistics: the
    sampled groups' mean reward, the fraction of all-equal groups, and over the kept groups the k3 KL
    to the reference, the policy's ``entropy`` per token (estimated on its own samples: the mean of
    -log pi_old over completion tokens, whose expectation is the entropy), the completion length and
    the fraction of completions that ended with EOS.
    """
    p, size = args.groups_per_phase, args.group_size
    eos = eos_id(policy)
    fast = (args.fast and sample_group.__code__ is _SAMPLE_GROUP_CODE and can_fast_sample(policy)
            and args.sampler_dtype == "float32")
    sampler = policy
    if args.sampler_dtype != "float32":  # a low-precision copy of the policy samples, as an inference engine would
        sampler = copy.deepcopy(policy).to(getattr(torch, args.sampler_dtype))
        sampler.cfg.dtype = getattr(torch, args.sampler_dtype)
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
            if fast and HARNESS["batched_prompts"]:
                sampled = _fast_sample_prompts(policy, prompts, args, eos)
            for prompt in dict.fromkeys(() if sampled else prompts):
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
                            sampler, prompt_tokens, n * size, args.max_new_tokens, eos, args.temperature, args.top_k
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
    elif args.advantage_estimator == "reinforce_pp":
        advantages = None  # per token: needs the log-probs, below
    else:
        raise ValueError(f"advantage_estimator must be 'group', 'rloo' or 'reinforce_pp', got "
                         f"{args.advantage_estimator!r}")
    prefix_lens = [k[0].shape[1] - k[1].shape[1] for k in kept]
    rows = max(1, p * size // args.num_minibatches)  # the rows of one minibatch: never more logits at once
    with torch.no_grad(), CLOCK("old_logprobs"):
        if fast:  # the sampler's own: the same numbers (to ~1e-6) without a second forward
            old_logprobs = torch.cat([k[5] for k in kept])
        else:
            old_logprobs = group_token_logprobs(policy, tokens, prefix_lens, args.temperature, rows)
    unused = reference_unused(args)
    with torch.no_grad(), CLOCK("ref_logprobs"):
        ref_logprobs = old_logprobs if unused else group_token_logprobs(reference, tokens, prefix_lens,
                                                                       args.temperature, rows)
    mask = torch.cat([k[1] for k in kept])
    if advantages is None:  # REINFORCE++: the KL to the reference in the per-token rewards, whitened over the batch
        advantages = reinforce_pp_advantages(rewards.flatten().to(device), old_logprobs, ref_logprobs, mask,
                                             args.kl_coef)  # [B g]
    mismatch: dict[str, float] = {}
    if sampler is not policy:  # the sampler's own log-probs of its tokens: mu, beside the trainer's pi_old
        with torch.no_grad(), CLOCK("old_logprobs"):
            sampler_logprobs = group_token_logprobs(sampler, tokens, prefix_lens, args.temperature, rows).float()
        diff = (old_logprobs - sampler_logprobs)[mask]
        mismatch = {
            "mismatch_abs_logratio": diff.abs().mean().item(),
            "mismatch_max_abs_logratio": diff.abs().max().item(),
            "mismatch_abs_prob": (old_logprobs.exp() - sampler_logprobs.exp())[mask].abs().mean().item(),
            "mismatch_kl": (-diff).mean().item(),  # KL(mu || pi_old) estimated on mu's samples (k1)
            "mismatch_frac_above_cap": (diff.exp() > args.tis_cap).float().mean().item() if args.tis_cap else 0.0,
        }
        if args.tis_cap:
            weights = truncated_is_weights(old_logprobs, sampler_logprobs, mask, args.tis_cap)  # [B g]
            mismatch["tis_weight_mean"] = weights[mask].mean().item()
            advantages = (advantages if advantages.dim() == 2 else advantages[:, None]) * weights  # [B g]
    rollout = GroupRollout(
        tokens=tokens,
        prefix_lens=prefix_lens,
        prompts=[k[2] for k in kept],
        mask=mask,
        rewards=rewards,
        advantages=advantages,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        texts=[t for k in kept for t in k[3]],
    )
    m = rollout.mask.float()
    if not unused:
        stats["kl"] = ((approx_kl(old_logprobs, ref_logprobs, "k3") * m).sum() / m.sum()).item()
    stats.update(
        # the policy's entropy per token, estimated on its own samples: mean of -log pi_old(token)
        entropy=(-(old_logprobs * m).sum() / m.sum()).item(),
        completion_len=m.sum(-1).mean().item(),
        frac_finished=_frac_finished(rollout, eos),
        **mismatch,
    )
    return rollout, stats


def _fast_sample_prompts(policy: HookedTransformer, prompts: list[str], args: GRPOArgs,
                        eos: int) -> dict[str, list[tuple[Tensor, Tensor, Tensor]]]:
    """``collect_rollout``'s groups drawn by ``speed.fast_sample`` with every prompt of the same token length in
    one call (``HARNESS["batched_prompts"]``): the same distribution as one call per prompt, other random draws
    (the stream is spent in another order), far fewer steps of a few rows. Per prompt, its groups as
    ``(tokens [G s], mask [G g], log-probs [G g])``."""
    size = args.group_size
    distinct = list(dict.fromkeys(prompts))
    by_len: dict[int, list[tuple[str, Tensor]]] = {}
    for prompt in distinct:
        prompt_tokens = policy.to_tokens(prompt, prepend_bos=args.prepend_bos)[0]  # [prompt_len]
        by_len.setdefault(len(prompt_tokens), []).append((prompt, prompt_tokens))
    sampled: dict[str, list[tuple[Tensor, Tensor, Tensor]]] = {}
    for prompt_len, group in by_len.items():
        counts = [prompts.count(prompt) * size for prompt, _ in group]
        rows = torch.cat([t[None].expand(c, -1) for (_, t), c in zip(group, counts)])  # [sum(counts) prompt_len]
        tokens, logprobs = fast_sample(policy, rows, args.max_new_tokens, eos, args.temperature, args.top_k)
        mask = completion_mask(tokens[:, prompt_len:], eos)
        for (prompt, _), t, m, lp in zip(group, tokens.split(counts), mask.split(counts), logprobs.split(counts)):
            sampled[prompt] = list(zip(t.split(size), m.split(size), lp.split(size)))
    return sampled


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
        clip_eps=args.clip_coef, beta=args.kl_coef, loss_type=args.loss_type,
        clip_eps_high=args.clip_coef_high, max_completion_len=args.max_new_tokens,
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
    adv = advantages if advantages.dim() == 2 else advantages[:, None]  # [B g] with REINFORCE++'s per-token ones
    return mask & (((ratio > 1 + high) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0)))


def grpo_diagnostics(logprobs: Float[Tensor, "B g"], batch: GroupRollout, args: GRPOArgs) -> dict[str, float]:
    """Masked means over the completion tokens, beside the loss:

    - ``approx_kl``, ``clipfrac``: chapter 01's ``clip_diagnostics`` (KL(pi_old || pi_theta), k3, and
      the share of ratios with ``|r - 1| > clip_eps``), the same definitions as PPO's;
    - ``clip_active_frac``: the share of tokens whose *clipped branch wins* (``clipped_tokens``:
      r > 1 + eps_high with A > 0, or r < 1 - eps with A < 0), whose gradient is zero. It is at most
      ``clipfrac`` and depends on the advantage's sign;
    - ``kl_ref``: k3 KL to the reference; ``ratio_mean``: mean of r.
    """
    clipped = clipped_tokens(logprobs, batch.old_logprobs, batch.advantages, batch.mask, args.clip_coef, args.clip_coef_high)
    return {
        **clip_diagnostics(logprobs, batch.old_logprobs, args.clip_coef, batch.mask),  # approx_kl, clipfrac
        "clip_active_frac": masked_mean(clipped, batch.mask).item(),
        "kl_ref": masked_mean(approx_kl(logprobs, batch.ref_logprobs, "k3"), batch.mask).item(),
        "ratio_mean": masked_mean(torch.exp(logprobs - batch.old_logprobs), batch.mask).item(),
    }


# ----------------------------------------------------------------------------------------------------
# Per-group records (what the group viewer shows)
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def group_record(policy: HookedTransformer, rollout: GroupRollout, args: GRPOArgs) -> list[dict[str, Any]]:
    """What the group viewer shows, one dict per group: the prompt, and per completion its tokens
    (as strings, the completion only, up to EOS), reward, advantage, and per token the ratio
    pi_theta / pi_old under the *current* policy and whether it is clipped."""
    logprobs = group_token_logprobs(policy, rollout.tokens, rollout.prefix_lens, args.temperature)
    ratio = torch.exp(logprobs - rollout.old_logprobs)
    clipped = clipped_tokens(
        logprobs, rollout.old_logprobs, rollout.advantages, rollout.mask, args.clip_coef, args.clip_coef_high
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
                "advantage": float(rollout.advantages[b, :n].mean() if rollout.advantages.dim() == 2
                                   else rollout.advantages[b]),  # REINFORCE++: the mean over its tokens
                "ratio": ratio[b, :n].tolist(),
                "clipped": clipped[b, :n].tolist(),
            })
        groups.append({"prompt": rollout.prompts[i], "completions": completions})
    return groups
