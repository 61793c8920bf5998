"""Checkers for chapter 06: DPO and friends.

Every exercise is a pure tensor function, so each is compared with the reference on seeded cases that
include the regimes where plausible implementations part ways: large magnitudes (an unstable
``log(sigmoid(x))`` or ``log(softmax(x))`` gives -inf there), ties, a group of two, single-token
completions, rows whose mask is all True or has one True, junk in masked positions, sequence
log-probs in the hundreds for implicit_reward (a ratio of probabilities underflows), and for
gspo_sequence_ratio one True per row at the end, the start and the middle (a mean over the first
mask.sum() positions is right only while the True positions start at 0). On a mismatch the
catalogued mistakes name what went wrong. ``dpo_loss`` is also checked to raise ``ValueError`` on an
unknown ``loss_type``. ``kto_loss`` is run on batches with more undesirable than desirable completions
(one mean over all of them is not the sum, nor the mean, of the two kinds' means), with one kind only,
with a negative z0 (clamped at 0), and its gradient is compared once more with z0 computed from the
policy's own log-probs, graph and all (the loss must treat it as a constant). ``orpo_loss`` is run on
mean log-probs between -1e-7 and -1e-5 (log(1 - exp(m)) loses every digit there in float32), in the
hundreds below 0 (exp(m) underflows) and on log-odds hundreds apart (a log of a sigmoid underflows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlhf_tutorial import dpo
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    checker,
    compare_gradients,
    compare_to_reference,
    failure,
    nudge,
    seeded,
    to_device,
)
from rlhf_tutorial.trainers.plug import DIFFERENTIATED

CHAPTER = "06_dpo_and_frontier"

#: The contract of each exercise (its CURRICULUM.md row and its docstring), clause by clause; the checker
#: tests hold a version breaking each (``VIOLATIONS``), and ``tests/checks/test_contract_clauses.py`` holds
#: the two together.
CLAUSES = {
    "sequence_logprobs": {
        "shifted": "token t's log-prob comes from the logits at position t - 1",
        "mask_marks_tokens": "the mask marks the tokens (mask[:, t] goes with token t), not the predicting positions",
        "mask_used": "only the tokens where the mask is True count",
        "first_ignored": "mask[:, 0] is ignored: the first token has no prediction",
        "last_token": "the last token counts too: the shift runs to the end of the row",
        "sum": "the result is the sum of the token log-probs, not their mean",
        "stable": "finite for large logits (a log of a softmax underflows there)",
        "shape": "one float per row, shape [b]",
        "differentiable": "differentiable in the logits, with the reference's gradient",
        "not_in_place": "no input tensor is modified in place",
    },
    "dpo_loss": {
        "log_ratios": "h is a difference of log-ratios to the reference, not of the policy's log-probs alone",
        "h_sign": "h is chosen minus rejected: the loss falls as the chosen completion gains",
        "beta_inside": "beta scales h inside the log-sigmoid, not the log-sigmoid",
        "label_smoothing": "label_smoothing weighs logsigmoid(-beta h) by ls and logsigmoid(beta h) by 1 - ls",
        "ipo": '"ipo" is the squared distance of h from 1 / (2 beta)',
        "hinge": '"hinge" is relu(1 - beta h)',
        "mean": "the loss is the mean over pairs",
        "stable": "finite for |beta h| in the hundreds (a log-sigmoid, not the log of a sigmoid)",
        "unknown_loss_type": "any other loss_type raises ValueError",
        "differentiable": "differentiable in the policy's chosen and rejected log-probs, with the reference's "
                          "gradient",
        "not_in_place": "no input tensor is modified in place",
    },
    "implicit_reward": {
        "log_ratio": "the policy's log-prob minus the reference's (not upside down)",
        "beta": "the log-ratio times beta (not divided, not left out)",
        "log_space": "exact for sequence log-probs in the hundreds (no ratio of probabilities)",
        "per_completion": "one reward per completion, shape [b]",
        "not_in_place": "no input tensor is modified in place",
    },
    "simpo_loss": {
        "length_normalised": "each side's log-prob is divided by its own length",
        "gamma_margin": "gamma is subtracted, outside the product with beta",
        "gamma_zero": "gamma = 0.0 is a value, not unset",
        "stable": "finite for margins in the hundreds (a log-sigmoid)",
        "mean": "the loss is the mean over pairs",
        "differentiable": "differentiable in the chosen and rejected log-probs, with the reference's gradient",
    },
    "kto_loss": {
        "log_ratio": "r is the policy's log-prob minus the reference's (not the policy's alone, not upside down)",
        "sides": "a desirable completion is scored on r - z, an undesirable one on z - r",
        "z0_clamped": "the reference point is z0 clamped at 0: a negative KL estimate counts as 0",
        "reference_point": "each completion is judged against the reference point z = max(z0, 0), not against 0",
        "z0_detached": "no gradient flows through z0, even when the caller's z0 was computed from the policy",
        "one_mean": "one mean over all the batch's completions, not the sum (or mean) of two class means",
        "one_class": "a batch with only desirable (or only undesirable) completions is a batch like any other",
        "lambdas": "lambda_d weighs the desirable completions, lambda_u the undesirable ones",
        "beta": "beta scales r - z inside the sigmoid",
        "one_minus_sigmoid": "each completion's loss is 1 - sigmoid(...) (a value in [0, lambda]), not a log-sigmoid",
        "differentiable": "differentiable in the policy's log-probs, with the reference's gradient",
        "not_in_place": "no input tensor is modified in place",
    },
    "orpo_loss": {
        "length_normalised": "the log-odds are of the mean per-token log-prob, each side divided by its own length",
        "nll": "the SFT term is the chosen completions' NLL per token, averaged over pairs (the rejected have none)",
        "odds_not_probs": "the odds-ratio term compares log-odds, log p - log(1 - p), not log-probs",
        "orientation": "the log-odds of the chosen minus those of the rejected, the term subtracted from the NLL",
        "lam": "lam weighs the odds-ratio term (not the NLL)",
        "lam_zero": "lam = 0.0 is a value (the SFT loss alone), not unset",
        "stable_near_zero": "exact for mean log-probs close to 0 (1 - p is then a difference of nearly equal numbers)",
        "stable_very_negative": "finite for mean log-probs in the hundreds below 0 (p underflows to 0 there)",
        "stable_logsigmoid": "finite for differences of log-odds in the hundreds (a log-sigmoid)",
        "mean": "both terms are means over pairs",
        "differentiable": "differentiable in the chosen and rejected log-probs, with the reference's gradient",
        "not_in_place": "no input tensor is modified in place",
    },
    "best_worst_pairs": {
        "chosen_first": "column 0 is the best sample (argmax), column 1 the worst (argmin)",
        "first_on_ties": "ties go to the first occurrence, for the best and the worst",
        "per_group": "the indices are within each group (a row)",
        "shape": "the pairs have shape [p, 2]",
        "int64": "the indices are int64",
    },
    "rloo_advantages": {
        "leave_one_out": "the baseline of sample j leaves sample j out",
        "g_minus_one": "the mean of the others divides by G - 1 (with true division: G = 3, 4, ... too)",
        "no_std": "no division by a standard deviation",
        "within_group": "the baseline is within each group, not over the batch",
        "not_in_place": "the rewards tensor is never modified in place",
    },
    "gspo_sequence_ratio": {
        "geometric": "the exponential of the mean log-ratio (a geometric mean), not the mean of the ratios",
        "length_normalised": "the log-ratios are averaged, not summed",
        "own_count": "each row divides by its own number of True positions, not by g",
        "mask": "only positions where the mask is True count, wherever they stand in the row",
        "orientation": "the ratio is pi_theta / pi_old",
        "stable": "finite for hundreds of tokens (no product of ratios)",
        "differentiable": "differentiable in logprobs, with the reference's gradient",
    },
}


# ----------------------------------------------------------------------------------------------------
# sequence_logprobs
# ----------------------------------------------------------------------------------------------------


def _completion_mask(lengths: list[tuple[int, int]], s: int) -> torch.Tensor:
    """Rows of [s] that are True from ``start`` (the first completion token) for ``n`` tokens."""
    pos = torch.arange(s)[None, :]
    start = torch.tensor([a for a, _ in lengths])[:, None]
    n = torch.tensor([b for _, b in lengths])[:, None]
    return (pos >= start) & (pos < start + n)


def _seq_cases() -> list[Case]:
    g = seeded(0)
    b, s, v = 4, 8, 13
    logits = 2 * torch.randn(b, s, v, generator=g)
    tokens = torch.randint(0, v, (b, s), generator=g)
    mask = _completion_mask([(3, 5), (2, 4), (5, 3), (4, 1)], s)  # padding after, one single-token row
    big = 60 * torch.randn(3, 6, 9, generator=g)  # log(softmax) underflows to log(0) here
    big_tokens = big.argmin(-1).roll(1, dims=1)  # unlikely tokens: log-probs near -100
    big_mask = _completion_mask([(2, 4), (1, 5), (3, 2)], 6)
    all_true = torch.ones(3, 5, dtype=torch.bool)
    one_true = torch.zeros(3, 5, dtype=torch.bool)
    one_true[0, 4], one_true[1, 1], one_true[2, 2] = True, True, True
    logits5 = torch.randn(3, 5, 7, generator=g)
    tokens5 = torch.randint(0, 7, (3, 5), generator=g)
    return [
        Case("4 rows: prompt, completion, then padding (one completion of a single token)", (logits, tokens, mask)),
        Case("large logits (x60) and unlikely tokens", (big, big_tokens, big_mask)),
        Case("an all-True mask (mask[:, 0] must be ignored)", (logits5, tokens5, all_true)),
        Case("one True per row, at the last, the second and a middle position", (logits5, tokens5, one_true)),
        Case("a batch of 1", (logits[:1], tokens[:1], mask[:1])),
    ]


def _seq_variant(*, shift=True, mask_shift=True, reduce="sum", stable=True, use_mask=True, drop_last=False):
    def fn(logits, tokens, mask):
        lp = logits.log_softmax(-1) if stable else logits.softmax(-1).log()
        if shift:
            token_lp = lp[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
            m = mask[:, 1:] if mask_shift else mask[:, :-1]
        else:
            token_lp = lp.gather(-1, tokens[:, :, None]).squeeze(-1)
            m = mask
        m = m.float() if use_mask else torch.ones_like(m, dtype=torch.float)
        if drop_last:
            token_lp, m = token_lp[:, :-1], m[:, :-1]
        total = (token_lp * m).sum(-1)
        return total / m.sum(-1).clamp(min=1) if reduce == "mean" else total

    return fn


def _seq_product_of_probs(logits, tokens, mask):
    p = logits[:, :-1].softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.where(mask[:, 1:], p, 1.0).prod(-1).log()


SEQ_MISTAKES = [
    Mistake("The logits are not shifted: logits[:, t] predicts token t + 1, so token t's log-prob is "
            "log_softmax(logits[:, t - 1])[tokens[:, t]].",
            _seq_variant(shift=False)),
    Mistake("The mask is shifted the wrong way: mask[:, t] goes with token t, "
            "which the logits at t - 1 predict (the mask marks the tokens, not the positions that predict them).", _seq_variant(mask_shift=False)),
    Mistake("You averaged over the completion's tokens: the contract is the sum (the log-probability of the "
            "whole completion, a product of token probabilities).", _seq_variant(reduce="mean")),
    Mistake("You summed over every position: only the tokens where mask is True count.", _seq_variant(use_mask=False)),
    Mistake("log(softmax(x)) underflows to log(0) = -inf for large logits: use log_softmax.",
            _seq_variant(stable=False)),
    Mistake("You multiplied the token probabilities and took the log of the product: a product of many "
            "probabilities underflows to 0 (log 0 = -inf). Sum the token log-probs instead.",
            _seq_product_of_probs),
    Mistake("The last token is dropped: with the shift, every token from position 1 to the "
            "last has its prediction, the last token included.", _seq_variant(drop_last=True)),
]


@checker(
    "sequence_logprobs",
    chapter=CHAPTER,
    hint=(
        "The logits at position t - 1 predict token t: shift the logits and the tokens against each "
        "other by one before you pick anything. `Tensor.gather` picks one entry per position.",
        "out[b] = sum over t >= 1 of mask[b, t] * log_softmax(logits[b, t - 1])[tokens[b, t]]: "
        "log-softmax over the vocabulary of every position but the last, gather each next token's entry "
        "along the last dim, zero it where the mask (shifted like the tokens, so mask[:, 0] plays no "
        "part) is False, sum over positions.",
        "```python\nlogps = logits[:, :-1].log_softmax(dim=-1)\ntoken_logps = logps.gather(-1, tokens[:, "
        "1:, None]).squeeze(-1)\nreturn torch.where(mask[:, 1:], token_logps, "
        "torch.zeros_like(token_logps)).sum(dim=-1)\n```",
    ),
)
def check_sequence_logprobs(candidate) -> str:
    return compare_to_reference(candidate, dpo.sequence_logprobs, _seq_cases(), mistakes=SEQ_MISTAKES,
                                arg_names=["logits", "tokens", "mask"], grad=DIFFERENTIATED["sequence_logprobs"])


# ----------------------------------------------------------------------------------------------------
# dpo_loss
# ----------------------------------------------------------------------------------------------------


def _pair_logps(b: int, seed: int, spread: float = 3.0) -> tuple:
    g = seeded(seed)
    ref_c, ref_r = -20 + 5 * torch.randn(b, generator=g), -20 + 5 * torch.randn(b, generator=g)
    return (ref_c + spread * torch.randn(b, generator=g), ref_r + spread * torch.randn(b, generator=g), ref_c, ref_r)


def _dpo_cases() -> list[Case]:
    logps = _pair_logps(6, seed=1)
    huge = _pair_logps(4, seed=2, spread=400.0)  # beta * h of several hundred, both signs
    tie = (logps[2], logps[3], logps[2], logps[3])  # policy == reference: h = 0 for every pair
    one = tuple(x[:1] for x in _pair_logps(1, seed=3))
    return [
        Case('"sigmoid", beta=0.1', logps, {"beta": 0.1, "loss_type": "sigmoid"}),
        Case('"sigmoid", beta=0.5, label_smoothing=0.2', logps, {"beta": 0.5, "loss_type": "sigmoid", "label_smoothing": 0.2}),
        Case('"sigmoid" with |beta * h| in the hundreds', huge, {"beta": 1.0, "loss_type": "sigmoid"}),
        Case('"sigmoid", |beta * h| in the hundreds, label_smoothing=0.1', huge,
             {"beta": 1.0, "loss_type": "sigmoid", "label_smoothing": 0.1}),
        Case('"ipo", beta=0.1', logps, {"beta": 0.1, "loss_type": "ipo"}),
        Case('"ipo", beta=2.0', logps, {"beta": 2.0, "loss_type": "ipo"}),
        Case('"hinge", beta=0.3', logps, {"beta": 0.3, "loss_type": "hinge"}),
        Case("a tie: policy equal to the reference (h = 0), label_smoothing=0.3", tie,
             {"beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.3}),
        Case('a batch of 1, "sigmoid", beta=0.25', one, {"beta": 0.25, "loss_type": "sigmoid"}),
    ]


def _dpo_variant(*, h_sign=1, use_ref=True, ipo_target="half", hinge_beta=True, beta_inside=True,
                 reduce="mean", stable=True, hinge_sign=-1, smoothing=True):
    def fn(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
        h = (pc - rc) - (pr - rr) if use_ref else pc - pr
        h = h_sign * h
        ls = label_smoothing if smoothing else 0.0
        if loss_type == "sigmoid":
            logsig = F.logsigmoid if stable else (lambda x: torch.sigmoid(x).log())
            pos, neg = (logsig(beta * h), logsig(-beta * h)) if beta_inside else (beta * logsig(h), beta * logsig(-h))
            losses = -((1 - ls) * pos + ls * neg)
        elif loss_type == "ipo":
            # "precedence": 1/2*beta read as 1 / (2 * beta) but computed as (1 / 2) * beta
            target = {"half": 1 / (2 * beta), "one": 1 / beta, "scaled": 0.5, "precedence": 1 / 2 * beta}[ipo_target]
            losses = (beta * h - target) ** 2 if ipo_target == "scaled" else (h - target) ** 2
        elif loss_type == "hinge":
            x = beta * h if hinge_beta else h
            losses = torch.relu({-1: 1 - x, 1: 1 + x, 0: x - 1}[hinge_sign])
        else:
            raise ValueError(loss_type)
        return losses.sum() if reduce == "sum" else losses.mean()

    return fn


DPO_MISTAKES = [
    # the hinge's own sign slips first: they differ from the reference on the hinge case only
    Mistake("The hinge has the wrong sign: relu(1 - beta * h), which is 0 once the chosen side wins by a margin "
            "beta * h >= 1; relu(1 + beta * h) pushes the rejected side up.", _dpo_variant(hinge_sign=1)),
    Mistake("The hinge is turned around: relu(1 - beta * h) (a loss while the margin beta * h is below 1), not "
            "relu(beta * h - 1), which punishes the pairs the policy already gets right.", _dpo_variant(hinge_sign=0)),
    Mistake("The sign of h is flipped, or label_smoothing weighs the wrong term (for the sigmoid loss the two "
            "give the same numbers). h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected): the loss "
            "falls as the chosen completion gains probability relative to the rejected one; the observed "
            "preference keeps weight (1 - ls) on logsigmoid(beta * h), the flipped one weight ls on "
            "logsigmoid(-beta * h).", _dpo_variant(h_sign=-1)),
    Mistake("The reference log-probs are missing: h is a difference of *log-ratios* to the reference, "
            "(policy_chosen - ref_chosen) - (policy_rejected - ref_rejected).", _dpo_variant(use_ref=False)),
    Mistake("log(sigmoid(x)) underflows to log(0) = -inf when beta * h is very negative: use "
            "torch.nn.functional.logsigmoid.", _dpo_variant(stable=False)),
    Mistake("beta multiplies the log-sigmoid instead of its argument: logsigmoid(beta * h), not beta * logsigmoid(h).",
            _dpo_variant(beta_inside=False)),
    Mistake("IPO's target is 1 / (2 beta), not 1: the loss is the squared distance of h from it.", _dpo_variant(ipo_target="one")),
    Mistake("IPO regresses h itself onto 1 / (2 beta), not beta * h onto 1/2 (that scales the loss by beta squared).",
            _dpo_variant(ipo_target="scaled")),
    Mistake("The hinge is on beta * h: relu(1 - beta * h).", _dpo_variant(hinge_beta=False)),
    Mistake("IPO's target is computed as (1 / 2) * beta: in Python 1/2*beta is beta / 2, not 1 / (2 * beta). Write "
            "1 / (2 * beta) with the parentheses.", _dpo_variant(ipo_target="precedence")),

    Mistake("You summed the per-pair losses: the contract takes their mean.", _dpo_variant(reduce="sum")),
    Mistake("label_smoothing is ignored: with probability ls the label is taken as flipped, so the loss is "
            "(1 - ls) times the loss of the observed preference plus ls times that of the flipped one.",
            _dpo_variant(smoothing=False)),
]


def _raises_value_error(candidate, *args, **kwargs) -> bool:
    def attempt(*args, **kwargs) -> bool:
        try:
            candidate(*args, **kwargs)
        except ValueError:
            return True
        return False

    return call(attempt, *args, **kwargs)  # the inputs go through call(): it knows their device


@checker(
    "dpo_loss",
    chapter=CHAPTER,
    hint=(
        "Everything depends on one number per pair, h: how much more the policy raised the chosen "
        "completion's log-prob over the reference's than the rejected one's. The three loss types are "
        "three functions of h.",
        "h = (policy chosen - reference chosen) - (policy rejected - reference rejected). 'sigmoid': -(1 "
        "- ls) log sigma(beta h) - ls log sigma(-beta h), with `F.logsigmoid` (log of `sigmoid` "
        "underflows to -inf); 'ipo': the square of (h - 1/(2 beta)); 'hinge': max(0, 1 - beta h). Mean "
        "over pairs; any other loss_type raises ValueError.",
        "```python\nh = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - "
        "ref_rejected_logps)\nif loss_type == \"sigmoid\":\n    losses = -(1 - label_smoothing) * "
        "F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)\nelif loss_type == \"ipo\":\n    "
        "losses = (h - 1 / (2 * beta)) ** 2\nelif loss_type == \"hinge\":\n    losses = torch.relu(1 - beta "
        "* h)\nelse:\n    raise ValueError(f\"loss_type must be 'sigmoid', 'ipo' or 'hinge', got "
        "{loss_type!r}\")\nreturn losses.mean()\n```",
    ),
)
def check_dpo_loss(candidate) -> str:
    detail = compare_to_reference(
        candidate, dpo.dpo_loss, _dpo_cases(), mistakes=DPO_MISTAKES,
        arg_names=["policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps"],
        grad=DIFFERENTIATED["dpo_loss"], grad_cases=(1, 4, 6),
    )
    for bad in ("kto", "Sigmoid", ""):
        if not _raises_value_error(candidate, *to_device(_pair_logps(3, seed=4)), beta=0.1, loss_type=bad):
            raise CheckFailure(f"loss_type={bad!r} did not raise ValueError.",
                               hint="Any other loss_type raises ValueError naming the "
                               "accepted ones: a typo must not silently train with another loss.")
    return detail + " Unknown loss types raise ValueError."


# ----------------------------------------------------------------------------------------------------
# implicit_reward
# ----------------------------------------------------------------------------------------------------


def _implicit_cases() -> list[Case]:
    policy, _, ref, _ = _pair_logps(5, seed=5)
    return [
        Case("beta=0.1", (policy, ref), {"beta": 0.1}),
        Case("beta=2.0", (policy, ref), {"beta": 2.0}),
        Case("policy equal to the reference (a tie: reward 0)", (ref, ref), {"beta": 0.5}),
        Case("a batch of 1, beta=0.3", (policy[:1], ref[:1]), {"beta": 0.3}),
        # Saturation: sequence log-probs are sums over tokens, in the hundreds for long completions; exp of
        # one below about -104 underflows to 0 in float32, so a ratio of probabilities is inf there.
        Case("sequence log-probs in the hundreds (exp underflows)",
             (torch.tensor([-20.0, -60.0, -95.0]), torch.tensor([-150.0, -300.0, -420.0])), {"beta": 0.1}),
    ]


@checker(
    "implicit_reward",
    chapter=CHAPTER,
    hint=(
        "The reward a DPO policy implies is hidden in how far it moved from the reference on that "
        "completion, scaled by the DPO loss's own constant.",
        "r_hat(x, y) = beta log(pi(y | x) / pi_ref(y | x)): the policy's log-prob minus the reference's, "
        "times beta, one number per completion (element-wise over the batch).",
        "```python\nreturn beta * (policy_logps - ref_logps)\n```",
    ),
)
def check_implicit_reward(candidate) -> str:
    return compare_to_reference(candidate, dpo.implicit_reward, _implicit_cases(), mistakes=[
        Mistake("The log-ratio is upside down: policy_logps - ref_logps (a completion the policy made more likely "
                "has a positive implicit reward).", lambda p, r, beta: beta * (r - p)),
        Mistake("beta is missing: the implicit reward is the log-ratio scaled by the DPO loss's beta.", lambda p, r, beta: p - r),
        Mistake("You divided by beta: multiply.", lambda p, r, beta: (p - r) / beta),
        Mistake("You exponentiated: the implicit reward is the log-ratio itself times beta, not a ratio of "
                "probabilities.", lambda p, r, beta: beta * torch.exp(p - r)),
        Mistake("You took log(p / p_ref) from probabilities: exp of a sequence log-prob below about -104 "
                "underflows to 0 in float32, so the ratio is inf. Stay in log space: a log-ratio is a difference "
                "of log-probs.", lambda p, r, beta: beta * torch.log(p.exp() / r.exp())),
    ], arg_names=["policy_logps", "ref_logps"])


# ----------------------------------------------------------------------------------------------------
# simpo_loss
# ----------------------------------------------------------------------------------------------------


def _simpo_cases() -> list[Case]:
    g = seeded(6)
    lengths_c = torch.tensor([5, 12, 1, 8, 3])
    lengths_r = torch.tensor([9, 2, 1, 8, 15])
    c = -2.0 * lengths_c * torch.rand(5, generator=g)
    r = -2.0 * lengths_r * torch.rand(5, generator=g)
    big_c, big_r = torch.tensor([-900.0, -3.0]), torch.tensor([-2.0, -1200.0])
    ones = torch.tensor([1, 1])
    return [
        Case("beta=2.0, gamma=0.5", (c, r, lengths_c, lengths_r), {"beta": 2.0, "gamma": 0.5}),
        Case("beta=10.0, gamma=1.0", (c, r, lengths_c, lengths_r), {"beta": 10.0, "gamma": 1.0}),
        Case("gamma=0 and equal lengths", (c, r, lengths_c, lengths_c), {"beta": 2.0, "gamma": 0.0}),
        Case("single-token completions with log-probs in the hundreds", (big_c, big_r, ones, ones),
             {"beta": 2.5, "gamma": 0.5}),
        Case("a batch of 1", (c[:1], r[:1], lengths_c[:1], lengths_r[:1]), {"beta": 2.0, "gamma": 0.5}),
    ]


def _simpo_variant(*, normalise=True, gamma_sign=-1, gamma_inside=False, stable=True, swap_lengths=False,
                   reduce="mean", gamma_or_default=False):
    def fn(c, r, lc, lr, beta=2.0, gamma=0.5):
        if swap_lengths:
            lc, lr = lr, lc
        if gamma_or_default:
            gamma = gamma or 0.5
        margin = c / lc - r / lr if normalise else c - r
        x = beta * (margin + gamma_sign * gamma) if gamma_inside else beta * margin + gamma_sign * gamma
        losses = -(F.logsigmoid(x) if stable else torch.sigmoid(x).log())
        return losses.sum() if reduce == "sum" else losses.mean()

    return fn


@checker(
    "simpo_loss",
    chapter=CHAPTER,
    hint=(
        "No reference model: SimPO's reward of a completion is its average log-prob per token. Form the "
        "margin of the chosen over the rejected, then a logistic loss that asks for a margin of at least "
        "gamma.",
        "loss = mean over pairs of -log sigma(beta (log pi(y_w)/|y_w| - log pi(y_l)/|y_l|) - gamma), "
        "with `F.logsigmoid` for the log sigma (finite for any margin). The lengths are integer tensors: "
        "the division promotes to float.",
        "```python\nmargin = chosen_logps / chosen_lengths - rejected_logps / rejected_lengths\nreturn "
        "-F.logsigmoid(beta * margin - gamma).mean()\n```",
    ),
)
def check_simpo_loss(candidate) -> str:
    return compare_to_reference(candidate, dpo.simpo_loss, _simpo_cases(), mistakes=[
        Mistake("The log-probs are not length-normalised: SimPO's reward is the mean log-prob per token, "
                "chosen_logps / chosen_lengths.", _simpo_variant(normalise=False)),
        Mistake("gamma is a margin the chosen side must win by: subtract it, beta * margin - gamma.",
                _simpo_variant(gamma_sign=1)),
        Mistake("gamma is scaled by beta: the contract subtracts it outside, beta * margin - gamma.",
                _simpo_variant(gamma_inside=True)),
        Mistake("log(sigmoid(x)) underflows to -inf for very negative x: use F.logsigmoid.", _simpo_variant(stable=False)),
        Mistake("The lengths are swapped: each side is divided by its own length, chosen_logps / chosen_lengths and "
                "rejected_logps / rejected_lengths.", _simpo_variant(swap_lengths=True)),
        Mistake("You summed the per-pair losses: the contract takes their mean.", _simpo_variant(reduce="sum")),
        Mistake("gamma = 0.0 was replaced by a default: 0 is a value (no margin asked for), not unset.",
                _simpo_variant(gamma_or_default=True)),
    ], arg_names=["chosen_logps", "rejected_logps", "chosen_lengths", "rejected_lengths"],
       grad=DIFFERENTIATED["simpo_loss"])


# ----------------------------------------------------------------------------------------------------
# kto_loss
# ----------------------------------------------------------------------------------------------------

_KTO_ARGS = ["policy_logps", "ref_logps", "desirable", "z0"]


def _kto_inputs(b: int, seed: int, spread: float = 2.0, shift: float = 0.0) -> tuple:
    g = seeded(seed)
    ref = -20 + 5 * torch.randn(b, generator=g)
    return ref + shift + spread * torch.randn(b, generator=g), ref


def _kto_cases() -> list[Case]:
    policy, ref = _kto_inputs(8, seed=10)
    mixed = torch.tensor([True, False, False, True, False, False, True, False])  # 3 desirable, 5 undesirable
    z = torch.tensor(0.7)
    p1, r1 = _kto_inputs(1, seed=11)
    return [
        Case("8 completions (3 desirable, 5 undesirable), z0=0.7, beta=0.5", (policy, ref, mixed, z),
             {"beta": 0.5, "lambda_d": 1.0, "lambda_u": 1.0}),
        Case("lambda_d=1.0, lambda_u=1.5, beta=0.5", (policy, ref, mixed, z),
             {"beta": 0.5, "lambda_d": 1.0, "lambda_u": 1.5}),
        Case("lambda_d=2.0, lambda_u=0.5, beta=0.1", (policy, ref, mixed, z),
             {"beta": 0.1, "lambda_d": 2.0, "lambda_u": 0.5}),
        Case("a negative KL estimate, z0=-1.5 (clamped at 0)", (policy, ref, mixed, torch.tensor(-1.5)),
             {"beta": 0.5, "lambda_d": 1.0, "lambda_u": 1.0}),
        Case("beta=3.0, lambda_d=1.0, lambda_u=1.2", (policy, ref, mixed, torch.tensor(0.2)),
             {"beta": 3.0, "lambda_d": 1.0, "lambda_u": 1.2}),
        Case("only desirable completions", (policy, ref, torch.ones(8, dtype=torch.bool), z),
             {"beta": 0.5, "lambda_d": 1.3, "lambda_u": 1.0}),
        Case("only undesirable completions", (policy, ref, torch.zeros(8, dtype=torch.bool), z),
             {"beta": 0.5, "lambda_d": 1.0, "lambda_u": 0.8}),
        Case("a batch of 1 (undesirable)", (p1, r1, torch.zeros(1, dtype=torch.bool), torch.tensor(0.3)),
             {"beta": 0.5, "lambda_d": 1.0, "lambda_u": 1.0}),
    ]


def _kto_variant(*, use_ref=True, flip_r=False, same_side=False, clamp=True, reduce="all", swap_lambdas=False,
                 beta_inside=True, swap_labels=False, logsigmoid=False, detach_z=True, use_z=True, one_minus=True):
    def fn(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
        z = z0.detach() if detach_z else z0
        z = z.clamp(min=0) if clamp else z
        z = z if use_z else torch.zeros_like(z)
        r = policy_logps - ref_logps if use_ref else policy_logps
        r = -r if flip_r else r
        if swap_labels:
            desirable = ~desirable
        if swap_lambdas:
            lambda_d, lambda_u = lambda_u, lambda_d

        def value(x):
            if logsigmoid:
                return -F.logsigmoid(beta * x if beta_inside else x) * (1 if beta_inside else beta)
            if not one_minus:
                return -torch.sigmoid(beta * x)
            return 1 - torch.sigmoid(beta * x) if beta_inside else beta * (1 - torch.sigmoid(x))

        d = lambda_d * value(r - z)
        u = lambda_u * value((r - z) if same_side else (z - r))
        losses = torch.where(desirable, d, u)
        if reduce == "sum":
            return losses.sum()
        if reduce in ("class_sum", "class_mean"):
            parts = [losses[desirable].mean(), losses[~desirable].mean()]
            total = parts[0] + parts[1]
            return total if reduce == "class_sum" else total / 2
        return losses.mean()

    return fn


KTO_MISTAKES = [
    Mistake("r must be a log-ratio to the reference: r = policy_logps - ref_logps, not the policy's log-probs alone.",
            _kto_variant(use_ref=False)),
    Mistake("The log-ratio is upside down: r = log pi - log pi_ref (policy minus reference).", _kto_variant(flip_r=True)),
    Mistake("Desirable and undesirable are swapped: `desirable` True means the completion should gain (scored on "
            "r - z), False that it should lose (scored on z - r).", _kto_variant(swap_labels=True)),
    Mistake("Both kinds are scored on r - z: an undesirable completion is scored on z - r, so that its loss falls "
            "as its log-ratio falls below the reference point.", _kto_variant(same_side=True)),
    Mistake("lambda_d and lambda_u are swapped: lambda_d weighs the desirable completions, lambda_u the "
            "undesirable ones.", _kto_variant(swap_lambdas=True)),
    Mistake("z0 is not clamped at 0: the reference point is max(z0, 0) (a KL is never negative, an estimate "
            "of it can be).", _kto_variant(clamp=False)),
    Mistake("The reference point is missing: each completion is judged against z = max(z0, 0), r - z for a "
            "desirable one and z - r for an undesirable one, not against 0.", _kto_variant(use_z=False)),
    Mistake("You took the mean of each kind and added the two: the contract is ONE mean over all the batch's "
            "completions (each completion counts once, whatever its kind).", _kto_variant(reduce="class_sum")),
    Mistake("You averaged the two kinds' means: the contract is ONE mean over all the batch's completions, so "
            "a kind with more completions weighs more.", _kto_variant(reduce="class_mean")),
    Mistake("You summed the completions' losses: the contract takes their mean.", _kto_variant(reduce="sum")),
    Mistake("beta multiplies the loss instead of scaling r - z inside the sigmoid.", _kto_variant(beta_inside=False)),
    Mistake("Each completion's loss is lambda * (1 - sigmoid(...)), in [0, lambda]: yours is minus the sigmoid, "
            "lower by lambda (the same gradient, not the same loss).", _kto_variant(one_minus=False)),
    Mistake("KTO's value of a completion is 1 - sigmoid(beta (r - z)) (a bounded loss, at most lambda), not "
            "-log sigmoid(...) as in DPO.", _kto_variant(logsigmoid=True)),
]


def _kto_z0_from_policy(fn):
    """``fn`` called with z0 computed from the policy's own log-probs, graph and all, as a trainer does."""

    def with_z0(policy_logps, ref_logps, desirable, beta=0.1, lambda_d=1.0, lambda_u=1.0):
        return fn(policy_logps, ref_logps, desirable, (policy_logps - ref_logps).mean(), beta=beta,
                  lambda_d=lambda_d, lambda_u=lambda_u)

    return with_z0


