"""Checkers of chapter 08: realistic wrong implementations, written out here, fail with a message that
names the mistake, and correct code written differently passes (the reference passing and the stub
failing are the manifest's)."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import math

import einops
import numpy as np
import pytest
import torch
from torch import nn
from transformer_lens import HookedTransformer

from rlhf_tutorial import lora
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.checks.fixtures import small_model
from tests.checks.helpers import assert_fails_with


# ----------------------------------------------------------------------------------------------------
# LoRA
# ----------------------------------------------------------------------------------------------------
def lora_class(*, b_init="zeros", a_init="scaled", scale_of=lambda alpha, rank: alpha / rank, forward_scale=1,
               detach=False, use_generator=True, none_seed=None, dtype=torch.float32, on_device=True, plain_a=False,
               check_rank=True, full_matrix=False, detach_x=False, detach_a=False, flat_only=False):
    """A LoRA a learner could write, with one decision changed."""

    class LearnerLoRA(nn.Module):
        def __init__(self, d_in, d_out, rank, alpha, generator=None, device=None):
            super().__init__()
            if check_rank and rank < 1:
                raise ValueError("rank")
            g = generator if use_generator else None
            if g is None and none_seed is not None:  # "reproducible" without a generator: the same A every time
                g = torch.Generator().manual_seed(none_seed)
            if a_init == "scaled":
                a = torch.randn(rank, d_in, generator=g) / math.sqrt(d_in)
            elif a_init == "unit":
                a = torch.randn(rank, d_in, generator=g)
            else:
                a = torch.zeros(rank, d_in)
            b = torch.zeros(d_out, rank) if b_init == "zeros" else torch.randn(d_out, rank, generator=g) * 0.01
            where = device if on_device else None
            if plain_a:
                self.A = a.to(device=where, dtype=dtype).requires_grad_()
            else:
                self.A = nn.Parameter(a.to(device=where, dtype=dtype))
            self.B = nn.Parameter(b.to(device=where, dtype=dtype))
            self.scale = scale_of(alpha, rank)

        def forward(self, x):
            a = self.A.detach() if detach_a else self.A
            if detach_x:
                x = x.detach()
            if full_matrix:  # the d_in x d_out matrix formed, then applied
                out = x @ (a.T @ self.B.T) * self.scale * forward_scale
            elif flat_only:  # torch.mm: two-dimensional inputs only
                out = torch.mm(torch.mm(x, a.T), self.B.T) * self.scale * forward_scale
            else:
                out = (x @ a.T) @ self.B.T * self.scale * forward_scale
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
    (lora_class(detach_x=True), "no gradient reaches `x`"),
    (lora_class(full_matrix=True), "The full matrix is formed"),
    (lora_class(none_seed=0), "ignores the global RNG"),
    (lora_class(on_device=False), "not on the device asked for"),
    (lora_class(check_rank=False), "should raise ValueError"),
], ids=["B-random", "A-zero", "scale-alpha", "scale-inverted", "integer-division", "scale-twice", "A-unit-std",
        "no-generator", "detached-forward", "detached-x", "full-matrix", "fixed-seed-without-generator",
        "device-ignored", "no-rank-check"])
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


class LoRAThroughLinear(nn.Module):
    """A drawn in float64 and cast, B built on the device directly, forward as two F.linear calls (x A^T, then
    that B^T), the scale applied last."""

    def __init__(self, d_in, d_out, rank, alpha, generator=None, device=None):
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank {rank}")
        a = torch.randn(rank, d_in, generator=generator, dtype=torch.float64) * d_in ** -0.5
        self.A = nn.Parameter(a.float().to(device))
        self.B = nn.Parameter(torch.zeros(d_out, rank, device=device))
        self.scale = alpha / rank

    def forward(self, x):
        return nn.functional.linear(nn.functional.linear(x, self.A), self.B) * self.scale


@pytest.mark.parametrize("version", [LoRAWrittenDifferently, LoRAThroughLinear], ids=["einsum", "linear"])
def test_lora_accepts_a_version_written_differently(version):
    result = run_check("LoRA", version)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# lora_hooks
# ----------------------------------------------------------------------------------------------------
def hooks_with(points=None, *, late_binding=False, twice=False, detach=False, flatten_z=True, store_once=False,
               in_place=False, split_d_head_first=False, z_d_head_first=False, permanent=False, every_layer=False,
               into_weights=False, as_dict=False):
    table = {**lora.HOOK_POINTS, **(points or {})}

    def lora_hooks(model, adapters):
        hooks = []
        n_heads = model.cfg.n_heads
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
                    if store_once and "x" in store:  # the first pass's x, kept for every later pass
                        return
                    if x.dim() == 4 and z_d_head_first:  # z flattened d_head-major: (d_head head)
                        store["x"] = x.transpose(-1, -2).flatten(-2)
                    else:
                        store["x"] = x.flatten(-2) if (x.dim() == 4 and flatten_z) else x

                def add(out, hook, store=store, adapter=adapter):
                    delta = adapter(store["x"])
                    delta = delta.detach() if detach else delta
                    if out.dim() == 4 and split_d_head_first:  # the flat axis split as (d_head head)
                        delta = delta.reshape(*delta.shape[:2], -1, n_heads).transpose(-1, -2)
                    if in_place:
                        out += delta.reshape(out.shape)
                        return out
                    return out + delta.reshape(out.shape)
            layers = range(model.cfg.n_layers) if every_layer else [layer]  # the key's layer ignored
            for at in layers:
                hooks += [(f"blocks.{at}.{read_at}", read), (f"blocks.{at}.{add_at}", add)]
            if twice:
                hooks.append((f"blocks.{layer}.{add_at}", add))
        if permanent:  # "attach" them too: the model keeps them
            for name, fn in hooks:
                model.add_hook(name, fn, is_permanent=True)
        if into_weights:  # W_in's update folded into the base weight in place of its hooks
            with torch.no_grad():
                for key, adapter in adapters.items():
                    if key.endswith("mlp_in"):
                        model.blocks[int(key[1:].split("_")[0])].mlp.W_in += adapter.scale * adapter.A.T @ adapter.B.T
            hooks = [(name, fn) for name, fn in hooks if "hook_normalized" not in name or "ln2" not in name]
            hooks = [(name, fn) for name, fn in hooks if not name.endswith("mlp.hook_pre")]
        return dict(hooks) if as_dict else hooks

    return lora_hooks


@pytest.mark.parametrize("wrong, fragment", [
    (hooks_with({t: ("hook_resid_pre", f"attn.hook_{t}") for t in "qkv"}), "hook_resid_pre"),
    (hooks_with({"mlp_out": ("mlp.hook_pre", "hook_mlp_out")}), "mlp.hook_post"),
    (hooks_with({"mlp_in": ("ln2.hook_normalized", "mlp.hook_post")}), "before the activation function"),
    (hooks_with(twice=True), "applied twice"),
    (hooks_with(late_binding=True), "loop"),
    (hooks_with(detach=True), "No gradient reaches"),
    (hooks_with(flatten_z=False), "only layer 1's 'o' adapter"),  # z kept per head: the matmul fails on the 'o' case
    (hooks_with(store_once=True), "an x from an earlier forward pass"),
    (hooks_with(in_place=True), "modified its activation in place"),
    (hooks_with(permanent=True), "The hooks were left on the model"),
    (hooks_with(into_weights=True), "A base weight changed"),
    (hooks_with(split_d_head_first=True), "split into heads in the wrong order"),
    (hooks_with(z_d_head_first=True), "flattened in the wrong order"),
    (hooks_with(every_layer=True), "applied to every layer"),
], ids=["resid-pre", "mlp-out-pre", "mlp-in-post", "twice", "late-binding", "detached", "z-not-flattened",
        "first-x-kept", "in-place-add", "hooks-left-on-model", "folded-into-weights", "split-d-head-first",
        "z-d-head-first", "every-layer"])
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


class _AdapterHooks:
    """One adapter's pair of hooks as the methods of an object that keeps the latest x as an attribute."""

    def __init__(self, adapter):
        self.adapter, self.x = adapter, None

    def read(self, x, hook):
        self.x = einops.rearrange(x, "b s h e -> b s (h e)") if x.ndim == 4 else x

    def add(self, out, hook):
        return torch.add(out, self.adapter(self.x).view(out.shape))


