"""Chapter 08: LoRA on hooks, or how few parameters reinforcement learning needs.

LoRA (Hu et al. 2021) freezes a weight matrix W [d_in, d_out] (TransformerLens multiplies on the
right: y = x @ W) and learns a low-rank change of it,

    W' = W + (alpha / r) A^T B^T        A: [r, d_in], B: [d_out, r]

so a layer's output gains  delta_y = (alpha / r) x A^T B^T : r * (d_in + d_out) parameters instead of
d_in * d_out. B starts at zero, so the tuned model starts equal to the base; A starts small
and random, so B's gradient is not zero from the first step. Here the update is added through
TransformerLens's hook points, without touching a base weight: a hook reads the matrix's input x, a
later hook adds delta_y to its output. The pieces a learner writes:

1. ``LoRA``                 one adapter: A, B, the scale alpha / r, and delta_y from x
2. ``lora_hooks``           the forward hooks that apply a dict of adapters to a model
3. ``merge_lora``           a copy of the model with every adapter folded into its weight (for export)
4. ``update_rank_profile``  the singular values of a weight change, and how many carry a share of it

Which matrices (``TARGETS``) and which hook points, per layer L (``blocks.L.``):

| target   | weight        | input x read at                 | delta_y added at   | delta_y shape         |
|----------|---------------|---------------------------------|--------------------|-----------------------|
| "q"      | attn.W_Q      | ln1.hook_normalized             | attn.hook_q        | [b, s, head, d_head]  |
| "k"      | attn.W_K      | ln1.hook_normalized             | attn.hook_k        | [b, s, head, d_head]  |
| "v"      | attn.W_V      | ln1.hook_normalized             | attn.hook_v        | [b, s, head, d_head]  |
| "o"      | attn.W_O      | attn.hook_z (flattened heads)   | hook_attn_out      | [b, s, d_model]       |
| "mlp_in" | mlp.W_in      | ln2.hook_normalized             | mlp.hook_pre       | [b, s, d_mlp]         |
| "mlp_out"| mlp.W_out     | mlp.hook_post                   | hook_mlp_out       | [b, s, d_model]       |

``ln1.hook_normalized`` is exactly what W_Q, W_K and W_V multiply in a model whose LayerNorm weights are
folded into the next weights (``normalization_type="LNPre"``, as both worlds' policies are: TransformerLens's
``hook_normalized`` comes before an unfolded LayerNorm's weight and bias); ``hook_resid_pre`` is not.
``hook_q`` holds x W_Q + b_Q before the attention scores are formed, so an addition there is an addition
to W_Q's output, which is what a change of W_Q makes. W_O reads the heads' outputs z, concatenated over
heads into one axis of head * d_head numbers, head-major (head 0's d_head numbers, then head 1's, ...),
and ``hook_attn_out`` is its output (plus b_O) before it joins the residual stream. ``mlp.hook_pre`` is W_in's output before the activation function,
``mlp.hook_post`` the activation that W_out multiplies.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedTransformer

#: The matrices an adapter can change, in the order the table above lists them.
TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "mlp_in", "mlp_out")


# ----------------------------------------------------------------------------------------------------
# One adapter
# ----------------------------------------------------------------------------------------------------


class LoRA(nn.Module):
    """One low-rank adapter of a weight W [d_in, d_out]: W' = W + scale A^T B^T, scale = alpha / rank.

    ``__init__`` creates two ``nn.Parameter``s on ``device`` (default: the CPU), float32:

    - ``A`` [rank, d_in]: normal(0, 1) / sqrt(d_in), drawn from ``generator`` (None: torch's global
      RNG); small and random, so that B's gradient, built from x A^T, is not zero at the start;
    - ``B`` [d_out, rank]: zeros, so that delta_y = 0 and the tuned model starts equal to the base;

    and keeps the scale alpha / rank as ``self.scale`` (a Python float). Dividing by the rank makes the first
    steps' update about the same size at every rank under Adam (roughly, and only early in training: see the
    chapter). Raises ValueError for rank < 1.

    ``forward(x)`` returns delta_y = scale * x A^T B^T (math: the row vector x times A transposed times B
    transposed), shape ``[*b, d_out]`` for ``x`` of shape ``[*b, d_in]``: computed through the rank-r
    bottleneck, the r numbers x A^T first (never forming the d_in x d_out matrix), differentiable in x, A
    and B.
    """

    def __init__(self, d_in: int, d_out: int, rank: int, alpha: float,
                 generator: torch.Generator | None = None, device: torch.device | str | None = None):
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be at least 1, got {rank}")
        # >>> exercise
        a = torch.randn(rank, d_in, generator=generator) / math.sqrt(d_in)
        self.A = nn.Parameter(a.to(device))
        self.B = nn.Parameter(torch.zeros(d_out, rank, device=device))
        self.scale = alpha / rank
        # <<< exercise

    def forward(self, x: Float[Tensor, "*b d_in"]) -> Float[Tensor, "*b d_out"]:
        """delta_y = scale * x A^T B^T, through the rank-r bottleneck."""
        # >>> exercise
        return self.scale * ((x @ self.A.T) @ self.B.T)
        # <<< exercise


def weight_shapes(model: HookedTransformer) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each target's weight seen as one matrix (heads concatenated)."""
    cfg = model.cfg
    heads = cfg.n_heads * cfg.d_head
    return {"q": (cfg.d_model, heads), "k": (cfg.d_model, heads), "v": (cfg.d_model, heads),
            "o": (heads, cfg.d_model), "mlp_in": (cfg.d_model, cfg.d_mlp), "mlp_out": (cfg.d_mlp, cfg.d_model)}


