"""Checkers for chapter 08: LoRA on hooks.

Regimes probed (where plausible implementations differ):
- LoRA: the initial state (B exactly zero so the tuned model starts at the base; A random, not zero,
  of scale 1 / sqrt(d_in) on a 64 x 256 draw, drawn from the generator given: the same seed twice gives
  the same A, two seeds differ); the scale alpha / rank at ranks 1, 4, 16 with alpha below, equal to and
  above the rank (a missing / r, r / alpha and a scale of 1 each differ on one of them); shapes with
  d_in != d_out != rank (a transposed A or B shows); forward on [n, d_in], [b, s, d_in] and a single
  vector [d_in] with a random B; gradients: at the start (B = 0) B's gradient is nonzero and A's is zero,
  with B random both match the reference's (a detached or no_grad forward, an A or B outside the graph);
  the parameters are nn.Parameters on the device asked for; rank 0 raises ValueError.
- lora_hooks: each target alone on one layer (q, k, v, o, mlp_in, mlp_out: a wrong hook point shows
  on its target only), every target on every layer, a model with LayerNorm weights and biases (LN: the
  input must be ``ln1.hook_normalized``, not ``hook_resid_pre`` / ``hook_scale``) and a folded one
  (LNPre), a batch of 1, no adapters at all (an empty list, logits unchanged); every hook name exists;
  base weights unchanged; the gradient reaches every A and B and equals the reference's (an input or
  delta detached is named).
- merge_lora: each target alone and all together, logits of the merged copy (no hooks) against the
  hooked model's to 1e-5; a model whose LoRA is already attached (the copy must not keep the hooks, or
  the update counts twice); d_model == head * d_head (a transposed delta keeps its shape and shows only
  in values); the model, its hooks and the adapters unchanged; a HookedTransformer returned.
- update_rank_profile: an exact low-rank matrix (k well below min(m, n)), a full-rank one, tall and wide,
  a zero matrix (k = 0, no division by zero), fraction 0, 1 and a boundary hit exactly by equal singular
  values (ties: >= not >), a 1 x 1 matrix, large magnitudes (1e6: float32 squares overflow nothing here
  but a float32 SVD loses the small values), the order (descending) and the dtype (float32) of the
  values, the int k.
"""

from __future__ import annotations

import copy

import einops
import torch
from torch import nn
from transformer_lens import HookedTransformer

from rlhf_tutorial import lora
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    check_device,
    checker,
    compare_to_reference,
    expect_tensor,
    failure,
    fmt,
    get_attr,
    seeded,
)
from rlhf_tutorial.checks.fixtures import small_model
from rlhf_tutorial.notebooks import solution_code

CHAPTER = "08_lora"


# ----------------------------------------------------------------------------------------------------
# LoRA
# ----------------------------------------------------------------------------------------------------


def _parameter(module, name: str, shape: tuple[int, ...]) -> nn.Parameter:
    value = get_attr(module, name)
    if not isinstance(value, nn.Parameter):
        raise CheckFailure(f"self.{name} is a {type(value).__name__}, not an nn.Parameter: the optimizer would not "
                           "see it (module.parameters() lists only Parameters).",
                           hint=f"self.{name} is a plain tensor: wrap it in nn.Parameter when you assign it, so that "
                           "the module registers it.")
    expect_tensor(value.detach(), shape=shape, dtype=torch.float32, what=f"self.{name}")
    if value.device.type != check_device().type:
        raise CheckFailure(f"self.{name} is on {value.device}, but the module was asked for {check_device()}.",
                           hint="A or B is not on the device asked for: create B there, and move A there after "
                           "drawing it from the (CPU) generator.")
    return value


def _set(module, a: torch.Tensor, b: torch.Tensor) -> None:
    with torch.no_grad():
        module.A.copy_(a)
        module.B.copy_(b)


def _forward_mistakes(a, b, alpha: float, rank: int) -> list[Mistake]:
    """Wrong forwards for an adapter holding ``a`` and ``b``."""
    return [
        Mistake("forward leaves out the scale: the update through the bottleneck is multiplied by self.scale.", lambda x: (x @ a.T) @ b.T),
        Mistake("forward applies the scale twice (or scales by alpha / rank again on top of a scaled B): "
                "multiply once by self.scale.", lambda x: (alpha / rank) ** 2 * (x @ a.T) @ b.T),
        Mistake("forward uses alpha, not alpha / rank: the scale is alpha / rank.", lambda x: alpha * (x @ a.T) @ b.T),
    ]


