"""Checkers for chapter 04: GRPO.

- ``group_relative_advantages`` and ``calc_grpo_objective`` (the contract exercises) and
  ``completion_mask`` are compared with the reference on seeded cases, with catalogued mistakes;
- ``sample_group`` is random, so it is checked by its properties: shapes and dtypes, the prompt in
  front, the mask agreeing with the sampled tokens (EOS counted, what follows masked), G different
  samples, the output padded when every row stopped early, and the first sampled token following
  the model's distribution at the given temperature;
- ``grpo_step`` is run twice from the same start as the reference (plain SGD, so that every factor
  of the gradient shows in the parameters) and the parameter updates are compared; known wrong steps
  are run the same way to name the mistake.

Regimes probed (where plausible implementations differ):
- group_relative_advantages: rewards that barely differ (eps matters, for "group" and "batch"), an
  all-equal group (std 0), a batch of 1, 0/1 rewards in a square batch (dim 0 vs dim -1), each scale (an
  attempt raising for one is told that mode is missing), unknown scales (they must raise);
- calc_grpo_objective: completions of 1 to g tokens with junk under the mask, each loss type,
  max_completion_len > g, clip-higher, zero advantages (the KL alone), negative advantages with ratios
  up to 12 and beta = 0 (a dual clip shows only there), a reference far from the policy (|logr| up to
  15: a clamped log-ratio or k3 shows only there), log-ratios to pi_old of +-6 to +-12 with both signs of
  advantage (a log-ratio clamped "to be safe" shows there, in the value; a clamp below -10 only in the
  gradient of a lone token at log r = -11), beta = 0 and clip_eps_high = 0 (values, not unset), a lower
  clip of 0.3 on negative advantages, a batch of 1 whose completion is one token; unknown loss types raise;
- completion_mask: EOS first, last, absent, repeated, EOS padding;
- sample_group: rows stopping early and not, every row stopping at once (padding), a prompt starting
  with the EOS token (BOS = EOS: a whole-sequence mask), the padding token after EOS, the temperature;
- sample_group also: max_new_tokens above generate's own default (10) from a model that never stops;
- grpo_step: dapo with the gradient clip active (every arg away from calc_grpo_objective's defaults);
  dr_grpo with max_new_tokens above the batch's g and the clip inactive (the objective's scale,
  max_completion_len); the grad_norm reported, when there is one, is the norm before clipping.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from functools import partial

import torch
from torch import nn
from transformer_lens import HookedTransformer

from rlhf_tutorial import grpo
from rlhf_tutorial.checks import fixtures
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    check_device,
    checker,
    compare_gradients,
    compare_to_reference,
    expect_tensor,
    failure,
    fmt,
    is_stub_raise,
    seeded,
    to_device,
)
from rlhf_tutorial.rlhf import approx_kl
from rlhf_tutorial.trainers.grpo import GRPOArgs
from rlhf_tutorial.trainers.plug import DIFFERENTIATED

CHAPTER = "04_grpo"

#: The contract of each exercise (its CURRICULUM.md row and its docstring), clause by clause; the checker
#: tests hold a version breaking each (``VIOLATIONS``), and ``tests/checks/test_contract_clauses.py`` holds
#: the two together.
CLAUSES = {
    "group_relative_advantages": {
        "group_mean": "the baseline of a completion is the mean of its own group (a row), not of the batch "
                      "nor of a column",
        "group_std": 'for "group" the centred rewards are divided by their own group\'s std plus eps',
        "unbiased_std": "the std is torch's default, unbiased one (divides by n - 1)",
        "eps_added": "eps is added to the std (not inside a square root, not left out: an all-equal group "
                     "gets 0, not NaN)",
        "eps_honoured": "the eps argument is used, whatever its value",
        "batch_mode": 'for "batch" the group-centred rewards are divided by the std of all p * G rewards plus '
                      "eps (an answer, not a raise)",
        "none_mode": 'for "none" the rewards are only centred, never divided',
        "unknown_scale": "any other scale raises an error instead of returning something",
        "not_in_place": "the rewards tensor is never modified in place",
        "dtype": "the advantages have the rewards' shape and dtype",
    },
    "calc_grpo_objective": {
        "ratio": "the ratio is exp(logprobs - old_logprobs) = pi_theta / pi_old",
        "pessimistic_min": "the surrogate is the min of ratio * A and clip(ratio) * A",
        "clip_eps": "the ratio is clipped at 1 - clip_eps below, with the clip_eps given",
        "clip_eps_high": "the ratio is clipped at 1 + clip_eps_high above, clip_eps_high given (0.0 included: "
                         "a value, not unset)",
        "clip_eps_high_default": "clip_eps_high None means clip_eps",
        "no_dual_clip": "no floor on the surrogate of negative-advantage tokens (no dual clip)",
        "large_log_ratios": "the log-ratio to pi_old is not clamped: at |log r| up to 12, with either sign of "
                            "advantage, value and gradient are those of exp(log r) * A",
        "k3": "the KL term is k3 of the policy against the reference, exp(ref - logprobs) - 1 - (ref - logprobs), "
              "not k1, k2 nor k3 with its arguments swapped",
        "k3_exact": "k3 is exact however far the reference is (no clamp of its log-ratio or of k3)",
        "kl_subtracted": "the KL penalty is subtracted from the surrogate (the objective is maximised)",
        "kl_to_reference": "the KL is measured against ref_logprobs, not old_logprobs",
        "beta": "beta scales the KL term, beta = 0.0 included (a value, not unset)",
        "mask": "masked tokens count for nothing, whatever their values, in the sums and in the token counts",
        "grpo_aggregation": '"grpo" is the mean over sequences of (masked sum / that sequence\'s token count)',
        "dapo_aggregation": '"dapo" is the masked sum over the batch / the total number of unmasked tokens',
        "dr_grpo_aggregation": '"dr_grpo" is the masked sum / (B * max_completion_len)',
        "max_completion_len": "max_completion_len is honoured when given and defaults to g",
        "differentiable": "the objective is differentiable in logprobs, with the reference's gradient",
        "not_in_place": "no input tensor is modified in place",
        "scalar": "the result is a 0-dim tensor",
        "unknown_loss_type": "any other loss_type raises an error (ValueError) instead of returning something",
    },
    "completion_mask": {
        "eos_counted": "the first EOS itself is True (it belongs to the completion)",
        "after_eos_masked": "every token after the first EOS is False",
        "first_eos": "the mask stops at the first EOS, not at a later one",
        "no_eos": "a row without EOS is all True",
        "eos_argument": "the EOS is the eos_token_id given, not a fixed id",
        "bool": "the mask is a bool tensor of the completions' shape",
    },
    "sample_group": {
        "shape": "the tokens are [G, prompt_len + max_new_tokens] int64, the mask [G, max_new_tokens] bool",
        "prompt_first": "every row starts with the prompt",
        "group_sampled": "the G rows are G samples, not one sample repeated",
        "stops_at_eos": "sampling stops at eos_token_id: what follows a row's first EOS is EOS padding",
        "eos_argument": "the eos_token_id argument stops the rows and ends the mask (not a fixed id)",
        "padded": "when every row stopped early the output is padded with EOS up to max_new_tokens",
        "mask_counts_eos": "the mask is True up to and including the first EOS, False after",
        "mask_completion_only": "the mask is computed on the generated tokens only (a prompt that starts "
                                "with the EOS id does not end the completion)",
        "temperature": "the samples follow the model's distribution at the temperature given",
        "top_k": "top_k is honoured",
    },
    "grpo_step": {
        "temperature": "the log-probs are those of logits / args.temperature",
        "old_logprobs": "the ratio is to the batch's stored old_logprobs (pi_old)",
        "reference": "the KL is to the batch's ref_logprobs",
        "args_passed": "clip_coef, kl_coef, loss_type and clip_coef_high of args reach the objective",
        "max_completion_len": "max_completion_len = args.max_new_tokens reaches the objective",
        "zero_grad": "the gradients are zeroed before each backward pass",
        "ascent": "the update ascends the objective (the optimizer is built with maximize=True)",
        "grad_clip": "the global gradient norm is clipped to args.max_grad_norm before the step",
        "steps": "the optimizer steps once: the parameters move",
        "objective_returned": "the diagnostics hold the objective of the step, before the update",
        "grad_norm": "the grad_norm reported is the global norm before clipping",
        "batch_read_only": "the batch's tensors are never modified",
    },
    "reinforce_pp_advantages": {
        "kl_per_token": "each token's reward holds its own KL penalty, k1 = logprobs - ref_logprobs (not k3, not the "
                        "reference over the policy), subtracted with weight beta",
        "beta": "beta scales the KL penalty, beta = 0.0 included (a value, not unset)",
        "returns_to_go": "a token's return sums the KL penalties of that token and every later one (not the earlier "
                         "ones, not the whole sequence's)",
        "gamma_one": "gamma = 1: no discount, and every token's return holds the whole sequence reward (not only the "
                     "last token's)",
        "batch_whitening": "the returns are whitened over every unmasked token of the whole batch at once (one mean, one "
                           "variance; not per sequence, not per group)",
        "masked_statistics": "the mean and variance are over the unmasked (True) tokens only, not over every position",
        "biased_variance": "the variance is the biased one (divides by N, the number of unmasked tokens), as whiten's",
        "scaled": "the centred returns are divided by sqrt(sigma^2 + eps): whitened, not only centred",
        "eps": "eps is added to the variance inside the square root, and the eps given is used",
        "no_clip": "the advantages are not clipped: an outlier among many tokens keeps its whitened value (above 10)",
        "masked_zero": "the advantages are 0 wherever the mask is False",
        "masked_ignored": "masked positions' log-probs (junk) count for nothing in the returns",
        "not_in_place": "no input tensor is modified in place",
        "dtype": "the advantages have logprobs' shape and dtype",
    },
    "cispo_objective": {
        "ratio": "the ratio is exp(logprobs - old_logprobs) = pi_theta / pi_old",
        "weight_times_logprob": "each token contributes weight * A * logprobs (not PPO's min(ratio * A, clip(ratio) * A))",
        "maximised": "the result is the objective to maximise (+ weight * A * logprobs), not its negative, a loss",
        "detached_weight": "the clipped ratio is a detached weight: the gradient is weight * A / N at each token, with "
                           "no term through the ratio",
        "clipped_tokens_keep_gradient": "tokens whose ratio left the clip range keep their gradient (through logprobs), "
                                        "with the clipped weight (not dropped, not zeroed)",
        "eps_low": "the weight is clipped at 1 - eps_low below, the eps_low given (0.0 included)",
        "eps_high": "the weight is clipped at 1 + eps_high above, the eps_high given (0.0 included)",
        "token_mean": "the mean is over all unmasked tokens of the batch (masked sum / number of True), not a mean of "
                      "per-sequence means",
        "mask": "masked tokens count for nothing, whatever their values, in the sum and in the count",
        "large_log_ratios": "exact for tokens of tiny probability (log-probs near -120): the ratio is the exponential "
                            "of the difference",
        "differentiable": "the objective is differentiable in logprobs",
        "not_in_place": "no input tensor is modified in place",
        "scalar": "the result is a 0-dim tensor",
    },
    "truncated_is_weights": {
        "ratio": "the weight is exp(train_logprobs - sampler_logprobs): the trainer's probability over the sampler's",
        "cap": "weights above cap are cap, the cap given",
        "above_only": "only the top is truncated: a weight below 1 / cap stays what it is",
        "per_token": "one weight per token, not one per sequence",
        "masked_zero": "the weight is 0 wherever the mask is False, whatever the masked positions hold (even where "
                       "their exponential overflows)",
        "large_log_ratios": "exact for log-ratios of hundreds and for tokens of tiny probability (log-probs near -115)",
        "detached": "the weights carry no gradient, even when train_logprobs does",
        "not_in_place": "no input tensor is modified in place",
        "dtype": "the weights have train_logprobs' shape and dtype",
    },
}
small_model = partial(fixtures.small_model, n_ctx=64)


def one_thread(fn):
    """Run a checker on one torch thread: these small models run faster on one, above all on a busy CPU."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