def adapter_key(layer: int, target: str) -> str:
    """The key of layer ``layer``'s ``target`` adapter in an adapters dict: ``"L{layer}_{target}"``."""
    return f"L{layer}_{target}"


def make_adapters(model: HookedTransformer, rank: int, alpha: float, targets: tuple[str, ...] = TARGETS,
                  seed: int = 0, lora_cls: type = LoRA) -> nn.ModuleDict:
    """One ``lora_cls`` per layer and target, keyed by ``adapter_key``, on the model's device, their A
    drawn in key order from one generator seeded with ``seed``."""
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise ValueError(f"unknown LoRA targets {sorted(unknown)}; known: {TARGETS}")
    shapes, device = weight_shapes(model), model.cfg.device
    g = torch.Generator().manual_seed(seed)
    return nn.ModuleDict({
        adapter_key(layer, t): lora_cls(*shapes[t], rank, alpha, generator=g, device=device)
        for layer in range(model.cfg.n_layers) for t in targets
    })


# ----------------------------------------------------------------------------------------------------
# Attaching through hooks
# ----------------------------------------------------------------------------------------------------

#: For each target: (hook that holds the input x, hook where delta_y is added), under ``blocks.L.``
HOOK_POINTS: dict[str, tuple[str, str]] = {
    "q": ("ln1.hook_normalized", "attn.hook_q"),
    "k": ("ln1.hook_normalized", "attn.hook_k"),
    "v": ("ln1.hook_normalized", "attn.hook_v"),
    "o": ("attn.hook_z", "hook_attn_out"),
    "mlp_in": ("ln2.hook_normalized", "mlp.hook_pre"),
    "mlp_out": ("mlp.hook_post", "hook_mlp_out"),
}


def lora_hooks(model: HookedTransformer, adapters: nn.ModuleDict) -> list[tuple[str, Callable]]:
    """The forward hooks that add every adapter's update to ``model``'s activations: a list of
    ``(hook_name, hook_fn)`` for ``model.run_with_hooks(tokens, fwd_hooks=...)`` or ``model.add_hook``.

    ``adapters`` maps ``adapter_key(layer, target)`` (``"L{layer}_{target}"``) to a ``LoRA``; targets
    and hook points are the module docstring's table (``HOOK_POINTS``): for each adapter, one hook
    stores the activation x at the input point (for "o", z's head and d_head axes made one axis of
    head * d_head numbers, head-major), and one hook at the output point returns the activation plus
    adapter(x), with delta_y reshaped to the activation's shape (for q, k, v: its last axis of head *
    d_head numbers split back into head and d_head, head-major: head 0's d_head numbers first). A hook
    returns a new tensor (no in-place edit: training differentiates through it). A layer or target absent from ``adapters`` is left
    alone; with no adapters the list is empty. The hooks of one forward pass must see that pass's x
    (the input hook runs before the output hook in every layer; one list serves any number of passes and
    batch shapes). The model is left as it is: base weights never touched, no hook added to it.
    """
    # >>> exercise
    hooks: list[tuple[str, Callable]] = []
    for key, adapter in adapters.items():
        layer, target = key[1:].split("_", 1)
        read_at, add_at = HOOK_POINTS[target]
        stored: dict[str, Tensor] = {}

        def read(x: Tensor, hook, stored=stored) -> None:
            stored["x"] = x.flatten(-2) if x.dim() == 4 else x  # hook_z: [b s head d_head] -> [b s (head d_head)]

        def add(out: Tensor, hook, stored=stored, adapter=adapter) -> Tensor:
            delta = adapter(stored.pop("x"))
            return out + delta.reshape(out.shape)

        hooks += [(f"blocks.{layer}.{read_at}", read), (f"blocks.{layer}.{add_at}", add)]
    return hooks
    # <<< exercise


def attach_lora(model: HookedTransformer, adapters: nn.ModuleDict,
           hooks_fn: Callable[[HookedTransformer, nn.ModuleDict], list] | None = None) -> None:
    """Attach the adapters to ``model`` for good (until ``detach_lora``): ``lora_hooks``'s hooks added as
    permanent hooks, so that ``run_with_hooks`` elsewhere (which removes the temporary ones) keeps them;
    ``hooks_fn`` replaces ``lora_hooks`` (a learner's version)."""
    for name, fn in (hooks_fn or lora_hooks)(model, adapters):
        model.add_hook(name, fn, is_permanent=True)