@checker(
    "LoRA",
    chapter=CHAPTER,
    hint=(
        "Two nn.Parameters and a plain float. `torch.randn` takes a `generator`; B starts at zeros. forward "
        "multiplies x by the two matrices transposed, the rank-sized product first.",
        "__init__: A = (standard normal draws of shape [rank, d_in] from `generator`) / sqrt(d_in), then moved "
        "to `device`; B = zeros of shape [d_out, rank] on `device`; both wrapped in nn.Parameter; the scale is "
        "alpha / rank, a Python float. forward: x times A transposed ([*b, rank], the bottleneck), that times B "
        "transposed ([*b, d_out]), times the scale. B = 0 makes the adapter add nothing at the start; A must not "
        "be zero, or no gradient ever reaches B (dL/dB is built from x A^T).",
        solution_code(lora.LoRA),
    ),
)
def check_lora(candidate) -> str:
    device = check_device()
    # 1. the initial state
    module = call(candidate, 12, 20, 4, 8.0, generator=seeded(0), device=device)
    if not isinstance(module, nn.Module):
        raise CheckFailure(f"LoRA(...) built a {type(module).__name__}, not an nn.Module.")
    a = _parameter(module, "A", (4, 12))
    b = _parameter(module, "B", (20, 4))
    params = {id(p) for p in module.parameters()}
    if id(a) not in params or id(b) not in params:
        raise CheckFailure("A and B are not both among module.parameters(): the optimizer would not train them.")
    if bool(b.detach().ne(0).any()):
        raise failure(f"B is not zero at the start: {fmt(b.detach())}.",
                      "B random: with B != 0 the adapter changes the model before any training, so the tuned model "
                      "does not start equal to the base (and its KL to the reference is not 0 at step 0). Start "
                      "B at zeros.")
    if not bool(a.detach().ne(0).any()):
        raise failure("A is all zeros.",
                      "A zero too: with A = 0 and B = 0 every gradient is zero (dL/dB needs x @ A^T, dL/dA needs "
                      "B), so nothing would ever train. Draw A at random, small.")
    scale = get_attr(module, "scale")
    if isinstance(scale, torch.Tensor) or not isinstance(scale, (int, float)):
        raise CheckFailure(f"self.scale is {fmt(scale)}: keep a plain Python number (alpha / rank).")
    # the size of A, on a draw large enough to measure it
    big = _parameter(call(candidate, 256, 8, 64, 1.0, generator=seeded(1), device=device), "A", (64, 256))
    std = float(big.detach().std())
    if not 0.7 / 256 ** 0.5 < std < 1.4 / 256 ** 0.5:
        raise failure(f"A's entries have a standard deviation of {std:.4g} for d_in = 256; expected about "
                      f"1 / sqrt(256) = {1 / 16:.4g}.",
                      "A's scale is wrong: draw it from a standard normal and divide by sqrt(d_in), so that x @ A^T "
                      "has entries of the size of x's whatever the width.")
    again = _parameter(call(candidate, 12, 20, 4, 8.0, generator=seeded(0), device=device), "A", (4, 12))
    other = _parameter(call(candidate, 12, 20, 4, 8.0, generator=seeded(2), device=device), "A", (4, 12))
    if not torch.equal(again.detach(), a.detach()) or torch.equal(other.detach(), a.detach()):
        raise failure("A does not follow the generator: the same seeded generator should give the same A, and "
                      "another seed another A.",
                      "A ignores `generator`: draw A from the generator given (a run is reproducible only when "
                      "every draw comes from its seed).")
    try:
        call(candidate, 12, 20, 0, 8.0, generator=seeded(0), device=device)
    except CheckFailure as exc:
        if "ValueError" not in exc.message:
            raise
    else:
        raise CheckFailure("LoRA(..., rank=0) did not raise ValueError (the reference's first lines do it: keep them).")

    # 2. the scale, and forward with a random B (every shape differs: d_in 12, d_out 20, rank r)
    g = seeded(3)
    verdicts = []
    for rank, alpha in ((4, 8.0), (1, 1.0), (16, 4.0), (1, 32.0)):
        learner = call(candidate, 12, 20, rank, alpha, generator=seeded(4), device=device)
        got_scale = get_attr(learner, "scale")
        if not isinstance(got_scale, (int, float)) or abs(got_scale - alpha / rank) > 1e-9 * max(1, alpha / rank):
            named = {alpha: "alpha (the division by the rank is missing)", rank / alpha: "rank / alpha (inverted)",
                     1.0: "1 (alpha and rank are not used)"}
            why = named.get(got_scale, "neither alpha / rank nor a usual slip")
            raise failure(f"With rank={rank}, alpha={alpha}: self.scale is {fmt(got_scale)}, expected {alpha / rank:g}; "
                          f"it equals {why}.",
                          "Missing alpha / r: the scale is alpha / rank, so that the update's size stays about the "
                          "same when the rank changes and one learning rate serves every rank.")
        reference = lora.LoRA(12, 20, rank, alpha, device=device)
        a_r = torch.randn(rank, 12, generator=g).to(device)
        b_r = torch.randn(20, rank, generator=g).to(device)
        _set(learner, a_r, b_r)
        _set(reference, a_r, b_r)
        cases = [Case(f"rank={rank}, alpha={alpha}, x of shape [5, 12]", (torch.randn(5, 12, generator=g),)),
                 Case(f"rank={rank}, alpha={alpha}, x of shape [2, 3, 12]", (torch.randn(2, 3, 12, generator=g),)),
                 Case(f"rank={rank}, alpha={alpha}, a single x of shape [12]", (torch.randn(12, generator=g),))]
        verdicts.append(compare_to_reference(learner, reference, cases, arg_names=["x"],
                                             mistakes=_forward_mistakes(a_r, b_r, alpha, rank)))

    # 3. gradients: at the start only B's gradient is nonzero; with a random B both match the reference's
    learner = call(candidate, 12, 20, 4, 8.0, generator=seeded(0), device=device)
    x = torch.randn(6, 12, generator=g).to(device)
    w = torch.randn(6, 20, generator=g).to(device)
    out = call(learner, x)
    expect_tensor(out, shape=(6, 20), what="your forward's output at the start")
    if not out.requires_grad:
        raise failure("your forward's output does not require grad: A and B would never train.",
                      "The output is detached: compute it with torch operations from self.A and self.B, with no "
                      ".detach(), .data or torch.no_grad().")
    if bool(out.detach().ne(0).any()):
        raise CheckFailure(f"with B = 0 your forward returns a nonzero update ({fmt(out.detach())}): the adapter "
                           "must add nothing at the start.")
    (out * w).sum().backward()
    grad_b = learner.B.grad
    if grad_b is None or not bool(grad_b.ne(0).any()):
        raise failure("at the start no gradient reaches B.",
                      "B must be in the graph: the output is scale * (x @ A^T) @ B^T, so dL/dB = scale * "
                      "(dL/dy)^T (x @ A^T), nonzero while A is not zero.")
    want_b = 8.0 / 4 * w.T @ (x @ learner.A.detach().T)
    if not torch.allclose(grad_b, want_b, atol=1e-4, rtol=1e-4):
        raise CheckFailure("at the start B's gradient differs from scale * (dL/dy)^T (x @ A^T): the forward is not "
                           "scale * (x @ A^T) @ B^T in B.")
    learner = call(candidate, 12, 20, 4, 8.0, generator=seeded(0), device=device)
    reference = lora.LoRA(12, 20, 4, 8.0, device=device)
    a_r, b_r = torch.randn(4, 12, generator=g).to(device), torch.randn(20, 4, generator=g).to(device)
    _set(learner, a_r, b_r)
    _set(reference, a_r, b_r)
    (call(learner, x) * w).sum().backward()
    (reference(x) * w).sum().backward()
    for name in ("A", "B"):
        got, want = getattr(learner, name).grad, getattr(reference, name).grad
        if got is None or not bool(got.ne(0).any()):
            raise failure(f"With a random B, no gradient reaches {name}.",
                          f"{name} is outside the graph (detached, .data, or a copy): use self.{name} itself.")
        if not torch.allclose(got, want, atol=1e-4, rtol=1e-3):
            raise CheckFailure(f"With a random B, the gradient of {name} differs from the reference's "
                               f"(max difference {float((got - want).abs().max()):.3g}).")
    return ("B starts at zero, A random of scale 1 / sqrt(d_in) from the generator, scale = alpha / rank at 4 "
            "settings; forward " + verdicts[0] + "; gradients reach A and B.")