# ----------------------------------------------------------------------------------------------------
# group_relative_advantages
# ----------------------------------------------------------------------------------------------------


def _adv_cases() -> list[Case]:
    g = seeded(0)
    spread = torch.tensor([[0.500, 0.504, 0.498, 0.507], [0.90, 0.91, 0.905, 0.899]])  # std ~ 0.004
    mixed = torch.randn(3, 6, generator=g)
    mixed[1] = 0.7  # one group whose rewards are all equal
    return [
        Case("rewards that barely differ (eps matters)", (spread,), {"scale": "group", "eps": 1e-4}),
        Case("4 prompts x 6 completions", (torch.randn(4, 6, generator=g),), {"scale": "group", "eps": 1e-4}),
        Case("a batch of 1 (one prompt, G = 5)", (torch.rand(1, 5, generator=g),), {"scale": "group", "eps": 1e-4}),
        Case("a group whose rewards are all equal", (mixed,), {"scale": "group", "eps": 1e-4}),
        Case("0/1 rewards with 3 prompts x 3 (square)", (torch.tensor([[1.0, 0, 0], [1, 1, 0], [0, 0, 1]]),),
             {"scale": "group", "eps": 1e-4}),
        Case('scale="batch"', (torch.randn(3, 4, generator=g) * 2 + 1,), {"scale": "batch", "eps": 1e-4}),
        Case('scale="batch", rewards that barely differ (eps matters)',
             (torch.tensor([[0.500, 0.504, 0.498], [0.503, 0.501, 0.499]]),), {"scale": "batch", "eps": 1e-4}),
        Case('scale="none"', (torch.randn(3, 4, generator=g),), {"scale": "none", "eps": 1e-4}),
        Case("eps = 0.5", (torch.randn(2, 4, generator=g),), {"scale": "group", "eps": 0.5}),
    ]


def _adv_variant(*, center="group", std="group", unbiased=True, eps_mode="add", none_divides=False):
    """A configurable (possibly wrong) group_relative_advantages."""

    def fn(rewards, scale="group", eps=1e-4):
        if center == "group":
            centred = rewards - rewards.mean(-1, keepdim=True)
        elif center == "batch":
            centred = rewards - rewards.mean()
        else:  # over prompts (dim 0)
            centred = rewards - rewards.mean(0, keepdim=True)
        if scale == "none" and not none_divides:
            return centred
        kind = "batch" if scale == "batch" else std
        if kind == "group":
            var = rewards.var(-1, keepdim=True, unbiased=unbiased)
        elif kind == "batch":
            var = rewards.var(unbiased=unbiased)
        else:
            var = rewards.var(0, keepdim=True, unbiased=unbiased)
        if eps_mode == "add":
            return centred / (var.sqrt() + eps)
        if eps_mode == "none":
            return centred / var.sqrt()
        if eps_mode == "fixed":
            return centred / (var.sqrt() + 1e-4)
        return centred / (var + eps).sqrt()  # eps inside the square root

    return fn


ADV_MISTAKES = [
    Mistake("You used the population std (unbiased=False, divides by G). The contract uses torch's default, "
            "the unbiased std (divides by G - 1), over each group.",
            _adv_variant(unbiased=False)),
    Mistake("There is no eps: divide by (std + eps). Without it a group whose rewards barely differ gets "
            "huge advantages, and an all-equal group gives 0 / 0 = NaN.", _adv_variant(eps_mode="none")),
    Mistake("eps is inside the square root: the contract adds it to the std, (r - mean) / (std + eps).",
            _adv_variant(eps_mode="sqrt")),
    Mistake("eps is hard-coded: use the `eps` argument.", _adv_variant(eps_mode="fixed")),
    Mistake('For scale="group" the std is over the batch (all p*G rewards): take it over each group '
            "(along the last dim). (Over the batch is what scale=\"batch\" does.)", _adv_variant(std="batch")),
    Mistake("You subtracted the mean of the whole batch: the baseline is each group's own mean "
            "(one mean per row).", _adv_variant(center="batch")),
    Mistake("You subtracted the batch mean and divided by the batch std: that is whitening, not a group baseline.",
            _adv_variant(center="batch", std="batch")),
    Mistake("You normalised over dim 0 (across prompts): a group is a row, the G completions of one prompt "
            "(the last dim).", _adv_variant(center="prompts", std="prompts")),
    Mistake('scale="none" (Dr. GRPO) only centres the rewards: do not divide by a std.',
            _adv_variant(none_divides=True)),
]


@checker(
    "group_relative_advantages",
    chapter=CHAPTER,
    hint=(
        "Each row of `rewards` is one group: the baseline and the scale of a completion come from its "
        "own row (or, for 'batch', from all rewards). Reduce along the last dim and keep it, so the "
        "result broadcasts.",
        "A[i, j] = (r[i, j] - mean_j r[i, :]) / (s + eps), where s is row i's standard deviation for "
        "'group', the standard deviation of all p * G rewards for 'batch'; for 'none' there is no "
        "division (and no eps). Use torch's default, unbiased std (divides by n - 1). Any other scale "
        "raises ValueError naming the three.",
        "```python\ncentred = rewards - rewards.mean(dim=-1, keepdim=True)\nif scale == \"group\":\n    "
        "return centred / (rewards.std(dim=-1, keepdim=True) + eps)\nif scale == \"batch\":\n    return "
        "centred / (rewards.std() + eps)\nif scale == \"none\":\n    return centred\nraise ValueError(f\"scale "
        "must be 'group', 'batch' or 'none', got {scale!r}\")\n```",
    ),
)
def check_group_relative_advantages(candidate) -> str:
    _check_adv_modes(candidate)
    detail = compare_to_reference(
        candidate, grpo.group_relative_advantages, _adv_cases(), mistakes=ADV_MISTAKES,
        arg_names=["rewards"],
    )
    rewards = to_device(torch.tensor([[0.0, 1.0, 0.5], [1.0, 1.0, 0.0]]))
    for bad in ("std", "grpo"):
        try:
            call(candidate, rewards.clone(), scale=bad, eps=1e-4, _arg_names=["rewards"])
        except CheckFailure as exc:
            if "your code raised" in exc.message:
                continue
            raise
        raise CheckFailure(f"scale={bad!r} did not raise an error: an unknown scale must not silently give "
                           "some other normalisation.",
                           hint="Any scale other than 'group', 'batch' and 'none' raises ValueError naming the "
                           "three.")
    return detail + " Unknown scales raise."


ADV_MODES = ("group", "batch", "none")


def _check_adv_modes(candidate) -> None:
    """Each of the three scales must have an answer: an attempt that raises for one (a ValueError of its
    final ``else``, or its own NotImplementedError) is told which mode is missing, not that it is the
    untouched stub."""
    rewards = to_device(torch.tensor([[0.0, 1.0, 0.5, 0.2], [1.0, 1.0, 0.0, 0.3]]))
    for mode in ADV_MODES:
        try:
            candidate(rewards.clone(), scale=mode, eps=1e-4)
        except NotImplementedError as exc:
            if is_stub_raise(exc):
                return  # the untouched stub: compare_to_reference says so
            missing = exc
        except ValueError as exc:
            missing = exc
        except Exception:  # noqa: BLE001 - any other error is reported, with its line, by compare_to_reference
            return
        else:
            continue
        raise CheckFailure(
            f'scale="{mode}" raised {type(missing).__name__}: {missing}: the contract covers this case, so it needs '
            'an answer, not a raise. Your code has no answer for this mode yet: the contract has three modes, '
            '"group", "batch" and "none", and each returns advantages.',
            hint=f'Add the "{mode}" case: ' + {
                "group": "divide each centred reward by its own group's std plus eps.",
                "batch": "divide each centred reward (still centred on its own group's mean) by the std of "
                         "all p * G rewards plus eps.",
                "none": "return the centred rewards, with no division.",
            }[mode])


# ----------------------------------------------------------------------------------------------------
# calc_grpo_objective
# ----------------------------------------------------------------------------------------------------


def _objective_inputs(B: int, g: int, lengths: list[int], seed: int) -> tuple:
    gen = seeded(seed)
    logprobs = -3 * torch.rand(B, g, generator=gen)
    old = logprobs + 0.45 * torch.randn(B, g, generator=gen)  # ratios from ~0.4 to ~2.5
    ref = logprobs + 0.5 * torch.randn(B, g, generator=gen)
    advantages = torch.randn(B, generator=gen)
    mask = torch.arange(g)[None, :] < torch.tensor(lengths)[:, None]  # [B g]
    # masked positions hold junk: it must count for nothing
    junk = torch.where(mask, 0.0, 4.0 * torch.randn(B, g, generator=gen))
    return logprobs + junk, old - junk, ref, advantages, mask


