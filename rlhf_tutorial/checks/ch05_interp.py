"""Checkers for chapter 05: what RLHF changed inside the model.

The readouts (direction, LayerNorm, lenses, attribution, restored fraction, activation difference) are
compared with the reference on seeded cases, including the edge regimes where the usual mistakes show:
large magnitudes, zero tensors, tiny magnitudes (where eps matters), single positions, ties and
directions or activations whose mean over ``d`` is not zero (where forgetting to centre shows). The
hook and the weight statistics get hand-written checks: ``patch_activation`` must leave its source
alone and honour ``[]`` and ``[-1]``; ``value_lens`` must leave the head's parameters and gradients as
they were; ``param_change`` and ``fraction_changed`` return Python numbers over the names in both dicts.
Two edge cases in particular: restored_fraction's [2, 3] batch (where averaging over dim 0 only gives
one ratio per column) and activation_difference's texts shorter than n_positions (where dividing a sum
by n_positions rather than by the positions that exist shows). Also: ln_pre on vectors with a large
common offset (a variance taken as E[x^2] - E[x]^2 cancels there), param_change on bfloat16 parameters,
param_change and fraction_changed on parameters that require grad (the contract's own input), and
fraction_changed with an atol of 20.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from rlhf_tutorial import interp
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    check_device,
    checker,
    compare_to_reference,
    device_problem,
    expect_tensor,
    fmt,
    seeded,
    to_device,
)
from rlhf_tutorial.checks.fixtures import small_model

CHAPTER = "05_interpretability"

#: The contract of each exercise (its CURRICULUM.md row and its docstring), clause by clause; the checker
#: tests hold a version breaking each (``VIOLATIONS``), and ``tests/checks/test_contract_clauses.py`` holds
#: the two together.
CLAUSES = {
    "sentiment_direction": {
        "sign": "the negative words' mean minus the positive words' (the direction raises the negative words)",
        "mean": "a mean over each list's words, not a sum",
        "duplicates": "a word listed twice counts twice",
        "unnormalised": "the direction keeps its scale (not normalised to unit length)",
        "columns": "a token's vector is a column of W_U (W_U is [d, v])",
    },
    "ln_pre": {
        "centred": "the mean over the last dim is subtracted",
        "biased_variance": "the variance is the biased one (divides by d)",
        "eps_inside": "eps is inside the square root",
        "eps_honoured": "the eps given is used, and without eps a constant vector would give NaN",
        "last_dim": "the means are over the last dim, for any number of leading dims",
        "centred_variance": "the variance is the mean square of the centred values (exact for a large common "
                            "offset, where E[x^2] - E[x]^2 cancels)",
        "not_in_place": "x is never modified in place",
    },
    "logit_lens_score": {
        "layer_norm_first": "each vector goes through ln_pre before the projection",
        "layer_norm_scale": "the normalisation is ln_pre's (centred, divided by sqrt(var + eps)), not a unit norm",
        "eps_passed": "eps is passed on to ln_pre",
        "last_dim": "ln_pre works over the last dim, not over the layers",
        "leading_dims": "every leading dim is kept, whatever their number",
        "direction_as_given": "the direction is used as given (not normalised)",
    },
    "value_lens": {
        "layer_norm_first": "the head reads ln_pre of each vector, not the raw residual",
        "eps_passed": "eps is passed on to ln_pre",
        "squeeze_last": "only the head's trailing dim of size 1 is dropped (a layer or batch of 1 stays)",
        "parameters_untouched": "the head's parameters are not changed",
        "grads_untouched": "the head's .grad tensors are not changed (no zero_grad, no backward)",
        "requires_grad_untouched": "the head's requires_grad flags are not changed",
    },
    "head_attribution": {
        "centred": "each head output is centred over d before the projection",
        "own_scale": "each example is divided by its own ln_scale, before averaging",
        "divides": "the scale divides (not multiplies, not left out)",
        "mean_over_batch": "the mean over the batch, not the sum",
        "shape": "the result is [layer, head], even for one layer and one head",
        "not_in_place": "head_out is never modified in place",
    },
    "patch_activation": {
        "positions_dim": "positions index dim 1 (the sequence), not the batch",
        "none_is_all": "positions None replaces every position",
        "empty_is_none": "positions [] replaces nothing",
        "negative_positions": "Python indexing: [-1] is the last position",
        "trailing_dims": "any trailing dims after [b, s] (per-head activations) are copied whole",
        "source_untouched": "source is never modified",
        "returns_activation": "the hook returns the patched activation",
        "not_source_itself": "what the hook returns is never source itself nor a view of it (the model would run on "
                             "the source's memory)",
    },
    "restored_fraction": {
        "ratio_of_means": "a ratio of means, not a mean of per-example ratios",
        "all_entries": "the means are over every entry, whatever the shape",
        "orientation": "(patched - base) over (tuned - base): 0 restores nothing, 1 everything",
        "signed": "the fraction keeps its sign and is not clamped to [0, 1]",
        "zero_dim_tensor": "the result is a 0-dim tensor in the inputs' dtype",
    },
    "activation_difference": {
        "orientation": "tuned minus base",
        "first_positions": "the first n_positions positions, BOS included, no more and no fewer",
        "positions_dim": "positions are dim 1, not the batch",
        "mean": "a mean over the batch and the positions, not a sum",
        "short_texts": "texts shorter than n_positions average over the positions that exist",
        "default": "n_positions defaults to 5",
        "shape": "the result is one d-vector",
    },
    "param_change": {
        "relative": "the norm of the change divided by the norm of the base tensor",
        "clamped": "the denominator is at least 1e-8 (a zero base gives no inf)",
        "norm_of_change": "the norm of the difference, not the difference of the norms",
        "whole_tensor": "one norm over all entries of each tensor",
        "names_in_both": "only the names in both dicts, skipping the others",
        "python_floats": "the values are Python floats",
        "parameters": "works on dict(model.named_parameters()): tensors that require grad",
        "wide_dtype": "bfloat16 parameters give the change computed in float32 or wider",
    },
    "fraction_changed": {
        "strict": "an entry counts when |tuned - base| > atol, strictly",
        "entries_together": "entries are counted over all tensors together, not per tensor then averaged",
        "absolute_value": "moves down count as well as up",
        "absolute_threshold": "atol is an absolute threshold (no relative tolerance)",
        "changed": "the fraction that changed, not the fraction unchanged",
        "names_in_both": "only the names in both dicts, skipping the others",
        "python_float": "the result is a Python float",
        "parameters": "works on dict(model.named_parameters()): tensors that require grad",
    },
}


def _offset(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Add a different constant to every vector (over the last dim): their means are far from 0."""
    return x + 3 * torch.randn(*x.shape[:-1], 1, generator=g)