# ----------------------------------------------------------------------------------------------------
# lora_hooks
# ----------------------------------------------------------------------------------------------------


def _random_adapters(model: HookedTransformer, keys: list[str], seed: int, rank: int = 2) -> nn.ModuleDict:
    """Reference adapters for ``keys`` with a random B (so that every update shows), on the model's device."""
    full = lora.make_adapters(model, rank, 3.0, seed=seed)
    adapters = nn.ModuleDict({k: full[k] for k in keys})
    g = seeded(seed + 100)
    with torch.no_grad():
        for adapter in adapters.values():
            adapter.B.copy_(torch.randn(adapter.B.shape, generator=g) * 0.5)
    return adapters


def _every_key(model: HookedTransformer) -> list[str]:
    """The adapter keys of every target on every layer of ``model``."""
    return [lora.adapter_key(layer, t) for layer in range(model.cfg.n_layers) for t in lora.TARGETS]


def _tokens(model: HookedTransformer, seed: int, shape: tuple[int, int] = (3, 7)) -> torch.Tensor:
    """Seeded random token ids of ``shape`` for ``model``, on the check's device."""
    return torch.randint(0, model.cfg.d_vocab, shape, generator=seeded(seed)).to(check_device())


def _adapter_cases(norm: str, model: HookedTransformer, tokens: torch.Tensor, layer: int,
                   seeds: tuple[int, int]) -> list[Case]:
    """The cases the LoRA checks share on one model: each target's adapter alone on ``layer`` (an update
    that shows only through its own hook points or weight), then every target on every layer (``seeds``:
    the adapters' of each)."""
    cases = [Case(f"{norm} model, only layer {layer}'s '{t}' adapter",
                  (model, _random_adapters(model, [lora.adapter_key(layer, t)], seeds[0]), tokens)) for t in lora.TARGETS]
    cases.append(Case(f"{norm} model, every target on every layer",
                      (model, _random_adapters(model, _every_key(model), seeds[1]), tokens)))
    return cases


