"""Speed in the harness: where a phase's time goes, and a sampler that keeps its log-probs.

Nothing here is an exercise; what a learner writes runs unchanged. The trainers use these pieces
only where they run the reference code:

- ``PhaseClock``: wall time per section of a phase ("sampling", "scoring", "old_logprobs",
  "ref_logprobs", "optimisation"), summed over a phase and reported in the JSON summaries.
- ``fast_sample``: sampling from a GPT-2-style ``HookedTransformer`` with a key/value cache of our
  own, a plain-torch forward of a few ops per layer (no hook points, no per-step checks), which also
  returns the temperature-scaled log-prob of every sampled token:

      logprobs[b, t] = log_softmax(logits[b, prompt_len + t - 1] / temperature)[tokens[b, prompt_len + t]]

  the very numbers a forward pass over the finished text gives (to float rounding, about 1e-6;
  tests/test_speed.py checks 1e-5), so the trainer needs no second forward for the old policy.
  ``top_k`` restricts the draw, not the log-prob (as ``grpo.group_token_logprobs`` has it: the log-prob is of
  the full tempered distribution).
- ``token_logprobs``: the log-probs of given tokens for training, by the same plain-torch forward
  (attention as one packed Q/K/V matmul per layer), unembedding only the positions that predict a
  kept token, with the unembedding, softmax and pick as one autograd step whose backward is
  ``(onehot - softmax) / temperature``: the same values and gradients as chapter 03's
  ``get_logprobs`` on the model's own forward, to float rounding (tested).
- ``fast_multi_turn_rollout``: chapter 09's multi-turn rollout (the reference ``agent.multi_turn_rollout``)
  with that cache: the same decisions, the same draws from the same generator, one position fed per step.
- ``sequence_logprobs``: chapter 06's sequence log-probs of masked completions (the DPO trainer's
  forward), by the same forward and fused unembedding, on the masked positions only.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

#: The sections of a phase, in the order they run.
SECTIONS = ("sampling", "scoring", "old_logprobs", "ref_logprobs", "optimisation")


class PhaseClock:
    """Seconds spent per named section, accumulated until ``take()`` hands them over and resets.

    ``with clock("sampling"): ...`` adds the block's wall time to "sampling". On a GPU the clock
    synchronises before reading the time, so that queued kernels are billed to their section.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, section: str) -> Iterator[None]:
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.seconds[section] += time.perf_counter() - start

    @contextmanager
    def method(self, obj: object, name: str, section: str | Callable[..., str | None]) -> Iterator[None]:
        """Within the block, every call of ``obj.name`` (a bound method or a callable attribute) is
        timed into ``section``: the attribute is replaced on the instance and restored after.
        ``section`` may be a function of the call's arguments naming the section (None: not timed)."""
        had_own, original = name in vars(obj), getattr(obj, name)

        def timed(*args, **kwargs):
            where = section(*args, **kwargs) if callable(section) else section
            if where is None:
                return original(*args, **kwargs)
            with self(where):
                return original(*args, **kwargs)

        setattr(obj, name, timed)
        try:
            yield
        finally:
            setattr(obj, name, original) if had_own else delattr(obj, name)

    @contextmanager
    def module(self, module: torch.nn.Module, section: str) -> Iterator[None]:
        """Within the block, every forward pass of ``module`` is timed into ``section`` (hooks)."""
        starts: list[float] = []

        def pre(*_):
            starts.append(time.perf_counter())

        def post(*_):
            self.seconds[section] += time.perf_counter() - starts.pop()

        handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def take(self) -> dict[str, float]:
        """The sections' seconds so far (``seconds_<section>`` keys), then start again from zero."""
        out = {f"seconds_{k}": v for k, v in self.seconds.items()}
        self.seconds = defaultdict(float)
        return out


