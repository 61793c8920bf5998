"""Checkers of chapter 08: realistic wrong implementations, written out here, fail with a message that
names the mistake, and correct code written differently passes (the reference passing and the stub
failing are the manifest's)."""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from rlhf_tutorial import lora
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.checks.fixtures import small_model
from tests.checks.helpers import assert_fails_with


# ----------------------------------------------------------------------------------------------------
# LoRA
# ----------------------------------------------------------------------------------------------------
def lora_class(*, b_init="zeros", a_init="scaled", scale_of=lambda alpha, rank: alpha / rank, forward_scale=1,
               detach=False, use_generator=True):
    """A LoRA a learner could write, with one decision changed."""

    class LearnerLoRA(nn.Module):
        def __init__(self, d_in, d_out, rank, alpha, generator=None, device=None):
            super().__init__()
            if rank < 1:
                raise ValueError("rank")
            g = generator if use_generator else None
            if a_init == "scaled":
                a = torch.randn(rank, d_in, generator=g) / math.sqrt(d_in)
            elif a_init == "unit":
                a = torch.randn(rank, d_in, generator=g)
            else:
                a = torch.zeros(rank, d_in)
            b = torch.zeros(d_out, rank) if b_init == "zeros" else torch.randn(d_out, rank, generator=g) * 0.01
            self.A = nn.Parameter(a.to(device))
            self.B = nn.Parameter(b.to(device))
            self.scale = scale_of(alpha, rank)

        def forward(self, x):
            out = (x @ self.A.T) @ self.B.T * self.scale * forward_scale
            return out.detach() if detach else out

    return LearnerLoRA