def _hooked_logits(hooks_fn):
    """A function (model, adapters, tokens) -> the logits of ``model`` run with ``hooks_fn``'s hooks."""

    def run(model, adapters, tokens):
        hooks = hooks_fn(model, adapters)
        if not isinstance(hooks, (list, tuple)):
            raise CheckFailure(f"lora_hooks returned a {type(hooks).__name__}: return a list of (hook_name, "
                               "hook_fn) pairs.")
        for item in hooks:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1])):
                raise CheckFailure(f"lora_hooks returned {fmt(item)} in its list: each item must be a pair "
                                   "(hook_name: str, hook_fn).")
            if item[0] not in model.hook_dict:
                raise CheckFailure(f"{item[0]!r} is no hook point of the model (hook points are named like "
                                   "'blocks.0.attn.hook_q').")
        return model.run_with_hooks(tokens, fwd_hooks=list(hooks))

    return run


def _variant_hooks(points=None, scale: float = 1.0, swap_qk: bool = False, per_head_o: bool = False):
    """Wrong versions of lora_hooks: other hook points (``points`` overrides HOOK_POINTS entries), the
    update scaled (2.0: applied twice), q's update added to k and k's to q."""
    table = {**lora.HOOK_POINTS, **(points or {})}

    def hooks_fn(model, adapters):
        hooks = []
        for key, adapter in adapters.items():
            layer, target = key[1:].split("_", 1)
            read_at, add_at = table[target]
            if swap_qk and target in ("q", "k"):
                add_at = "attn.hook_k" if target == "q" else "attn.hook_q"
            stored = {}

            def read(x, hook, stored=stored):
                stored["x"] = x.flatten(-2) if x.dim() == 4 else x

            def add(out, hook, stored=stored, adapter=adapter):
                return out + scale * adapter(stored["x"]).reshape(out.shape)

            hooks += [(f"blocks.{layer}.{read_at}", read), (f"blocks.{layer}.{add_at}", add)]
        return hooks

    return hooks_fn


def _late_binding_hooks(model, adapters):
    """The closure bug: hooks defined in the loop read `adapter` and `stored` when they run (the last ones)."""
    hooks = []
    for key, adapter in adapters.items():
        layer, target = key[1:].split("_", 1)
        read_at, add_at = lora.HOOK_POINTS[target]
        stored = {}

        def read(x, hook):
            stored["x"] = x.flatten(-2) if x.dim() == 4 else x  # noqa: B023 - the bug this variant is

        def add(out, hook):
            return out + adapter(stored["x"]).reshape(out.shape)  # noqa: B023

        hooks += [(f"blocks.{layer}.{read_at}", read), (f"blocks.{layer}.{add_at}", add)]
    return hooks