_Z0_GRAPH = ("z0 carried a gradient into the loss: the caller's KL estimate was computed from the policy's own "
             "log-probs, so unless the loss treats it as a constant, training also pushes the reference point "
             "around. Take z0 without its graph before you use it.")


@checker(
    "kto_loss",
    chapter=CHAPTER,
    hint=(
        "Each completion is judged alone, against a reference point: how far its log-ratio r to the reference "
        "stands above that point (desirable) or below it (undesirable), through a sigmoid. The reference "
        "point is the caller's z0, never below 0 and never trained.",
        "z = max(z0, 0) with no gradient; r = log pi - log pi_ref; a desirable completion's loss is "
        "lambda_d (1 - sigma(beta (r - z))), an undesirable one's lambda_u (1 - sigma(beta (z - r))); pick "
        "one or the other per completion from `desirable`, then ONE mean over the b completions.",
        "```python\nz = z0.detach().clamp(min=0)\nr = policy_logps - ref_logps\nlosses = torch.where(desirable, "
        "lambda_d * (1 - torch.sigmoid(beta * (r - z))),\n                     lambda_u * (1 - torch.sigmoid(beta * "
        "(z - r))))\nreturn losses.mean()\n```",
    ),
)
def check_kto_loss(candidate) -> str:
    summary = compare_to_reference(candidate, dpo.kto_loss, _kto_cases(), mistakes=KTO_MISTAKES,
                                   arg_names=_KTO_ARGS, grad=DIFFERENTIATED["kto_loss"], grad_cases=(0, 1))
    policy, ref = _kto_inputs(8, seed=12, shift=1.0)  # z0 about +1: the clamp keeps its gradient
    desirable = torch.tensor([True, True, False, True, False, False, False, True])
    case = Case("z0 computed from the policy's log-probs (with its graph), as the trainer does",
                (policy, ref, desirable), {"beta": 0.5, "lambda_d": 1.0, "lambda_u": 1.3})
    compare_gradients(_kto_z0_from_policy(candidate), _kto_z0_from_policy(dpo.kto_loss), case,
                      DIFFERENTIATED["kto_loss"], arg_names=_KTO_ARGS[:3],
                      mistakes=[Mistake(_Z0_GRAPH, _kto_z0_from_policy(_kto_variant(detach_z=False)))])
    return summary + " Its gradient ignores a z0 computed from the policy."