def detach_lora(model: HookedTransformer) -> None:
    """Remove every hook from ``model``, the permanent ones (an attached LoRA) included."""
    model.reset_hooks(including_permanent=True)


# ----------------------------------------------------------------------------------------------------
# Merging
# ----------------------------------------------------------------------------------------------------


def merge_lora(model: HookedTransformer, adapters: nn.ModuleDict) -> HookedTransformer:
    """A copy of ``model`` (``copy.deepcopy``, with no hooks) whose weights hold every adapter's update,
    so that it computes, with no hook, what ``model`` with ``lora_hooks(model, adapters)`` computes:

        W'  = W + scale A^T B^T          ([d_in, d_out], heads concatenated as in ``lora_hooks``)

    mapped back to TransformerLens's shapes: for W_Q, W_K, W_V [head, d_model, d_head] the update's d_out
    axis is split into head and d_head (head-major, as the hooks have it) and the head axis put first; for
    W_O [head, d_head, d_model] its d_in axis is split the same way; W_in and W_out add as they are. ``model`` and
    the adapters are left unchanged; biases are unchanged (LoRA changes matrices only). The copy's
    parameters carry no graph (computed under no_grad) and keep the model's dtype and device.
    """
    merged = copy.deepcopy(model)
    merged.reset_hooks(including_permanent=True)
    # >>> exercise
    with torch.no_grad():
        for key, adapter in adapters.items():
            layer, target = key[1:].split("_", 1)
            block = merged.blocks[int(layer)]
            delta = adapter.scale * adapter.A.T @ adapter.B.T  # [d_in, d_out]
            if target in ("q", "k", "v"):
                weight = getattr(block.attn, f"W_{target.upper()}")
                weight += einops.rearrange(delta, "d (h e) -> h d e", h=weight.shape[0]).to(weight.dtype)
            elif target == "o":
                weight = block.attn.W_O
                weight += einops.rearrange(delta, "(h e) d -> h e d", h=weight.shape[0]).to(weight.dtype)
            else:
                weight = block.mlp.W_in if target == "mlp_in" else block.mlp.W_out
                weight += delta.to(weight.dtype)
    # <<< exercise
    return merged


# ----------------------------------------------------------------------------------------------------
# How many directions did a full fine-tune move?
# ----------------------------------------------------------------------------------------------------


def update_rank_profile(delta: Float[Tensor, "m n"], fraction: float = 0.9) -> tuple[Float[Tensor, "k"], int]:
    """The spectrum of a weight change, and how many directions carry ``fraction`` of it.

    Returns ``(singular_values, k)``: the singular values s_1 >= s_2 >= ... of ``delta``
    (``min(m, n)`` of them, float32, on ``delta``'s device) and the smallest k such that the top k
    carry at least ``fraction`` of the change's squared Frobenius norm,

        sum_{i <= k} s_i^2  >=  fraction * sum_i s_i^2          (||delta||_F^2 = sum_i s_i^2)

    (a Python int; the comparison allows a relative 1e-6 of float rounding, so ``fraction = 1.0``
    gives the number of nonzero singular values). A change that is exactly zero gives k = 0, and so
    does ``fraction = 0.0``. Raises ValueError unless 0 <= fraction <= 1. The singular values are
    computed in float64 (a float32 SVD of a 768 x 3072 matrix loses the small ones).
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    # >>> exercise
    s = torch.linalg.svdvals(delta.double())
    energy = s.square()
    total = energy.sum()
    if fraction == 0.0 or total == 0:
        return s.float(), 0
    carried = energy.cumsum(0)
    k = int((carried < fraction * total * (1 - 1e-6)).sum()) + 1
    return s.float(), min(k, len(s))
    # <<< exercise


def weight_matrices(model: HookedTransformer) -> dict[str, Float[Tensor, "d_in d_out"]]:
    """Every target weight of every layer as one [d_in, d_out] matrix (heads concatenated as
    ``lora_hooks`` has them), keyed by ``adapter_key``: what a full fine-tune changes, per matrix."""
    out = {}
    for layer, block in enumerate(model.blocks):
        out[adapter_key(layer, "q")] = einops.rearrange(block.attn.W_Q, "h d e -> d (h e)")
        out[adapter_key(layer, "k")] = einops.rearrange(block.attn.W_K, "h d e -> d (h e)")
        out[adapter_key(layer, "v")] = einops.rearrange(block.attn.W_V, "h d e -> d (h e)")
        out[adapter_key(layer, "o")] = einops.rearrange(block.attn.W_O, "h e d -> (h e) d")
        out[adapter_key(layer, "mlp_in")] = block.mlp.W_in
        out[adapter_key(layer, "mlp_out")] = block.mlp.W_out
    return {k: v.detach() for k, v in out.items()}


def trainable_parameters(module: nn.Module) -> int:
    """The number of parameters of ``module`` that require grad."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