HOOK_MISTAKES = [
    Mistake("The update is applied twice (two hooks add it, or it is added and then scaled again): add "
            "adapter(x) once, at the output hook point.", _hooked_logits(_variant_hooks(scale=2.0))),
    Mistake("Hooks on the wrong point: q, k and v read hook_resid_pre, but W_Q, W_K and W_V multiply the "
            "LayerNorm's output, ln1.hook_normalized.",
            _hooked_logits(_variant_hooks({t: ("hook_resid_pre", f"attn.hook_{t}") for t in "qkv"}))),
    Mistake("Hooks on the wrong point: W_in reads ln2.hook_normalized, not hook_resid_mid.",
            _hooked_logits(_variant_hooks({"mlp_in": ("hook_resid_mid", "mlp.hook_pre")}))),
    Mistake("Hooks on the wrong point: W_in's update goes to mlp.hook_pre (before the activation function), "
            "not mlp.hook_post.", _hooked_logits(_variant_hooks({"mlp_in": ("ln2.hook_normalized", "mlp.hook_post")}))),
    Mistake("Hooks on the wrong point: W_out multiplies the activation after the nonlinearity, mlp.hook_post, "
            "not mlp.hook_pre.", _hooked_logits(_variant_hooks({"mlp_out": ("mlp.hook_pre", "hook_mlp_out")}))),
    Mistake("Hooks on the wrong point: W_O reads the heads' outputs z (attn.hook_z, heads flattened), not the "
            "residual stream.", _hooked_logits(_variant_hooks({"o": ("ln1.hook_normalized", "hook_attn_out")}))),
    Mistake("The q and k updates are swapped: each target's update goes to its own hook (attn.hook_q for "
            "'q').", _hooked_logits(_variant_hooks(swap_qk=True))),
    Mistake("Every hook uses the last adapter of the loop: a function defined in a loop sees the loop variable's "
            "final value. Bind each hook's adapter and store when it is made (default arguments, or "
            "functools.partial).", _hooked_logits(_late_binding_hooks)),
]


def _compare_per_case(candidate, reference, cases, **kwargs) -> str:
    """``compare_to_reference`` one case at a time, so that an exception raised while the model runs the
    learner's hooks (a shape that does not fit) names the case, hence the target, it happened on."""
    for case in cases:
        try:
            compare_to_reference(candidate, reference, [case], **kwargs)
        except CheckFailure as exc:
            if case.label in exc.message:
                raise
            raise CheckFailure(f"On {case.label}: {exc.message}", hint=exc.hint) from None
    return f"matches the reference on {len(cases)} cases"


