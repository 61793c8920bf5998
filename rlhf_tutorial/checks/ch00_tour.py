"""Checkers for chapter 00: the tour of HookedTransformer.

Regimes probed (where plausible implementations differ):
- next_token_probs: a batch of 1 (a dropped batch dimension), one token per row (first position ==
  last), and logits in the hundreds (an unembedding x 2000), where a hand-written exp / sum softmax
  overflows; then the gradient with respect to every weight of the model (a detached result has none);
- final_normalized_residual: the same token cases, against the neighbouring activations (the residual
  before the final LayerNorm, the last block's ln2, the logits); the batch of 1 and the one-token rows
  are where a squeeze() of the [batch, pos, d_model] activation drops a dimension; then the gradient of
  a weighted sum of the result with respect to every weight of the model, against the reference's (a
  cached activation, a detach in the hook or a forward pass under no_grad carries none), and the hooks
  on the model after the call (a hook added by hand and never removed stays on every later forward).
"""

from __future__ import annotations

from functools import partial

import torch
from transformer_lens import HookedTransformer

from rlhf_tutorial import tour
from rlhf_tutorial.checks import fixtures
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    checker,
    compare_to_reference,
    fmt,
    seeded,
)
from rlhf_tutorial.notebooks import solution_code

CHAPTER = "00_setup_and_tour"

#: The contract of each exercise (its CURRICULUM row and docstring), clause by clause; the tests write a
#: version that breaks each one (tests/checks/test_ch00_tour.py: VIOLATIONS).
CLAUSES = {
    "next_token_probs": {
        "last_position": "the distribution comes from the LAST position's logits (position t scores token t+1)",
        "softmax_over_vocab": "probabilities: a softmax over the vocabulary (the last dimension), every row sums to 1",
        "shape": "the result is [batch, vocab]: a batch of 1 keeps its batch dimension",
        "stable": "logits in the hundreds give finite probabilities (no overflow of exp)",
        "differentiable": "the probabilities stay in the graph: a loss on them trains the model's weights",
    },
    "final_normalized_residual": {
        "which_activation": "the activation at ln_final.hook_normalized, not a neighbouring one",
        "as_stored": "returned as stored, [batch, pos, d_model]: no dimension of size 1 squeezed away",
        "each_call": "each call returns the activation of the tokens it was given (not one stored by an earlier call)",
        "differentiable": "the result stays in the graph: its gradient reaches the model's weights (not detached, "
                          "not from the cache, not under no_grad)",
        "hooks_removed": "every hook the function adds is removed from the model when it returns",
    },
}
small_model = partial(fixtures.small_model, normalization_type="LNPre")  # the worlds' LayerNorms


def _token_cases(model: HookedTransformer) -> list[Case]:
    """A batch of 1 (a batch dimension dropped or squeezed shows), a batch of 3 (the typical case),
    one token per row (first position == last: a sequence dimension squeezed away shows)."""
    g = seeded(0)
    vocab = model.cfg.d_vocab
    return [
        Case("a batch of 1", (model, torch.randint(0, vocab, (1, 5), generator=g))),
        Case("a batch of 3", (model, torch.randint(0, vocab, (3, 7), generator=g))),
        Case("one token per row", (model, torch.randint(0, vocab, (2, 1), generator=g))),
    ]


@checker(
    "next_token_probs",
    chapter=CHAPTER,
    hint=(
        "Two steps: a forward pass gives the logits, and torch's `softmax` (over the right dimension) turns "
        "one position's logits into probabilities. Which position predicts the token after the sequence?",
        "The logits have shape [batch, seq, vocab] and position t scores token t+1, so the next token is scored "
        "by the LAST position. Select it (a basic index on the sequence dimension leaves [batch, vocab]) and "
        "take the softmax over the vocabulary, the last dimension. torch's softmax subtracts the max first, so "
        "logits in the hundreds stay finite; exp / sum by hand does not.",
        solution_code(tour.next_token_probs),
    ),
)
def check_next_token_probs(candidate) -> str:
    model = small_model()
    # Saturation: the same model with its unembedding x 2000 (logits in the hundreds), where exp
    # overflows: only a max-subtracting softmax (torch's) stays finite.
    loud = small_model()
    with torch.no_grad():
        loud.W_U.mul_(2000.0)
    tokens = torch.randint(0, loud.cfg.d_vocab, (2, 4), generator=seeded(1))
    summary = compare_to_reference(
        candidate,
        tour.next_token_probs,
        _token_cases(model) + [Case("logits in the hundreds (exp overflows)", (loud, tokens))],
        arg_names=["model", "tokens"],
        mistakes=[
            Mistake("These are raw logits: apply softmax to get probabilities.", lambda m, t: m(t)[:, -1]),
            Mistake("These are log-probabilities: use softmax, not log_softmax.",
                    lambda m, t: m(t)[:, -1].log_softmax(-1)),
            Mistake("You read the first position: the next token is predicted by the LAST position's logits.",
                    lambda m, t: m(t)[:, 0].softmax(-1)),
            Mistake("The softmax is over the batch dimension: use dim=-1 (the vocabulary).",
                    lambda m, t: m(t)[:, -1].softmax(0)),
        ],
    )
    _check_gradient_reaches_model(candidate, tour.next_token_probs,
                                  "a loss on these probabilities (the policy's) would never train the policy")
    return f"{summary} Its gradient reaches every weight of the model."


