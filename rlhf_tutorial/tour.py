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

    pi(x_s | x_{<s}) = softmax_v(z_{s-1}, v): the logits z_t at position t score token t+1, so the last
    position's logits give the next token's distribution, a softmax over the vocabulary (every row sums
    to 1; logits in the hundreds must not overflow). The probabilities stay in the graph of the forward
    pass: a loss computed from them trains the model's weights.
    """
    logits: Float[Tensor, "b s v"] = model(tokens)
    return logits[:, -1, :].softmax(dim=-1)


def final_normalized_residual(
    model: HookedTransformer, tokens: Int[Tensor, "b s"]
) -> Float[Tensor, "b s d_model"]:
    """The residual stream after the final LayerNorm, read with a hook on ``ln_final.hook_normalized``,
    as stored: [batch, pos, d_model], no dimension squeezed.

    This is exactly what the unembedding sees (logits = normalized @ W_U + b_U), so it is the natural
    input for a value head. The result stays in the forward pass's graph: a loss computed from it sends
    its gradient back into the transformer's weights (a value head on it trains the shared trunk). Every
    hook the function adds is gone from the model when it returns.
    """
    stored: list[Tensor] = []

    def save(activation: Float[Tensor, "b s d_model"], hook) -> None:
        stored.append(activation)

    model.run_with_hooks(tokens, fwd_hooks=[("ln_final.hook_normalized", save)])
    return stored[0]