def _state_digest(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@checker(
    "lora_hooks",
    chapter=CHAPTER,
    hint=(
        "Each adapter needs two hooks in its layer, both named in `HOOK_POINTS`: one that only remembers the "
        "matrix's input, one that returns the matrix's output plus the adapter's update. Beware of Python "
        "closures made in a loop.",
        "For every key 'L{layer}_{target}' (cut off the 'L', split at the first underscore: 'mlp_in' holds "
        "one too), look up the two points and make a small dict shared by two functions. The first, at the "
        "input point, stores x (for 'o' the heads' outputs z with the last two axes, head and d_head, "
        "flattened into one) and returns nothing. The second, at the output point, returns the activation "
        "plus the adapter applied to the stored x, reshaped to the activation's shape. Name them "
        "'blocks.{layer}.' + the point. Bind each function's adapter and dict when it is made (default "
        "arguments), or every hook uses the loop's last ones.",
        solution_code(lora.lora_hooks),
    ),
)
def check_lora_hooks(candidate) -> str:
    run = _hooked_logits(lambda model, adapters: call(candidate, model, adapters))
    reference = _hooked_logits(lora.lora_hooks)
    verdicts = []
    for norm in ("LN", "LNPre"):
        model = small_model(seed=8, normalization_type=norm)
        before = _state_digest(model)
        tokens = _tokens(model, 9)
        one = tokens[:1, :5]
        cases = _adapter_cases(norm, model, tokens, layer=1, seeds=(3, 4)) + [
            Case(f"{norm} model, every target on layer 0, a batch of 1",
                 (model, _random_adapters(model, [lora.adapter_key(0, t) for t in lora.TARGETS], 5), one)),
            Case(f"{norm} model, no adapters (nothing may change)", (model, nn.ModuleDict(), tokens)),
        ]
        verdicts.append(_compare_per_case(run, reference, cases, arg_names=["model", "adapters", "tokens"],
                                          mistakes=HOOK_MISTAKES, atol=1e-5, rtol=1e-4))
        if any(not torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before)):
            raise CheckFailure("a base weight of the model changed: LoRA adds its update to activations through "
                               "hooks and never touches the model's parameters.")
        if any(hp.fwd_hooks for hp in model.hook_dict.values()):
            raise CheckFailure("hooks were left attached to the model: lora_hooks returns the list, the caller "
                               "decides how to run it (run_with_hooks, or add_hook).")
    if call(candidate, model, nn.ModuleDict()) not in ([], ()):
        raise CheckFailure("with no adapters lora_hooks should return an empty list.")

    # gradients: every A and B of every adapter, against the reference's
    model = small_model(seed=8, normalization_type="LN")
    keys = _every_key(model)
    tokens = _tokens(model, 10, (2, 6))
    w = torch.randn(2, 6, model.cfg.d_vocab, generator=seeded(11)).to(check_device())
    grads = []
    for hooks_fn in (lora.lora_hooks, lambda m, a: call(candidate, m, a)):
        adapters = _random_adapters(model, keys, 6)
        logits = _hooked_logits(hooks_fn)(model, adapters, tokens)
        (logits * w).sum().backward()
        grads.append({f"{k}.{n}": p.grad for k, a in adapters.items() for n, p in a.named_parameters()})
    model.zero_grad(set_to_none=True)
    for name, want in grads[0].items():
        got = grads[1][name]
        if got is None or not bool(got.ne(0).any()):
            raise failure(f"No gradient reaches {name}: the values are right, but training would never move it.",
                          "The update is detached: keep x and adapter(x) in the graph (no .detach(), .data, "
                          "torch.no_grad() or .clone().detach() on the stored activation).")
        if not torch.allclose(got, want, atol=1e-4, rtol=1e-3):
            raise CheckFailure(f"The gradient of {name} differs from the reference's (max difference "
                               f"{float((got - want).abs().max()):.3g}): part of the update is cut off the graph.")
    return f"{verdicts[0]} (LN), {verdicts[1]} (LNPre); gradients reach every A and B."


# ----------------------------------------------------------------------------------------------------
# merge_lora
# ----------------------------------------------------------------------------------------------------


def _merge_variant(*, transpose: bool = False, scale: float = 1.0, keep_hooks: bool = False,
                   head_order: bool = False):
    """Wrong versions of merge_lora: the delta transposed, scaled (0: the scale forgotten is handled by
    ``scale=None``), the hooks kept on the copy, heads and d_head swapped in the rearrange."""

    def merge(model, adapters):
        merged = copy.deepcopy(model)
        if not keep_hooks:
            merged.reset_hooks(including_permanent=True)
        with torch.no_grad():
            for key, adapter in adapters.items():
                layer, target = key[1:].split("_", 1)
                block = merged.blocks[int(layer)]
                s = adapter.scale * scale if scale is not None else 1.0
                delta = s * adapter.A.T @ adapter.B.T
                if transpose:
                    delta = delta.T
                h = block.attn.W_Q.shape[0]
                if target in "qkv":
                    pattern = "d (e h) -> h d e" if head_order else "d (h e) -> h d e"
                    getattr(block.attn, f"W_{target.upper()}").add_(einops.rearrange(delta, pattern, h=h))
                elif target == "o":
                    pattern = "(e h) d -> h e d" if head_order else "(h e) d -> h e d"
                    block.attn.W_O.add_(einops.rearrange(delta, pattern, h=h))
                else:
                    (block.mlp.W_in if target == "mlp_in" else block.mlp.W_out).add_(delta)
        return merged

    return merge


def _merged_logits(merge_fn):
    def run(model, adapters, tokens):
        merged = merge_fn(model, adapters)
        if not isinstance(merged, HookedTransformer):
            raise CheckFailure(f"merge_lora returned a {type(merged).__name__}: return the merged HookedTransformer.")
        if merged is model:
            raise failure("merge_lora returned the model it was given.",
                          "The base model was modified: merge into the deep copy the given first lines make, never "
                          "into the model; the base stays the reference and the adapters keep training on it.")
        return merged(tokens)

    return run