def _objective_cases() -> list[Case]:
    lp, old, ref, adv, mask = _objective_inputs(6, 7, [7, 1, 3, 5, 2, 6], seed=0)
    lp1, old1, ref1, adv1, mask1 = _objective_inputs(1, 5, [3], seed=1)
    lp2, old2, ref2, _, mask2 = _objective_inputs(4, 6, [6, 4, 1, 3], seed=2)
    base = dict(clip_eps=0.2, beta=0.04)
    # Negative advantages with large ratios (up to e^2.5 ~ 12) and positive ones with tiny ratios, on
    # unmasked tokens, beta = 0: the surrogate alone, where a dual clip (a floor c * A for A < 0) differs.
    neg_lp = torch.tensor([[-0.5, -1.0, -0.2, -3.0], [-1.0, -0.1, -2.0, -0.3], [-0.7, -0.7, -0.7, -0.7]])
    neg_old = neg_lp - torch.tensor([[2.5, 1.5, 0.05, -2.0], [2.0, -3.0, 1.2, 0.0], [0.3, 2.2, -0.3, 0.0]])
    neg_adv = torch.tensor([-1.5, 0.8, -0.4])
    neg_mask = torch.tensor([[True, True, True, True], [True, True, True, False], [True, True, False, False]])
    # A reference far from the policy (|logr| up to 15, k3 up to ~3e6) and zero advantages: the KL term
    # alone, where a clamp of the log-ratio or of k3 differs.
    far_lp = torch.tensor([[-0.3, -14.0, -1.0], [-2.0, -0.5, -16.0]])
    far_ref = torch.tensor([[-15.3, -1.0, -1.2], [-1.0, -13.5, -1.0]])
    # Large log-ratios to pi_old (|log r| up to 12), beta = 0: a negative advantage keeps its full
    # ratio * A (e^12 * A), a positive one its tiny ratio * A; a clamp of log r (at 5, 10, ...) or of the
    # ratio "to be safe" changes the value there (and zeroes the gradient of the clamped tokens).
    big_lp = torch.tensor([[-0.5, -1.0, -0.2], [-12.5, -7.0, -0.9]])
    big_old = big_lp - torch.tensor([[12.0, 6.0, 0.3], [-12.0, -6.0, 0.1]])
    big_adv = torch.tensor([-0.5, 1.5])
    # One positive-advantage token at log r = -11 (its value ~ 3e-5): only the gradient shows a clamp at 10.
    tiny_lp = torch.tensor([[-11.5, -0.3, -2.0]])
    tiny_old = tiny_lp - torch.tensor([[-11.0, 3.0, -4.0]])
    tiny_mask = torch.tensor([[True, False, False]])
    low_lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, -2.5]])
    return [
        Case('loss_type="grpo"', (lp, old, ref, adv, mask), {**base, "loss_type": "grpo"}),
        Case('loss_type="dapo"', (lp, old, ref, adv, mask), {**base, "loss_type": "dapo"}),
        Case('loss_type="dr_grpo" (max_completion_len = g)', (lp, old, ref, adv, mask), {**base, "loss_type": "dr_grpo"}),
        Case('loss_type="dr_grpo", max_completion_len=10', (lp, old, ref, adv, mask),
             {**base, "loss_type": "dr_grpo", "max_completion_len": 10}),
        Case("clip-higher (clip_eps_high=0.28), beta=0.1", (lp, old, ref, adv, mask),
             {"clip_eps": 0.2, "beta": 0.1, "loss_type": "grpo", "clip_eps_high": 0.28}),
        Case("zero advantages (an all-equal group): only the KL term is left, beta=0.3",
             (lp2, old2, ref2, torch.zeros(4), mask2), {"clip_eps": 0.2, "beta": 0.3, "loss_type": "dapo"}),
        Case("a batch of 1, clip_eps=0.1", (lp1, old1, ref1, adv1, mask1),
             {"clip_eps": 0.1, "beta": 0.04, "loss_type": "grpo"}),
        Case("negative advantages with ratios up to 12, beta=0", (neg_lp, neg_old, neg_lp.clone(), neg_adv, neg_mask),
             {"clip_eps": 0.2, "beta": 0.0, "loss_type": "dapo"}),
        Case("zero advantages, a reference far from the policy (|logr| up to 15), beta=0.1",
             (far_lp, far_lp.clone(), far_ref, torch.zeros(2), torch.ones(2, 3, dtype=torch.bool)),
             {"clip_eps": 0.2, "beta": 0.1, "loss_type": "grpo"}),
        Case("large log-ratios to pi_old (|log r| up to 12, both signs of advantage), beta=0",
             (big_lp, big_old, big_lp.clone(), big_adv, torch.ones(2, 3, dtype=torch.bool)),
             {"clip_eps": 0.2, "beta": 0.0, "loss_type": "grpo"}),
        Case("one positive-advantage token at log r = -11, beta=0",
             (tiny_lp, tiny_old, tiny_lp.clone(), torch.tensor([2.0]), tiny_mask),
             {"clip_eps": 0.2, "beta": 0.0, "loss_type": "dapo"}),
        Case('a batch of 1 whose completion is one token (EOS first), "dapo"',
             (lp1[:, :2], old1[:, :2], ref1[:, :2], adv1, torch.tensor([[True, False]])),
             {"clip_eps": 0.2, "beta": 0.04, "loss_type": "dapo"}),
        Case("beta=0.0 (a value, not unset), a reference away from the policy", (lp, old, ref, adv, mask),
             {"clip_eps": 0.2, "beta": 0.0, "loss_type": "dapo"}),
        Case("clip_eps=0.3, negative advantages with ratios from 0.6 to 1",
             (low_lp, low_lp + torch.tensor([[0.5, 0.3, 0.1], [0.25, 0.4, 0.02]]), low_lp.clone(),
              torch.tensor([-1.0, -0.6]), torch.ones(2, 3, dtype=torch.bool)),
             {"clip_eps": 0.3, "beta": 0.04, "loss_type": "grpo"}),
        Case("clip_eps_high=0.0 (a value, not unset), positive advantages", (lp2, old2, ref2, adv.abs()[:4], mask2),
             {"clip_eps": 0.2, "beta": 0.04, "loss_type": "grpo", "clip_eps_high": 0.0}),
    ]


def _objective_diagnosis(case: Case, got, expected) -> str | None:
    """Differences no fixed variant captures: a dual clip or a KL clamp at any bound."""
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        return None
    higher = got.item() > expected.item() + 1e-4 * (1 + abs(expected.item()))
    if case.label.startswith("negative advantages") and higher:
        return ("With negative advantages and large ratios your surrogate is higher than min(ratio * A, "
                "clip(ratio) * A): that is a dual clip (a floor such as max(., c * A) for A < 0). The contract "
                "has none: a negative-advantage token with a large ratio keeps its full ratio * A.")
    if case.label.startswith("large log-ratios") and higher:
        return ("With log-ratios to pi_old as large as 12 and a negative advantage, your surrogate is higher than "
                "ratio * A: the log-ratio (or the ratio) is clamped, or the surrogate has a floor. The contract has "
                "neither: ratio = exp(logprobs - old_logprobs) exactly, however large; the clip of PPO bounds "
                "only the side that would raise the objective.")
    if case.label.startswith("zero advantages, a reference far") and higher:
        return ("Your KL penalty is smaller than k3 where the reference is far from the policy (|logr| up to 15): "
                "the log-ratio or k3 is clamped. k3 = exp(logr) - 1 - logr, with logr = ref_logprobs - "
                "logprobs, exactly, however large.")
    return None


def _objective_variant(
    *, aggregate=None, kl="k3", kl_sign=-1, use_high=True, use_mask=True, reducer="min", ratio="new_old",
    kl_against="ref", dr_len="max", dual_clip=None, logr_clamp=None, ratio_clamp=None,
):
    """A configurable (possibly wrong) calc_grpo_objective."""

    def fn(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04, loss_type="grpo",
           clip_eps_high=None, max_completion_len=None):
        high = clip_eps if (clip_eps_high is None or not use_high) else clip_eps_high
        logr = logprobs - old_logprobs if ratio == "new_old" else old_logprobs - logprobs
        if ratio_clamp is not None:
            logr = logr.clamp(-ratio_clamp, ratio_clamp)
        r = torch.exp(logr)
        a = advantages[:, None]
        unclipped, clipped = r * a, r.clamp(1 - clip_eps, 1 + high) * a
        if reducer == "min":
            surr = torch.minimum(unclipped, clipped)
        elif reducer == "max":
            surr = torch.maximum(unclipped, clipped)
        elif reducer == "clip_only":
            surr = clipped
        else:  # no clipping at all
            surr = unclipped
        if dual_clip is not None:
            surr = torch.where(a < 0, torch.maximum(surr, dual_clip * a), surr)
        other = ref_logprobs if kl_against == "ref" else old_logprobs
        if kl == "k3_swapped":
            k = approx_kl(other, logprobs, "k3")
        elif logr_clamp is not None:
            logr = (other - logprobs).clamp(-logr_clamp, logr_clamp)
            k = torch.expm1(logr) - logr
        else:
            k = approx_kl(logprobs, other, kl)
        obj = surr + kl_sign * beta * k
        m = mask if use_mask else torch.ones_like(mask)
        obj = torch.where(m, obj, torch.zeros_like(obj))
        n = m.sum(-1).float()
        kind = aggregate(loss_type) if aggregate else loss_type
        if kind == "grpo":
            return (obj.sum(-1) / n).mean()
        if kind == "dapo":
            return obj.sum() / n.sum()
        if kind == "padded_mean":  # zeros at masked tokens, but the mean counts them
            return obj.mean()
        length = logprobs.shape[1] if (max_completion_len is None or dr_len == "g") else max_completion_len
        if dr_len == "no_batch":
            return obj.sum() / length
        if dr_len == "longest":
            return obj.sum() / (logprobs.shape[0] * n.max())
        return obj.sum() / (logprobs.shape[0] * length)

    return fn


def _only(loss_type: str, instead: str):
    return lambda lt: instead if lt == loss_type else lt


OBJECTIVE_MISTAKES = [
    Mistake('Your "grpo" aggregation is a token-level mean over the whole batch: that is DAPO. GRPO first '
            "averages each sequence over its own tokens, then averages the sequences.",
            _objective_variant(aggregate=_only("grpo", "dapo"))),
    Mistake('Your "dapo" aggregation averages per sequence first: that is GRPO. DAPO divides the masked sum '
            "by the total number of unmasked tokens, so every token weighs the same.",
            _objective_variant(aggregate=_only("dapo", "grpo"))),
    Mistake('Your "dr_grpo" divides by the true number of tokens: Dr. GRPO divides the masked sum by the '
            "constant B * max_completion_len, so no length normalisation is left.",
            _objective_variant(aggregate=_only("dr_grpo", "dapo"))),
    Mistake('Your "dr_grpo" normalises each sequence by its own length: Dr. GRPO divides the masked sum by '
            "the constant B * max_completion_len.", _objective_variant(aggregate=_only("dr_grpo", "grpo"))),
    Mistake('Your "dr_grpo" ignores max_completion_len: use it when given (it defaults to g, logprobs.shape[1]).',
            _objective_variant(dr_len="g")),
    Mistake('Your "dr_grpo" divides the masked sum by the completion length only: Dr. GRPO divides by '
            "B * max_completion_len (the number of completions times the constant length).",
            _objective_variant(dr_len="no_batch")),
    Mistake('Your "dr_grpo" divides by B times the longest completion in the batch: the constant is '
            "max_completion_len (given, or g), whatever this batch's lengths.", _objective_variant(dr_len="longest")),
    Mistake("You added a dual clip (a floor c * A on the surrogate of negative-advantage tokens): the contract "
            "has none, min(ratio * A, clip(ratio) * A) only.", _objective_variant(dual_clip=3.0)),
    Mistake("The log-ratio to pi_old is clamped (to [-5, 5]) before the exponential: ratio = exp(logprobs - "
            "old_logprobs) exactly. A negative-advantage token whose ratio has grown large keeps its full "
            "ratio * A, and its gradient: that is what pulls its probability back.", _objective_variant(ratio_clamp=5.0)),
    Mistake("The log-ratio to pi_old is clamped (to [-10, 10]) before the exponential: ratio = exp(logprobs - "
            "old_logprobs) exactly. A negative-advantage token whose ratio has grown large keeps its full "
            "ratio * A, and its gradient: that is what pulls its probability back.", _objective_variant(ratio_clamp=10.0)),
    Mistake("Your k3 clamps the log-ratio (to [-10, 10]): k3 = exp(logr) - 1 - logr exactly, however far "
            "the reference is.", _objective_variant(logr_clamp=10.0)),
    Mistake("The mask is ignored: masked tokens (after the first EOS) count for nothing, in the sum and in "
            "the token counts.", _objective_variant(use_mask=False)),
    Mistake("Masked tokens are zeroed but still counted in the mean: divide by the number of *unmasked* tokens.",
            _objective_variant(aggregate=lambda lt: "padded_mean" if lt != "dr_grpo" else lt)),
    Mistake("The KL term has the wrong sign: the objective is maximised, so the penalty is subtracted: "
            "surrogate - beta * k3.", _objective_variant(kl_sign=+1)),
    Mistake("That KL term is k1 (logprobs - ref_logprobs): GRPO uses k3 = exp(logr) - 1 - logr with "
            "logr = ref_logprobs - logprobs (chapter 03's approx_kl, 'k3' estimator).", _objective_variant(kl="k1")),
    Mistake("That KL term is k2 (logr**2 / 2): GRPO uses k3 = exp(logr) - 1 - logr.", _objective_variant(kl="k2")),
    Mistake("Your k3 has its arguments swapped: it no longer estimates KL(policy || ref) (on tokens from the "
            "policy it averages to chi2(policy || ref) - KL(policy || ref)). k3's "
            "log-ratio is logr = ref_logprobs - logprobs: the reference over the policy.",
            _objective_variant(kl="k3_swapped")),
    Mistake("The KL is measured against old_logprobs: the penalty keeps the policy near the frozen "
            "*reference* (ref_logprobs).", _objective_variant(kl_against="old")),
    Mistake("clip_eps_high is ignored: clip the ratio to [1 - clip_eps, 1 + clip_eps_high], with clip_eps_high "
            "defaulting to clip_eps when it is None.", _objective_variant(use_high=False)),
    Mistake("You took the max of the clipped and unclipped terms: PPO's surrogate is the pessimistic min.",
            _objective_variant(reducer="max")),
    Mistake("Only the clipped term is used: take min(ratio * A, clip(ratio, ...) * A).",
            _objective_variant(reducer="clip_only")),
    Mistake("The ratio is not clipped: take min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps_high) * A).",
            _objective_variant(reducer="none")),
    Mistake("The ratio is upside down: ratio = exp(logprobs - old_logprobs) = pi_theta / pi_old.",
            _objective_variant(ratio="old_new")),
]