def _ln(x, eps=1e-5):
    c = x - x.mean(-1, keepdim=True)
    return c / (c.pow(2).mean(-1, keepdim=True) + eps).sqrt()


# ----------------------------------------------------------------------------------------------------
# sentiment_direction
# ----------------------------------------------------------------------------------------------------
@checker(
    "sentiment_direction",
    chapter=CHAPTER,
    hint=(
        "`W_U` is [d_model, d_vocab]: which axis holds one token's vector? Indexing that axis with a "
        "tensor of ids picks all the words of a list at once.",
        "direction = (mean of the negative words' unembedding vectors) - (mean of the positive words' "
        "vectors): average over the words (so lists of different lengths weigh the same), keep "
        "duplicates (a word listed twice counts twice: no `unique`), and do not normalise (h . direction "
        "must be the logit difference).",
        "```python\nreturn W_U[:, neg_ids].mean(dim=1) - W_U[:, pos_ids].mean(dim=1)\n```",
    ),
)
def check_sentiment_direction(candidate) -> str:
    g = seeded(50)
    W = torch.randn(6, 11, generator=g)
    big = torch.randn(5, 9, generator=g) * 1e4
    cases = [
        Case("3 positive and 2 negative words", (W, torch.tensor([0, 3, 7]), torch.tensor([2, 9]))),
        Case("one word each", (W, torch.tensor([4]), torch.tensor([10]))),
        Case("a word listed twice (counts twice)", (W, torch.tensor([1, 1, 5]), torch.tensor([6, 8, 8, 0]))),
        Case("large weights (x1e4)", (big, torch.tensor([0, 1]), torch.tensor([2, 3, 4]))),
        Case("a zero unembedding", (torch.zeros(4, 7), torch.tensor([0]), torch.tensor([1, 2]))),
    ]
    return compare_to_reference(
        candidate, interp.sentiment_direction, cases, arg_names=["W_U", "pos_ids", "neg_ids"],
        mistakes=[
            Mistake("The sign is flipped: that is positive minus negative. The direction should RAISE the "
                    "negative words: the negative words' mean column minus the positive words'.",
                    lambda W, p, n: W[:, p].mean(1) - W[:, n].mean(1)),
            Mistake("You summed the columns: take their mean, so that lists of different lengths weigh the "
                    "same.", lambda W, p, n: W[:, n].sum(1) - W[:, p].sum(1)),
            Mistake("You normalised the direction to unit length: keep its scale, so that h @ direction is "
                    "the logit difference itself.",
                    lambda W, p, n: (d := W[:, n].mean(1) - W[:, p].mean(1)) / d.norm().clamp(min=1e-12)),
            Mistake("Duplicates were dropped (torch.unique or a set): a word listed twice counts twice, as "
                    "a mean over an index tensor with repeats does.",
                    lambda W, p, n: W[:, n.unique()].mean(1) - W[:, p.unique()].mean(1)),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# ln_pre
# ----------------------------------------------------------------------------------------------------
def _ln_cases() -> list[Case]:
    g = seeded(51)
    return [
        Case("a batch of 3 vectors (d = 8)", (_offset(torch.randn(3, 8, generator=g), g),)),
        Case("one vector", (_offset(torch.randn(16, generator=g), g),)),
        Case("[2, 3, 16]", (_offset(torch.randn(2, 3, 16, generator=g), g),)),
        Case("large magnitudes (x1e4)", (_offset(torch.randn(2, 8, generator=g), g) * 1e4,)),
        # E[x^2] - E[x]^2 cancels catastrophically here: the variance must be that of the centred values
        Case("a large common offset (300 + values of spread 1)", (300 + torch.randn(3, 8, generator=g),)),
        Case("tiny magnitudes (x1e-3: eps matters)", (torch.randn(3, 8, generator=g) * 1e-3,)),
        Case("a zero tensor", (torch.zeros(2, 8),)),
        Case("all entries equal (ties)", (torch.full((2, 5), 4.0),)),
        Case("eps=0.5", (torch.randn(2, 6, generator=g),), {"eps": 0.5}),
    ]


@checker(
    "ln_pre",
    chapter=CHAPTER,
    hint=(
        "Everything happens along the last dim (d_model) of each vector; keep that dim in your "
        "reductions (keepdim) so the result broadcasts back over x.",
        "Centre (subtract the mean over the last dim), then divide by the square root of (the mean of "
        "the squared centred values + eps): the biased variance (divide by d, not d - 1: `torch.var`'s "
        "default is the unbiased one) and eps inside the root.",
        "```python\ncentred = x - x.mean(dim=-1, keepdim=True)\nscale = (centred.pow(2).mean(dim=-1, "
        "keepdim=True) + eps).sqrt()\nreturn centred / scale\n```",
    ),
)
def check_ln_pre(candidate) -> str:
    return compare_to_reference(
        candidate, interp.ln_pre, _ln_cases(), arg_names=["x", "eps"],
        mistakes=[
            Mistake("You did not centre (that is an RMSNorm, x / sqrt(mean(x**2) + eps)): LayerNorm subtracts the "
                    "mean over the last dim before scaling.",
                    lambda x, eps=1e-5: x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()),
            Mistake("That is the unbiased variance (torch.var/std default, divides by d - 1): LayerNorm "
                    "uses the biased one (unbiased=False, or mean of squares).",
                    lambda x, eps=1e-5: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + eps).sqrt()),
            Mistake("eps is outside the square root (std + eps): LayerNorm uses sqrt(var + eps), which "
                    "differs for small activations.",
                    lambda x, eps=1e-5: (x - x.mean(-1, keepdim=True))
                    / ((x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True).sqrt() + eps)),
            Mistake("eps is missing: a constant (or zero) vector has variance 0 and gives NaN. Use "
                    "sqrt(var + eps).",
                    lambda x, eps=1e-5: (x - x.mean(-1, keepdim=True))
                    / (x - x.mean(-1, keepdim=True)).pow(2).mean(-1, keepdim=True).sqrt()),
            Mistake("Your variance is E[x^2] - E[x]^2: with a large common offset the two terms are huge and "
                    "nearly equal, and their difference loses most of its digits in float32. Take the mean square "
                    "of the centred values instead.",
                    lambda x, eps=1e-5: (x - x.mean(-1, keepdim=True))
                    / (x.pow(2).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2 + eps).sqrt()),
            Mistake("You normalised over the first dim: the means are over the LAST dim (d_model), dim=-1.",
                    lambda x, eps=1e-5: (x - x.mean(0, keepdim=True))
                    / ((x - x.mean(0, keepdim=True)).pow(2).mean(0, keepdim=True) + eps).sqrt()),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# logit_lens_score
# ----------------------------------------------------------------------------------------------------
@checker(
    "logit_lens_score",
    chapter=CHAPTER,
    hint=(
        "You already wrote both pieces: the final LayerNorm of a folded model, and the direction. The "
        "lens applies them to every vector of the stack, whatever the leading dims.",
        "score = (the vector normalised by your ln_pre, with eps passed on) . direction, for every "
        "d-vector along the last dim; the dot product consumes d and keeps every leading dim (a matrix "
        "product with a 1-d tensor does that).",
        "```python\nreturn ln_pre(resid_stack, eps) @ direction\n```",
    ),
)
def check_logit_lens_score(candidate) -> str:
    g = seeded(52)
    direction = torch.randn(16, generator=g) + 0.5  # mean over d not zero: centring matters
    cases = [
        Case("[3 layers, 2 examples, 5 positions]", (_offset(torch.randn(3, 2, 5, 16, generator=g), g), direction)),
        Case("[layer, d] (one position)", (_offset(torch.randn(4, 16, generator=g), g), direction)),
        Case("a single layer", (_offset(torch.randn(1, 3, 16, generator=g), g), direction)),
        Case("large residuals (x1e4)", (_offset(torch.randn(3, 2, 16, generator=g), g) * 1e4, direction * 1e3)),
        Case("a zero residual stream", (torch.zeros(2, 3, 16), direction)),
        Case("eps=1.0", (torch.randn(2, 4, 16, generator=g) * 0.3, direction), {"eps": 1.0}),
    ]
    return compare_to_reference(
        candidate, interp.logit_lens_score, cases, arg_names=["resid_stack", "direction", "eps"],
        mistakes=[
            Mistake("You read the raw residual stream: apply the final LayerNorm (your ln_pre) to "
                    "each vector before projecting it on the direction (the scale of the residual grows with depth).",
                    lambda r, d, eps=1e-5: r @ d),
            Mistake("You divided by the norm of each vector instead of its LayerNorm scale: ln_pre centres "
                    "and divides by sqrt(var + eps), which is ||x - mean|| / sqrt(d).",
                    lambda r, d, eps=1e-5: ((r - r.mean(-1, keepdim=True))
                                            / (r - r.mean(-1, keepdim=True)).norm(dim=-1, keepdim=True)) @ d),
            Mistake("You normalised over the layer dim: ln_pre works on each vector, over the LAST dim.",
                    lambda r, d, eps=1e-5: ((r - r.mean(0, keepdim=True))
                                            / ((r - r.mean(0, keepdim=True)).pow(2).mean(0, keepdim=True) + eps).sqrt()) @ d),
            Mistake("eps was not passed on: ln_pre takes the eps this function was given.",
                    lambda r, d, eps=1e-5: _ln(r) @ d),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# value_lens
# ----------------------------------------------------------------------------------------------------
def _value_head(seed: int, d: int = 16) -> nn.Module:
    torch.manual_seed(seed)
    head = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, 1))
    with torch.no_grad():
        head[0].bias.add_(0.5)  # enough live ReLUs that the output depends on the input
    return head


@checker(
    "value_lens",
    chapter=CHAPTER,
    hint=(
        "The head was trained on the final LayerNorm's output: give it the same kind of input. Then look "
        "at the shape it returns.",
        "value = the head applied to the normalised stack (your ln_pre, with eps passed on), its "
        "trailing dim of size 1 dropped (only that one: a batch of 1 must stay). Read only: no "
        "`zero_grad()`, no `requires_grad_(False)`, no `backward()`; `torch.no_grad()` is allowed.",
        "```python\nreturn value_head(ln_pre(resid_stack, eps)).squeeze(-1)\n```",
    ),
)
def check_value_lens(candidate) -> str:
    g = seeded(53)
    head = _value_head(0)
    cases = [
        Case("[3 layers, 2 examples, 4 positions]", (_offset(torch.randn(3, 2, 4, 16, generator=g), g), head)),
        Case("[layer, d]", (_offset(torch.randn(2, 16, generator=g), g), head)),
        Case("large residuals (x1e4)", (_offset(torch.randn(3, 2, 16, generator=g), g) * 1e4, head)),
        Case("a zero residual stream", (torch.zeros(2, 3, 16), head)),
        Case("eps=1.0", (torch.randn(2, 3, 16, generator=g) * 0.3, head), {"eps": 1.0}),
        # size-1 dims: a squeeze() without -1 drops the layer (or the example) with the head's trailing 1
        Case("a single layer [1, 2, 16]", (_offset(torch.randn(1, 2, 16, generator=g), g), head)),
        Case("a single layer and example [1, 1, 16]", (_offset(torch.randn(1, 1, 16, generator=g), g), head)),
    ]
    detail = compare_to_reference(
        candidate, interp.value_lens, cases, arg_names=["resid_stack", "value_head", "eps"],
        mistakes=[
            Mistake("You fed the raw residual stream to the head: it was trained on the final LayerNorm's "
                    "output, so normalise the stack with ln_pre first.",
                    lambda r, h, eps=1e-5: h(r).squeeze(-1)),
            Mistake("eps was not passed on: ln_pre takes the eps this function was given.",
                    lambda r, h, eps=1e-5: h(_ln(r)).squeeze(-1)),
            Mistake("The head's output keeps a trailing dim of size 1: drop that dim (and only that one).",
                    lambda r, h, eps=1e-5: h(_ln(r, eps))),
            Mistake("squeeze() dropped every dim of size 1 (here the layer, or the example, too): drop only the "
                    "head's trailing one.", lambda r, h, eps=1e-5: h(_ln(r, eps)).squeeze()),
        ],
    )
    # The head is left as it was: parameters, their gradients, requires_grad (on the checker's device).
    head = to_device(_value_head(1))
    for p in head.parameters():
        p.grad = to_device(torch.randn(p.shape, generator=g))
    before = [(p.detach().clone(), p.grad.clone(), p.requires_grad) for p in head.parameters()]
    call(candidate, to_device(torch.randn(2, 3, 16, generator=g)), head, _arg_names=["resid_stack", "value_head"])
    for (name, p), (value, grad, needs_grad) in zip(head.named_parameters(), before):
        if not torch.equal(p.detach(), value):
            raise CheckFailure(f"reading the value lens changed the head's parameter {name}.",
                               hint="A lens only reads: a forward pass through value_head, no optimizer step, no "
                               "in-place edits of its weights.")
        if p.requires_grad != needs_grad:
            raise CheckFailure(f"after your value_lens, {name}.requires_grad is {p.requires_grad}.",
                               hint="Do not switch the head's gradients off (requires_grad_(False)): the head "
                               "is still being trained elsewhere. To read it without building a graph, use "
                               "`with torch.no_grad():` instead.")
        if p.grad is None or not torch.equal(p.grad, grad):
            raise CheckFailure(f"your value_lens changed {name}.grad (it is now "
                               f"{'None' if p.grad is None else fmt(p.grad)}).",
                               hint="Do not call zero_grad() or backward() on the head: gradients it has "
                               "accumulated belong to the training loop. A lens is a forward pass only.")
    return detail + " The head's parameters and gradients are untouched."


# ----------------------------------------------------------------------------------------------------
# head_attribution
# ----------------------------------------------------------------------------------------------------
@checker(
    "head_attribution",
    chapter=CHAPTER,
    hint=(
        "Per example, the final LayerNorm does two linear things to each head's output once its scale is "
        "fixed: it centres the vector over d and divides by that example's scale. Apply both, project on "
        "the direction, then average over examples.",
        "attr[l, h] = mean over b of ((head_out[b, l, h] - its mean over d) . direction) / ln_scale[b]. "
        "Divide each example by its OWN scale before averaging (not the average by the average scale); "
        "the [b] scale must broadcast against [b, layer, head] (add two trailing dims). Result [layer, "
        "head].",
        "```python\ncentred = head_out - head_out.mean(dim=-1, keepdim=True)\nper_example = (centred @ "
        "direction) / ln_scale[:, None, None]\nreturn per_example.mean(dim=0)\n```",
    ),
)
def check_head_attribution(candidate) -> str:
    g = seeded(54)
    direction = torch.randn(16, generator=g) + 0.5

    def head_out(b: int, scale: float = 1.0, layers: int = 2, heads: int = 3) -> torch.Tensor:
        return _offset(torch.randn(b, layers, heads, 16, generator=g), g) * scale

    cases = [
        Case("3 examples with different scales", (head_out(3), torch.tensor([0.5, 2.0, 7.0]), direction)),
        Case("a batch of 1", (head_out(1), torch.tensor([1.7]), direction)),
        Case("large outputs and scales (x1e4)", (head_out(2, 1e4), torch.tensor([3e4, 9e3]), direction)),
        Case("zero head outputs", (torch.zeros(2, 2, 3, 16), torch.tensor([1.0, 2.0]), direction)),
        Case("equal scales (ties)", (head_out(4), torch.full((4,), 2.5), direction)),
        # size-1 dims: the result stays [layer, head] = [1, 1] (a squeeze() would drop both)
        Case("one example, a single layer and a single head", (head_out(1, layers=1, heads=1), torch.tensor([1.3]),
                                                                 direction)),
    ]

    def centred(h):
        return h - h.mean(-1, keepdim=True)

    return compare_to_reference(
        candidate, interp.head_attribution, cases, arg_names=["head_out", "ln_scale", "direction"],
        mistakes=[
            Mistake("You did not centre the head outputs: the final LayerNorm subtracts the mean over d, so "
                    "a head's share is its output minus that output's mean over d, dotted with the direction.",
                    lambda h, s, d: ((h @ d) / s[:, None, None]).mean(0)),
            Mistake("You divided by the mean scale: each example has its own LayerNorm scale; divide each by "
                    "ln_scale[b] before averaging.",
                    lambda h, s, d: (centred(h) @ d).mean(0) / s.mean()),
            Mistake("You summed over the batch: average over it (mean over b).",
                    lambda h, s, d: ((centred(h) @ d) / s[:, None, None]).sum(0)),
            Mistake("You multiplied by the scale: the LayerNorm DIVIDES by ln_scale.",
                    lambda h, s, d: ((centred(h) @ d) * s[:, None, None]).mean(0)),
            Mistake("The LayerNorm scale is missing: divide each example by ln_scale[b].",
                    lambda h, s, d: (centred(h) @ d).mean(0)),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# patch_activation
# ----------------------------------------------------------------------------------------------------
def _expected_patch(activation, source, positions):
    return interp.patch_activation(activation.clone(), None, source.clone(), positions)


def _patch_dropping_empty(activation, hook, source, positions=None):
    if not positions:
        return source.clone()
    activation[:, positions] = source[:, positions]
    return activation


def _patch_batch_dim(activation, hook, source, positions=None):
    if positions is None:
        return source.clone()
    if any(not -activation.shape[0] <= p < activation.shape[0] for p in positions):
        # bounds checked in Python: on a GPU the indexing itself would be a device-side assert
        raise IndexError(f"positions {positions} do not fit the batch of {activation.shape[0]}")
    activation[positions] = source[positions]
    return activation


def _call_hook(run: Callable, device: torch.device):
    """``call(run)`` for a hook called in place (its activation is edited by contract, so the inputs are
    not handed to ``call``): a device mix names the activations' device."""
    return call(run, _device_hint=f"The activations are on {device}: build any new tensor on the activation's "
                "device (device=activation.device).")


def _patch_none_is_nothing(activation, hook, source, positions=None):
    if positions is not None:
        activation[:, positions] = source[:, positions]
    return activation


def _patch_second_to_last(activation, hook, source, positions=None):
    idx = slice(None) if positions is None else positions
    activation[..., idx, :] = source[..., idx, :]
    return activation


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same memory (one a view of the other, or the same tensor); on the
    simulated GPU, that of the CPU tensors they wrap."""
    a, b = getattr(a, "elem", a), getattr(b, "elem", b)
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage: identity is all that can be told
        return a is b


def _where_patches_differ(expected: torch.Tensor, got: torch.Tensor) -> str:
    """Where a patched activation differs: which positions (dim 1), and the first differing [b, s] entry of
    each, side by side (a preview of the first entries alone may show the same numbers twice)."""
    differs = ~torch.isclose(got, expected, rtol=0.0, atol=0.0, equal_nan=True)
    per_position = differs.flatten(2).any(-1) if differs.dim() > 2 else differs  # [b s]
    positions = sorted({int(i) for i in per_position.nonzero()[:, 1].tolist()})
    b, pos = (int(i) for i in per_position.nonzero()[0])
    return (f"  positions (dim 1) whose values differ: {positions} of {expected.shape[1]}; at batch row {b}, "
            f"position {pos}:\n  expected: {fmt(expected[b, pos])}\n  got:      {fmt(got[b, pos])}")


_PATCH_BATCH_DIM = Mistake("You indexed the batch dim: positions index dim 1 (the sequence), every batch row alike.",
                           _patch_batch_dim)
_PATCH_MISTAKES = [
    Mistake("With positions=None every position is replaced (None means all of them); yours left the "
            "activation as it was.", _patch_none_is_nothing),
    Mistake("You indexed the second-to-last dim: that is the position only for [b, s, d] activations. Per-head "
            "activations are [b, s, head, d_head]; the position is always dim 1, and every dim after it is "
            "copied whole.", _patch_second_to_last),
    Mistake("With positions=[] nothing should change, but you replaced every position: `if not positions` "
            "treats [] like None. Only None means every position.", _patch_dropping_empty),
    _PATCH_BATCH_DIM,
]


@checker(
    "patch_activation",
    chapter=CHAPTER,
    hint=(
        "A hook receives the activation, may write into it, and returns it. Dim 1 is the position; "
        "`None` means every position.",
        "If positions is None copy all of source into activation (slice assignment keeps it the same "
        "tensor); otherwise copy only the listed positions along dim 1 (indexing dim 1 with a Python "
        "list handles [-1] and [] too). Write into activation in place, never into source, and return "
        "activation.",
        "```python\nif positions is None:\n    activation[:] = source\nelse:\n    activation[:, positions] = "
        "source[:, positions]\nreturn activation\n```",
    ),
)
def check_patch_activation(candidate) -> str:
    g = seeded(55)
    shapes_positions = [
        ("every position (None)", (2, 5, 4), None),
        ("positions [1, 3]", (2, 5, 4), [1, 3]),
        ("positions [-1] (the last)", (3, 5, 4), [-1]),
        ("positions [] (none)", (2, 5, 4), []),
        ("per-head activations [b, s, head, d_head], positions [0, -2]", (2, 4, 3, 2), [0, -2]),
        ("a single position, [0]", (2, 1, 4), [0]),
        ("a single position, [-1]", (1, 1, 4), [-1]),
        ("large values (x1e4), [2]", (2, 4, 3), [2]),
    ]
    for label, shape, positions in shapes_positions:
        activation = to_device(torch.randn(*shape, generator=g))
        source = to_device(torch.randn(*shape, generator=g) * (1e4 if "large" in label else 1.0))
        expected = _expected_patch(activation, source, positions)
        act_in, src_in = activation.clone(), source.clone()
        try:
            out = _call_hook(lambda: candidate(act_in, None, src_in, positions), activation.device)  # noqa: B023
        except CheckFailure as failure:
            if "for dimension 0" in failure.message:  # an index that fits the sequence but not the batch
                raise CheckFailure(f"On {label}: {failure.message}", hint=_PATCH_BATCH_DIM.hint) from None
            raise
        if not torch.equal(src_in, source):
            raise CheckFailure(f"On {label}, your hook modified `source`.",
                               hint="Copy from source into activation, never the other way round: the tuned run's cache must "
                               "stay intact for the next patch.")
        if out is None:
            raise CheckFailure(f"On {label}, your hook returned None.",
                               hint="Return the (patched) activation: TransformerLens uses the returned tensor.")
        expect_tensor(out, shape=expected.shape, dtype=expected.dtype, what=f"On {label}, your output")
        problem = device_problem(out, activation.device)  # the lambda above hides the inputs from call()
        if problem:
            raise CheckFailure(f"On {label}, {problem}",
                               hint="A hook must return the activation on its own device: patch it in place, or "
                               "build new tensors with device=activation.device.", about_devices=True)
        if not torch.equal(out, expected):
            wrong = None
            for mistake in _PATCH_MISTAKES:
                try:
                    if torch.equal(out, mistake.fn(activation.clone(), None, source.clone(), positions)):
                        wrong = mistake.hint
                        break
                except Exception:  # noqa: BLE001 - a mistake may not apply to this case
                    continue
            raise CheckFailure(f"Wrong values on {label}.\n{_where_patches_differ(expected, out)}", wrong)
        if _shares_memory(out, src_in):
            raise CheckFailure(f"On {label}, your hook returned `source` itself (or a view of it): the values are "
                               "right, but the model then runs on the source's own memory.",
                               hint="Return the activation, patched: when the hook hands back the source tensor, "
                               "whatever later writes into that activation in place (another hook, the next patch) "
                               "writes into the cached source too, which must stay intact.")
    # In a real forward pass: patch the last position's residual of one run into another.
    model = small_model(seed=5)  # on check_device(), as the cases above
    clean = torch.tensor([[1, 5, 9, 2]], device=check_device())
    corrupt = torch.tensor([[1, 7, 3, 4]], device=check_device())
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
        name = "blocks.1.hook_resid_pre"
        results = []
        for fn in (interp.patch_activation, candidate):
            hook_fn = functools.partial(fn, source=cache[name].clone(), positions=[-1])
            results.append(_call_hook(lambda: model.run_with_hooks(corrupt, fwd_hooks=[(name, hook_fn)]),  # noqa: B023
                                      check_device()))
    if not torch.allclose(results[0], results[1], atol=1e-5):
        raise CheckFailure("Used as a hook in model.run_with_hooks (positions=[-1] on blocks.1.hook_resid_pre), "
                           "your function gives different logits from the reference.")
    return (f"matches the reference on {len(shapes_positions)} cases (None, [], [-1], single positions, "
            "per-head shapes) and inside run_with_hooks; source is left untouched.")


# ----------------------------------------------------------------------------------------------------
# restored_fraction
# ----------------------------------------------------------------------------------------------------
@checker(
    "restored_fraction",
    chapter=CHAPTER,
    hint=(
        "Three tensors of the same metric: reduce each to one number before you compare them.",
        "restored = (mean of patched - mean of base) / (mean of tuned - mean of base), each mean over "
        "ALL entries (any shape), a 0-d tensor: a ratio of means, not a mean of per-example ratios (one "
        "example that barely moved would blow those up).",
        "```python\nreturn (patched.mean() - base.mean()) / (tuned.mean() - base.mean())\n```",
    ),
)
def check_restored_fraction(candidate) -> str:
    g = seeded(56)

    def triple(shape, shift, spread=1.0, dtype=torch.float32):
        base = torch.randn(*shape, generator=g, dtype=torch.float64) * spread
        tuned = base + shift + torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3
        patched = base + 0.4 * (tuned - base) + torch.randn(*shape, generator=g, dtype=torch.float64) * 0.3
        return tuple(x.to(dtype) for x in (patched, base, tuned))

    p, b, t = triple((6,), 2.0)
    cases = [
        Case("8 prompts", triple((8,), 2.0)),
        Case("a [2, 3] batch", triple((2, 3), 1.5)),
        Case("a tuned model that moved the metric down", triple((5,), -3.0)),
        Case("one example (0-d tensors)", tuple(x[0] for x in triple((1,), 1.0))),
        Case("large values (1e6 offsets, float64)", tuple(x + 1e6 for x in triple((4,), 5.0, dtype=torch.float64))),
        Case("patched == base (restores nothing)", (b.clone(), b, t)),
        Case("patched == tuned (restores all)", (t.clone(), b, t)),
        # fractions outside [0, 1] are findings, not errors: a patch can overshoot or push the other way
        Case("a patch that overshoots the tuned model (fraction 1.6)", (b + 1.6 * (t - b), b, t)),
        Case("a patch that pushes the other way (fraction -0.5)", (b - 0.5 * (t - b), b, t)),
    ]
    return compare_to_reference(
        candidate, interp.restored_fraction, cases, arg_names=["patched", "base", "tuned"],
        mistakes=[
            Mistake("You computed what is left, 1 - restored: (mean(tuned) - mean(patched)) / (...). The "
                    "fraction restored is (mean(patched) - mean(base)) / (mean(tuned) - mean(base)).",
                    lambda p, b, t: (t.mean() - p.mean()) / (t.mean() - b.mean())),
            Mistake("That is a mean of per-example ratios: use a ratio of means (average patched, base and "
                    "tuned first); per-example ratios blow up where one example barely moved.",
                    lambda p, b, t: ((p - b) / (t - b)).mean()),
            # before the sign flip: on the negative case both give +0.5
            Mistake("You took an absolute value: a patch that pushes the metric the other way restores a NEGATIVE "
                    "fraction. Keep the signs of both differences.",
                    lambda p, b, t: ((p.mean() - b.mean()) / (t.mean() - b.mean())).abs()),
            Mistake("The sign is flipped: the denominator is mean(tuned) - mean(base).",
                    lambda p, b, t: (p.mean() - b.mean()) / (b.mean() - t.mean())),
            Mistake("You divided by mean(tuned): divide by the SHIFT, mean(tuned) - mean(base).",
                    lambda p, b, t: (p.mean() - b.mean()) / t.mean()),
            Mistake("You clamped the fraction to [0, 1]: a patch can restore more than the tuned shift (> 1) or "
                    "push the metric the other way (< 0), and both are findings. Return the ratio as it is.",
                    lambda p, b, t: ((p.mean() - b.mean()) / (t.mean() - b.mean())).clamp(0, 1)),
            Mistake("You averaged over dim 0 only: right for a 1-d batch of prompts, but a [2, 3] batch then "
                    "gives one ratio per column. Average over every element, .mean() with no dim.",
                    lambda p, b, t: (p.mean(0) - b.mean(0)) / (t.mean(0) - b.mean(0))),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# activation_difference
# ----------------------------------------------------------------------------------------------------
@checker(
    "activation_difference",
    chapter=CHAPTER,
    hint=(
        "The difference of the two residual streams on the first positions, then one average that leaves "
        "a single d-vector.",
        "delta = mean over examples b and positions t < n_positions of tuned[b, t] - base[b, t]: slice "
        "dim 1, subtract, average over dims 0 and 1 together. When the texts are shorter than "
        "n_positions the average is over the positions that exist (a slice does that; dividing a sum by "
        "n_positions does not).",
        "```python\ndiff = tuned_resid[:, :n_positions] - base_resid[:, :n_positions]\nreturn "
        "diff.mean(dim=(0, 1))\n```",
    ),
)
def check_activation_difference(candidate) -> str:
    g = seeded(57)

    def pair(b, s, d=8, scale=1.0):
        base = torch.randn(b, s, d, generator=g) * scale
        return base, base + torch.randn(b, s, d, generator=g) * scale + torch.linspace(0, 1, s)[None, :, None]

    cases = [
        Case("[6, 7, 8], n_positions=3", (*pair(6, 7), 3)),
        Case("the default n_positions (5), 9 positions", pair(2, 9)),
        Case("n_positions=1 (the first position only)", (*pair(3, 6), 1)),
        Case("texts shorter than n_positions", (*pair(2, 3), 5)),
        Case("a batch of 1", (*pair(1, 6), 4)),
        Case("large residuals (x1e4)", (*pair(2, 6, scale=1e4), 3)),
        Case("identical residuals (zero)", (torch.ones(2, 5, 8), torch.ones(2, 5, 8), 3)),
    ]
    return compare_to_reference(
        candidate, interp.activation_difference, cases, arg_names=["base_resid", "tuned_resid", "n_positions"],
        mistakes=[
            Mistake("The sign is flipped: the lens is tuned - base (what the fine-tune ADDED).",
                    lambda b, t, n=5: (b[:, :n] - t[:, :n]).mean((0, 1))),
            Mistake("You averaged over every position: only the first n_positions count.",
                    lambda b, t, n=5: (t - b).mean((0, 1))),
            Mistake("You took the LAST n_positions: the lens reads the first ones.",
                    lambda b, t, n=5: (t[:, -n:] - b[:, -n:]).mean((0, 1))),
            Mistake("You sliced the batch dim: positions are dim 1; every example counts.",
                    lambda b, t, n=5: (t[:n] - b[:n]).mean((0, 1))),
            Mistake("You summed over positions: average over the batch and the positions.",
                    lambda b, t, n=5: (t[:, :n] - b[:, :n]).sum(1).mean(0)),
            Mistake("Off by one: you kept [:, :n_positions + 1], one position too many: the lens "
                    "reads positions 0 .. n_positions - 1.", lambda b, t, n=5: (t[:, :n + 1] - b[:, :n + 1]).mean((0, 1))),
            Mistake("Off by one: you kept [:, :n_positions - 1], one position too few.",
                    lambda b, t, n=5: (t[:, :n - 1] - b[:, :n - 1]).mean((0, 1))),
            Mistake("You skipped position 0 (the BOS): the lens reads the first n_positions positions, BOS "
                    "included.", lambda b, t, n=5: (t[:, 1:n + 1] - b[:, 1:n + 1]).mean((0, 1))),
            Mistake("You skipped position 0 (the BOS) and kept n_positions - 1: the lens reads positions "
                    "0 .. n_positions - 1, BOS included.", lambda b, t, n=5: (t[:, 1:n] - b[:, 1:n]).mean((0, 1))),
            Mistake("You divided the sum by n_positions: when the texts are shorter than n_positions, fewer "
                    "positions exist. Average over the batch and the positions that exist.",
                    lambda b, t, n=5: (t[:, :n] - b[:, :n]).sum(1).mean(0) / n),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# param_change and fraction_changed: dicts of tensors in, Python numbers out
# ----------------------------------------------------------------------------------------------------
def _param_dicts(seed: int) -> list[tuple[str, dict, dict]]:
    g = seeded(seed)
    W, b, U = torch.randn(4, 5, generator=g), torch.randn(5, generator=g), torch.randn(3, 3, generator=g)
    W2 = W.clone()
    W2[0] += 0.5  # one row moved
    W2[2, 1] -= 0.25
    b2 = b + torch.randn(5, generator=g) * 0.01
    big = torch.randn(3, 4, generator=g) * 1e4
    return [
        ("two tensors, one row moved", {"W": W, "b": b}, {"W": W2, "b": b2}),
        ("an unchanged tensor", {"U": U, "b": b}, {"U": U.clone(), "b": b2}),
        ("a name only in one dict (skipped)", {"W": W, "only_base": b}, {"W": W2, "only_tuned": U}),
        ("large weights (x1e4)", {"big": big}, {"big": big * 1.001}),
        ("a zero base tensor", {"z": torch.zeros(2, 3), "b": b}, {"z": torch.full((2, 3), 0.5), "b": b2}),
        ("zero before and after", {"z": torch.zeros(4)}, {"z": torch.zeros(4)}),
    ]


def _compare_numbers(candidate: Callable, reference: Callable, cases: list[Case], mistakes: list[Mistake],
                     arg_names: list[str]) -> str:
    """``compare_to_reference`` for outputs that are Python floats or dicts of them: tensors are refused
    (the contract asks for numbers), and a KeyError gets the "names in both dicts" hint."""
    cases = [to_device(case) for case in cases]  # as compare_to_reference does: on check_device()
    got = call(candidate, *cases[0].args, _arg_names=arg_names, **cases[0].kwargs) if cases else None
    values = list(got.values()) if isinstance(got, dict) else [got]
    if any(isinstance(v, torch.Tensor) for v in values):
        raise CheckFailure(f"On {cases[0].label}, your function returned tensors: {fmt(got)}.",
                           hint="Return Python floats (a 0-d tensor converts to one).")
    try:
        return compare_to_reference(candidate, reference, cases, mistakes=mistakes, arg_names=arg_names,
                                    atol=1e-7, rtol=1e-4)
    except CheckFailure as failure:
        if "KeyError" in failure.message or "keys" in failure.message:
            raise CheckFailure(failure.message, hint="Only names in BOTH dicts count: skip a name that one of them "
                               "lacks.") from None
        raise


def _check_on_parameters(candidate: Callable, reference: Callable, **kwargs) -> None:
    """The contract's own input: ``dict(model.named_parameters())``, tensors that require grad (a
    ``.numpy()`` or an in-place edit fails on them, and a result must still be a plain number)."""
    g = seeded(61)
    base = {"w": nn.Parameter(to_device(torch.randn(3, 4, generator=g))),
            "b": nn.Parameter(to_device(torch.randn(4, generator=g)))}
    tuned = {"w": nn.Parameter(base["w"].detach() + to_device(0.1 * torch.randn(3, 4, generator=g))),
             "b": nn.Parameter(base["b"].detach().clone())}
    got = call(candidate, base, tuned, _arg_names=["base_params", "tuned_params"], **kwargs)
    with torch.no_grad():
        expected = reference(base, tuned, **kwargs)
    values = list(got.values()) if isinstance(got, dict) else [got]
    if any(isinstance(v, torch.Tensor) for v in values):
        raise CheckFailure(f"On parameters that require grad (dict(model.named_parameters())), your function "
                           f"returned tensors: {fmt(got)}.", hint="Return Python floats, whatever the inputs carry.")
    def close(a, b) -> bool:
        return isinstance(a, (int, float)) and abs(a - b) <= 1e-6 + 1e-4 * abs(b)

    if isinstance(expected, dict):
        same = isinstance(got, dict) and got.keys() == expected.keys() and all(close(got[k], v)
                                                                               for k, v in expected.items())
    else:
        same = close(got, expected)
    if not same:
        raise CheckFailure(f"On parameters that require grad (dict(model.named_parameters())), your function "
                           f"returned {fmt(got)}, expected {fmt(expected)}.")


def _common(base: dict, tuned: dict):
    return [(base[k].double(), tuned[k].double()) for k in base if k in tuned]


@checker(
    "param_change",
    chapter=CHAPTER,
    hint=(
        "Loop over the names both dicts share; each gives one number, the norm of a difference relative "
        "to a norm.",
        "change[name] = ||tuned - base|| / max(||base||, 1e-8), norms over all entries of the tensor, as "
        "a Python float. Skip a name only one dict has; detach (parameters carry gradients) and subtract "
        "in float32 or wider (bf16 inputs lose the difference otherwise); clamp the denominator so a "
        "zero tensor gives no inf.",
        "```python\nout = {}\nfor name, base in base_params.items():\n    if name in tuned_params:\n        "
        "delta = (tuned_params[name].detach().float() - base.detach().float()).norm()\n        out[name] "
        "= (delta / base.detach().float().norm().clamp(min=1e-8)).item()\nreturn out\n```",
    ),
)
def check_param_change(candidate) -> str:
    cases = [Case(label, (base, tuned)) for label, base, tuned in _param_dicts(58)]
    g = seeded(62)
    w = torch.randn(8, 8, generator=g)
    # bfloat16 parameters (a model rounded to bf16): a norm taken in bf16 is off by ~0.4%
    cases.append(Case("bfloat16 parameters", ({"w": w.bfloat16()}, {"w": (w + 0.05 * torch.randn(8, 8, generator=g))
                                                                    .bfloat16()})))
    mistakes = [
        Mistake("That is the absolute change ||tuned - base||: divide by ||base|| to make it relative.",
                lambda B, T: {k: (T[k] - B[k]).norm().item() for k in B if k in T}),
        Mistake("A zero base tensor gave inf or NaN: clamp the denominator, max(||base||, 1e-8).",
                lambda B, T: {k: ((T[k] - B[k]).norm() / B[k].norm()).item() for k in B if k in T}),
        Mistake("You divided by ||tuned||: the change is relative to the BASE weights.",
                lambda B, T: {k: ((T[k] - B[k]).norm() / T[k].norm().clamp(min=1e-8)).item() for k in B if k in T}),
        Mistake("That is ||tuned|| / ||base|| - 1 (how much the norm grew), not the norm of the change: "
                "||tuned - base|| / ||base||.",
                lambda B, T: {k: (T[k].norm() / B[k].norm().clamp(min=1e-8) - 1).item() for k in B if k in T}),
        Mistake("You averaged per-row (or per-entry) relative changes: use one norm over all entries of each "
                "tensor.",
                lambda B, T: {k: ((T[k] - B[k]).abs() / B[k].abs().clamp(min=1e-8)).mean().item() for k in B if k in T}),
    ]
    detail = _compare_numbers(candidate, interp.param_change, cases, mistakes,
                              arg_names=["base_params", "tuned_params"])
    _check_on_parameters(candidate, interp.param_change)
    return detail + " Parameters that require grad give the same numbers."


@checker(
    "fraction_changed",
    chapter=CHAPTER,
    hint=(
        "Count entries, not tensors: keep two running totals over every tensor both dicts name.",
        "fraction = #{entries with |tuned - base| > atol} / #{entries}, over all shared tensors together "
        "(a big matrix weighs more than a bias). Strictly greater: with atol = 0 an entry that did not "
        "move does not count. Subtract in a wide dtype (double) so that bf16 inputs compare exactly. "
        "Return a Python float.",
        "```python\nchanged, total = 0, 0\nfor name, base in base_params.items():\n    if name in "
        "tuned_params:\n        delta = (tuned_params[name].detach().double() - "
        "base.detach().double()).abs()\n        changed += int((delta > atol).sum())\n        total += "
        "base.numel()\nreturn changed / total\n```",
    ),
)
def check_fraction_changed(candidate) -> str:
    cases = [Case(label, (base, tuned)) for label, base, tuned in _param_dicts(59)]
    g = seeded(60)
    x = torch.randn(6, 6, generator=g)
    cases += [
        Case("atol=0.1", (_param_dicts(59)[0][1], _param_dicts(59)[0][2]), {"atol": 0.1}),
        Case("changes exactly equal to atol (ties: not counted)",
             ({"a": torch.ones(4)}, {"a": torch.tensor([1.5, 1.0, 0.5, 2.0])}), {"atol": 0.5}),
        Case("bfloat16 tensors", ({"x": x.bfloat16()}, {"x": (x + 1e-3 * torch.randn(6, 6, generator=g)).bfloat16()})),
        # changes of about 1e-6 of the weight: below torch.isclose's default rtol (1e-5), yet they moved
        Case("large weights moved by 1e-6 of their size (below torch.isclose's default rtol)",
             ({"w": 1000 + x[0]}, {"w": 1000 + x[0] + torch.tensor([1e-3, 0, 2e-3, 0, -1e-3, 0])})),
        # the threshold is absolute: 0.5 on weights near 10 is not 5% of them
        Case("atol=20: changes of 15 and 25 (large moves)",
             ({"w": torch.zeros(4)}, {"w": torch.tensor([15.0, -25.0, 0.0, 25.0])}), {"atol": 20.0}),
        Case("atol=0.5 on weights near 10 (an absolute threshold)",
             ({"w": 10 + x[1]}, {"w": 10 + x[1] + torch.tensor([0.6, 0.4, 2.0, -0.7, 0.1, 0.0])}), {"atol": 0.5}),
    ]

    def per_tensor_mean(B, T, atol=0.0):
        fractions = [((t - b).abs() > atol).double().mean().item() for b, t in _common(B, T)]
        return sum(fractions) / len(fractions)

    mistakes = [
        Mistake("You counted abs(tuned - base) >= atol: the test is strictly greater, > atol (with atol=0, "
                "an entry that did not move must not count).",
                lambda B, T, atol=0.0: sum(int(((t - b).abs() >= atol).sum()) for b, t in _common(B, T))
                / sum(b.numel() for b, _ in _common(B, T))),
        Mistake("You averaged the per-tensor fractions: count entries over ALL tensors together (a large "
                "matrix weighs more than a bias).", per_tensor_mean),
        Mistake("You counted only entries that went UP (tuned - base > atol): take the absolute value.",
                lambda B, T, atol=0.0: sum(int(((t - b) > atol).sum()) for b, t in _common(B, T))
                / sum(b.numel() for b, _ in _common(B, T))),
        Mistake("torch.isclose (or allclose) has a default rtol of 1e-5: it calls a change of 1e-6 of a large "
                "weight no change. Compare abs(tuned - base) > atol directly.",
                lambda B, T, atol=0.0: sum(int((~torch.isclose(t, b, atol=atol)).sum()) for b, t in _common(B, T))
                / sum(b.numel() for b, _ in _common(B, T))),
        Mistake("Your threshold is relative to the weight (abs(tuned - base) > atol * abs(base)): atol is "
                "absolute, abs(tuned - base) > atol.",
                lambda B, T, atol=0.0: sum(int(((t - b).abs() > atol * b.abs()).sum()) for b, t in _common(B, T))
                / sum(b.numel() for b, _ in _common(B, T))),
        Mistake("That is the fraction UNCHANGED (the sparsity): return the fraction that changed.",
                lambda B, T, atol=0.0: 1 - interp.fraction_changed(B, T, atol)),
    ]
    detail = _compare_numbers(candidate, interp.fraction_changed, cases, mistakes,
                              arg_names=["base_params", "tuned_params", "atol"])
    _check_on_parameters(candidate, interp.fraction_changed, atol=0.05)
    return detail + " Parameters that require grad give the same number."
