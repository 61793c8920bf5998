"""Checkers for chapter 08: LoRA on hooks.

Regimes probed (where plausible implementations differ):
- LoRA: the initial state (B exactly zero so the tuned model starts at the base; A random, not zero,
  of scale 1 / sqrt(d_in) on a 64 x 256 draw, drawn from the generator given: the same seed twice gives
  the same A, two seeds differ); the scale alpha / rank at ranks 1, 4, 16 with alpha below, equal to and
  above the rank (a missing / r, r / alpha and a scale of 1 each differ on one of them); shapes with
  d_in != d_out != rank (a transposed A or B shows); forward on [n, d_in], [b, s, d_in] and a single
  vector [d_in] with a random B; gradients: at the start (B = 0) B's gradient is nonzero and A's is zero,
  with B random both match the reference's (a detached or no_grad forward, an A or B outside the graph),
  and so does the gradient in x (x detached); the parameters are nn.Parameters on the device asked for
  (also asked for "meta", which shows a tensor left on the default device on a CPU-only machine); with
  generator None A follows torch's global RNG (a fixed seed of one's own does not); no tensor of the
  d_in x d_out matrix's shape appears during forward (the bottleneck); rank 0 raises ValueError.
- lora_hooks: each target alone on one layer (q, k, v, o, mlp_in, mlp_out: a wrong hook point shows
  on its target only), every target on every layer, an LN model and a folded one (LNPre), both with
  random biases (TransformerLens starts them at zero), a batch of 1, no adapters at all (an empty list,
  logits unchanged); every hook name exists; after lora_hooks returns, no hook is left on the model and
  no base weight changed (each its own message); each hook is watched for an in-place edit of its
  activation (its version counter); one hook list run on three batches, the second of the same shape,
  the third of another (an x kept from the first pass); the q/k/v split and the z flatten orders (both
  named; a wrong logit says where it differs: the first values printed may agree, position 0 attends
  only to itself); the gradient reaches every A and B and equals the reference's.
- merge_lora: each target alone and all together, logits of the merged copy (no hooks) against the
  hooked model's to 1e-5; a model whose LoRA is already attached (the copy must not keep the hooks, or
  the update counts twice); d_model == head * d_head (a transposed delta keeps its shape and shows only
  in values); random biases (a copy that lost them shows); the model, its hooks and the adapters
  unchanged; a HookedTransformer returned whose parameters keep the model's dtype and device and carry no
  graph (checked before it runs: a float64 weight would fail inside TransformerLens).
- update_rank_profile: an exact low-rank matrix (k well below min(m, n)), a full-rank one, tall and wide,
  a zero matrix (k = 0, no division by zero), fraction 0, 1 and a boundary hit exactly by equal singular
  values (ties: >= not >), a 1 x 1 matrix, large magnitudes (1e6: float32 squares overflow nothing here
  but a float32 SVD loses the small values), the order (descending) and the dtype (float32) of the
  values, k a Python int (a 0-d tensor compares equal), a fraction outside [0, 1] raises ValueError.
"""

from __future__ import annotations

import contextlib
import copy
import io

import einops
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from transformer_lens import HookedTransformer

from rlhf_tutorial import lora
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    check_device,
    checker,
    compare_gradients,
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