MERGE_MISTAKES = [
    Mistake("The update is applied twice: the copy kept the LoRA hooks (copy.deepcopy copies them), so the merged "
            "weights and the hooks both add it. Remove every hook from the copy, the permanent ones "
            "too (the given first lines do it: keep them).", _merged_logits(_merge_variant(keep_hooks=True))),
    Mistake("The merged delta is transposed: W (d_in x d_out, TransformerLens multiplies x @ W) gains "
            "scale * A^T @ B^T.", _merged_logits(_merge_variant(transpose=True))),
    Mistake("Missing alpha / r: the merged delta is scale * A^T @ B^T, with the adapter's scale.",
            _merged_logits(_merge_variant(scale=None))),
    Mistake("The update is applied twice (scaled by 2): add scale * A^T @ B^T once.",
            _merged_logits(_merge_variant(scale=2.0))),
    Mistake("Heads and d_head are swapped in the rearrange: the hooks flatten [head, d_head] "
            "head-major (head 0's d_head numbers first): split that axis into (head, d_head) in this order.",
            _merged_logits(_merge_variant(head_order=True))),
]


@checker(
    "merge_lora",
    chapter=CHAPTER,
    hint=(
        "The given lines make the copy and clear its hooks. For each adapter, form its full [d_in, d_out] "
        "update once and add it to the copy's matching weight, with gradients off.",
        "Per key 'L{layer}_{target}': delta = scale * A^T B^T, [d_in, d_out]. W_Q, W_K, W_V are [head, "
        "d_model, d_head]: split delta's d_out axis into (head, d_head), head first as the hooks flattened "
        "it, and move head to the front; W_O is [head, d_head, d_model]: split d_in the same way; W_in and "
        "W_out take delta as it is. Add in place to the copy's parameter (inside torch.no_grad()), in its "
        "dtype; einops.rearrange with h= the number of heads does the split.",
        solution_code(lora.merge_lora),
    ),
)
def check_merge_lora(candidate) -> str:
    run = _merged_logits(lambda model, adapters: call(candidate, model, adapters))
    reference = _hooked_logits(lora.lora_hooks)
    verdicts = []
    for norm in ("LN", "LNPre"):
        model = small_model(seed=12, normalization_type=norm)
        cases = _adapter_cases(norm, model, _tokens(model, 13), layer=0, seeds=(14, 15))
        verdicts.append(_compare_per_case(run, reference, cases, arg_names=["model", "adapters", "tokens"],
                                          mistakes=MERGE_MISTAKES, atol=1e-5, rtol=1e-5))

    # a model whose LoRA is attached (as a trainer holds it), the model and adapters unchanged
    model = small_model(seed=12, normalization_type="LN")
    adapters = _random_adapters(model, _every_key(model), 16)
    tokens = _tokens(model, 17, (2, 6))
    want = model.run_with_hooks(tokens, fwd_hooks=lora.lora_hooks(model, adapters)).detach()
    lora.attach_lora(model, adapters)
    weights, ab = _state_digest(model), _state_digest(adapters)
    try:
        merged = call(candidate, model, adapters)
        got = _merged_logits(lambda m, a: merged)(model, adapters, tokens).detach()
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-5):
            twice = _merge_variant(keep_hooks=True)(model, adapters)(tokens).detach()
            if torch.allclose(got, twice, atol=1e-5, rtol=1e-5):
                raise failure("On a model whose LoRA is attached, the merged copy counts the update twice.",
                              MERGE_MISTAKES[0].hint)
            raise CheckFailure(f"On a model whose LoRA is attached, the merged copy's logits differ from the hooked "
                               f"model's by up to {float((got - want).abs().max()):.3g}.")
        if any(not torch.equal(p.detach(), q) for p, q in zip(model.parameters(), weights)):
            raise failure("merge_lora changed the base model's weights.", "The base model was modified: merge into "
                          "the copy, never into the model itself.")
        if any(not torch.equal(p.detach(), q) for p, q in zip(adapters.parameters(), ab)):
            raise CheckFailure("merge_lora changed the adapters' A or B.")
        if not any(hp.fwd_hooks for hp in model.hook_dict.values()):
            raise CheckFailure("merge_lora removed the hooks of the model it was given: remove them from the copy only.")
    finally:
        lora.detach_lora(model)
    return f"{verdicts[0]} (LN), {verdicts[1]} (LNPre); merged logits equal the hooked ones to 1e-5, " \
           "also from a model with its LoRA attached; the model and adapters are unchanged."


# ----------------------------------------------------------------------------------------------------
# update_rank_profile
# ----------------------------------------------------------------------------------------------------