# ----------------------------------------------------------------------------------------------------
# orpo_loss
# ----------------------------------------------------------------------------------------------------

_ORPO_ARGS = ["chosen_logps", "rejected_logps", "chosen_lengths", "rejected_lengths"]


def _orpo_cases() -> list[Case]:
    g = seeded(13)
    lc, lr = torch.tensor([5, 12, 1, 8, 3, 6]), torch.tensor([9, 2, 1, 8, 15, 4])
    c = -lc * (0.1 + 2.5 * torch.rand(6, generator=g))
    r = -lr * (0.1 + 2.5 * torch.rand(6, generator=g))
    # mean log-probs of -1e-7 .. -1e-5: 1 - exp(m) loses every digit in float32
    near_c, near_r = torch.tensor([-3e-7, -2e-7, -5e-6]), torch.tensor([-9e-7, -1.6e-6, -2e-5])
    near_lc, near_lr = torch.tensor([3, 2, 5]), torch.tensor([3, 4, 5])
    ones = torch.ones(3, dtype=torch.int64)
    far_c, far_r = torch.tensor([-150.0, -300.0, -120.0]), torch.tensor([-140.0, -310.0, -2.0])
    big_c, big_r = torch.tensor([-400.0, -1.5]), torch.tensor([-2.0, -450.0])
    return [
        Case("6 pairs of various lengths, lam=0.1", (c, r, lc, lr), {"lam": 0.1}),
        Case("lam=1.0", (c, r, lc, lr), {"lam": 1.0}),
        Case("lam=0 (the SFT loss alone)", (c, r, lc, lr), {"lam": 0.0}),
        Case("mean log-probs between -1e-7 and -1e-5 (p within 1e-5 of 1), lam=1.0",
             (near_c, near_r, near_lc, near_lr), {"lam": 1.0}),
        Case("single-token completions with log-probs in the hundreds below 0, lam=0.5",
             (far_c, far_r, ones, ones), {"lam": 0.5}),
        Case("log-odds hundreds apart, lam=0.2", (big_c, big_r, ones[:2], ones[:2]), {"lam": 0.2}),
        Case("a batch of 1, lam=0.3", (c[:1], r[:1], lc[:1], lr[:1]), {"lam": 0.3}),
    ]