#: The contract of each exercise, clause by clause (tests/checks/test_contract_clauses.py holds every clause to a
#: violating version in tests/checks/test_ch08_lora.py, and every such version to a rejection here).
CLAUSES = {
    "LoRA": {
        "a_init": "A has shape [rank, d_in], standard normal draws divided by sqrt(d_in): random, small, not zero",
        "a_generator": "A is drawn from the generator given: the same seed gives the same A, another seed another",
        "a_global_rng": "with generator None A comes from torch's global RNG (it follows torch.manual_seed)",
        "b_zero": "B has shape [d_out, rank] and is zero at the start, so the adapter adds nothing",
        "float32": "A and B are float32",
        "device": "A and B are created on the device asked for",
        "parameters": "A and B are nn.Parameters registered on the module, so the optimizer sees them",
        "scale": "self.scale is alpha / rank, a plain Python float",
        "rank_error": "a rank below 1 raises ValueError",
        "forward": "forward returns scale * x A^T B^T",
        "leading_shape": "forward takes any leading shape [*b, d_in] and returns [*b, d_out]",
        "bottleneck": "forward goes through the rank-r bottleneck and never forms the d_in x d_out matrix",
        "differentiable": "forward is differentiable in x, A and B (the reference's gradients for each)",
    },
    "lora_hooks": {
        "hook_points": "each target reads x at its own input point and adds at its own output point (HOOK_POINTS)",
        "z_flattened": "for 'o' the heads' outputs z are flattened head-major (head 0's d_head numbers first)",
        "head_split": "the update of q, k and v is split into [head, d_head] head-major, as the activation is",
        "added_once": "the output hook returns the activation plus adapter(x), added once",
        "own_adapter": "each pair of hooks uses its own adapter and its own stored x (no late binding in a loop)",
        "own_x": "every forward pass uses its own x: one hook list reused on other batches and shapes stays right",
        "not_in_place": "a hook returns a new tensor and never edits its activation in place",
        "absent_alone": "a layer or target without an adapter is left alone; no adapters give an empty list",
        "model_unchanged": "the model is left as it was: no base weight changed, no hook added to it",
        "differentiable": "the update stays in the graph: every A and B gets the reference's gradient",
        "returns_list": "returns a list of (hook_name, hook_fn) pairs",
    },
    "merge_lora": {
        "copy": "works on a deep copy: the model given is unchanged",
        "no_hooks": "the copy has no hooks (a model with its LoRA attached does not count the update twice)",
        "delta": "each weight gains scale * A^T B^T, a [d_in, d_out] update",
        "head_major": "W_Q, W_K, W_V and W_O take the update split into heads head-major, as the hooks have it",
        "every_target": "every adapter of the dict is merged, each into its own weight",
        "adapters_unchanged": "the adapters' A and B are unchanged",
        "biases": "the biases (and every other parameter) are unchanged",
        "no_graph": "the copy's parameters carry no graph back to the adapters",
        "dtype": "the copy keeps the model's dtype (and device)",
        "returns_model": "returns a HookedTransformer that computes, with no hook, what the hooked model computes",
    },
    "update_rank_profile": {
        "values": "returns all min(m, n) singular values of delta, largest first",
        "float32": "the singular values are returned as float32 (on delta's device)",
        "float64": "they are computed in float64: small values next to large ones survive",
        "squares": "k counts the squared singular values' share of the squared Frobenius norm",
        "reaches": "k is the smallest count whose share reaches the fraction (>=, ties count)",
        "rounding": "a relative 1e-6 slack absorbs rounding: fraction 1.0 gives the number of nonzero values",
        "zero_change": "a change that is exactly zero gives k = 0 (no division by zero)",
        "zero_fraction": "a fraction of 0 gives k = 0",
        "int_k": "k is a Python int",
        "fraction_range": "a fraction outside [0, 1] raises ValueError",
    },
}


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