def _profile_variant(*, energy: bool = True, strict: bool = False, ascending: bool = False, float32: bool = False,
                     frobenius_ratio: bool = False):
    def profile(delta, fraction=0.9):
        s = torch.linalg.svdvals(delta if float32 else delta.double())
        if ascending:
            s = s.flip(0)
        e = s.square() if energy else s
        total = e.sum()
        if total == 0 or fraction == 0:
            return s.float(), 0
        carried = e.cumsum(0)
        if frobenius_ratio:  # sqrt of the energy share against the fraction: ||top k|| / ||delta||
            carried, total = carried.sqrt(), total.sqrt()
        k = int((carried <= fraction * total).sum()) + 1 if strict else int((carried < fraction * total * (1 - 1e-6)).sum()) + 1
        return s.float(), min(k, len(s))

    return profile


def _low_rank(g, m, n, r, scale=1.0):
    return scale * torch.randn(m, r, generator=g) @ torch.randn(r, n, generator=g)


@checker(
    "update_rank_profile",
    chapter=CHAPTER,
    hint=(
        "`torch.linalg.svdvals` gives the singular values, largest first; the squared Frobenius norm is the "
        "sum of their squares, and `cumsum` gives every running sum at once.",
        "In float64: s = the singular values, e = s squared, total = the sum of e. A zero total or a "
        "fraction of 0 gives k = 0. Otherwise k = 1 + how many running sums of e are still below fraction "
        "times total (shrunk by a relative 1e-6 for rounding: reaching it counts, >= not >), capped at the "
        "number of values. Return s as float32 and k as a Python int.",
        solution_code(lora.update_rank_profile),
    ),
)
def check_update_rank_profile(candidate) -> str:
    g = seeded(20)
    ties = torch.diag(torch.tensor([3.0, 3.0, 3.0, 3.0]))
    ties = torch.cat([ties, torch.zeros(2, 4)])  # 6 x 4, four equal singular values
    graded = torch.diag(torch.tensor([4.0, 2.0, 1.0, 0.5, 0.25]))
    cases = [
        Case("an exact rank-3 change of a 24 x 40 matrix, fraction 0.9", (_low_rank(g, 24, 40, 3),)),
        Case("the same kind of change, fraction 1.0 (the rank, not min(m, n))", (_low_rank(g, 24, 40, 3),),
             {"fraction": 1.0}),
        Case("a full-rank 30 x 12 change (tall), fraction 0.5", (torch.randn(30, 12, generator=g),), {"fraction": 0.5}),
        Case("a full-rank 8 x 50 change (wide), fraction 0.99", (torch.randn(8, 50, generator=g),), {"fraction": 0.99}),
        Case("singular values 4, 2, 1, 0.5, 0.25 (squares 16, 4, 1, .25, .0625), fraction 0.75",
             (graded,), {"fraction": 0.75}),
        Case("the same, fraction 0.95 (the square root of the energy share would say 3)", (graded,), {"fraction": 0.95}),
        Case("four equal singular values, fraction 0.5: two reach it exactly (>=, not >)", (ties,), {"fraction": 0.5}),
        Case("four equal singular values, fraction 0.75: three reach it exactly", (ties,), {"fraction": 0.75}),
        Case("a zero change (k = 0, nothing to divide by)", (torch.zeros(5, 7),)),
        Case("fraction 0.0 (k = 0)", (_low_rank(g, 10, 10, 2),), {"fraction": 0.0}),
        Case("a 1 x 1 change", (torch.tensor([[-2.5]]),)),
        Case("a rank-2 change with entries about 1e6 plus a rank-20 one of about 1e-2, fraction 1.0",
             (_low_rank(g, 20, 30, 2, 1e6) + _low_rank(g, 20, 30, 20, 1e-2),), {"fraction": 1.0}),
    ]
    return compare_to_reference(candidate, lora.update_rank_profile, cases, arg_names=["delta", "fraction"],
                                atol=1e-4, rtol=1e-4, mistakes=[
        Mistake("You summed the singular values, not their squares: the squared Frobenius norm of the change is "
                "the sum of the squared singular values.", _profile_variant(energy=False)),
        Mistake("A running sum that reaches the fraction exactly should stop there (>=, not >).",
                _profile_variant(strict=True)),
        Mistake("The singular values come in increasing order: return them largest first and count from the largest.",
                _profile_variant(ascending=True)),
        Mistake("You compared the norm share (square root of the energy share) with the fraction: compare the "
                "squared norms.", _profile_variant(frobenius_ratio=True)),
        Mistake("A float32 SVD loses the small singular values next to large ones: compute in float64, return "
                "float32.", _profile_variant(float32=True)),
    ])
