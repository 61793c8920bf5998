"""Chapter 00 reference: reading a HookedTransformer's outputs and activations.

Two small exercises that every later chapter builds on: the next-token distribution (what the policy
samples from) and the final normalised residual stream (where chapter 03 attaches the value head).
"""

from __future__ import annotations

from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer


def next_token_probs(model: HookedTransformer, tokens: Int[Tensor, "b s"]) -> Float[Tensor, "b v"]:
    """The policy's distribution over the token that follows each sequence.

    pi(x_{s} | x_{<s}) = softmax(logits[:, -1, :]): the logits at the last position predict the next token.
    """
    logits: Float[Tensor, "b s v"] = model(tokens)
    return logits[:, -1, :].softmax(dim=-1)


def final_normalized_residual(
    model: HookedTransformer, tokens: Int[Tensor, "b s"]
) -> Float[Tensor, "b s d_model"]:
    """The residual stream after the final LayerNorm, read with a hook on ``ln_final.hook_normalized``.

    This is exactly what the unembedding sees (logits = normalized @ W_U + b_U), so it is the natural
    input for a value head.
    """
    stored: list[Tensor] = []

    def save(activation: Float[Tensor, "b s d_model"], hook) -> None:
        stored.append(activation.detach())

    model.run_with_hooks(tokens, fwd_hooks=[("ln_final.hook_normalized", save)])
    return stored[0]