class _ShapeLog(TorchFunctionMode):
    """Records the shape of every tensor a torch function returns while it is active."""

    def __init__(self):
        super().__init__()
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.shapes.add(tuple(out.shape))
        return out


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
                      "A zero too: with A = 0 and B = 0 every gradient is zero (dL/dB needs x A^T, dL/dA needs "
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
                      "A's scale is wrong: draw it from a standard normal and divide by sqrt(d_in), so that x A^T "
                      "has entries of the size of x's whatever the width.")
    again = _parameter(call(candidate, 12, 20, 4, 8.0, generator=seeded(0), device=device), "A", (4, 12))
    other = _parameter(call(candidate, 12, 20, 4, 8.0, generator=seeded(2), device=device), "A", (4, 12))
    if not torch.equal(again.detach(), a.detach()) or torch.equal(other.detach(), a.detach()):
        raise failure("A does not follow the generator: the same seeded generator should give the same A, and "
                      "another seed another A.",
                      "A ignores `generator`: draw A from the generator given (a run is reproducible only when "
                      "every draw comes from its seed).")
    # without a generator: torch's global RNG (forked, so that the learner's session keeps its own state)
    with torch.random.fork_rng(devices=[]):
        draws = []
        for seed in (5, 5, 6):
            torch.manual_seed(seed)
            draws.append(_parameter(call(candidate, 12, 20, 4, 8.0, generator=None, device=device), "A", (4, 12)).detach())
    if not torch.equal(draws[0], draws[1]) or torch.equal(draws[0], draws[2]):
        raise failure("With generator=None, A does not follow torch's global RNG: torch.manual_seed(5) twice should "
                      "give the same A, torch.manual_seed(6) another.",
                      "A ignores the global RNG when no generator is given: with None, A must come from torch's "
                      "global random state (as every torch draw without a generator does), not from a fixed seed "
                      "of your own: torch.manual_seed is how a run without a generator is made reproducible.")
    # the device asked for: "meta" (no data) shows a tensor left on the default device even on a CPU-only machine
    try:
        meta = call(candidate, 12, 20, 4, 8.0, generator=seeded(0), device=torch.device("meta"))
    except CheckFailure:
        meta = None  # some correct code cannot build on "meta"; the device check then relies on check_device()
    if meta is not None:
        for name in ("A", "B"):
            value = get_attr(meta, name)
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                raise failure(f"LoRA(..., device='meta') put self.{name} on {value.device}, not on the device asked "
                              "for.", f"{name} is not on the device asked for: create B there, and move A there after "
                              "drawing it from the (CPU) generator; the same code must run on a GPU.")
    try:
        call(candidate, 12, 20, 0, 8.0, generator=seeded(0), device=device)
    except CheckFailure as exc:
        if "ValueError" not in exc.message:
            raise CheckFailure(f"LoRA(..., rank=0) should raise ValueError; {exc.message.replace('your code', 'it')}",
                               hint="A rank below 1 is an error the caller must hear about as a ValueError (the "
                               "given first lines raise it: keep them).") from None
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
                      "B must be in the graph: the output is scale * x A^T B^T, so dL/dB = scale * "
                      "(dL/dy)^T (x A^T), nonzero while A is not zero.")
    want_b = 8.0 / 4 * w.T @ (x @ learner.A.detach().T)
    if not torch.allclose(grad_b, want_b, atol=1e-4, rtol=1e-4):
        raise CheckFailure("at the start B's gradient differs from scale * (dL/dy)^T (x A^T): the forward is not "
                           "scale * x A^T B^T in B.")
    learner = call(candidate, 12, 20, 4, 8.0, generator=seeded(0), device=device)
    reference = lora.LoRA(12, 20, 4, 8.0, device=device)
    a_r, b_r = torch.randn(4, 12, generator=g).to(device), torch.randn(20, 4, generator=g).to(device)
    _set(learner, a_r, b_r)
    _set(reference, a_r, b_r)
    # the bottleneck: no tensor of the full matrix's shape, [12, 20] or [20, 12], appears during forward
    with _ShapeLog() as log:
        call(learner, x)
    if {(12, 20), (20, 12)} & log.shapes:
        raise failure("forward formed the full d_in x d_out matrix (a [12, 20] or [20, 12] tensor appeared) before "
                      "applying it to x.",
                      "The full matrix is formed: multiply x by A transposed first, a [*b, rank] bottleneck, then "
                      "that by B transposed; the d_in x d_out product costs d_in * d_out memory and time per call, "
                      "which is what LoRA saves (merging forms it once, for export).")
    compare_gradients(learner, reference, Case("a random B, x of shape [6, 12]", (x,)), ["x"], arg_names=["x"])
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