@checker(
    "final_normalized_residual",
    chapter=CHAPTER,
    hint=(
        "`model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])` calls `fn(activation, hook)` at the hook point "
        "`name`: your fn has to keep the activation somewhere the function can read after the forward pass.",
        "Make an empty list (or dict) in the function; define a hook function that appends the activation to it "
        "and returns nothing (returning a tensor would replace the activation); run the model with that hook on "
        "'ln_final.hook_normalized'; return the one stored tensor, unchanged (no squeeze, and no detached "
        "copy: chapter 03 backpropagates through it). run_with_hooks removes the hook when the pass ends.",
        solution_code(tour.final_normalized_residual),
    ),
)
def check_final_normalized_residual(candidate) -> str:
    model = small_model(seed=1)
    last = model.cfg.n_layers - 1

    def residual_before_ln(m, t):
        _, cache = m.run_with_cache(t)
        return cache[f"blocks.{last}.hook_resid_post"]

    def last_block_ln2(m, t):
        _, cache = m.run_with_cache(t)
        return cache[f"blocks.{last}.ln2.hook_normalized"]

    summary = compare_to_reference(
        candidate,
        tour.final_normalized_residual,
        _token_cases(model),
        arg_names=["model", "tokens"],
        mistakes=[
            Mistake("That is the residual stream BEFORE the final LayerNorm (blocks.L-1.hook_resid_post): "
                    "hook 'ln_final.hook_normalized' instead.", residual_before_ln),
            Mistake("That is the last block's MLP LayerNorm (blocks.L-1.ln2.hook_normalized): the one you "
                    "want is the final LayerNorm, 'ln_final.hook_normalized'.", last_block_ln2),
            Mistake("Those are the logits, not the residual stream: read the activation in a hook.",
                    lambda m, t: m(t)),
            Mistake("squeeze() dropped a dimension of size 1 (the batch of a single row, or the position of "
                    "one-token rows): return the activation as stored, [batch, pos, d_model].",
                    lambda m, t: m.run_with_cache(t)[1]["ln_final.hook_normalized"].squeeze()),
        ],
    )
    _check_hooks_removed(candidate)
    _check_gradient_reaches_model(candidate)
    return (f"{summary} Its gradient reaches every weight of the model below the final LayerNorm, and it "
            "leaves no hook on the model.")


def _hook_count(model: HookedTransformer) -> int:
    """The number of hooks registered on the model and its submodules (TransformerLens's hook points keep
    theirs as PyTorch module hooks)."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               + len(getattr(m, "_backward_pre_hooks", {})) for m in model.modules())


def _check_hooks_removed(candidate) -> None:
    model = small_model(seed=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=seeded(3)).to(model.cfg.device)
    before = _hook_count(model)
    call(candidate, model, tokens, _arg_names=["model", "tokens"])
    left = _hook_count(model) - before
    if left > 0:
        raise CheckFailure(
            f"After your function returned, the model still has {left} hook(s) on it that were not there before "
            "the call: every later forward pass (the notebook's, a trainer's) would run them again, and each "
            "call would add more.",
            hint="Remove every hook you add before returning: TransformerLens's run_with_hooks (or its hooks() "
                 "context manager) removes them at the end of the forward pass; a hook added by hand must be "
                 "removed by hand (model.reset_hooks()).",
        )


def _check_gradient_reaches_model(candidate, reference=tour.final_normalized_residual,
                                  what: str = "a value head on it would train only itself, never the shared trunk "
                                              "below it") -> None:
    """The gradient of sum(w * result) with respect to every weight of the model, against the reference's."""
    model = small_model(seed=1)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 6), generator=seeded(4)).to(model.cfg.device)
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    want_out = reference(model, tokens)
    weights = torch.randn(want_out.shape, generator=seeded(5)).to(want_out.device)
    want = torch.autograd.grad((weights * want_out).sum(), [p for _, p in params], allow_unused=True)
    got_out = call(candidate, model, tokens, _arg_names=["model", "tokens"])
    if not isinstance(got_out, torch.Tensor) or got_out.shape != want_out.shape:
        raise CheckFailure(f"With the model's weights requiring grad your function returned {fmt(got_out)}, "
                           f"expected a tensor of shape {tuple(want_out.shape)}.")
    if not got_out.requires_grad:
        raise CheckFailure(
            "Your result is detached from the model: the values are right, but no gradient reaches the "
            f"transformer's weights through it, so {what}.",
            hint="The result must stay in the graph of the forward pass: run_with_cache's cache holds detached "
                 "copies, and a .detach() (in a hook or on the result) or a forward pass under torch.no_grad() "
                 "drops the graph too.",
        )
    got = torch.autograd.grad((weights.to(got_out.dtype) * got_out).sum(), [p for _, p in params],
                              allow_unused=True)
    for (name, p), w_grad, g_grad in zip(params, want, got):
        w_grad = torch.zeros_like(p) if w_grad is None else w_grad
        g_grad = torch.zeros_like(p) if g_grad is None else g_grad
        scale = float(w_grad.abs().max())
        if not torch.allclose(g_grad.double(), w_grad.double(), rtol=1e-3, atol=1e-6 + 1e-3 * scale):
            what = "no gradient reaches" if not bool(g_grad.ne(0).any()) else "the gradient differs for"
            raise CheckFailure(
                f"The values are right, but {what} the model's weight {name} through your result: part of the "
                "computation is detached (computed from a cached or detached activation), so training would not "
                "move that weight as it should.",
                hint="Compute the result from the forward pass itself, kept in the graph (no cache, no .detach(), "
                     "no torch.no_grad()).",
            )