def _orpo_variant(*, normalise=True, swap_lengths=False, nll="chosen_mean", log_odds="stable", sign=1,
                  lam_on="or", lam_or_default=False, reduce="mean", logsig="stable", term_added=False):
    def fn(c, r, lc, lr, lam=0.1):
        if lam_or_default:
            lam = lam or 0.1
        if swap_lengths:
            lc, lr = lr, lc
        mc, mr = c / lc, r / lr
        oc, orr = (mc, mr) if normalise else (c, r)

        def odds(m):
            if log_odds == "naive":
                return m - torch.log(1 - torch.exp(m))
            if log_odds == "probs":
                p = torch.exp(m)
                return torch.log(p / (1 - p))
            if log_odds == "logprob":
                return m
            return m - torch.log(-torch.expm1(m))

        x = sign * (odds(oc) - odds(orr))
        term = F.logsigmoid(x) if logsig == "stable" else torch.log(torch.sigmoid(x))
        sft = {"chosen_mean": -mc, "chosen_sum": -c, "both": -(mc + mr),
               "token_weighted": (-c).sum() / lc.sum() * torch.ones_like(mc)}[nll]
        if term_added:
            term = -term
        if reduce == "sum":
            sft, term = sft.sum(), term.sum()
        else:
            sft, term = sft.mean(), term.mean()
        return sft - lam * term if lam_on == "or" else lam * sft - term

    return fn