def lora_hooks_as_objects(model, adapters):
    hooks = []
    for key, adapter in adapters.items():
        layer, target = key.removeprefix("L").split("_", 1)
        pair = _AdapterHooks(adapter)
        read_at, add_at = lora.HOOK_POINTS[target]
        hooks.extend([(f"blocks.{layer}.{read_at}", pair.read), (f"blocks.{layer}.{add_at}", pair.add)])
    return hooks


@pytest.mark.parametrize("version", [lora_hooks_written_differently, lora_hooks_as_objects], ids=["partial", "objects"])
def test_lora_hooks_accepts_a_version_written_differently(version):
    result = run_check("lora_hooks", version)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# merge_lora
# ----------------------------------------------------------------------------------------------------
def merge_with(*, in_place=False, keep_hooks=False, transpose=False, no_scale=False, heads_last=False, skip=(),
               reset_b=False, fresh_model=False, with_graph=False, float64=False, state_dict=False):
    def merge_lora(model, adapters):
        if fresh_model:  # a new model from the config, every weight but the biases loaded into it
            with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens prints where it puts a new model
                merged = HookedTransformer(model.cfg)
            merged.load_state_dict({k: v for k, v in model.state_dict().items()
                                    if not k.rsplit(".", 1)[-1].startswith("b")}, strict=False)
        else:
            merged = model if in_place else copy.deepcopy(model)
        if not keep_hooks and not in_place:
            merged.reset_hooks(including_permanent=True)
        if with_graph:  # "a leaf that requires grad used in an in-place operation": turned off, then added
            for p in merged.parameters():
                p.requires_grad_(False)
        with torch.enable_grad() if with_graph else torch.no_grad():
            for key, adapter in adapters.items():
                layer, target = key[1:].split("_", 1)
                if target in skip:
                    continue
                block = merged.blocks[int(layer)]
                delta = adapter.B @ adapter.A if transpose else adapter.A.T @ adapter.B.T
                if not no_scale:
                    delta = delta * adapter.scale
                if float64:
                    delta = delta.double()
                n_heads, d_head = model.cfg.n_heads, model.cfg.d_head
                if target in ("q", "k", "v"):
                    w = getattr(block.attn, "W_" + target.upper())
                    if heads_last:
                        update = delta.reshape(-1, d_head, n_heads).permute(2, 0, 1)
                    else:
                        update = delta.reshape(-1, n_heads, d_head).permute(1, 0, 2)
                elif target == "o":
                    w = block.attn.W_O
                    update = delta.reshape(d_head, n_heads, -1).transpose(0, 1) if heads_last else delta.reshape(n_heads, d_head, -1)
                else:
                    w = block.mlp.W_in if target == "mlp_in" else block.mlp.W_out
                    update = delta
                if float64:  # the sum kept in float64
                    w.data = w.data.double() + update
                else:
                    w += update
                if reset_b:  # "the adapter is merged now": its B zeroed
                    adapter.B.zero_()
        return merged.state_dict() if state_dict else merged

    return merge_lora