def time_split(history: list[dict]) -> dict[str, float]:
    """Mean seconds per phase of each section over a run's phase records (``seconds_*`` keys), with
    ``other`` = the phase's total minus its sections (logging, advantages, bookkeeping)."""
    keys = sorted({k for r in history for k in r if k.startswith("seconds_") and k != "seconds_phase"})
    out = {k.removeprefix("seconds_"): sum(r.get(k, 0.0) for r in history) / len(history) for k in keys}
    if history and all("seconds_phase" in r for r in history):
        total = sum(r["seconds_phase"] for r in history) / len(history)
        out["other"] = total - sum(out.values())
        out["phase"] = total
    return {k: round(v, 4) for k, v in out.items()}


#: The mean reward at which runs are compared ("time to 0.9").
REWARD_TARGET = 0.9


def time_to_reward(history: list[dict], target: float = REWARD_TARGET) -> dict[str, float | int | None]:
    """The first phase (counted from 1) whose sampled mean reward reaches ``target``, and the training
    seconds up to the end of that phase (``seconds_phase`` summed); None when never reached."""
    elapsed = 0.0
    for k, record in enumerate(history, start=1):
        elapsed += record.get("seconds_phase", float("nan"))
        if record["reward"] >= target:
            return {"phases_to_target": k, "seconds_to_target": round(elapsed, 2), "reward_target": target}
    return {"phases_to_target": None, "seconds_to_target": None, "reward_target": target}


# ----------------------------------------------------------------------------------------------------
# Sampling with a cache of our own
# ----------------------------------------------------------------------------------------------------


_enabled = True


@contextmanager
def harness_speedups(enabled: bool) -> Iterator[None]:
    """Within the block, ``token_logprobs`` uses the hook-free forward where it can (``enabled``) or
    always the model's own forward (to measure what the speed-ups gain)."""
    global _enabled
    saved, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = saved


def can_fast_sample(model: HookedTransformer) -> bool:
    """Whether ``fast_sample`` / ``fast_residual`` compute ``model``'s function: a GPT-2-shaped model
    (what ``export`` maps onto GPT-2) with a supported activation and no hooks attached (a hook
    would be skipped)."""
    from rlhf_tutorial.trainers.export import check_exportable

    if not isinstance(model, HookedTransformer):
        return False
    try:
        check_exportable(model)
    except ValueError:
        return False
    hooked = any(hp.fwd_hooks or hp.bwd_hooks for hp in model.hook_dict.values())
    return model.cfg.act_fn in _ACTIVATIONS and not hooked


def _gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), by ATen's fused kernel,
    except on a CPU whose kernels are unvectorised (``ATEN_CPU_CAPABILITY=default``: a CPU without AVX2). There
    that kernel takes the C library's scalar tanh element by element (about 30 ns an element, four times the
    cost of the rest of the tiny model's forward), so the formula is computed by separate ops as
    TransformerLens's own ``gelu_new`` writes it (the same numbers as the model's forward; its ``torch.tanh``
    is vectorised by the math library at every level): 3x faster forward, 2.5x with the backward, and to
    float rounding (2.4e-7) the kernel's values. The vectorised levels keep the kernel (faster there)."""
    if _SCALAR_KERNELS and x.device.type == "cpu":
        return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))
    return F.gelu(x, approximate="tanh")


_SCALAR_KERNELS = torch.backends.cpu.get_cpu_capability() == "DEFAULT"
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # np.sqrt(2.0 / np.pi) in TransformerLens: the same double

_ACTIVATIONS = {
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu": F.gelu,
    "relu": F.relu,
}


def _layer_norm(x: Tensor, module, eps: float) -> Tensor:
    w, b = getattr(module, "w", None), getattr(module, "b", None)  # None for LNPre (folded)
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


class _Cache:
    """Keys and values of every layer, ``[batch, n_heads, max_len, d_head]``, filled up to ``length``."""

    def __init__(self, model: HookedTransformer, batch: int, max_len: int):
        cfg = model.cfg
        shape = (cfg.n_layers, batch, cfg.n_heads, max_len, cfg.d_head)
        dtype = model.W_E.dtype
        self.k = torch.empty(shape, dtype=dtype, device=model.W_E.device)
        self.v = torch.empty(shape, dtype=dtype, device=model.W_E.device)
        self.length = 0