ORPO_MISTAKES = [
    Mistake("The log-probs are not length-normalised: ORPO's p is the mean log-prob per token, exp(logps / lengths).",
            _orpo_variant(normalise=False)),
    Mistake("The log-probs are not length-normalised: ORPO's p is the mean log-prob per token, exp(logps / lengths), "
            "and its SFT term the NLL per token.", _orpo_variant(normalise=False, nll="chosen_sum")),
    Mistake("The lengths are swapped: each side is divided by its own length.", _orpo_variant(swap_lengths=True)),
    Mistake("The SFT term is the chosen completions' NLL per token, -chosen_logps / chosen_lengths averaged over "
            "pairs, not their summed log-probs.", _orpo_variant(nll="chosen_sum")),
    Mistake("The SFT term weighs every token the same (all the chosen log-probs summed over all their tokens): "
            "it is the mean over pairs of each chosen completion's NLL per token, mean(-chosen_logps / "
            "chosen_lengths), so a short completion counts as much as a long one.", _orpo_variant(nll="token_weighted")),
    Mistake("The SFT term is on the chosen completions alone: the rejected ones are never imitated.",
            _orpo_variant(nll="both")),
    Mistake("You compared log-probs, not log-odds: log_odds(m) = m - log(1 - exp(m)).", _orpo_variant(log_odds="logprob")),
    Mistake("The odds-ratio term has the wrong sign: log_odds(chosen) - log_odds(rejected), and the loss subtracts "
            "lam times its log-sigmoid.", _orpo_variant(sign=-1)),
    Mistake("The odds-ratio term has the wrong sign: the loss subtracts lam times the mean log-sigmoid (a log-sigmoid "
            "is negative: subtracting it adds a penalty that shrinks as the chosen odds win).",
            _orpo_variant(term_added=True)),
    Mistake("lam weighs the NLL instead of the odds-ratio term: NLL - lam * mean(log sigmoid(...)).",
            _orpo_variant(lam_on="nll")),
    Mistake("lam = 0.0 was replaced by a default: 0 is a value (the SFT loss alone), not unset.",
            _orpo_variant(lam_or_default=True)),
    Mistake("You summed over pairs: both terms are means.", _orpo_variant(reduce="sum")),
    Mistake("log(1 - exp(m)) loses every digit when m is close to 0 (exp(m) rounds to 1 or near it): "
            "compute 1 - exp(m) as minus (exp(m) - 1) with a function made for exp(x) - 1 at small x.",
            _orpo_variant(log_odds="naive")),
    Mistake("You went through p = exp(m): for a mean log-prob in the hundreds below 0, p underflows to 0 and "
            "log(p) is -inf. Stay in log space: log p is m itself.", _orpo_variant(log_odds="probs")),
    Mistake("log(sigmoid(x)) underflows to -inf for very negative x: use a log-sigmoid.",
            _orpo_variant(logsig="naive")),
]