@checker(
    "calc_grpo_objective",
    chapter=CHAPTER,
    hint=(
        "Build one [B, g] tensor first, the per-token objective (clipped surrogate minus beta times the "
        "k3 estimate), zero it where the mask is False, and only then reduce: the three loss types "
        "differ only in the final reduction.",
        "Per token: ratio = exp(logprobs - old_logprobs); surrogate = min(ratio * A, clip(ratio, 1 - "
        "clip_eps, 1 + clip_eps_high) * A), with each row's advantage broadcast over its tokens (A has "
        "shape [B]); k3 is chapter 03's `approx_kl` of logprobs against ref_logprobs with the 'k3' "
        "estimator. Masked positions hold junk (any finite value): zero them before any sum. With n_b the "
        "row's token count: 'grpo' = mean over rows of (row sum / n_b); 'dapo' = total sum / total "
        "count; 'dr_grpo' = total sum / (B * L), L = max_completion_len or g. clip_eps_high None means "
        "clip_eps; any other loss_type raises ValueError.",
        "```python\nhigh = clip_eps if clip_eps_high is None else clip_eps_high\nratio = "
        "torch.exp(logprobs - old_logprobs)\nadv = advantages[:, None]\nsurrogate = torch.minimum(ratio * "
        "adv, ratio.clamp(1 - clip_eps, 1 + high) * adv)\nper_token = surrogate - beta * "
        "approx_kl(logprobs, ref_logprobs, \"k3\")\nper_token = torch.where(mask, per_token, "
        "torch.zeros_like(per_token))\ntokens_per_seq = mask.sum(dim=-1)\nif loss_type == \"grpo\":\n    "
        "return (per_token.sum(dim=-1) / tokens_per_seq.clamp(min=1)).mean()\nif loss_type == \"dapo\":\n    "
        "return per_token.sum() / tokens_per_seq.sum().clamp(min=1)\nif loss_type == \"dr_grpo\":\n    "
        "length = logprobs.shape[1] if max_completion_len is None else max_completion_len\n    return "
        "per_token.sum() / (logprobs.shape[0] * length)\nraise ValueError(f\"loss_type must be 'grpo', "
        "'dapo' or 'dr_grpo', got {loss_type!r}\")\n```",
    ),
)
def check_calc_grpo_objective(candidate) -> str:
    detail = compare_to_reference(
        candidate, grpo.calc_grpo_objective, _objective_cases(), mistakes=OBJECTIVE_MISTAKES,
        diagnose=_objective_diagnosis,
        arg_names=["logprobs", "old_logprobs", "ref_logprobs", "advantages", "mask"],
        grad=DIFFERENTIATED["calc_grpo_objective"], grad_cases=(0, 1, 2, 4, 9),
    )
    lp, old, ref, adv, mask = to_device(_objective_inputs(3, 4, [4, 2, 3], seed=4))
    for bad in ("gspo", "GRPO"):
        try:
            call(candidate, lp, old, ref, adv, mask, loss_type=bad,
                 _arg_names=["logprobs", "old_logprobs", "ref_logprobs", "advantages", "mask"])
        except CheckFailure as exc:
            if "your code raised" in exc.message:
                continue
            raise
        raise CheckFailure(f"loss_type={bad!r} did not raise an error.",
                           hint="Any loss_type other than 'grpo', 'dapo' and 'dr_grpo' raises ValueError: a typo "
                           "must not silently train with another aggregation.")
    tiny = next(case for case in _objective_cases() if case.label.startswith("one positive-advantage token"))
    try:
        compare_gradients(candidate, grpo.calc_grpo_objective, tiny, DIFFERENTIATED["calc_grpo_objective"],
                          arg_names=["logprobs", "old_logprobs", "ref_logprobs", "advantages", "mask"])
    except CheckFailure as exc:
        raise failure(exc.message.split("\n")[0],
                      "This token's value is tiny (ratio e^-11 times A), but its gradient is not zero: a clamp of "
                      "the log-ratio (or of the ratio) at its size cuts the gradient off. The ratio is "
                      "exp(logprobs - old_logprobs) exactly, however small or large.") from None
    return detail


# ----------------------------------------------------------------------------------------------------
# completion_mask
# ----------------------------------------------------------------------------------------------------


def _mask_cases() -> list[Case]:
    gen = seeded(3)
    many = torch.randint(1, 20, (5, 9), generator=gen)
    many[0, 4] = 0
    many[1, 0] = 0
    many[2, 8] = 0
    many[3, 2:] = 0  # EOS then EOS padding
    # row 4: no EOS
    return [
        Case("EOS in the middle", (torch.tensor([[5, 6, 9, 7, 7]]), 9)),
        Case("no EOS: cut off by the length limit", (torch.tensor([[5, 6, 8, 4], [3, 3, 3, 3]]), 9)),
        Case("EOS as the first token", (torch.tensor([[9, 1, 2, 3]]), 9)),
        Case("EOS as the last token", (torch.tensor([[1, 2, 3, 9]]), 9)),
        Case("EOS, a token, EOS again (the first one counts)", (torch.tensor([[1, 9, 4, 9, 2, 3]]), 9)),
        Case("5 rows, eos_token_id = 0, EOS padding", (many, 0)),
    ]


def _mask_to_last_eos(completions, eos):
    """Wrong: True up to the last EOS (or everywhere without EOS)."""
    is_eos = (completions == eos).long()
    eos_after = is_eos.flip(-1).cumsum(-1).flip(-1) - is_eos  # EOS strictly after t
    return (eos_after > 0) | (is_eos.cumsum(-1) - is_eos == 0)


def _mask_one_past_eos(completions, eos):
    """Wrong: keeps the token right after the first EOS."""
    is_eos = (completions == eos).long()
    right = is_eos.cumsum(-1) - is_eos == 0
    shifted = torch.cat([torch.ones_like(right[:, :1]), right[:, :-1]], dim=-1)  # right[t - 1]
    return right | shifted


MASK_MISTAKES = [
    Mistake("The EOS token itself is masked out: it counts (the policy chose to stop, and that choice must "
            "get credit or blame). Mask only what comes *after* the first EOS.",
            lambda c, e: (c == e).long().cumsum(-1) == 0),
    Mistake("Tokens after the first EOS are kept: they are padding (or garbage sampled after the end) and "
            "must be masked.", lambda c, e: torch.ones_like(c, dtype=torch.bool)),
    Mistake("You masked only the EOS tokens: everything after the first EOS must go too, and the EOS itself "
            "stays.", lambda c, e: c != e),
    Mistake("Your mask runs to the *last* EOS: it must stop at the first.", _mask_to_last_eos),
    Mistake("Off by one: your mask keeps one token after the EOS.", _mask_one_past_eos),
]


@checker(
    "completion_mask",
    chapter=CHAPTER,
    hint=(
        "A token counts unless an EOS came strictly before it. Which running quantity along a row tells "
        "you how many EOS tokens lie before position t? (torch has a cumulative sum.)",
        "Mark the EOS positions (1 where the token is the EOS id), take their cumulative sum along the "
        "row and subtract each position's own mark: that is the number of EOS tokens strictly before t. "
        "The mask is True where that number is 0. So the EOS itself is True, everything after it False, "
        "and a row with no EOS all True. Return a bool tensor on the completions' device.",
        "```python\nis_eos = (completions == eos_token_id).long()\neos_before = is_eos.cumsum(dim=-1) - "
        "is_eos\nreturn eos_before == 0\n```",
    ),
)
def check_completion_mask(candidate) -> str:
    return compare_to_reference(
        candidate, grpo.completion_mask, _mask_cases(), mistakes=MASK_MISTAKES,
        arg_names=["completions", "eos_token_id"],
    )


# ----------------------------------------------------------------------------------------------------
# sample_group
# ----------------------------------------------------------------------------------------------------

EOS = 7


def _eos_model(eos_bias: float, seed: int = 4, spread: float = 0.0, eos: int = EOS) -> HookedTransformer:
    model = small_model(seed)
    with torch.no_grad():
        if spread:
            gen = seeded(seed)
            model.unembed.b_U.copy_(spread * torch.randn(model.cfg.d_vocab, generator=gen))
        model.unembed.b_U[eos] = eos_bias
    return model


def _sampled(candidate, model, prompt, group_size, max_new_tokens, temperature=1.0, eos=EOS, **kwargs):
    out = call(candidate, model, prompt, group_size, max_new_tokens, eos, temperature,
               _arg_names=["model", "prompt_tokens", "group_size", "max_new_tokens"], _keep_modes=False, **kwargs)
    if out is None:
        raise CheckFailure("sample_group returned None: return (tokens, mask).")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise CheckFailure(f"sample_group should return a pair (tokens, mask), got {fmt(out)}")
    return out


def _check_eos_padding(completions: torch.Tensor, mask: torch.Tensor, where: str) -> None:
    """Everything after a row's first EOS must be EOS: generate pads finished rows with it, and the
    output is padded with it up to max_new_tokens."""
    after = ~grpo.completion_mask(completions, EOS)
    wrong = after & (completions != EOS)
    if not wrong.any():
        return
    rows = wrong.any(-1).nonzero().flatten().tolist()
    others = completions[wrong].unique().tolist()
    if len(others) == 1:
        hint = (f"The padding after EOS is {others[0]}, not EOS: pad with eos_token_id (generate pads finished rows "
                "with it; the output is padded with it up to prompt_len + max_new_tokens too).")
    else:
        hint = ("Your rows go on after their first EOS: generate did not stop at EOS. Have generate stop each "
                "row at eos_token_id (it has options for stopping at EOS and for the EOS id); a finished row is then "
                "padded with EOS.")
    raise failure(f"{where}, rows {rows[:6]} hold tokens other than EOS after their first EOS: "
                  f"{completions[rows[0]].tolist()}", hint)