@pytest.mark.parametrize("wrong, fragment", [
    (lora_class(b_init="random"), "B random"),
    (lora_class(a_init="zeros"), "A zero too"),
    (lora_class(scale_of=lambda alpha, rank: alpha), "Missing alpha / r"),
    (lora_class(scale_of=lambda alpha, rank: rank / alpha), "(inverted)"),
    (lora_class(scale_of=lambda alpha, rank: alpha // rank), "Missing alpha / r"),  # only alpha < rank shows it
    (lora_class(forward_scale=2), "applies the scale twice"),
    (lora_class(a_init="unit"), "A's scale is wrong"),
    (lora_class(use_generator=False), "ignores `generator`"),
    (lora_class(detach=True), "does not require grad"),
], ids=["B-random", "A-zero", "scale-alpha", "scale-inverted", "integer-division", "scale-twice", "A-unit-std",
        "no-generator", "detached-forward"])
def test_lora_rejects(wrong, fragment):
    assert_fails_with("LoRA", wrong, fragment)


class LoRAWrittenDifferently(nn.Module):
    """Parameters registered by name, A drawn in place from the generator, the forward as one einsum
    over the rank axis, the scale kept as a float from math."""

    def __init__(self, d_in, d_out, rank, alpha, generator=None, device=None):
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank {rank}")
        a = torch.empty(rank, d_in).normal_(0.0, 1.0 / math.sqrt(d_in), generator=generator)
        self.register_parameter("A", nn.Parameter(a.to(device)))
        self.register_parameter("B", nn.Parameter(torch.zeros(rank, d_out, device=device).T.contiguous()))
        self.scale = float(alpha) / float(rank)

    def forward(self, x):
        low = torch.einsum("...i,ri->...r", x, self.A)
        return torch.einsum("...r,or->...o", low * self.scale, self.B)


def test_lora_accepts_a_version_written_differently():
    result = run_check("LoRA", LoRAWrittenDifferently)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# lora_hooks
# ----------------------------------------------------------------------------------------------------
def hooks_with(points=None, *, late_binding=False, twice=False, detach=False, flatten_z=True):
    table = {**lora.HOOK_POINTS, **(points or {})}

    def lora_hooks(model, adapters):
        hooks = []
        for key, adapter in adapters.items():
            layer, target = key[1:].split("_", 1)
            read_at, add_at = table[target]
            store = {}
            if late_binding:  # the classic closure bug: every hook sees the loop's last adapter and store
                def read(x, hook):
                    store["x"] = x.flatten(-2) if (x.dim() == 4 and flatten_z) else x  # noqa: B023

                def add(out, hook):
                    delta = adapter(store["x"])  # noqa: B023
                    return out + delta.reshape(out.shape)
            else:
                def read(x, hook, store=store):
                    store["x"] = x.flatten(-2) if (x.dim() == 4 and flatten_z) else x

                def add(out, hook, store=store, adapter=adapter):
                    delta = adapter(store["x"])
                    return out + (delta.detach() if detach else delta).reshape(out.shape)
            hooks += [(f"blocks.{layer}.{read_at}", read), (f"blocks.{layer}.{add_at}", add)]
            if twice:
                hooks.append((f"blocks.{layer}.{add_at}", add))
        return hooks

    return lora_hooks


@pytest.mark.parametrize("wrong, fragment", [
    (hooks_with({t: ("hook_resid_pre", f"attn.hook_{t}") for t in "qkv"}), "hook_resid_pre"),
    (hooks_with({"mlp_out": ("mlp.hook_pre", "hook_mlp_out")}), "mlp.hook_post"),
    (hooks_with({"mlp_in": ("ln2.hook_normalized", "mlp.hook_post")}), "before the activation function"),
    (hooks_with(twice=True), "applied twice"),
    (hooks_with(late_binding=True), "loop"),
    (hooks_with(detach=True), "No gradient reaches"),
    (hooks_with(flatten_z=False), "only layer 1's 'o' adapter"),  # z kept per head: the matmul fails on the 'o' case
], ids=["resid-pre", "mlp-out-pre", "mlp-in-post", "twice", "late-binding", "detached", "z-not-flattened"])
def test_lora_hooks_rejects(wrong, fragment):
    assert_fails_with("lora_hooks", wrong, fragment)


def lora_hooks_written_differently(model, adapters):
    """functools.partial instead of closures, and the attention / MLP outputs' updates added to the
    residual stream right after them (hook_resid_mid / hook_resid_post: the same sum)."""
    out_points = {**lora.HOOK_POINTS, "o": ("attn.hook_z", "hook_resid_mid"), "mlp_out": ("mlp.hook_post", "hook_resid_post")}
    seen = {}

    def remember(x, hook, key):
        seen[key] = x.reshape(*x.shape[:2], -1)

    def add_delta(act, hook, key):
        delta = adapters[key](seen[key])
        return act + delta.view(act.shape)

    hooks = []
    for key in adapters:
        layer = int(key.split("_")[0][1:])
        target = key.split("_", 1)[1]
        read_at, add_at = out_points[target]
        hooks.append((f"blocks.{layer}.{read_at}", functools.partial(remember, key=key)))
        hooks.append((f"blocks.{layer}.{add_at}", functools.partial(add_delta, key=key)))
    return hooks


def test_lora_hooks_accepts_a_version_written_differently():
    result = run_check("lora_hooks", lora_hooks_written_differently)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# merge_lora
# ----------------------------------------------------------------------------------------------------
def merge_with(*, in_place=False, keep_hooks=False, transpose=False, no_scale=False, heads_last=False, skip=()):
    def merge_lora(model, adapters):
        merged = model if in_place else copy.deepcopy(model)
        if not keep_hooks and not in_place:
            merged.reset_hooks(including_permanent=True)
        with torch.no_grad():
            for key, adapter in adapters.items():
                layer, target = key[1:].split("_", 1)
                if target in skip:
                    continue
                block = merged.blocks[int(layer)]
                delta = adapter.B @ adapter.A if transpose else adapter.A.T @ adapter.B.T
                if not no_scale:
                    delta = delta * adapter.scale
                n_heads, d_head = model.cfg.n_heads, model.cfg.d_head
                if target in ("q", "k", "v"):
                    w = getattr(block.attn, "W_" + target.upper())
                    if heads_last:
                        w += delta.reshape(-1, d_head, n_heads).permute(2, 0, 1)
                    else:
                        w += delta.reshape(-1, n_heads, d_head).permute(1, 0, 2)
                elif target == "o":
                    w = block.attn.W_O
                    w += delta.reshape(d_head, n_heads, -1).transpose(0, 1) if heads_last else delta.reshape(n_heads, d_head, -1)
                elif target == "mlp_in":
                    block.mlp.W_in += delta
                else:
                    block.mlp.W_out += delta
        return merged

    return merge_lora


@pytest.mark.parametrize("wrong, fragment", [
    (merge_with(in_place=True), "base model was modified"),
    (merge_with(keep_hooks=True), "applied twice"),
    (merge_with(transpose=True), "transposed"),
    (merge_with(no_scale=True), "Missing alpha / r"),
    (merge_with(heads_last=True), "Heads and d_head are swapped"),
    (merge_with(skip=("o",)), "only layer 0's 'o' adapter"),
], ids=["in-place", "kept-hooks", "transposed", "no-scale", "heads-last", "forgot-W_O"])
def test_merge_lora_rejects(wrong, fragment):
    assert_fails_with("merge_lora", wrong, fragment)


def merge_lora_written_differently(model, adapters):
    """Through the state dict: every update built with einsum, loaded into a fresh copy."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    names = {"q": "attn.W_Q", "k": "attn.W_K", "v": "attn.W_V", "o": "attn.W_O", "mlp_in": "mlp.W_in",
             "mlp_out": "mlp.W_out"}
    h = model.cfg.n_heads
    for key, adapter in adapters.items():
        layer, target = key[1:].split("_", 1)
        update = adapter.scale * torch.einsum("ri,or->io", adapter.A.detach(), adapter.B.detach())
        name = f"blocks.{layer}.{names[target]}"
        if target in ("q", "k", "v"):
            update = update.reshape(update.shape[0], h, -1).transpose(0, 1)
        elif target == "o":
            update = update.reshape(h, -1, update.shape[1])
        state[name] = state[name] + update
    merged = copy.deepcopy(model)
    merged.reset_hooks(including_permanent=True)
    merged.load_state_dict(state)
    return merged


def test_merge_lora_accepts_a_version_written_differently():
    result = run_check("merge_lora", merge_lora_written_differently)
    assert result.passed, result.message


def test_merged_and_hooked_lora_give_the_same_logits_to_1e5():
    """The acceptance's claim, on a trained-looking adapter set (every target, random B) of the course's
    small model: the merged copy without hooks and the base with hooks agree to 1e-5."""
    model = small_model(seed=3)
    adapters = lora.make_adapters(model, 4, 8.0, seed=1)
    with torch.no_grad():
        for adapter in adapters.values():
            adapter.B.normal_(std=0.1)
    tokens = torch.randint(0, model.cfg.d_vocab, (4, 12), generator=torch.Generator().manual_seed(0)).to(model.cfg.device)
    hooked = model.run_with_hooks(tokens, fwd_hooks=lora.lora_hooks(model, adapters))
    merged = lora.merge_lora(model, adapters)
    assert not any(hp.fwd_hooks for hp in merged.hook_dict.values())
    assert torch.allclose(merged(tokens), hooked, atol=1e-5, rtol=0)
    assert (hooked - model(tokens)).abs().max() > 0.1  # the adapters do change the model


# ----------------------------------------------------------------------------------------------------
# update_rank_profile
# ----------------------------------------------------------------------------------------------------
def profile_with(*, squares=True, strict=False, float32=False, guard_zero=True):
    def update_rank_profile(delta, fraction=0.9):
        s = torch.linalg.svdvals(delta.float() if float32 else delta.double())
        weights = s**2 if squares else s
        share = weights.cumsum(0) / weights.sum()
        if guard_zero and (weights.sum() == 0 or fraction == 0):
            return s.float(), 0
        k = int((share <= fraction).sum()) + 1 if strict else int((share < fraction - 1e-7).sum()) + 1
        return s.float(), min(k, len(s))

    return update_rank_profile


def profile_counts_large_values(delta, fraction=0.9):
    s = torch.linalg.svdvals(delta.double())
    return s.float(), int((s > (1 - fraction) * s[0]).sum()) if len(s) else 0


@pytest.mark.parametrize("wrong, fragment", [
    (profile_with(squares=False), "not their squares"),
    (profile_with(strict=True), ">=, not >"),
    (profile_with(float32=True), "float64"),
    (profile_with(guard_zero=False), "a zero change"),  # 0 / 0: NaN shares, and k = 1
    (profile_counts_large_values, "Wrong values"),
], ids=["sum-of-s", "strict", "float32-svd", "zero-change", "threshold-count"])
def test_update_rank_profile_rejects(wrong, fragment):
    assert_fails_with("update_rank_profile", wrong, fragment)


def update_rank_profile_written_differently(delta, fraction=0.9):
    """numpy's SVD in float64 and a Python loop over the squares."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(fraction)
    s = np.linalg.svd(delta.detach().cpu().numpy().astype(np.float64), compute_uv=False)
    total = float((s**2).sum())
    values = torch.tensor(s, dtype=torch.float32, device=delta.device)
    if total == 0.0 or fraction == 0.0:
        return values, 0
    running = 0.0
    for i, value in enumerate(s):
        running += value * value
        if running >= fraction * total * (1 - 1e-6):
            return values, i + 1
    return values, len(s)


def test_update_rank_profile_accepts_a_version_written_differently():
    result = run_check("update_rank_profile", update_rank_profile_written_differently)
    assert result.passed, result.message