@pytest.mark.parametrize("wrong, fragment", [
    (merge_with(in_place=True), "base model was modified"),
    (merge_with(keep_hooks=True), "applied twice"),
    (merge_with(transpose=True), "transposed"),
    (merge_with(no_scale=True), "Missing alpha / r"),
    (merge_with(heads_last=True), "Heads and d_head are swapped"),
    (merge_with(skip=("o",)), "only layer 0's 'o' adapter"),
    (merge_with(float64=True), "must keep the model's own"),
    (merge_with(with_graph=True), "carry a graph back to the adapters"),
    (merge_with(fresh_model=True), "lost the model's biases"),
    (merge_with(reset_b=True), "changed the adapters' A or B"),
], ids=["in-place", "kept-hooks", "transposed", "no-scale", "heads-last", "forgot-W_O", "float64", "graph",
        "fresh-model", "adapter-reset"])
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
def profile_with(*, squares=True, strict=False, float32=False, guard_zero=True, guard_fraction=True, ascending=False,
                 float64_out=False, slack=1e-7, tensor_k=False, check_fraction=True, top_only=False):
    def update_rank_profile(delta, fraction=0.9):
        if check_fraction and not 0 <= fraction <= 1:
            raise ValueError(fraction)
        s = torch.linalg.svdvals(delta.float() if float32 else delta.double())
        weights = s**2 if squares else s
        share = weights.cumsum(0) / weights.sum()
        values = s.flip(0) if ascending else s
        values = values.double() if float64_out else values.float()
        if guard_zero and weights.sum() == 0:
            return values, 0
        if guard_fraction and fraction == 0:
            return values, 0
        k = (share <= fraction).sum() + 1 if strict else (share < fraction - slack).sum() + 1
        k = torch.clamp(k, max=len(s)) if tensor_k else min(int(k), len(s))
        return (values[:k] if top_only else values), k

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
    (profile_with(tensor_k=True), "not a Python int"),
    (profile_with(check_fraction=False), "did not raise ValueError"),
], ids=["sum-of-s", "strict", "float32-svd", "zero-change", "threshold-count", "tensor-k", "no-fraction-check"])
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