def _packed_layers(model: HookedTransformer) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per layer, the attention weights as 2-D matrices, so that a layer is four plain matmuls:
    ``W_QKV`` [d_model, 3 * n_heads * d_head] (Q, K, V side by side), its bias, and ``W_O`` as
    [n_heads * d_head, d_model]. Built from the parameters by differentiable ops (a copy of a few
    d_model^2 numbers), so gradients reach ``W_Q``, ``W_K``, ``W_V`` as usual."""
    packed = []
    for block in model.blocks:
        attn = block.attn
        W_QKV = torch.cat([attn.W_Q, attn.W_K, attn.W_V]).permute(1, 0, 2).flatten(1)  # [3h m e] -> [m 3he]
        b_QKV = torch.cat([attn.b_Q, attn.b_K, attn.b_V]).flatten()  # [3he]
        packed.append((W_QKV, b_QKV, attn.W_O.flatten(0, 1)))  # W_O: [h e m] -> [he m]
    return packed


def _residual(
    model: HookedTransformer,
    tokens: Int[Tensor, "b n"],
    cache: _Cache | None,
    packed: list[tuple[Tensor, Tensor, Tensor]] | None = None,
) -> Float[Tensor, "b n d"]:
    """The final normalised residual (``ln_final.hook_normalized``) of ``tokens``, which continue the
    cached ones when a cache is given (and are added to it). The computation of
    ``HookedTransformer.forward`` for a GPT-2-shaped model, in a few plain-torch ops per layer
    (``packed``: ``_packed_layers(model)``, built here when not given)."""
    cfg = model.cfg
    start, (b, n) = (cache.length if cache is not None else 0), tokens.shape
    act = _ACTIVATIONS[cfg.act_fn]
    x = (model.W_E[tokens] + model.W_pos[start : start + n]).flatten(0, 1)  # [(b n) d]
    for i, (block, (W_QKV, b_QKV, W_O)) in enumerate(zip(model.blocks, packed or _packed_layers(model))):
        h = _layer_norm(x, block.ln1, cfg.eps)
        qkv = torch.addmm(b_QKV, h, W_QKV).view(b, n, 3, cfg.n_heads, cfg.d_head).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each [b heads n d_head]
        if cache is not None:
            cache.k[i, :, :, start : start + n] = k
            cache.v[i, :, :, start : start + n] = v
            k, v = cache.k[i, :, :, : start + n], cache.v[i, :, :, : start + n]
        # A sequence attends causally; one new token attends to everything cached before it.
        z = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1 and start == 0)  # [b heads n d_head]
        x = x + torch.addmm(block.attn.b_O, z.transpose(1, 2).reshape(b * n, -1), W_O)  # [(b n) d]
        h = _layer_norm(x, block.ln2, cfg.eps)
        x = x + torch.addmm(block.mlp.b_out, act(torch.addmm(block.mlp.b_in, h, block.mlp.W_in)), block.mlp.W_out)
    if cache is not None:
        cache.length = start + n
    return _layer_norm(x, model.ln_final, cfg.eps).view(b, n, -1)


def fast_residual(model: HookedTransformer, tokens: Int[Tensor, "b s"]) -> Float[Tensor, "b s d"]:
    """``ln_final.hook_normalized`` of ``tokens`` for a GPT-2-shaped model (``can_fast_sample``), without
    TransformerLens's hook points: the same numbers to float rounding, gradients flowing as usual."""
    return _residual(model, tokens, None)