def _model(seed: int, norm: str) -> HookedTransformer:
    """``small_model`` with random biases (TransformerLens starts them at 0): a bias lost in a merge then shows.
    The LayerNorms keep weight 1 and bias 0: TransformerLens's ``hook_normalized`` holds the LayerNorm's output
    before its weight and bias, so it is what W_Q, W_K, W_V and W_in multiply only when those are folded into the
    next weights (LNPre, as both worlds' policies are) or are 1 and 0."""
    model = small_model(seed=seed, normalization_type=norm)
    g = seeded(seed + 1000)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("b_"):
                param.copy_(0.3 * torch.randn(param.shape, generator=g))
    return model


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


def _hooked_logits(hooks_fn, watch: bool = False):
    """A function (model, adapters, tokens) -> the logits of ``model`` run with ``hooks_fn``'s hooks. ``watch`` (the
    learner's hooks): the model must come back from ``hooks_fn`` as it was (no hook added, no weight changed), and a
    hook that edits its activation in place is caught as it does it."""

    def run(model, adapters, tokens):
        weights = _state_digest(model) if watch else []
        hooks = hooks_fn(model, adapters)
        if watch:
            _model_unchanged(model, weights)
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
        if watch:
            hooks = [(name, _no_in_place(name, fn)) for name, fn in hooks]
        return model.run_with_hooks(tokens, fwd_hooks=list(hooks))

    return run


def _model_unchanged(model: HookedTransformer, weights: list[torch.Tensor]) -> None:
    """Fail (and clean up) when lora_hooks left a hook on ``model`` or changed one of its weights."""
    left = sorted(name for name, hp in model.hook_dict.items() if hp.fwd_hooks)
    if left:
        model.reset_hooks(including_permanent=True)
        raise failure(f"lora_hooks left hooks on the model ({', '.join(left[:3])}{', ...' if len(left) > 3 else ''}): "
                      "it changed the model instead of only returning the list.",
                      "The hooks were left on the model: lora_hooks only builds and returns the list (no add_hook "
                      "inside); the caller decides how to run it (run_with_hooks for one pass, attach_lora to keep "
                      "them), and a model that keeps them counts the update again on every later run.")
    if any(not torch.equal(p.detach(), q) for p, q in zip(model.parameters(), weights)):
        changed = [n for (n, p), q in zip(model.named_parameters(), weights) if not torch.equal(p.detach(), q)]
        with torch.no_grad():
            for p, q in zip(model.parameters(), weights):
                p.copy_(q)
        raise failure(f"lora_hooks changed the model's weights ({', '.join(changed[:3])}).",
                      "A base weight changed: LoRA adds its update to activations through hooks and never touches "
                      "the model's parameters (folding the update into the weights is merge_lora's job, on a copy).")


def _no_in_place(name: str, fn):
    """``fn`` as a hook that fails when it modifies its activation in place (its version counter moves)."""

    def hook_fn(activation, hook):
        version = activation._version
        out = fn(activation, hook=hook)
        if activation._version != version:
            raise failure(f"the hook at {name!r} modified its activation in place.",
                          "A hook edits its activation in place: return a new tensor (activation plus the update), "
                          "never += or an add_ on the one it is given: training differentiates through it, and "
                          "other hooks on the same point may hold it.")
        return out

    return hook_fn