@checker(
    "orpo_loss",
    chapter=CHAPTER,
    hint=(
        "Two terms, no reference model: the usual SFT loss on the chosen completions, and a logistic loss "
        "asking the chosen completion's odds to beat the rejected one's. Both use the mean log-prob per "
        "token m; the odds of p = exp(m) are p / (1 - p), and 1 - p must be computed without losing digits "
        "when p is close to 1.",
        "m = logps / lengths per side; log_odds(m) = m - log(1 - exp(m)), with 1 - exp(m) computed from a "
        "function exact for exp(x) - 1 at small x; loss = mean(-m_chosen) - lam * mean(log sigma(log_odds("
        "m_chosen) - log_odds(m_rejected))), the log sigma finite for any argument.",
        "```python\nm_w = chosen_logps / chosen_lengths\nm_l = rejected_logps / rejected_lengths\nlog_odds_w = m_w - "
        "torch.log(-torch.expm1(m_w))\nlog_odds_l = m_l - torch.log(-torch.expm1(m_l))\nreturn -m_w.mean() - lam "
        "* F.logsigmoid(log_odds_w - log_odds_l).mean()\n```",
    ),
)
def check_orpo_loss(candidate) -> str:
    return compare_to_reference(candidate, dpo.orpo_loss, _orpo_cases(), mistakes=ORPO_MISTAKES,
                                arg_names=_ORPO_ARGS, grad=DIFFERENTIATED["orpo_loss"], grad_cases=(0, 1))