class _UnembedTokenLogprobs(torch.autograd.Function):
    """``log_softmax((resid @ W_U + b_U) / temperature)[target]`` per row, in one step: the backward
    builds one ``[N, v]`` tensor (``softmax`` minus the one-hot of the target) where autograd through
    ``log_softmax`` and ``gather`` builds several. Gradients:

        d logp / d logits = (onehot(target) - softmax(logits / T)) / T
    """

    @staticmethod
    def forward(ctx, resid, W_U, b_U, targets, temperature):  # [N d], [d v], [v], [N], float
        logits = torch.addmm(b_U, resid, W_U)  # [N v]
        if temperature != 1.0:
            logits.div_(temperature)
        lse = torch.logsumexp(logits, dim=-1)  # [N]
        logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # [N]
        ctx.save_for_backward(resid, W_U, logits, lse, targets)
        ctx.temperature = temperature
        return logprobs

    @staticmethod
    def backward(ctx, grad):  # [N]
        resid, W_U, logits, lse, targets = ctx.saved_tensors
        d_logits = (logits - lse[:, None]).exp_().mul_(-grad[:, None])  # -softmax * grad, [N v]
        d_logits.scatter_add_(-1, targets[:, None], grad[:, None])  # + onehot * grad
        if ctx.temperature != 1.0:
            d_logits.div_(ctx.temperature)
        d_resid = d_logits @ W_U.T if ctx.needs_input_grad[0] else None
        d_W_U = resid.T @ d_logits if ctx.needs_input_grad[1] else None
        d_b_U = d_logits.sum(0) if ctx.needs_input_grad[2] else None
        return d_resid, d_W_U, d_b_U, None, None


def token_logprobs(
    model: HookedTransformer, tokens: Int[Tensor, "b s"], prefix_len: int, temperature: float = 1.0
) -> Float[Tensor, "b g"]:
    """Log-probs of the tokens after ``prefix_len`` (g = s - prefix_len) under ``model`` at ``temperature``:

        logprobs[b, t] = log_softmax(logits[b, prefix_len + t - 1] / temperature)[tokens[b, prefix_len + t]]

    chapter 03's ``get_logprobs(model(tokens) / temperature, tokens, prefix_len)``. With the speed-ups
    on and a GPT-2-shaped model, only the positions that predict a kept token are unembedded, and the
    unembedding, the softmax and the pick are one autograd step (``_UnembedTokenLogprobs``): the same
    numbers and gradients to float rounding (tests/test_speed.py)."""
    if not (_enabled and can_fast_sample(model)):
        from rlhf_tutorial.rlhf import get_logprobs

        keep = prefix_len - 1
        return get_logprobs(model(tokens)[:, keep:] / temperature, tokens[:, keep:], 1)
    resid = _residual(model, tokens[:, :-1], None)[:, prefix_len - 1 :]  # [b g d]: predicts tokens[:, prefix_len:]
    b, g, d = resid.shape
    targets = tokens[:, prefix_len:].reshape(b * g)
    flat = _UnembedTokenLogprobs.apply(resid.reshape(b * g, d), model.W_U, model.b_U, targets, float(temperature))
    return flat.view(b, g)


def sequence_logprobs(model: HookedTransformer, tokens: Int[Tensor, "b s"], mask: Bool[Tensor, "b s"]) -> Float[Tensor, "b"]:
    """Chapter 06's ``sequence_logprobs(model(tokens), tokens, mask)``: each row's completion log-prob,

        out[b] = sum_{t >= 1} mask[b, t] * log_softmax(logits[b, t - 1])[tokens[b, t]]

    With the speed-ups on and a GPT-2-shaped model: the hook-free forward over the columns up to the
    last masked one, and only the positions that predict a masked token unembedded, with the
    unembedding, softmax and pick as one autograd step (``_UnembedTokenLogprobs``): the same numbers
    and gradients to float rounding (tests/test_speed.py)."""
    if not (_enabled and can_fast_sample(model)):
        from rlhf_tutorial.dpo import sequence_logprobs as reference

        return reference(model(tokens), tokens, mask)
    keep = mask[:, 1:]  # [b s-1]: position t-1 predicts token t
    used = keep.any(0).nonzero()
    out = torch.zeros(tokens.shape[0], dtype=model.W_U.dtype, device=model.W_U.device)  # [b]
    if used.numel() == 0:
        return out + 0.0 * model.W_U.sum()  # no completion token anywhere: zeros, still in the graph
    width = int(used.max()) + 1  # the columns after the last masked token predict nothing kept
    keep = keep[:, :width]
    resid = _residual(model, tokens[:, :width], None)  # [b width d]
    rows = keep.nonzero()[:, 0]  # [N]: the row of each kept position
    picked = _UnembedTokenLogprobs.apply(resid[keep], model.W_U, model.b_U, tokens[:, 1 : width + 1][keep], 1.0)
    return out.index_add(0, rows, picked)