def _variant_hooks(points=None, scale: float = 1.0, swap_qk: bool = False, d_head_first: bool = False,
                   z_d_head_first: bool = False, every_layer: bool = False):
    """Wrong versions of lora_hooks: other hook points (``points`` overrides HOOK_POINTS entries), the
    update scaled (2.0: applied twice), q's update added to k and k's to q, q/k/v's update split into
    (d_head, head) rather than (head, d_head), z flattened d_head-major."""
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
                if x.dim() == 4 and z_d_head_first:
                    x = x.transpose(-1, -2)
                stored["x"] = x.flatten(-2) if x.dim() == 4 else x

            def add(out, hook, stored=stored, adapter=adapter):
                delta = adapter(stored["x"])
                if out.dim() == 4 and d_head_first:
                    delta = delta.unflatten(-1, (out.shape[-1], out.shape[-2])).transpose(-1, -2)
                return out + scale * delta.reshape(out.shape)

            for at in range(model.cfg.n_layers) if every_layer else [layer]:
                hooks += [(f"blocks.{at}.{read_at}", read), (f"blocks.{at}.{add_at}", add)]
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
    Mistake("An adapter is applied to every layer: the key names its layer ('L1_q' is layer 1's W_Q), and a "
            "layer without an adapter of its own is left alone.", _hooked_logits(_variant_hooks(every_layer=True))),
    Mistake("The update of q, k or v is split into heads in the wrong order: the adapter's last axis, head * d_head "
            "numbers, is head-major (head 0's d_head numbers first, then head 1's), as W_Q's heads concatenated; "
            "cutting it into d_head groups of head numbers puts each number in another head.",
            _hooked_logits(_variant_hooks(d_head_first=True))),
    Mistake("The heads' outputs z are flattened in the wrong order for 'o': W_O's input is the heads side by side, "
            "head-major (head 0's d_head numbers first); flattening with d_head outermost mixes the heads.",
            _hooked_logits(_variant_hooks(z_d_head_first=True))),
]