# ----------------------------------------------------------------------------------------------------
# best_worst_pairs
# ----------------------------------------------------------------------------------------------------


def _pairs_cases() -> list[Case]:
    g = seeded(7)
    ties = torch.tensor([[0.2, 0.9, 0.9, 0.1, 0.1], [0.5, 0.5, 0.5, 0.5, 0.5], [0.3, 0.1, 0.3, 0.7, 0.1]])
    return [
        Case("4 groups of 6 distinct rewards", (torch.rand(4, 6, generator=g),)),
        Case("ties for the best and the worst, and an all-equal group", (ties,)),
        Case("G = 2", (torch.tensor([[0.3, 0.8], [0.8, 0.3], [0.4, 0.4]]),)),
        Case("one group (p = 1)", (torch.randn(1, 7, generator=g),)),
    ]


def _last_argmax(x: torch.Tensor) -> torch.Tensor:
    return x.shape[-1] - 1 - x.flip(-1).argmax(-1)


@checker(
    "best_worst_pairs",
    chapter=CHAPTER,
    hint=(
        "Per row, two indices: where the reward is largest and where it is smallest. torch has "
        "reductions that return the index instead of the value.",
        "out[i] = (index of row i's maximum, index of its minimum), chosen first, int64, shape [p, 2]. "
        "Ties go to the first occurrence (torch's `argmax`/`argmin` do that), so an all-equal row gives "
        "(0, 0); stack the two [p] index tensors along a new last dim.",
        "```python\nreturn torch.stack([rewards.argmax(dim=-1), rewards.argmin(dim=-1)], dim=-1)\n```",
    ),
)
def check_best_worst_pairs(candidate) -> str:
    return compare_to_reference(candidate, dpo.best_worst_pairs, _pairs_cases(), mistakes=[
        Mistake("Chosen and rejected are swapped: column 0 is the best sample (argmax), column 1 the worst.",
                lambda r: torch.stack([r.argmin(-1), r.argmax(-1)], -1)),
        Mistake("On ties you took the last occurrence: the contract takes the first (what argmax/argmin return).",
                lambda r: torch.stack([_last_argmax(r), _last_argmax(-r)], -1)),
        Mistake("On ties the best is the first occurrence but the worst the last (sorting puts tied items in an "
                "unspecified order): use argmin for the worst.",
                lambda r: torch.stack([r.argmax(-1), _last_argmax(-r)], -1)),
    ], arg_names=["rewards"])


# ----------------------------------------------------------------------------------------------------
# rloo_advantages
# ----------------------------------------------------------------------------------------------------


def _rloo_cases() -> list[Case]:
    g = seeded(8)
    mixed = torch.rand(3, 5, generator=g)
    mixed[1] = 0.4  # all equal
    return [
        Case("4 groups of 8", (torch.rand(4, 8, generator=g),)),
        Case("G = 2", (torch.tensor([[0.2, 0.9], [0.6, 0.1], [0.5, 0.5]]),)),
        Case("a group whose rewards are all equal", (mixed,)),
        Case("one group of 3 with large rewards", (torch.tensor([[1000.0, -250.0, 3.0]]),)),
    ]


@checker(
    "rloo_advantages",
    chapter=CHAPTER,
    hint=(
        "Each sample's baseline is the mean reward of the OTHER samples of its group: you can get it "
        "from the row's total, without a loop.",
        "baseline[i, j] = (sum over k of r[i, k] - r[i, j]) / (G - 1); A = r - baseline (equivalently "
        "G/(G - 1) times the reward minus the row mean). No division by a standard deviation.",
        "```python\nsize = rewards.shape[-1]\nothers = (rewards.sum(dim=-1, keepdim=True) - rewards) / "
        "(size - 1)\nreturn rewards - others\n```",
    ),
)
def check_rloo_advantages(candidate) -> str:
    try:
        return _compare_rloo(candidate)
    except CheckFailure as failed:
        if failed.hint != _WHOLE_GROUP_MEAN:
            raise
        # G / (G - 1) * (r - mean) is RLOO; with integer division, G // (G - 1) is 1 for G > 2, which
        # looks like the whole group's mean, but 2 for G = 2, where it is right: tell the two apart.
        pair = to_device(torch.tensor([[0.2, 0.9], [0.6, 0.1]]))
        got = call(candidate, pair.clone(), _arg_names=["rewards"])
        if isinstance(got, torch.Tensor) and got.shape == pair.shape and torch.allclose(
                got.to(pair.dtype), dpo.rloo_advantages(pair), atol=1e-5):
            raise failure(failed.message.removesuffix("\n  " + nudge(_WHOLE_GROUP_MEAN)), _INTEGER_DIVISION) from None
        raise