def _draw(probs: Float[Tensor, "b v"], generator: torch.Generator | None) -> Int[Tensor, "b"]:
    """One token per row from ``probs`` by inverting the cumulative distribution at a uniform draw:
    one random number a row (``torch.multinomial`` spends most of a step drawing one per token)."""
    cdf = probs.cumsum(dim=-1)  # [b v]
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


@torch.no_grad()
def fast_sample(
    model: HookedTransformer,
    prompt_tokens: Int[Tensor, "b prompt_len"],
    max_new_tokens: int,
    eos_token_id: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Int[Tensor, "b s"], Float[Tensor, "b g"]]:
    """Sample ``max_new_tokens`` tokens after each row of ``prompt_tokens`` (s = prompt_len + g).

    With ``eos_token_id``, a row that emitted EOS continues with EOS (padding; its log-prob is that of
    EOS under the model, as a forward pass would give), and the loop ends once every row has stopped:
    the remaining columns are EOS with log-prob 0 (padding that every mask excludes). Returns the
    tokens and the log-probs of the g generated tokens (module docstring). ``generator``: the random
    stream (default: torch's global one).
    """
    if temperature <= 0:
        raise ValueError("fast_sample samples: temperature must be > 0")
    batch, prompt_len = prompt_tokens.shape
    if prompt_len + max_new_tokens > model.cfg.n_ctx:
        raise ValueError(f"prompt ({prompt_len}) + {max_new_tokens} new tokens exceed n_ctx = {model.cfg.n_ctx}")
    device = model.W_E.device
    out = torch.full((batch, prompt_len + max_new_tokens), eos_token_id if eos_token_id is not None else 0,
                     dtype=torch.long, device=device)
    out[:, :prompt_len] = prompt_tokens
    logprobs = torch.zeros(batch, max_new_tokens, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    cache = _Cache(model, batch, prompt_len + max_new_tokens)
    packed = _packed_layers(model)
    logits = torch.addmm(model.b_U, _residual(model, out[:, :prompt_len], cache, packed)[:, -1], model.W_U)  # [b v]
    for t in range(max_new_tokens):
        logp = (logits.float() / temperature).log_softmax(dim=-1)  # [b v]
        if top_k is not None:
            kth = logp.topk(top_k, dim=-1).values[:, -1:]
            draw = logp.masked_fill(logp < kth, float("-inf"))
        else:
            draw = logp
        token = _draw(draw.exp(), generator)  # [b]
        if eos_token_id is not None:
            token = token.masked_fill(finished, eos_token_id)
            finished |= token == eos_token_id
        out[:, prompt_len + t] = token
        logprobs[:, t] = logp.gather(-1, token[:, None]).squeeze(-1)
        if t + 1 == max_new_tokens or (eos_token_id is not None and bool(finished.all())):
            break
        logits = torch.addmm(model.b_U, _residual(model, token[:, None], cache, packed)[:, -1], model.W_U)
    return out, logprobs


@torch.no_grad()
def fast_multi_turn_rollout(
    policy: HookedTransformer,
    prompts: Int[Tensor, "b prompt_len"],
    tool: Callable[[str], str],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    max_turns: int,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    token_mask: Callable | None = None,
):
    """Chapter 09's reference ``agent.multi_turn_rollout`` (its contract, its ``AgentRollout``) with a
    key/value cache of our own (``can_fast_sample`` models): each position is fed once, where the
    reference runs a forward over the whole prefix per position. Every decision is the reference's, in
    its order: at each position the rows that sample draw from ``softmax(logits / temperature)`` by one
    ``torch.multinomial`` over all rows (the same call on the same generator, so with the same random
    stream the same tokens wherever the two forwards' probabilities agree to float rounding), a row
    with environment tokens queued writes the next one, a turn's decoded text ending with
    ``CALL_CLOSE`` runs ``tool`` and queues ``encode`` of its text. ``token_mask``: the
    ``policy_token_mask`` that builds the mask (default: the reference). tests/test_agent_fast.py
    compares the two."""
    from rlhf_tutorial import agent

    token_mask = token_mask or agent.policy_token_mask
    b, prompt_len = prompts.shape
    s = prompt_len + max_new_tokens
    if s > policy.cfg.n_ctx:
        raise ValueError(f"prompt ({prompt_len}) + {max_new_tokens} new tokens exceed n_ctx = {policy.cfg.n_ctx}")
    device = prompts.device
    pad = eos_token_id if eos_token_id is not None else 0
    tokens = torch.full((b, s), pad, dtype=torch.long, device=device)
    tokens[:, :prompt_len] = prompts
    logprobs = torch.zeros(b, s, device=device)
    lengths = [s] * b
    env_spans: list[list[tuple[int, int]]] = [[] for _ in range(b)]
    queued: list[list[int]] = [[] for _ in range(b)]  # tool tokens still to write, per row
    turn_tokens: list[list[int]] = [[] for _ in range(b)]  # the current turn's sampled tokens, per row
    turn, done = [1] * b, [False] * b
    cache = _Cache(policy, b, s)
    packed = _packed_layers(policy)
    resid = _residual(policy, tokens[:, :prompt_len], cache, packed)[:, -1]  # [b d]: predicts position prompt_len
    for t in range(prompt_len, s):
        column = [pad] * b
        if any(not done[i] and not queued[i] for i in range(b)):
            logits = torch.addmm(policy.b_U, resid, policy.W_U).float() / temperature  # [b v]
            logp = logits.log_softmax(dim=-1)
            drawn = torch.multinomial(logp.exp(), 1, generator=generator)  # [b 1]
            drawn_lp = logp.gather(-1, drawn).squeeze(-1)  # [b]
            drawn_list = drawn.squeeze(-1).tolist()
        for i in range(b):
            if done[i]:
                continue
            if queued[i]:  # the environment writes this position
                column[i] = queued[i].pop(0)
                if not queued[i]:
                    turn_tokens[i] = []
                continue
            token = column[i] = drawn_list[i]
            logprobs[i, t] = drawn_lp[i]
            turn_tokens[i].append(token)
            if token == eos_token_id:
                done[i], lengths[i] = True, t + 1
            elif decode(turn_tokens[i]).endswith(agent.CALL_CLOSE):
                ids = list(encode(tool(decode(turn_tokens[i])))) if turn[i] < max_turns else []
                if turn[i] >= max_turns or t + 1 + len(ids) > s:
                    done[i], lengths[i] = True, t + 1
                else:
                    queued[i] = ids
                    env_spans[i].append((t + 1, t + 1 + len(ids)))
                    turn[i] += 1
        tokens[:, t] = torch.tensor(column, dtype=torch.long, device=device)
        if all(done) or t + 1 == s:
            break
        resid = _residual(policy, tokens[:, t : t + 1], cache, packed)[:, -1]
    lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
    mask = token_mask(tokens, prompt_len, env_spans, lengths_t)
    num_calls = torch.tensor([len(spans) for spans in env_spans], dtype=torch.long, device=device)
    return agent.AgentRollout(tokens, mask, logprobs, env_spans, lengths_t, num_calls, prompt_len)