def _where_logits_differ(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where two [batch, pos, vocab] logit tensors differ, in words: the largest difference, its place and both
    values there, and the positions that differ at all (the first values printed may agree: position 0 sees only
    itself, so a change of the attention pattern leaves it alone)."""
    got, want = got.detach(), want.detach()
    diff = (got.double() - want.double()).abs()
    b, t, v = (int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    positions = sorted({int(i) for i in (diff.amax(dim=(0, 2)) > 1e-5).nonzero().flatten()})
    return (f"  largest difference {float(diff[b, t, v]):.3g} at [batch {b}, position {t}, token {v}]: expected "
            f"{float(want[b, t, v]):.4g}, got {float(got[b, t, v]):.4g}; positions that differ: {positions}")


def _compare_per_case(candidate, reference, cases, **kwargs) -> str:
    """``compare_to_reference`` one case at a time, so that an exception raised while the model runs the
    learner's hooks (a shape that does not fit) names the case, hence the target, it happened on; wrong logits
    also say where they differ most."""
    for case in cases:
        try:
            compare_to_reference(candidate, reference, [case], **kwargs)
        except CheckFailure as exc:
            message = exc.message
            if message.startswith("Wrong values"):
                try:
                    got, want = candidate(*case.args), reference(*case.args)
                except CheckFailure:
                    got = want = None
                if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape == want.shape:
                    head, sep, tail = message.partition("\n  got:")
                    line, nl, rest = tail.partition("\n")
                    message = f"{head}{sep}{line}\n{_where_logits_differ(got, want)}{nl}{rest}"
            if case.label not in message:
                message = f"On {case.label}: {message}"
            raise CheckFailure(message, hint=exc.hint) from None
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
    run = _hooked_logits(lambda model, adapters: call(candidate, model, adapters), watch=True)
    reference = _hooked_logits(lora.lora_hooks)
    verdicts = []
    for norm in ("LN", "LNPre"):
        model = _model(8, norm)
        tokens = _tokens(model, 9)
        one = tokens[:1, :5]
        cases = _adapter_cases(norm, model, tokens, layer=1, seeds=(3, 4)) + [
            Case(f"{norm} model, every target on layer 0, a batch of 1",
                 (model, _random_adapters(model, [lora.adapter_key(0, t) for t in lora.TARGETS], 5), one)),
            Case(f"{norm} model, no adapters (nothing may change)", (model, nn.ModuleDict(), tokens)),
        ]
        verdicts.append(_compare_per_case(run, reference, cases, arg_names=["model", "adapters", "tokens"],
                                          mistakes=HOOK_MISTAKES, atol=1e-5, rtol=1e-4))
    if call(candidate, model, nn.ModuleDict()) not in ([], ()):
        raise CheckFailure("with no adapters lora_hooks should return an empty list.")

    # one hook list, several forward passes: a second batch of the same shape, then one of another shape
    model = _model(8, "LN")
    adapters = _random_adapters(model, _every_key(model), 7)
    weights = _state_digest(model)
    hooks = call(candidate, model, adapters)
    _model_unchanged(model, weights)
    watched = [(name, _no_in_place(name, fn)) for name, fn in hooks]
    for i, (label, tokens) in enumerate((("a first batch [3, 7]", _tokens(model, 21)),
                                         ("a second batch of the same shape [3, 7]", _tokens(model, 22)),
                                         ("a third batch of another shape [2, 5]", _tokens(model, 23, (2, 5))))):
        want = model.run_with_hooks(tokens, fwd_hooks=lora.lora_hooks(model, adapters)).detach()
        got = call(lambda t: model.run_with_hooks(t, fwd_hooks=list(watched)), tokens, _arg_names=["tokens"],
                   _keep_modes=False)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            continue
        off = (f"its logits are off by up to {float((got.detach() - want).abs().max()):.3g}"
               if isinstance(got, torch.Tensor) and got.shape == want.shape else f"it returned {fmt(got)}")
        raise failure(f"One list of hooks run on {label} (after {i} earlier pass{'es' if i != 1 else ''} with the same "
                      f"list): {off}.",
                      "A hook used an x from an earlier forward pass: every pass must add the update computed from "
                      "its own x (the input hook runs before the output hook in every layer of every pass), so store "
                      "each pass's x anew, never only the first one: a trainer reuses one list for every batch.")

    # gradients: every A and B of every adapter, against the reference's
    model = _model(8, "LN")
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
    return (f"{verdicts[0]} (LN), {verdicts[1]} (LNPre); one hook list stays right over three batches of two shapes; "
            "gradients reach every A and B.")


# ----------------------------------------------------------------------------------------------------
# merge_lora
# ----------------------------------------------------------------------------------------------------


def _merge_variant(*, transpose: bool = False, scale: float = 1.0, keep_hooks: bool = False,
                   head_order: bool = False, fresh: bool = False):
    """Wrong versions of merge_lora: the delta transposed, scaled (0: the scale forgotten is handled by
    ``scale=None``), the hooks kept on the copy, heads and d_head swapped in the rearrange, a new model from the
    config given the matrices but not the biases."""

    def merge(model, adapters):
        merged = copy.deepcopy(model)
        if fresh:
            with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens prints where it moves a new model
                merged = HookedTransformer(model.cfg)
            merged.load_state_dict({k: v for k, v in model.state_dict().items()
                                    if not k.rsplit(".", 1)[-1].startswith("b_")}, strict=False)
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
        given = dict(model.named_parameters())
        for name, param in merged.named_parameters():
            if name in given and (param.dtype, param.device) != (given[name].dtype, given[name].device):
                raise failure(f"The merged copy's {name} is {str(param.dtype).replace('torch.', '')} on "
                              f"{param.device}; the model's is {str(given[name].dtype).replace('torch.', '')} on "
                              f"{given[name].device}.",
                              "The merged weights changed dtype or device: the copy must keep the model's own (the "
                              "update is computed from float32 adapters, the model may be float16 or float64; "
                              "TransformerLens fails on a model that mixes them), so bring the update to the "
                              "weight's dtype and device before adding it.")
            if param.grad_fn is not None:
                raise failure(f"The merged copy's {name} carries a graph ({type(param.grad_fn).__name__}): it was "
                              "computed with gradients on.",
                              "The merged weights carry a graph back to the adapters: merge with gradients off (the "
                              "copy is a plain model for export, its weights leaves; a graph keeps the adapters' "
                              "A and B alive and lets a backward pass through the copy train them).")
        return merged(tokens)

    return run


MERGE_MISTAKES = [
    Mistake("The update is applied twice: the copy kept the LoRA hooks (copy.deepcopy copies them), so the merged "
            "weights and the hooks both add it. Remove every hook from the copy, the permanent ones "
            "too (the given first lines do it: keep them).", _merged_logits(_merge_variant(keep_hooks=True))),
    Mistake("The merged delta is transposed: W (d_in x d_out, TransformerLens multiplies x W) gains "
            "scale * A^T B^T.", _merged_logits(_merge_variant(transpose=True))),
    Mistake("Missing alpha / r: the merged delta is scale * A^T B^T, with the adapter's scale.",
            _merged_logits(_merge_variant(scale=None))),
    Mistake("The update is applied twice (scaled by 2): add scale * A^T B^T once.",
            _merged_logits(_merge_variant(scale=2.0))),
    Mistake("The merged copy lost the model's biases: it must be the model itself (a deep copy) with only the "
            "adapted matrices changed, not a new model given some of its weights.",
            _merged_logits(_merge_variant(fresh=True))),
    Mistake("Heads and d_head are swapped in the split: the hooks flatten [head, d_head] "
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
        "dtype; a split of one axis into two, given the number of heads, does it.",
        solution_code(lora.merge_lora),
    ),
)
def check_merge_lora(candidate) -> str:
    run = _merged_logits(lambda model, adapters: call(candidate, model, adapters))
    reference = _hooked_logits(lora.lora_hooks)
    verdicts = []
    for norm in ("LN", "LNPre"):
        model = _model(12, norm)
        cases = _adapter_cases(norm, model, _tokens(model, 13), layer=0, seeds=(14, 15))
        verdicts.append(_compare_per_case(run, reference, cases, arg_names=["model", "adapters", "tokens"],
                                          mistakes=MERGE_MISTAKES, atol=1e-5, rtol=1e-5))

    # a model whose LoRA is attached (as a trainer holds it), the model and adapters unchanged
    model = _model(12, "LN")
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
    verdict = compare_to_reference(candidate, lora.update_rank_profile, cases, arg_names=["delta", "fraction"],
                                   atol=1e-4, rtol=1e-4, mistakes=[
        Mistake("You summed the singular values, not their squares: the squared Frobenius norm of the change is "
                "the sum of the squared singular values.", _profile_variant(energy=False)),
        Mistake("A running sum that reaches the fraction should stop there: >=, not >, with a relative 1e-6 slack "
                "for float rounding (with fraction 1.0, a numerically zero singular value must not count).",
                _profile_variant(strict=True)),
        Mistake("The singular values come in increasing order: return them largest first and count from the largest.",
                _profile_variant(ascending=True)),
        Mistake("You compared the norm share (square root of the energy share) with the fraction: compare the "
                "squared norms.", _profile_variant(frobenius_ratio=True)),
        Mistake("A float32 SVD loses the small singular values next to large ones: compute in float64, return "
                "float32.", _profile_variant(float32=True)),
    ])
    for case in cases[:1] + cases[8:10]:  # a count, a zero change and a zero fraction
        _, k = call(candidate, *case.args, _arg_names=["delta", "fraction"], **case.kwargs)
        if type(k) is not int:
            raise failure(f"On {case.label}, k is {fmt(k)} ({type(k).__name__}), not a Python int.",
                          "k is a count, returned as a Python int: a tensor there would be compared, printed and used "
                          "as a rank as a tensor, so convert the count to int before returning it.")
    for fraction in (1.5, -0.1):
        try:
            call(candidate, torch.eye(3), fraction, _arg_names=["delta", "fraction"])
        except CheckFailure as exc:
            if "ValueError" not in exc.message:
                raise CheckFailure(f"update_rank_profile(delta, fraction={fraction}) should raise ValueError; "
                                   f"{exc.message.replace('your code', 'it')}") from None
        else:
            raise CheckFailure(f"update_rank_profile(delta, fraction={fraction}) did not raise ValueError: a share "
                               "outside [0, 1] means nothing (the given first lines raise it: keep them).")
    return verdict + " k is a Python int; a fraction outside [0, 1] raises ValueError."
