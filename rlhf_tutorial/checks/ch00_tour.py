"""Checkers for chapter 00: the tour of HookedTransformer.

Regimes probed (where plausible implementations differ):
- next_token_probs: a batch of 1 (a dropped batch dimension), one token per row (first position ==
  last), and logits in the hundreds (an unembedding x 2000), where a hand-written exp / sum softmax
  overflows;
- final_normalized_residual: the same token cases, against the neighbouring activations (the residual
  before the final LayerNorm, the last block's ln2, the logits); the batch of 1 and the one-token rows
  are where a squeeze() of the [batch, pos, d_model] activation drops a dimension.
"""

from __future__ import annotations

from functools import partial

import torch
from transformer_lens import HookedTransformer

from rlhf_tutorial import tour
from rlhf_tutorial.checks import fixtures
from rlhf_tutorial.checks.core import Case, Mistake, checker, compare_to_reference, seeded
from rlhf_tutorial.notebooks import solution_code

CHAPTER = "00_setup_and_tour"
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
    return compare_to_reference(
        candidate,
        tour.next_token_probs,
        _token_cases(model) + [Case("logits in the hundreds (exp overflows)", (loud, tokens))],
        arg_names=["model", "tokens"],
        mistakes=[
            Mistake("These are raw logits: apply softmax to get probabilities.", lambda m, t: m(t)[:, -1]),
            Mistake("These are log-probabilities: use softmax, not log_softmax.",
                    lambda m, t: m(t)[:, -1].log_softmax(-1)),
            Mistake("You read the first position: the next token is predicted by the LAST position, "
                    "logits[:, -1].", lambda m, t: m(t)[:, 0].softmax(-1)),
            Mistake("The softmax is over the batch dimension: use dim=-1 (the vocabulary).",
                    lambda m, t: m(t)[:, -1].softmax(0)),
        ],
    )


@checker(
    "final_normalized_residual",
    chapter=CHAPTER,
    hint=(
        "`model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])` calls `fn(activation, hook)` at the hook point "
        "`name`: your fn has to keep the activation somewhere the function can read after the forward pass.",
        "Make an empty list (or dict) in the function; define a hook function that appends the activation to it "
        "and returns nothing (returning a tensor would replace the activation); run the model with that hook on "
        "'ln_final.hook_normalized'; return the one stored tensor, unchanged (no squeeze).",
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

    return compare_to_reference(
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