_WHOLE_GROUP_MEAN = ("You subtracted the mean of the whole group, sample j included (GRPO's baseline): leave sample j "
                     "out, (sum - r_j) / (G - 1).")
_INTEGER_DIVISION = ("G // (G - 1) is integer division: it is 1 for every G > 2 (and right only for G = 2). "
                     "r_j - (sum - r_j) / (G - 1) equals G / (G - 1) * (r_j - mean): use /, not //.")


def _compare_rloo(candidate) -> str:
    return compare_to_reference(candidate, dpo.rloo_advantages, _rloo_cases(), mistakes=[
        Mistake(_WHOLE_GROUP_MEAN, lambda r: r - r.mean(-1, keepdim=True)),
        Mistake("The leave-one-out mean divides by G - 1 (the other samples), not G.",
                lambda r: r - (r.sum(-1, keepdim=True) - r) / r.shape[-1]),
        Mistake("RLOO does not divide by a std: only the baseline changes.",
                lambda r: (r - (r.sum(-1, keepdim=True) - r) / (r.shape[-1] - 1)) / (r.std(-1, keepdim=True) + 1e-4)),
        Mistake("The baseline is over the whole batch: leave-one-out works within each group (a row).",
                lambda r: r - (r.sum() - r) / (r.numel() - 1)),
    ], arg_names=["rewards"])


# ----------------------------------------------------------------------------------------------------
# gspo_sequence_ratio
# ----------------------------------------------------------------------------------------------------


def _gspo_cases() -> list[Case]:
    g = seeded(9)
    B, T = 4, 6
    lp = -3 * torch.rand(B, T, generator=g)
    old = lp + 0.3 * torch.randn(B, T, generator=g)
    mask = _completion_mask([(0, 6), (0, 1), (0, 3), (0, 5)], T)
    junk = torch.where(mask, 0.0, 5.0 * torch.randn(B, T, generator=g))  # masked positions must not count
    one_true = torch.zeros(3, 5, dtype=torch.bool)
    one_true[0, 4], one_true[1, 0], one_true[2, 2] = True, True, True
    lp5 = -2 * torch.rand(3, 5, generator=g)
    old5 = lp5 + 0.5 * torch.randn(3, 5, generator=g)
    long_old = -2 * torch.rand(2, 400, generator=g)
    return [
        Case("4 completions of 6, 1, 3 and 5 tokens, junk where masked", (lp + junk, old - junk, mask)),
        Case("an all-True mask", (lp, old, torch.ones(B, T, dtype=torch.bool))),
        Case("one True per row (at the end, the start, the middle)", (lp5, old5, one_true)),
        Case("the policy has not moved (ratio 1)", (lp, lp.clone(), mask)),
        # a product of 400 token ratios of about exp(0.3) is exp(120): inf in float32; a sum of logs is not
        Case("400 tokens whose log-ratios are about +0.3 (a product of ratios overflows)",
             (long_old + 0.3 + 0.05 * torch.randn(2, 400, generator=g), long_old, torch.ones(2, 400, dtype=torch.bool))),
    ]


def _gspo_variant(*, kind="geometric", invert=False, use_mask=True, denom="mask"):
    def fn(logprobs, old_logprobs, mask):
        d = old_logprobs - logprobs if invert else logprobs - old_logprobs
        m = mask.float() if use_mask else torch.ones_like(d)
        n = m.sum(-1) if denom == "mask" else torch.full_like(m[:, 0], m.shape[-1])
        if kind == "arithmetic":
            return (torch.exp(d) * m).sum(-1) / n
        if kind == "product":
            return torch.exp((d * m).sum(-1))
        return torch.exp((d * m).sum(-1) / n)

    return fn


@checker(
    "gspo_sequence_ratio",
    chapter=CHAPTER,
    hint=(
        "A geometric mean of the token ratios is an arithmetic mean in log space: average the log-ratios "
        "over the completion's own tokens, then exponentiate.",
        "s[b] = exp( sum over t of m[b, t] (logprobs - old_logprobs)[b, t] / sum over t of m[b, t] ). "
        "Zero the masked log-ratios with a select (`torch.where`), so that whatever a masked position "
        "holds counts for nothing, and divide by the row's own token count (not g).",
        "```python\nlog_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))\n"
        "return torch.exp(log_ratio.sum(dim=-1) / mask.sum(dim=-1))\n```",
    ),
)
def check_gspo_sequence_ratio(candidate) -> str:
    return compare_to_reference(candidate, dpo.gspo_sequence_ratio, _gspo_cases(), mistakes=[
        Mistake("You averaged the token ratios (arithmetic mean of exp): GSPO takes the exp of the mean log-ratio, "
                "the geometric mean.", _gspo_variant(kind="arithmetic")),
        # before the summed log-ratios: on the 400-token case both are inf
        Mistake("You multiplied the token ratios and took the n-th root: the product of hundreds of ratios overflows "
                "(or underflows) float32 before the root. Average the log-ratios, then exp: exp(sum(log r) / n).",
                _gspo_product_root),
        Mistake("The log-ratios are summed, not averaged: that is the ratio of the whole sequence's probabilities, "
                "which explodes with the length. Divide by the number of tokens.", _gspo_variant(kind="product")),
        Mistake("The mean divides by g, the padded length: divide by each row's own number of tokens (its True positions).",
                _gspo_variant(denom="g")),
        Mistake("The ratio is upside down: pi_theta / pi_old, exp(logprobs - old_logprobs).", _gspo_variant(invert=True)),
        Mistake("Masked positions were counted: only the completion's tokens (mask True) enter the mean.",
                _gspo_variant(use_mask=False)),
        Mistake("You averaged the first mask.sum(-1) positions, as if the True positions always started at 0: "
                "they need not (a completion after a prompt). Select the positions "
                "with the mask itself.", _gspo_leading_positions),
    ], arg_names=["logprobs", "old_logprobs", "mask"], grad=DIFFERENTIATED["gspo_sequence_ratio"])


def _gspo_product_root(logprobs, old_logprobs, mask):
    """The geometric mean as a product of ratios, then the n-th root: inf once the product overflows."""
    ratios = torch.where(mask, torch.exp(logprobs - old_logprobs), 1.0)
    return ratios.prod(-1) ** (1.0 / mask.sum(-1))


def _gspo_leading_positions(logprobs, old_logprobs, mask):
    """Right only while every row's True positions start at 0 (the one-True-per-row case shows it)."""
    n = mask.sum(-1)
    leading = torch.arange(mask.shape[-1], device=mask.device)[None, :] < n[:, None]
    return torch.exp(torch.where(leading, logprobs - old_logprobs, 0.0).sum(-1) / n)