@checker(
    "sample_group",
    chapter=CHAPTER,
    hint=(
        "One call to `model.generate` samples the whole group if you give it G copies of the prompt as a "
        "batch; then make the shape fixed and build the mask with your `completion_mask`.",
        "(1) A [G, prompt_len] batch of the prompt (`expand` needs no copy). (2) `generate` with the "
        "token budget, stopping at the EOS id given, at the temperature and top_k given, without a "
        "progress bar. (3) "
        "Clone the result (it is an inference tensor). (4) If every row stopped early the output is "
        "shorter than prompt_len + max_new_tokens: pad it on the right with the EOS id. (5) The mask is "
        "`completion_mask` of the generated columns only (from prompt_len on): the prompt may contain "
        "the EOS id (it is also BOS).",
        "```python\ntokens = model.generate(\n    prompt_tokens[None].expand(group_size, -1),\n    "
        "max_new_tokens=max_new_tokens, stop_at_eos=True, eos_token_id=eos_token_id,\n    "
        "temperature=temperature, top_k=top_k, verbose=False, return_type=\"tokens\",\n).clone()\nmissing = "
        "prompt_len + max_new_tokens - tokens.shape[1]\ntokens = nn.functional.pad(tokens, (0, missing), "
        "value=eos_token_id)\nmask = completion_mask(tokens[:, prompt_len:], eos_token_id)\n```",
    ),
)
@one_thread
def check_sample_group(candidate) -> str:
    prompt = torch.tensor([3, 11, 25, 40], device=check_device())  # where the models are
    plen, size, new = len(prompt), 32, 10

    # 1. a model whose rows stop within 10 tokens about half the time (so
    #    P(every row stops) and P(no row stops) are ~ 2^-32 whatever the random draws):
    #    shapes, dtypes, prompt, mask, diversity
    torch.manual_seed(1)
    tokens, mask = _sampled(candidate, _eos_model(1.8), prompt, size, new)
    expect_tensor(tokens, dtype=torch.int64, what="the tokens (first output)")
    if tokens.is_inference():
        raise CheckFailure("your tokens are an inference tensor, made under torch.inference_mode by generate: "
                           "they cannot enter a forward pass that needs gradients.",
                           hint="Return a clone of the generated tokens: a clone is an ordinary tensor.")
    if tuple(tokens.shape) != (size, plen + new):
        raise CheckFailure(f"the tokens have shape {tuple(tokens.shape)}, expected (G, prompt_len + max_new_tokens)"
                           f" = {(size, plen + new)}.",
                           hint="Each row is the prompt followed by max_new_tokens tokens (padded with EOS).")
    expect_tensor(mask, dtype=torch.bool, what="the mask (second output)")
    if tuple(mask.shape) == tuple(tokens.shape):
        raise CheckFailure(f"the mask has shape {tuple(mask.shape)}, the shape of the whole sequence.",
                           hint="The mask covers the completion only: the generated tokens, from prompt_len on.")
    expect_tensor(mask, shape=(size, new), what="the mask (second output)")
    if not torch.equal(tokens[:, :plen], prompt.expand(size, -1)):
        raise CheckFailure(f"the rows do not start with the prompt {prompt.tolist()}: got {tokens[:, :plen].tolist()}",
                           hint="Sample from a batch of G copies of the prompt.")
    expected_mask = grpo.completion_mask(tokens[:, plen:], EOS)
    if not torch.equal(mask, expected_mask):
        completions = tokens[:, plen:]
        hint = next((m.hint for m in MASK_MISTAKES if torch.equal(m.fn(completions, EOS), mask)), None)
        raise CheckFailure(
            f"the mask does not match the sampled tokens.\n  completions: {completions.tolist()}\n"
            f"  your mask:   {mask.int().tolist()}\n  expected:    {expected_mask.int().tolist()}",
            hint=hint or "mask[b, t] is True up to and including the first EOS of row b, False after it.",
        )
    _check_eos_padding(tokens[:, plen:], mask, "with this model (about half the rows stop early)")
    if len({tuple(row) for row in tokens.tolist()}) == 1:
        raise CheckFailure("all G rows are the same completion.",
                           hint="Sample G times (generate on G copies of the prompt): do not repeat one sample.")
    if not (~mask).any() or mask.all(-1).sum() == 0:
        raise CheckFailure("with this model some rows should stop at EOS and others not; yours do not: "
                           f"{tokens[:, plen:].tolist()}",
                           hint="Stop each row at eos_token_id (generate has options for it).")

    # 1b. a prompt that starts with the EOS token (in the tiny world and in GPT-2, BOS *is* EOS): a mask
    #     computed over the whole sequence and then sliced sees that EOS and masks every completion.
    bos_prompt = torch.tensor([EOS, 11, 25], device=check_device())
    torch.manual_seed(4)
    tokens_b, mask_b = _sampled(candidate, _eos_model(1.8), bos_prompt, 8, new)
    expect_tensor(tokens_b, shape=(8, len(bos_prompt) + new), dtype=torch.int64, what="the tokens (BOS = EOS prompt)")
    expect_tensor(mask_b, shape=(8, new), dtype=torch.bool, what="the mask (BOS = EOS prompt)")
    expected_b = grpo.completion_mask(tokens_b[:, len(bos_prompt):], EOS)
    if not torch.equal(mask_b, expected_b):
        whole = grpo.completion_mask(tokens_b, EOS)[:, len(bos_prompt):]
        hint = ("You computed the mask over the whole sequence and then sliced it: the prompt starts with BOS, "
                "which is the EOS token here (as in the tiny world and GPT-2), so every completion looks "
                "finished before it starts and the mask is all False (training then dies later on NaN logits). "
                "Compute the mask on the generated tokens only, from prompt_len on."
                if torch.equal(mask_b, whole) else None)
        raise failure(f"with a prompt that starts with the EOS token {bos_prompt.tolist()}, the mask is wrong.\n"
                      f"  your mask: {mask_b.int().tolist()}\n  expected:  {expected_b.int().tolist()}",
                      hint or "mask[b, t] is True up to and including the first EOS of the COMPLETION, False after.")

    # 2. a model that always stops at once: the output must still be max_new_tokens long
    torch.manual_seed(2)
    tokens2, mask2 = _sampled(candidate, _eos_model(40.0), prompt, 4, new)
    expect_tensor(tokens2, dtype=torch.int64, what="the tokens")
    if tuple(tokens2.shape) != (4, plen + new):
        raise CheckFailure(
            f"when every row stops at the first token, your tokens have shape {tuple(tokens2.shape)}, expected "
            f"{(4, plen + new)}.",
            hint="generate stops as soon as every row has emitted EOS: pad the output on the right with EOS "
            "up to prompt_len + max_new_tokens.",
        )
    expect_tensor(mask2, shape=(4, new), dtype=torch.bool, what="the mask")
    _check_eos_padding(tokens2[:, plen:], mask2, "when every row stops at the first token")
    if not torch.equal(mask2, grpo.completion_mask(tokens2[:, plen:], EOS)):
        raise CheckFailure(f"the mask does not match the tokens when every row stops at once: {mask2.int().tolist()}",
                           hint="Only the first token (the EOS) of each completion counts.")

    # 2b. another EOS id: the argument, not a fixed id (nor the tokenizer's), stops the rows and ends the mask
    torch.manual_seed(6)
    other_eos = 12
    tokens4, mask4 = _sampled(candidate, _eos_model(40.0, eos=other_eos), prompt, 4, new, eos=other_eos)
    expect_tensor(tokens4, shape=(4, plen + new), dtype=torch.int64, what=f"the tokens (eos_token_id={other_eos})")
    expect_tensor(mask4, shape=(4, new), dtype=torch.bool, what=f"the mask (eos_token_id={other_eos})")
    if not torch.equal(mask4, grpo.completion_mask(tokens4[:, plen:], other_eos)) or bool(mask4.all()):
        raise failure(f"with eos_token_id={other_eos} (a model that emits it at once), the mask is "
                      f"{mask4.int().tolist()}: it should end at that token.",
                      "Use the eos_token_id argument, for generate's stop and for the mask and the padding (not "
                      f"a fixed id such as {EOS}, nor the tokenizer's).")

    # 3. the first sampled token follows softmax(logits / temperature), at a temperature below and above 1
    model = _eos_model(-30.0, seed=5, spread=2.0)  # peaked, no EOS
    n = 2000  # TV(T=1, T=0.5) = 0.32, TV(T=1, T=2) = 0.36 for this model: far above the 0.12 threshold
    with torch.no_grad():
        last_logits = model(prompt[None])[0, -1]
    tvs = []
    for seed, temperature in ((3, 0.5), (7, 2.0)):
        torch.manual_seed(seed)
        tokens3, _ = _sampled(candidate, model, prompt, n, 1, temperature)
        expect_tensor(tokens3, shape=(n, plen + 1), dtype=torch.int64, what=f"the tokens (G = {n}, 1 new token)")
        freq = torch.bincount(tokens3[:, plen], minlength=model.cfg.d_vocab).float() / n
        tv = 0.5 * (freq - (last_logits / temperature).softmax(-1)).abs().sum().item()
        tvs.append(tv)
        if tv > 0.12:
            tv_plain = 0.5 * (freq - last_logits.softmax(-1)).abs().sum().item()
            hint = ("Your samples follow softmax(logits), not softmax(logits / temperature): pass temperature to "
                    "generate." if tv_plain < 0.12 else
                    "Sample from the model's next-token distribution at the given temperature (model.generate).")
            raise CheckFailure(f"the first sampled tokens do not follow the model's distribution at temperature "
                               f"{temperature} (total variation {tv:.2f} over {n} samples).", hint=hint)

    # 3b. a budget above generate's default (10 tokens) from a model that never stops: every row runs to the end
    torch.manual_seed(9)
    long_new = 13
    tokens6, mask6 = _sampled(candidate, _eos_model(-30.0), prompt, 4, long_new)
    expect_tensor(tokens6, shape=(4, plen + long_new), dtype=torch.int64, what=f"the tokens (max_new_tokens={long_new})")
    if bool((tokens6[:, plen:] == EOS).any()) or not bool(mask6.all()):
        raise failure(f"with max_new_tokens={long_new} and a model that never emits EOS, your rows hold EOS (or a "
                      f"masked tail): {tokens6[:, plen:].tolist()}",
                      "The token budget is max_new_tokens: generate must be given it (its own default is 10 "
                      "tokens, and padding then fills the rest with EOS).")

    # 4. top_k = 1: every row is the greedy continuation
    torch.manual_seed(8)
    tokens5, _ = _sampled(candidate, model, prompt, 4, 1, top_k=1)
    greedy = int(last_logits.argmax())
    if not bool((tokens5[:, plen] == greedy).all()):
        raise failure(f"with top_k=1 every row's first token should be the most likely one ({greedy}), got "
                      f"{tokens5[:, plen].tolist()}.", "top_k is ignored: pass it on to generate.")
    return (f"shapes, prompt, mask (EOS counted, the rest masked), {size} distinct samples, padding when all rows "
            f"stop early, another eos_token_id, the distribution at temperatures 0.5 and 2 (TV {tvs[0]:.3f}, "
            f"{tvs[1]:.3f}) and top_k=1 are right.")


# ----------------------------------------------------------------------------------------------------
# grpo_step
# ----------------------------------------------------------------------------------------------------


def _step_setup() -> tuple[HookedTransformer, grpo.GroupRollout, GRPOArgs]:
    """A small policy and a hand-made rollout: 3 groups of 4, prompts of different lengths, g = 6. As
    ``collect_rollout`` leaves it: the rewards on the CPU, every other tensor on the policy's device."""
    policy, other = small_model(seed=6), small_model(seed=7)
    gen = seeded(8)
    size, g = 4, 6
    args = GRPOArgs(
        group_size=size, max_new_tokens=g, clip_coef=0.25, clip_coef_high=0.3, kl_coef=0.1, loss_type="dapo",
        temperature=0.8, max_grad_norm=0.05, learning_rate=0.1,
    )
    tokens, prefix_lens = [], []
    for plen in (3, 5, 2):
        tokens.append(to_device(torch.randint(0, 50, (size, plen + g), generator=gen)))
        prefix_lens.append(plen)
    lengths = torch.tensor([6, 1, 3, 4, 2, 6, 5, 6, 1, 2, 6, 3])
    mask = to_device(torch.arange(g)[None, :] < lengths[:, None])
    rewards = torch.rand(3, size, generator=gen)
    with torch.no_grad():
        current = grpo.group_token_logprobs(policy, tokens, prefix_lens, args.temperature)
        ref = grpo.group_token_logprobs(other, tokens, prefix_lens, args.temperature)
    moved = to_device(0.3 * torch.randn(current.shape, generator=gen))  # the policy has moved since
    rollout = grpo.GroupRollout(
        tokens=tokens, prefix_lens=prefix_lens, prompts=["a", "b", "c"], mask=mask, rewards=rewards,
        advantages=to_device(grpo.group_relative_advantages(rewards).flatten()),
        old_logprobs=current + moved, ref_logprobs=ref, texts=[""] * 12,
    )
    return policy, rollout, args


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _batch_tensors(batch: grpo.GroupRollout) -> dict[str, torch.Tensor]:
    out = {f"batch.{name}": getattr(batch, name).detach().clone()
           for name in ("mask", "rewards", "advantages", "old_logprobs", "ref_logprobs")}
    out.update({f"batch.tokens[{i}]": t.detach().clone() for i, t in enumerate(batch.tokens)})
    return out