# ----------------------------------------------------------------------------------------------------
# The contract, clause by clause (tests/checks/test_contract_clauses.py runs each against its checker)
# ----------------------------------------------------------------------------------------------------
VIOLATIONS = {
    "LoRA": {
        "a_init": [lora_class(a_init="unit"), lora_class(a_init="zeros")],
        "a_generator": [lora_class(use_generator=False)],
        "a_global_rng": [lora_class(none_seed=0)],
        "b_zero": [lora_class(b_init="random")],
        "float32": [lora_class(dtype=torch.float64)],
        "device": [lora_class(on_device=False)],
        "parameters": [lora_class(plain_a=True)],
        "scale": [lora_class(scale_of=lambda alpha, rank: alpha), lora_class(scale_of=lambda alpha, rank: rank / alpha),
                  lora_class(scale_of=lambda alpha, rank: alpha // rank),
                  lora_class(scale_of=lambda alpha, rank: torch.tensor(alpha / rank))],
        "rank_error": [lora_class(check_rank=False)],
        "forward": [lora_class(forward_scale=2)],
        "leading_shape": [lora_class(flat_only=True)],
        "bottleneck": [lora_class(full_matrix=True)],
        "differentiable": [lora_class(detach=True), lora_class(detach_x=True), lora_class(detach_a=True)],
    },
    "lora_hooks": {
        "hook_points": [hooks_with({t: ("hook_resid_pre", f"attn.hook_{t}") for t in "qkv"}),
                        hooks_with({"mlp_out": ("mlp.hook_pre", "hook_mlp_out")}),
                        hooks_with({"mlp_in": ("ln2.hook_normalized", "mlp.hook_post")})],
        "z_flattened": [hooks_with(flatten_z=False), hooks_with(z_d_head_first=True)],
        "head_split": [hooks_with(split_d_head_first=True)],
        "added_once": [hooks_with(twice=True)],
        "own_adapter": [hooks_with(late_binding=True)],
        "own_x": [hooks_with(store_once=True)],
        "not_in_place": [hooks_with(in_place=True)],
        "absent_alone": [hooks_with(every_layer=True)],
        "model_unchanged": [hooks_with(permanent=True), hooks_with(into_weights=True)],
        "differentiable": [hooks_with(detach=True)],
        "returns_list": [hooks_with(as_dict=True)],
    },
    "merge_lora": {
        "copy": [merge_with(in_place=True)],
        "no_hooks": [merge_with(keep_hooks=True)],
        "delta": [merge_with(transpose=True), merge_with(no_scale=True)],
        "head_major": [merge_with(heads_last=True)],
        "every_target": [merge_with(skip=("o",)), merge_with(skip=("mlp_in", "mlp_out"))],
        "adapters_unchanged": [merge_with(reset_b=True)],
        "biases": [merge_with(fresh_model=True)],
        "no_graph": [merge_with(with_graph=True)],
        "dtype": [merge_with(float64=True)],
        "returns_model": [merge_with(state_dict=True)],
    },
    "update_rank_profile": {
        "values": [profile_with(ascending=True), profile_with(top_only=True)],
        "float32": [profile_with(float64_out=True)],
        "float64": [profile_with(float32=True)],
        "squares": [profile_with(squares=False), profile_counts_large_values],
        "reaches": [profile_with(strict=True)],
        "rounding": [profile_with(slack=0.0)],
        "zero_change": [profile_with(guard_zero=False)],
        "zero_fraction": [profile_with(guard_fraction=False)],
        "int_k": [profile_with(tensor_k=True)],
        "fraction_range": [profile_with(check_fraction=False)],
    },
}
