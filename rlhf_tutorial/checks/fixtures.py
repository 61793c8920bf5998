"""What the checkers build their cases from, in one place: small seeded models.

``seeded(seed)`` (a CPU generator that never touches the global RNG) lives in ``checks.core``;
every random case of every checker draws from one.
"""

from __future__ import annotations

from transformer_lens import HookedTransformer, HookedTransformerConfig

from rlhf_tutorial.checks.core import check_device


def small_model(
    seed: int = 0, d_vocab: int = 50, n_ctx: int = 32, normalization_type: str = "LN"
) -> HookedTransformer:
    """A seeded random GPT-2-style model without a tokenizer (2 layers, d_model 32, 4 heads of 8),
    small enough to build in milliseconds, in eval mode, on :func:`check_device` (the device of the check
    now running, else the course's). ``normalization_type="LNPre"``: LayerNorm weights folded into the
    next layer, as in both worlds' policies."""
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=32, n_ctx=n_ctx, d_head=8, n_heads=4, d_vocab=d_vocab,
        act_fn="gelu_new", normalization_type=normalization_type, seed=seed, device=str(check_device()),
    )
    return HookedTransformer(cfg).eval()