def _run_steps(step_fn, policy, rollout, args, learner: bool) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Two steps of ``step_fn`` (on two different minibatches of the rollout) from the given start with
    SGD(maximize=True); the stats and the parameter change after each step."""
    policy = copy.deepcopy(policy).train()
    optimizer = torch.optim.SGD(policy.parameters(), lr=args.learning_rate, maximize=True)
    start = _params(policy)
    outs, deltas = [], []
    for batch in (rollout.select([0, 1]), rollout.select([2, 1])):  # two different minibatches
        if learner:
            before = _batch_tensors(batch)
            out = call(step_fn, policy, optimizer, batch, args, _arg_names=["policy", "optimizer", "batch", "args"])
            for name, tensor in before.items():
                if not torch.equal(_batch_tensors(batch)[name], tensor):
                    raise CheckFailure(f"your step modified {name} in place.",
                                       hint="The rollout is read-only: compute new tensors instead of changing it.")
        else:
            out = step_fn(policy, optimizer, batch, args)
        outs.append(out)
        deltas.append(_params(policy) - start)
    return outs, deltas[0], deltas[1]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp(min=1e-12)).item()


def _step_variant(*, zero_grad=True, sign=1.0, clip=True, old="old", ref="ref", pass_args=True, temperature=True,
                  max_len=True):
    """A configurable (possibly wrong) grpo_step."""

    def step(policy, optimizer, batch, args):
        t = args.temperature if temperature else 1.0
        logprobs = grpo.group_token_logprobs(policy, batch.tokens, batch.prefix_lens, t)
        old_lp = {"old": batch.old_logprobs, "detached": logprobs.detach(), "ref": batch.ref_logprobs}[old]
        ref_lp = {"ref": batch.ref_logprobs, "old": batch.old_logprobs}[ref]
        kwargs = dict(clip_eps=args.clip_coef, beta=args.kl_coef, loss_type=args.loss_type,
                      clip_eps_high=args.clip_coef_high, max_completion_len=args.max_new_tokens)
        if not max_len:
            kwargs.pop("max_completion_len")
        if not pass_args:
            kwargs = {}
        objective = grpo.calc_grpo_objective(logprobs, old_lp, ref_lp, batch.advantages, batch.mask, **kwargs)
        if zero_grad:
            optimizer.zero_grad()
        (sign * objective).backward()
        if clip:
            nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
        optimizer.step()
        return {"objective": objective.item()}

    return step


STEP_MISTAKES = [
    Mistake("The update goes the wrong way: the optimizer is built with maximize=True, so backpropagate the "
            "objective itself (not its negative).", _step_variant(sign=-1.0)),
    Mistake("Gradients accumulate from one step to the next: zero the gradients (the optimizer's zero_grad) before each backward pass.",
            _step_variant(zero_grad=False)),
    Mistake("The gradient norm is not clipped: clip the global norm of the policy's gradients to "
            "args.max_grad_norm after the backward pass and before the optimizer step.", _step_variant(clip=False)),
    Mistake("The ratio uses the current log-probs detached as pi_old (so it is always 1): use the batch's "
            "old_logprobs, stored at rollout time.", _step_variant(old="detached")),
    Mistake("old_logprobs and ref_logprobs are swapped.", _step_variant(old="ref", ref="old")),
    Mistake("The objective ignores the args: its clip_eps is args.clip_coef, beta args.kl_coef, loss_type "
            "args.loss_type, clip_eps_high args.clip_coef_high and max_completion_len args.max_new_tokens.", _step_variant(pass_args=False)),
    Mistake("The log-probs are of the raw logits: the tokens were sampled at args.temperature, so take "
            "log-probs of logits / temperature (group_token_logprobs takes the temperature).",
            _step_variant(temperature=False)),
    Mistake("max_completion_len is not passed: Dr. GRPO divides by B * max_completion_len, and the rollout's "
            "completions may be shorter than args.max_new_tokens, so its max_completion_len is args.max_new_tokens.",
            _step_variant(max_len=False)),
]


@checker(
    "grpo_step",
    chapter=CHAPTER,
    hint=(
        "Three moves: the current policy's log-probs (with gradients), the objective, one optimizer "
        "step. Every tensor you need is a field of `batch`, every setting a field of `args`; name the "
        "results `logprobs`, `objective` and `grad_norm`.",
        "(1) `group_token_logprobs` of the policy on the batch's tokens and prefix lengths, at the args' "
        "temperature. (2) `calc_grpo_objective` of those against the batch's old and reference "
        "log-probs, advantages and mask; its clip_eps is the args' clip_coef, beta is kl_coef, "
        "clip_eps_high is clip_coef_high, max_completion_len is max_new_tokens, loss_type is loss_type. "
        "(3) Zero the gradients, backpropagate the objective (the optimizer maximises: no minus sign), "
        "clip the gradient norm to max_grad_norm with `nn.utils.clip_grad_norm_` (it returns the norm "
        "before clipping), step.",
        "```python\nlogprobs = group_token_logprobs(policy, batch.tokens, batch.prefix_lens, "
        "args.temperature)\nobjective = calc_grpo_objective(\n    logprobs, batch.old_logprobs, "
        "batch.ref_logprobs, batch.advantages, batch.mask,\n    clip_eps=args.clip_coef, "
        "beta=args.kl_coef, loss_type=args.loss_type,\n    clip_eps_high=args.clip_coef_high, "
        "max_completion_len=args.max_new_tokens,\n)\noptimizer.zero_grad()\nobjective.backward()\ngrad_norm "
        "= nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)\noptimizer.step()\n```",
    ),
)
@one_thread
def check_grpo_step(candidate) -> str:
    # Two settings, each probing its own decisions:
    # - "dapo, clipping active" (max_grad_norm 0.05 clips every step): the loss sign, zero_grad, the
    #   gradient clip, the temperature, pi_old and the reference, the args passed on;
    # - "dr_grpo, completions shorter than max_new_tokens (6 < 10), clipping inactive": the objective's
    #   scale reaches the update, so ignoring max_completion_len shows.
    policy, rollout, args = _step_setup()
    settings = [
        ("dapo, gradient clipping active", args),
        ("dr_grpo with max_new_tokens=10 > the batch's 6 generated tokens, clipping inactive",
         dataclasses.replace(args, loss_type="dr_grpo", max_new_tokens=10, max_grad_norm=1e3)),
    ]
    details = []
    for label, step_args in settings:
        ref_outs, ref_d1, ref_d2 = _run_steps(grpo.grpo_step, policy, rollout, step_args, learner=False)
        outs, d1, d2 = _run_steps(candidate, policy, rollout, step_args, learner=True)
        for out in outs:
            if not isinstance(out, dict) or "objective" not in out:
                raise CheckFailure(f"grpo_step should return a dict of diagnostics with an 'objective' entry, got "
                                   f"{fmt(out)}")
        if d1.norm() == 0:
            raise CheckFailure(f"{label}: the parameters did not change after a step.",
                               hint="No parameter moved: the step must backpropagate the objective and then step the optimizer.")
        e1, e2 = _rel(d1, ref_d1), _rel(d2, ref_d2)
        objective, expected = float(outs[0]["objective"]), ref_outs[0]["objective"]
        objective_ok = math.isclose(objective, expected, rel_tol=1e-3, abs_tol=1e-5)
        if objective_ok and e1 < 1e-3 and e2 < 1e-3:
            if "grad_norm" in outs[0]:
                norm, want = float(outs[0]["grad_norm"]), ref_outs[0]["grad_norm"]
                if not math.isclose(norm, want, rel_tol=1e-3, abs_tol=1e-6):
                    clipped = math.isclose(norm, min(want, step_args.max_grad_norm), rel_tol=1e-3)
                    raise failure(
                        f"{label}: the update is right, but the grad_norm you report ({norm:.5f}) is not the "
                        f"gradient norm before clipping ({want:.5f}).",
                        "The reported grad_norm is the norm clipping measured, before it scaled the gradients "
                        "down (the norm after clipping is at most max_grad_norm, whatever happened)."
                        if clipped else "The reported grad_norm is the global norm of all the gradients "
                        "before clipping.")
            details.append(f"{label.split(',')[0]} ({e1:.1e}, {e2:.1e})")
            continue
        for mistake in STEP_MISTAKES:
            _, m1, m2 = _run_steps(mistake.fn, policy, rollout, step_args, learner=False)
            if _rel(m1, ref_d1) < 1e-3 and _rel(m2, ref_d2) < 1e-3:
                continue  # this mistake changes nothing in this setting: it cannot explain a difference
            if _rel(d1, m1) < 1e-3 and _rel(d2, m2) < 1e-3:
                raise failure(f"{label}: your step does not update the policy as the reference does (relative "
                              f"difference {max(e1, e2):.2e}).", mistake.hint)
        if e1 < 1e-3 and e2 < 1e-3:
            raise failure(f"{label}: the update is right, but the objective you return ({objective:.5f}) differs "
                          f"from the reference's ({expected:.5f}) on the first step.",
                          "Return the objective of the step, computed before the update, as a number.")
        which = "first" if e1 >= 1e-3 else "second"
        raise CheckFailure(
            f"{label}: after the {which} step your parameters differ from the reference's (relative difference "
            f"{max(e1, e2):.2e}).")
    return ("two steps from the same start (SGD, maximize=True) move the parameters exactly as the reference in "
            "each setting (relative differences): " + "; ".join(details) + ".")


# ----------------------------------------------------------------------------------------------------
# reinforce_pp_advantages
# ----------------------------------------------------------------------------------------------------


def _pp_inputs(B: int, g: int, lengths: list[int], seed: int, spread: float = 0.5) -> tuple:
    gen = seeded(seed)
    logprobs = -3 * torch.rand(B, g, generator=gen)
    ref = logprobs + spread * torch.randn(B, g, generator=gen)
    rewards = torch.randn(B, generator=gen)
    mask = torch.arange(g)[None, :] < torch.tensor(lengths)[:, None]  # [B g]
    junk = torch.where(mask, 0.0, 4.0 * torch.randn(B, g, generator=gen))  # masked positions hold junk
    return rewards, logprobs + junk, ref - junk, mask


def _pp_cases() -> list[Case]:
    r, lp, ref, mask = _pp_inputs(6, 7, [7, 1, 3, 5, 2, 6], seed=10)
    r2, lp2, ref2, mask2 = _pp_inputs(4, 12, [12, 9, 4, 11], seed=11, spread=0.8)
    r3, lp3, ref3, mask3 = _pp_inputs(5, 6, [6, 6, 2, 4, 5], seed=12, spread=0.05)
    flat = torch.full((5,), 0.4)  # every reward equal: the returns differ only by a tiny KL
    _, lp4, ref4, _ = _pp_inputs(16, 10, [10] * 16, seed=13, spread=0.01)
    mask4 = torch.arange(10)[None, :] < torch.tensor([1] + [10] * 14 + [9])[:, None]  # 150 tokens
    outlier = torch.zeros(16)
    outlier[0] = 5.0  # one completion of one token far above the rest: z = sqrt(149) ~ 12
    return [
        Case("6 completions of 1 to 7 tokens, junk under the mask, beta=0.2", (r, lp, ref, mask),
             {"beta": 0.2, "eps": 1e-8}),
        Case("completions of up to 12 tokens, rewards of both signs, beta=0.5", (r2 * 3, lp2, ref2, mask2),
             {"beta": 0.5, "eps": 1e-8}),
        Case("beta=0.0 (a value, not unset): the whitened rewards alone", (r, lp, ref, mask), {"beta": 0.0, "eps": 1e-8}),
        Case("equal rewards, returns that barely differ, eps=0.5 (eps matters)", (flat, lp3, ref3, mask3),
             {"beta": 0.1, "eps": 0.5}),
        Case("a batch of 1 whose completion is one token", (r[:1], lp[:1, :3], ref[:1, :3],
                                                            torch.tensor([[True, False, False]])),
             {"beta": 0.2, "eps": 1e-8}),
        Case("defaults (beta=0.01, eps=1e-8), 12-token completions", (r2, lp2, ref2, mask2), {}),
        Case("one outlier among 150 tokens (its advantage is above 10)", (outlier, lp4, ref4, mask4),
             {"beta": 0.01, "eps": 1e-8}),
    ]


def _pp_variant(*, kl="k1", kl_sign=-1.0, to_go="reverse", gamma=1.0, reward_at="all", whiten_over="masked",
                unbiased=False, eps_mode="var", fixed_beta=None, zero_masked=True, mask_kl=True, scale=True):
    """A configurable (possibly wrong) reinforce_pp_advantages."""

    def fn(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
        b = beta if fixed_beta is None else fixed_beta
        logr = ref_logprobs - logprobs
        per_token = {"k1": -logr, "k3": torch.expm1(logr) - logr, "swapped": logr}[kl]
        if mask_kl:
            per_token = per_token * mask
        g = mask.shape[1]
        if to_go in ("reverse", "after"):
            weights = torch.triu(torch.ones(g, g), diagonal=int(to_go == "after")).to(per_token)  # s >= t (s > t)
            if gamma != 1.0:
                t = torch.arange(g, dtype=per_token.dtype, device=per_token.device)
                weights = weights * gamma ** (t[None, :] - t[:, None]).clamp(min=0)
            kl_to_go = per_token @ weights.T
        elif to_go == "forward":
            kl_to_go = per_token.cumsum(-1)
        elif to_go == "none":  # per-token rewards, never summed into returns
            kl_to_go = per_token
        else:  # the whole sequence's KL on every token
            kl_to_go = per_token.sum(-1, keepdim=True).expand_as(per_token)
        last = mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)
        last = last & mask & (torch.cumsum(last.long(), -1) == 1)
        if reward_at == "all":
            if gamma == 1.0:
                reward = rewards[:, None].expand_as(per_token)
            else:
                t = torch.arange(g, device=mask.device)
                end = mask.sum(-1, keepdim=True) - 1
                reward = rewards[:, None] * gamma ** (end - t).clamp(min=0)
        else:  # only on the last token, not carried back
            reward = rewards[:, None] * last
        returns = reward + kl_sign * b * kl_to_go
        if whiten_over == "masked":
            sel = returns[mask]
            mean, var = sel.mean(), sel.var(unbiased=unbiased)
        elif whiten_over == "all":
            mean, var = returns.mean(), returns.var(unbiased=unbiased)
        elif whiten_over == "all_zeroed":  # the masked returns set to 0 first, then every position counted
            returns = returns * mask
            mean, var = returns.mean(), returns.var(unbiased=unbiased)
        else:  # per sequence
            m = mask.float()
            n = m.sum(-1, keepdim=True)
            mean = (returns * m).sum(-1, keepdim=True) / n
            var = (((returns - mean) ** 2) * m).sum(-1, keepdim=True) / (n - 1 if unbiased else n)
        if not scale:
            adv = returns - mean
        elif eps_mode == "var":
            adv = (returns - mean) / torch.sqrt(var + eps)
        elif eps_mode == "std":
            adv = (returns - mean) / (torch.sqrt(var) + eps)
        else:  # a fixed eps
            adv = (returns - mean) / torch.sqrt(var + 1e-8)
        return adv * mask if zero_masked else adv

    return fn


PP_MISTAKES = [
    Mistake("You whitened each sequence on its own: REINFORCE++ whitens over every unmasked token of the whole "
            "batch at once (one mean and one variance), which is what lets it do without a group baseline.",
            _pp_variant(whiten_over="row")),
    Mistake("The mean and variance include the masked positions: take them over the unmasked tokens (mask "
            "True) only.", _pp_variant(whiten_over="all")),
    Mistake("The mean and variance include the masked positions (as zeros): take them over the unmasked "
            "tokens (mask True) only.", _pp_variant(whiten_over="all_zeroed")),
    Mistake("You used the unbiased variance (divides by N - 1): the course's whiten uses the biased one, "
            "dividing by N, the number of unmasked tokens.", _pp_variant(unbiased=True)),
    Mistake("eps is added to the standard deviation: as in whiten, it goes inside the square root, "
            "(G - mu) / sqrt(sigma^2 + eps).", _pp_variant(eps_mode="std")),
    Mistake("eps is hard-coded: use the `eps` argument.", _pp_variant(eps_mode="fixed")),
    Mistake("Your KL penalties are summed from the start of the sequence up to t: a token's return holds what "
            "comes *after* it (t and every later token), not before.", _pp_variant(to_go="forward")),
    Mistake("Every token carries the KL of its whole sequence: a token's return holds the KL penalties from it "
            "to the end only (the return-to-go).", _pp_variant(to_go="whole")),
    Mistake("Your returns leave out each token's own KL penalty (the sum starts after t): a token's return "
            "holds its own penalty and every later one, s >= t.", _pp_variant(to_go="after")),
    Mistake("The returns are centred but not scaled: whitening also divides by sqrt(sigma^2 + eps).",
            _pp_variant(scale=False)),
    Mistake("The sequence reward is only on the last token: with gamma = 1 every token's return-to-go "
            "contains it.", _pp_variant(reward_at="last")),
    Mistake("Those are per-token rewards (the sequence reward only on the last token), not returns: a token's "
            "return is the sequence reward plus the sum of the KL penalties from it to the end (gamma = 1).",
            _pp_variant(reward_at="last", to_go="none")),
    Mistake("The returns are discounted: REINFORCE++ here uses gamma = 1, plain sums.",
            _pp_variant(gamma=0.99)),
    Mistake("That per-token KL is k3: the penalty in the reward is k1, logprobs - ref_logprobs.",
            _pp_variant(kl="k3")),
    Mistake("The KL penalty has the wrong sign (added, or the reference over the policy): the per-token reward "
            "is -beta * (logprobs - ref_logprobs), so moving away from the reference costs reward.",
            _pp_variant(kl="swapped")),
    Mistake("beta is hard-coded: use the `beta` argument (0.0 included).", _pp_variant(fixed_beta=0.01)),
    Mistake("The masked positions are not 0: the advantages are 0 wherever the mask is False.",
            _pp_variant(zero_masked=False)),
    Mistake("The masked positions' log-probs entered the KL sums: masked positions hold junk and count for "
            "nothing.", _pp_variant(mask_kl=False)),
]


@checker(
    "reinforce_pp_advantages",
    chapter=CHAPTER,
    hint=(
        "Two stages: first a [B, g] tensor of returns (the sequence reward plus the KL penalties still to "
        "come at each token), then one whitening of those returns over the unmasked tokens (mask True) of the whole batch.",
        "kl[b, t] = logprobs - ref_logprobs where the mask is True, 0 elsewhere; G[b, t] = R[b] - beta * (sum "
        "of kl[b, s] over s >= t): a cumulative sum taken from the end of each row. Then mu and sigma^2 are the "
        "mean and the biased variance of G over the True positions only, A = (G - mu) / sqrt(sigma^2 + eps) "
        "there and 0 elsewhere.",
        "```python\nkl = torch.where(mask, logprobs - ref_logprobs, torch.zeros_like(logprobs))\nto_go = "
        "kl.flip(-1).cumsum(-1).flip(-1)\nreturns = rewards[:, None] - beta * to_go\nn = mask.sum()\nmean = "
        "torch.where(mask, returns, torch.zeros_like(returns)).sum() / n\nvar = torch.where(mask, (returns - "
        "mean) ** 2, torch.zeros_like(returns)).sum() / n\nadvantages = (returns - mean) * torch.rsqrt(var + "
        "eps)\nreturn torch.where(mask, advantages, torch.zeros_like(advantages))\n```",
    ),
)
def check_reinforce_pp_advantages(candidate) -> str:
    return compare_to_reference(
        candidate, grpo.reinforce_pp_advantages, _pp_cases(), mistakes=PP_MISTAKES,
        arg_names=["rewards", "logprobs", "ref_logprobs", "mask"],
    )


# ----------------------------------------------------------------------------------------------------
# cispo_objective
# ----------------------------------------------------------------------------------------------------


def _cispo_cases() -> list[Case]:
    lp, old, _, adv, mask = _objective_inputs(6, 7, [7, 1, 3, 5, 2, 6], seed=20)
    lp2, old2, _, adv2, mask2 = _objective_inputs(4, 6, [6, 4, 1, 3], seed=21)
    # ratios far outside the clip range, both signs of advantage
    far_lp = torch.tensor([[-0.5, -1.0, -0.2, -3.0], [-1.0, -0.1, -2.0, -0.3], [-0.7, -0.7, -0.7, -0.7]])
    far_old = far_lp - torch.tensor([[2.5, 1.5, 0.05, -2.0], [2.0, -3.0, 1.2, 0.0], [0.3, 2.2, -0.3, -0.1]])
    far_mask = torch.tensor([[True, True, True, True], [True, True, True, False], [True, True, False, False]])
    # tokens of probability ~e^-120: exp of each log-prob alone is 0 in float32
    tiny_lp = torch.tensor([[-120.0, -118.0, -2.0], [-115.0, -0.5, -1.0]])
    tiny_old = tiny_lp - torch.tensor([[-0.5, 0.1, 0.05], [0.2, -0.1, 0.0]])
    return [
        Case("6 completions of 1 to 7 tokens, junk under the mask", (lp, old, adv, mask),
             {"eps_low": 0.2, "eps_high": 0.28}),
        Case("ratios far outside the clip range, both signs of advantage", (far_lp, far_old,
             torch.tensor([-1.5, 0.8, -0.4]), far_mask), {"eps_low": 0.2, "eps_high": 0.28}),
        Case("eps_low=0.5, eps_high=0.1 (each bound its own)", (far_lp, far_old, torch.tensor([1.0, -0.7, 0.3]),
             far_mask), {"eps_low": 0.5, "eps_high": 0.1}),
        Case("eps_low=0.05, eps_high=2.0", (lp2, old2, adv2, mask2), {"eps_low": 0.05, "eps_high": 2.0}),
        Case("eps_low=0.0 and eps_high=0.0 (values, not unset: every weight is 1)", (lp2, old2, adv2, mask2),
             {"eps_low": 0.0, "eps_high": 0.0}),
        Case("tokens of probability about e^-120", (tiny_lp, tiny_old, torch.tensor([0.9, -1.2]),
             torch.ones(2, 3, dtype=torch.bool)), {"eps_low": 0.2, "eps_high": 0.28}),
        Case("a batch of 1 whose completion is one token", (lp[:1, :3], old[:1, :3], adv[:1],
             torch.tensor([[True, False, False]])), {"eps_low": 0.2, "eps_high": 0.28}),
        Case("eps_low=1.0 (no lower bound, MiniMax's setting), eps_high=100: ratios up to e^4 unclipped",
             (far_lp, far_old - torch.tensor([[1.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
              torch.tensor([0.7, -1.0, 0.4]), far_mask), {"eps_low": 1.0, "eps_high": 100.0}),
        Case("defaults (eps_low=0.2, eps_high=0.28)", (far_lp, far_old, torch.tensor([0.5, -1.0, 2.0]), far_mask), {}),
    ]


def _cispo_variant(*, clip="both", aggregate="token", ppo=False, drop_clipped=False, use_mask=True,
                   invert=False, fixed=None, detach=True, sign=1.0, with_logprob=True):
    """A configurable (possibly wrong) cispo_objective."""

    def fn(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
        lo, hi = (eps_low, eps_high) if fixed is None else fixed
        logr = logprobs - old_logprobs if not invert else old_logprobs - logprobs
        ratio = torch.exp(logr)
        bounds = {"both": (1 - lo, 1 + hi), "sym_low": (1 - lo, 1 + lo), "sym_high": (1 - hi, 1 + hi),
                  "none": (None, None), "high_only": (None, 1 + hi)}[clip]
        weight = ratio.clamp(*bounds) if bounds != (None, None) else ratio
        a = advantages[:, None]
        if ppo:
            per_token = torch.minimum(ratio * a, weight * a)
        else:
            per_token = (weight.detach() if detach else weight) * a * (logprobs if with_logprob else 1.0)
        per_token = sign * per_token
        m = mask if use_mask else torch.ones_like(mask)
        if drop_clipped:
            m = m & (ratio >= 1 - lo) & (ratio <= 1 + hi)
        per_token = per_token * m
        if aggregate == "token":
            return per_token.sum() / mask.sum()
        if aggregate == "sequence":
            return (per_token.sum(-1) / mask.sum(-1)).mean()
        return per_token.mean()

    return fn


CISPO_MISTAKES = [
    Mistake("That is PPO's clipped surrogate, min(ratio * A, clip(ratio) * A): CISPO multiplies the log-prob "
            "by a clipped, detached ratio, sg(clip(ratio)) * A * logprobs.", _cispo_variant(ppo=True)),
    Mistake("Tokens whose ratio left the clip range are dropped: CISPO keeps every token, with its weight "
            "clipped (that is its point: no token loses its gradient).", _cispo_variant(drop_clipped=True)),
    Mistake("You averaged each sequence first: CISPO's mean is over all unmasked tokens of the batch "
            "(every token weighs the same).", _cispo_variant(aggregate="sequence")),
    Mistake("Masked tokens are zeroed but counted in the mean: divide by the number of unmasked tokens.",
            _cispo_variant(aggregate="padded")),
    Mistake("The mask is ignored: masked tokens count for nothing.", _cispo_variant(use_mask=False)),
    Mistake("The weight is clipped with eps_low on both sides: the upper bound is 1 + eps_high.",
            _cispo_variant(clip="sym_low")),
    Mistake("The weight is clipped with eps_high on both sides: the lower bound is 1 - eps_low.",
            _cispo_variant(clip="sym_high")),
    Mistake("The weight is not clipped below: clip(ratio, 1 - eps_low, 1 + eps_high).",
            _cispo_variant(clip="high_only")),
    Mistake("The weight is not clipped: clip(ratio, 1 - eps_low, 1 + eps_high).", _cispo_variant(clip="none")),
    Mistake("The ratio is upside down: ratio = exp(logprobs - old_logprobs) = pi_theta / pi_old.",
            _cispo_variant(invert=True)),
    Mistake("The clip bounds are hard-coded: use eps_low and eps_high (0.0 included).",
            _cispo_variant(fixed=(0.2, 0.28))),
    Mistake("That is the objective's opposite (a loss to minimise): cispo_objective is the objective to "
            "maximise, + sum of w * A * logprobs over the unmasked tokens / their number.", _cispo_variant(sign=-1.0)),
]
CISPO_MISTAKES.append(
    Mistake("The log-prob factor is missing: each token contributes w * A * logprobs, the clipped ratio as a "
            "constant weight and the log-prob carrying the gradient (w * A alone is an importance-weighted "
            "advantage, with no gradient once w is a constant).", _cispo_variant(with_logprob=False, detach=False)))
CISPO_GRAD_MISTAKES = [
    Mistake("The weight carries a gradient: the clipped ratio is sg(clip(ratio)), a constant, so the gradient "
            "at a token is w * A / N through the log-prob alone, with no term through the ratio (a token whose "
            "ratio is clipped keeps its gradient, and one inside the range is not pushed twice).",
            _cispo_variant(detach=False)),
]


@checker(
    "cispo_objective",
    chapter=CHAPTER,
    hint=(
        "Per token, three factors: a weight (the clipped ratio, turned into a plain number so no gradient goes "
        "through it), the sequence's advantage, and the log-prob itself, which carries the gradient. Then one "
        "mean over the unmasked tokens of the whole batch.",
        "ratio = exp(logprobs - old_logprobs); w = clip(ratio, 1 - eps_low, 1 + eps_high) with its gradient "
        "stopped (the exponential of the difference of the log-probs, never a ratio of two exponentials: "
        "they underflow); per token w * A[b] * logprobs (A has shape [B]: broadcast it over the row's tokens); "
        "zero the masked positions, then divide the sum by the number of True in the mask.",
        "```python\nratio = torch.exp(logprobs - old_logprobs)\nweight = ratio.clamp(1 - eps_low, 1 + "
        "eps_high).detach()\nper_token = weight * advantages[:, None] * logprobs\nper_token = torch.where(mask, "
        "per_token, torch.zeros_like(per_token))\nreturn per_token.sum() / mask.sum()\n```",
    ),
)
def check_cispo_objective(candidate) -> str:
    return compare_to_reference(
        candidate, grpo.cispo_objective, _cispo_cases(), mistakes=CISPO_MISTAKES,
        arg_names=["logprobs", "old_logprobs", "advantages", "mask"],
        grad=DIFFERENTIATED["cispo_objective"], grad_cases=(0, 1, 2, 5), grad_mistakes=CISPO_GRAD_MISTAKES,
    )


# ----------------------------------------------------------------------------------------------------
# truncated_is_weights
# ----------------------------------------------------------------------------------------------------


def _tis_cases() -> list[Case]:
    gen = seeded(30)
    train = -4 * torch.rand(5, 8, generator=gen)
    sampler = train + 0.7 * torch.randn(5, 8, generator=gen)  # weights from ~0.1 to ~8
    mask = torch.arange(8)[None, :] < torch.tensor([[8], [1], [5], [3], [7]])
    junk = torch.where(mask, 0.0, 60.0 * torch.randn(5, 8, generator=gen))  # exp of it overflows
    far_train = torch.tensor([[-1.0, -300.0, -2.0], [-0.2, -5.0, -250.0]])
    far_sampler = torch.tensor([[-301.0, -1.0, -2.5], [-0.1, -400.0, -0.3]])
    tiny_train = torch.tensor([[-120.0, -115.0, -109.0]])
    tiny_sampler = torch.tensor([[-119.0, -115.5, -111.0]])
    return [
        Case("5 rows of 1 to 8 tokens, cap=2.0, junk under the mask", (train + junk, sampler - junk, mask),
             {"cap": 2.0}),
        Case("cap=5.0", (train, sampler, mask), {"cap": 5.0}),
        Case("cap=1.0: no weight above 1", (train, sampler, mask), {"cap": 1.0}),
        Case("log-ratios of hundreds, both signs", (far_train, far_sampler, torch.ones(2, 3, dtype=torch.bool)),
             {"cap": 2.0}),
        Case("tokens of probability about e^-115", (tiny_train, tiny_sampler, torch.ones(1, 3, dtype=torch.bool)),
             {"cap": 3.0}),
        Case("the default cap (2.0)", (train, sampler, mask), {}),
    ]


def _tis_variant(*, invert=False, cap_mode="min", masked="zero", per="token", fixed_cap=None):
    """A configurable (possibly wrong) truncated_is_weights."""

    def fn(train_logprobs, sampler_logprobs, mask, cap=2.0):
        c = cap if fixed_cap is None else fixed_cap
        logr = train_logprobs - sampler_logprobs if not invert else sampler_logprobs - train_logprobs
        if per == "sequence":
            logr = torch.where(mask, logr, 0.0).sum(-1, keepdim=True).expand_as(logr)
        w = torch.exp(logr)
        if cap_mode == "log":
            w = torch.exp(logr.clamp(max=c))
        w = w.clamp(max=c) if cap_mode == "min" else w.clamp(1 / c, c) if cap_mode == "both" else w
        w = w.detach()
        if masked == "zero":
            return torch.where(mask, w, 0.0)
        if masked == "one":
            return torch.where(mask, w, 1.0)
        return w

    return fn


TIS_MISTAKES = [
    Mistake("The ratio is upside down: the weight is exp(train_logprobs - sampler_logprobs), the trainer's "
            "probability over the sampler's (the tokens came from the sampler).", _tis_variant(invert=True)),
    Mistake("The weights are truncated from below too: only the top is cut, min(ratio, cap); a small "
            "ratio stays small.", _tis_variant(cap_mode="both")),
    Mistake("The cap is applied to the log-ratio (the weight is then cut at exp(cap)): cap bounds the weight "
            "itself, min(ratio, cap).", _tis_variant(cap_mode="log")),
    Mistake("The weights are not truncated: min(ratio, cap).", _tis_variant(cap_mode="none")),
    Mistake("The cap is hard-coded: use the `cap` argument.", _tis_variant(fixed_cap=2.0)),
    Mistake("Masked positions are not 0: the weight is 0 wherever the mask is False.", _tis_variant(masked="keep")),
    Mistake("Masked positions are 1: the weight is 0 wherever the mask is False.", _tis_variant(masked="one")),
    Mistake("That is one weight per sequence (the product of its token ratios): the correction here is per "
            "token.", _tis_variant(per="sequence")),
]


@checker(
    "truncated_is_weights",
    chapter=CHAPTER,
    hint=(
        "One number per token: how much more (or less) likely the trainer finds the token than the sampler that "
        "drew it, cut off at `cap`; a constant (no gradient), and 0 off the mask.",
        "w = min(exp(train_logprobs - sampler_logprobs), cap) where the mask is True, 0 elsewhere, computed "
        "without gradients. Take the exponential of the difference, never a ratio of two exponentials (they "
        "underflow), and the masked positions must be 0 even where the exponential of their junk overflows to "
        "inf (inf times 0 is NaN).",
        "```python\nwith torch.no_grad():\n    weights = torch.exp(train_logprobs - "
        "sampler_logprobs).clamp(max=cap)\n    return torch.where(mask, weights, torch.zeros_like(weights))\n```",
    ),
)
def check_truncated_is_weights(candidate) -> str:
    detail = compare_to_reference(
        candidate, grpo.truncated_is_weights, _tis_cases(), mistakes=TIS_MISTAKES,
        arg_names=["train_logprobs", "sampler_logprobs", "mask"],
    )
    train, sampler, mask = to_device(_tis_cases()[1].args)
    leaf = train.clone().requires_grad_(True)
    out = call(candidate, leaf, sampler.clone(), mask.clone(), cap=2.0,
               _arg_names=["train_logprobs", "sampler_logprobs", "mask"])
    if isinstance(out, torch.Tensor) and out.requires_grad:
        raise CheckFailure(
            "The weights carry a gradient: train_logprobs required grad, and your output does too. The weights "
            "are constants of the update (a correction of the sampling distribution, not something to optimise).",
            hint="Detach the weights: no gradient flows through them, whatever the inputs carry.")
    return detail + " The weights carry no gradient when train_logprobs does."
