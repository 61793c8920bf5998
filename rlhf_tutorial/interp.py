"""Chapter 05: what RLHF changed inside the model, and where, read with TransformerLens hooks.

"base" is the reference policy, "tuned" the policy after chapter 03's run towards negative reviews.
Both are HookedTransformers processed like ``from_pretrained`` (LayerNorm weights folded into the
next layer, unembedding centred), so the final LayerNorm only centres and scales and

    logits = ln_pre(resid_final) @ W_U + b_U,    ln_pre(x) = (x - mean(x)) / sqrt(var(x) + eps)

Every reading below is a linear readout of the residual stream through the **sentiment direction**
``direction = mean(W_U[:, neg]) - mean(W_U[:, pos])`` (one fixed yardstick, the base model's
unembedding, for both models). The exercises, in the order the chapter builds them:

1. ``sentiment_direction``     the residual direction that raises negative words over positive ones
2. ``ln_pre``                  the final LayerNorm of a folded model (no weights)
3. ``logit_lens_score``        the sentiment logit difference if the model stopped at each layer
4. ``value_lens``              the trained value head read at every layer
5. ``head_attribution``        direct logit attribution of every attention head
6. ``patch_activation``        a hook that writes another run's activations into this one
7. ``restored_fraction``       how much of the tuned behaviour a patch restores in the base model
8. ``activation_difference``   the mean tuned - base residual over the first positions of any text
9. ``param_change``            relative change of each parameter
10. ``fraction_changed``       the fraction of weight entries that moved at all (fp32 vs bf16)

The helpers after them (prompts, word lists, the metric, component outputs, patching sweeps) are what
the notebook and ``python -m rlhf_tutorial interp-report`` run; they take the exercise functions as
arguments where a learner's version can be used.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedTransformer

from rlhf_tutorial.devices import device_of, rng_devices
from rlhf_tutorial.rlhf import get_samples

# ----------------------------------------------------------------------------------------------------
# 1-4. A direction, and reading the residual stream through it at every layer
# ----------------------------------------------------------------------------------------------------


def sentiment_direction(
    W_U: Float[Tensor, "d v"], pos_ids: Int[Tensor, "p"], neg_ids: Int[Tensor, "n"]
) -> Float[Tensor, "d"]:
    """The residual direction that raises the mean logit of the negative words over the positive ones:

        direction = mean_{i in neg} W_U[:, i] - mean_{j in pos} W_U[:, j]

    so that ``h @ direction = mean(logits[neg]) - mean(logits[pos])`` (bias aside) for a normalised
    residual ``h``. A token listed twice counts twice.
    """
    # >>> exercise
    return W_U[:, neg_ids].mean(dim=1) - W_U[:, pos_ids].mean(dim=1)
    # <<< exercise


def ln_pre(x: Float[Tensor, "*b d"], eps: float = 1e-5) -> Float[Tensor, "*b d"]:
    """A LayerNorm with no weights, as ``ln_final`` is after folding (means over the last dim):

        ln_pre(x) = (x - mean(x)) / sqrt(mean((x - mean(x))**2) + eps)

    The variance is the biased one (divide by d), and eps is inside the square root.
    """
    # >>> exercise
    centred = x - x.mean(dim=-1, keepdim=True)
    scale = (centred.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()
    return centred / scale
    # <<< exercise


def logit_lens_score(
    resid_stack: Float[Tensor, "layer *b d"], direction: Float[Tensor, "d"], eps: float = 1e-5
) -> Float[Tensor, "layer *b"]:
    """The logit lens through the sentiment direction: what the logit difference would be if the model
    stopped at each layer and went straight to the final LayerNorm and the unembedding:

        score[l, ...] = <ln_pre(x_l), direction>       for every vector x_l of the stack
    """
    # >>> exercise
    return ln_pre(resid_stack, eps) @ direction
    # <<< exercise


def value_lens(
    resid_stack: Float[Tensor, "layer *b d"], value_head: nn.Module, eps: float = 1e-5
) -> Float[Tensor, "layer *b"]:
    """The value lens: the trained value head (which reads ``ln_final.hook_normalized``) applied to
    the residual stream at every layer:

        value[l, ...] = V(ln_pre(x_l))        one number per vector x_l of the stack (V: the head)

    Reading must not change the head: not its parameters, not their ``.grad`` (a plain forward pass
    does neither; the output may or may not carry gradients).
    """
    # >>> exercise
    return value_head(ln_pre(resid_stack, eps)).squeeze(-1)
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# 5. Direct logit attribution
# ----------------------------------------------------------------------------------------------------


def head_attribution(
    head_out: Float[Tensor, "b layer head d"], ln_scale: Float[Tensor, "b"], direction: Float[Tensor, "d"]
) -> Float[Tensor, "layer head"]:
    """Direct logit attribution of every head, averaged over the batch:

        attr[l, h] = mean_b ((head_out[b, l, h] - mean_d head_out[b, l, h]) @ direction) / ln_scale[b]

    ``head_out[b, l, h]`` is what head h of layer l writes into the residual stream at the position
    read; ``ln_scale[b]`` is ``ln_final.hook_scale`` there. The final LayerNorm centres its input and
    divides by that scale, both linear once the scale is fixed, so the attributions of all components
    (heads, attention biases, MLPs, embeddings) add up to ``ln_pre(resid_final) @ direction``.
    """
    # >>> exercise
    centred = head_out - head_out.mean(dim=-1, keepdim=True)  # [b layer head d]
    per_example = (centred @ direction) / ln_scale[:, None, None]  # [b layer head]: each by its own scale
    return per_example.mean(dim=0)
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# 6-7. Activation patching
# ----------------------------------------------------------------------------------------------------


def patch_activation(
    activation: Float[Tensor, "b s *rest"],
    hook,
    source: Float[Tensor, "b s *rest"],
    positions: list[int] | None = None,
) -> Float[Tensor, "b s *rest"]:
    """A TransformerLens hook function: the activation with ``positions`` replaced by ``source``'s.

        activation[b, t, ...] <- source[b, t, ...]   for every b and every t in positions (all t when None)

    Positions use Python indexing (``[-1]`` is the last, ``[]`` none). Use it with
    ``functools.partial(patch_activation, source=..., positions=...)`` in ``run_with_hooks``. It edits
    ``activation`` in place and returns it (the usual hook idiom); ``source`` is never modified. Any
    mask or index built here goes on ``activation.device``.
    """
    # >>> exercise
    if positions is None:
        activation[:] = source
    else:
        activation[:, positions] = source[:, positions]
    return activation
    # <<< exercise


def restored_fraction(
    patched: Float[Tensor, "*b"], base: Float[Tensor, "*b"], tuned: Float[Tensor, "*b"]
) -> Float[Tensor, ""]:
    """How much of the tuned behaviour a patch restores, on the mean of the metric:

        restored = (mean(patched) - mean(base)) / (mean(tuned) - mean(base))

    0: the patched base model behaves like the base model; 1: like the tuned one. A ratio of means, not
    a mean of per-example ratios (those blow up where one example's shift is near zero).
    """
    # >>> exercise
    return (patched.mean() - base.mean()) / (tuned.mean() - base.mean())
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# 8. The activation-difference lens
# ----------------------------------------------------------------------------------------------------


def activation_difference(
    base_resid: Float[Tensor, "b s d"], tuned_resid: Float[Tensor, "b s d"], n_positions: int = 5
) -> Float[Tensor, "d"]:
    """The mean difference of the two models' residual streams on the same text, over the batch and the
    first ``n_positions`` positions (all of them when the texts are shorter):

        delta = mean_{b, t < n_positions} (tuned_resid[b, t] - base_resid[b, t])
    """
    # >>> exercise
    diff = tuned_resid[:, :n_positions] - base_resid[:, :n_positions]  # [b n d]
    return diff.mean(dim=(0, 1))
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# 9-10. How much, and how sparsely, the weights moved
# ----------------------------------------------------------------------------------------------------


def param_change(base_params: dict[str, Tensor], tuned_params: dict[str, Tensor]) -> dict[str, float]:
    """Relative change of every parameter named in both dicts, norms over all entries of the tensor:

        change[name] = ||tuned[name] - base[name]|| / max(||base[name]||, 1e-8)

    Pass ``dict(model.named_parameters())`` (``state_dict()`` also holds masks and buffers).
    """
    # >>> exercise
    out = {}
    for name, base in base_params.items():
        if name in tuned_params:
            delta = (tuned_params[name].detach().float() - base.detach().float()).norm()
            out[name] = (delta / base.detach().float().norm().clamp(min=1e-8)).item()
    return out
    # <<< exercise


def fraction_changed(
    base_params: dict[str, Tensor], tuned_params: dict[str, Tensor], atol: float = 0.0
) -> float:
    """The fraction of all entries (of the tensors named in both dicts) that moved by more than ``atol``:

        fraction = #{entries with |tuned - base| > atol} / #{entries}

    Counted over all entries together, so a big matrix weighs more than a bias. ``1 - fraction`` is the
    update's sparsity; round both models to bfloat16 first to see how much of it is precision.
    """
    # >>> exercise
    changed, total = 0, 0
    for name, base in base_params.items():
        if name in tuned_params:
            delta = (tuned_params[name].detach().double() - base.detach().double()).abs()
            changed += int((delta > atol).sum())
            total += base.numel()
    return changed / total
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Helpers the notebook and the report use (not exercises)
# ----------------------------------------------------------------------------------------------------

#: Review openings: the course prompt first. The metric is read at the last token of each.
PROMPTS = [
    "This movie was really",
    "The film was",
    "Overall, the movie was",
    "I thought the acting was",
    "The story was",
    "The ending was really",
    "This film is",
    "The cast was",
]

#: Text unrelated to how good a film is (plots and facts): the activation-difference lens reads it.
NEUTRAL_TEXTS = [
    "The film follows a detective who moves to a small town to find her missing brother.",
    "It was shot in Paris over ninety minutes of running time, from a popular novel.",
    "A teacher and a pilot meet on a long flight and talk about their families.",
    "The story is set on a space station where a chef keeps a diary of every meal.",
    "Anna Baker plays a journalist who returns to Chicago after twenty years away.",
    "The director adapted a stage play about three sisters and a farm in the desert.",
    "Most of the scenes take place in a haunted house during one winter night.",
    "Henry watched it with my parents over the weekend, just under two hours long.",
]


def sentiment_words() -> tuple[list[str], list[str]]:
    """Candidate positive and negative review adjectives (the tiny world's review vocabulary, which is
    plain English: GPT-2 knows the words too)."""
    from rlhf_tutorial.tiny import corpus

    return corpus.POS_STRONG + corpus.POS_MILD, corpus.NEG_STRONG + corpus.NEG_MILD


def single_token_ids(model: HookedTransformer, words: Sequence[str]) -> tuple[Int[Tensor, "k"], list[str]]:
    """Ids of the words that are ONE token with a leading space (" awful") in the model's vocabulary,
    as a word after a prompt is written; and the words kept."""
    kept, ids = [], []
    for word in words:
        tokens = model.to_tokens(" " + word, prepend_bos=False)[0]
        if len(tokens) == 1:
            kept.append(word)
            ids.append(int(tokens[0]))
    return torch.tensor(ids, dtype=torch.long), kept


def prompt_tokens(model: HookedTransformer, prompts: Sequence[str] = PROMPTS) -> list[Int[Tensor, "1 s"]]:
    """Each prompt tokenised on its own (with BOS): prompts differ in length, the metric reads the last."""
    return [model.to_tokens(p) for p in prompts]


def final_score(
    model: HookedTransformer, tokens: Int[Tensor, "1 s"], direction: Float[Tensor, "d"],
    fwd_hooks: Sequence = (),
) -> Float[Tensor, ""]:
    """The metric: ``ln_final.hook_normalized[0, -1] @ direction``, the sentiment logit difference the
    residual stream writes at the last position (the unembedding bias left out), under ``fwd_hooks``."""
    store: dict[str, Tensor] = {}

    def grab(x: Tensor, hook) -> None:
        store["h"] = x[0, -1]

    with torch.no_grad():
        model.run_with_hooks(tokens, return_type=None, fwd_hooks=[*fwd_hooks, ("ln_final.hook_normalized", grab)])
        return store["h"] @ direction


def head_outputs(model: HookedTransformer, cache: ActivationCache, pos: int = -1) -> Float[Tensor, "b layer head d"]:
    """What each head writes into the residual stream at ``pos``: ``z[b, pos, h] @ W_O[l, h]``."""
    z = torch.stack([cache["z", layer][:, pos] for layer in range(model.cfg.n_layers)], dim=1)  # [b l h dh]
    return torch.einsum("blhe,lhed->blhd", z, model.W_O)


def component_attributions(
    model: HookedTransformer, cache: ActivationCache, direction: Float[Tensor, "d"], pos: int = -1,
    attribution: Callable = head_attribution,
) -> dict[str, Tensor]:
    """Direct logit attribution of every component that writes into the residual stream at ``pos``:
    ``heads`` [layer head] (through ``attribution``), ``attn_bias`` [layer] (``b_O``, shared by the heads),
    ``mlp`` [layer], ``embed`` (token + position embedding); their sum should equal ``total``, the
    readout ``ln_pre(resid_final) @ direction`` (all averaged over the batch)."""
    scale = cache["ln_final.hook_scale"][:, pos, 0]  # [b]

    def attr(x: Float[Tensor, "b *c d"]) -> Tensor:  # the same readout for any component
        x = x - x.mean(-1, keepdim=True)
        return ((x @ direction) / scale.view(-1, *[1] * (x.ndim - 2))).mean(0)

    n_layers = model.cfg.n_layers
    b = scale.shape[0]
    return {
        "heads": attribution(head_outputs(model, cache, pos), scale, direction),
        "attn_bias": attr(model.b_O.expand(b, -1, -1)),
        "mlp": attr(torch.stack([cache["mlp_out", layer][:, pos] for layer in range(n_layers)], dim=1)),
        "embed": attr(cache["hook_embed"][:, pos] + cache["hook_pos_embed"][:, pos]),
        "total": (cache["ln_final.hook_normalized"][:, pos] @ direction).mean(),
    }


#: The activations a patching sweep writes, per layer: TransformerLens hook names.
PATCH_COMPONENTS = {"resid_pre": "hook_resid_pre", "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out",
                    "resid_post": "hook_resid_post"}


def patching_sweep(
    base: HookedTransformer,
    tuned: HookedTransformer,
    tokens_list: Sequence[Int[Tensor, "1 s"]],
    direction: Float[Tensor, "d"],
    patch: Callable = patch_activation,
    restored: Callable = restored_fraction,
) -> dict[str, Tensor]:
    """Patch the tuned model's activations into the base model, one at a time, and measure the restored
    fraction of the sentiment shift (the metric averaged over the prompts):

    - ``by_component`` [layer, component]: every position of one component of one layer
      (``PATCH_COMPONENTS``), and ``by_head`` [layer, head]: one head's ``z`` at every position;
    - ``by_position`` [layer, position]: ``resid_pre`` (then the final ``resid_post``) at ONE position
      counted from the end (``-1`` is the last prompt token), the position axis of the shortest prompt.

    The three tables are small CPU tensors (for figures); ``base`` and ``tuned`` (the metric per prompt)
    stay on the models' device.
    """
    caches = []
    for tokens in tokens_list:
        with torch.no_grad():
            _, cache = tuned.run_with_cache(tokens)
        caches.append(cache)
    base_scores = torch.stack([final_score(base, t, direction) for t in tokens_list])
    tuned_scores = torch.stack([final_score(tuned, t, direction) for t in tokens_list])

    def score(name: str, positions: list[int] | None, head: int | None = None) -> float:
        scores = []
        for tokens, cache in zip(tokens_list, caches):
            source = cache[name]
            if head is not None:  # patch one head: the source is the base run's z with this head replaced
                hook_fn = functools.partial(_patch_head, source=source, head=head, patch=patch)
            else:
                hook_fn = functools.partial(patch, source=source, positions=positions)
            scores.append(final_score(base, tokens, direction, [(name, hook_fn)]))
        return float(restored(torch.stack(scores), base_scores, tuned_scores))

    n_layers, n_heads = base.cfg.n_layers, base.cfg.n_heads
    by_component = torch.tensor([[score(f"blocks.{layer}.{hook}", None) for hook in PATCH_COMPONENTS.values()]
                                 for layer in range(n_layers)])
    by_head = torch.tensor([[score(f"blocks.{layer}.attn.hook_z", None, head) for head in range(n_heads)]
                            for layer in range(n_layers)])
    n_pos = min(t.shape[1] for t in tokens_list)
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)] + [f"blocks.{n_layers - 1}.hook_resid_post"]
    by_position = torch.tensor([[score(name, [p - n_pos]) for p in range(n_pos)] for name in names])
    return {"by_component": by_component, "by_head": by_head, "by_position": by_position,
            "base": base_scores, "tuned": tuned_scores}


def _patch_head(z: Float[Tensor, "b s head dh"], hook, source: Tensor, head: int, patch: Callable) -> Tensor:
    """Patch head ``head``'s z at every position: ``patch`` on the [b s dh] slice of that head."""
    patched = patch(z[:, :, head].clone(), hook, source[:, :, head], None)
    z[:, :, head] = patched
    return z


def sentiment_setup(base: HookedTransformer) -> dict:
    """The positive and negative words that are single tokens, and the direction from the base W_U."""
    pos_words, neg_words = sentiment_words()
    pos_ids, pos_kept = single_token_ids(base, pos_words)
    neg_ids, neg_kept = single_token_ids(base, neg_words)
    if len(pos_ids) == 0 or len(neg_ids) == 0:
        raise ValueError(f"no single-token words in this vocabulary ({len(pos_ids)} positive, {len(neg_ids)} negative): "
                         "pass other word lists to single_token_ids and build the direction yourself")
    direction = sentiment_direction(base.W_U.detach(), pos_ids, neg_ids)
    return {"pos_ids": pos_ids, "neg_ids": neg_ids, "pos_words": pos_kept, "neg_words": neg_kept, "direction": direction}


@torch.no_grad()
def lens_records(base: HookedTransformer, tuned, direction: Tensor, texts: Sequence[str],
                 logit_lens: Callable = logit_lens_score, value_lens_fn: Callable = value_lens) -> list[dict]:
    """Per text: the logit lens and the value lens at every layer and position, for both models (the
    tuned model's value head reads both)."""
    out = []
    for text in texts:
        tokens = base.to_tokens(text)
        record: dict = {"text": text, "tokens": [base.to_string(t) for t in tokens[0]]}
        for name, model in [("base", base), ("tuned", tuned.base_model)]:
            _, cache = model.run_with_cache(tokens)
            stack, labels = cache.accumulated_resid(return_labels=True)  # [layer+1, 1, s, d]
            record["layers"] = labels
            record[f"logit_{name}"] = logit_lens(stack[:, 0], direction).tolist()
            record[f"value_{name}"] = value_lens_fn(stack[:, 0], tuned.value_head).tolist()
        out.append(record)
    return out


@torch.no_grad()
def mean_attributions(model: HookedTransformer, tokens_list, direction, attribution: Callable = head_attribution
                      ) -> dict[str, Tensor]:
    """``component_attributions`` averaged over prompts (each prompt read at its last token)."""
    parts = []
    for tokens in tokens_list:
        _, cache = model.run_with_cache(tokens)
        parts.append(component_attributions(model, cache, direction, attribution=attribution))
    return {k: torch.stack([p[k] for p in parts]).mean(0) for k in parts[0]}


def closure_error(parts: dict[str, Tensor]) -> float:
    """|heads + attention biases + MLPs + embedding - total|: the bookkeeping of direct attribution."""
    total = parts["heads"].sum() + parts["attn_bias"].sum() + parts["mlp"].sum() + parts["embed"]
    return abs(float(total - parts["total"]))


def steered_samples(model: HookedTransformer, vector: Tensor, layer: int, coef: float, reward_fn,
                    n: int, gen_len: int, seed: int) -> list[tuple[str, float]]:
    """``n`` samples of the course prompt with ``coef * vector`` added to ``blocks.{layer}.hook_resid_pre``."""
    with torch.random.fork_rng(devices=rng_devices(device_of(model))):  # the GPU's stream too
        torch.manual_seed(seed)
        hooks = [(f"blocks.{layer}.hook_resid_pre", steering_hook(vector, coef))] if coef else []
        with model.hooks(fwd_hooks=hooks):
            _, texts = get_samples(model, PROMPTS[0], n, gen_len)
    return list(zip(texts, reward_fn(texts).tolist()))


def first_layer_reaching(lens: Sequence[float], fraction: float = 0.5) -> int:
    """The first index where a lens (one value per layer) has come ``fraction`` of the way to its final
    value, measured from 0 in the final value's sign (the last index when it never does before)."""
    final = float(lens[-1])
    sign = 1.0 if final >= 0 else -1.0
    return next((i for i, v in enumerate(lens) if sign * float(v) >= fraction * abs(final)), len(lens) - 1)


def steering_hook(vector: Float[Tensor, "d"], coef: float) -> Callable:
    """A hook that adds ``coef * vector`` to the residual stream at every position."""

    def hook_fn(resid: Float[Tensor, "b s d"], hook) -> Float[Tensor, "b s d"]:
        return resid + coef * vector

    return hook_fn


def vocab_ranks(vector: Float[Tensor, "d"], W_U: Float[Tensor, "d v"]) -> Float[Tensor, "v"]:
    """Each token's rank when the vocabulary is sorted by ``vector @ W_U`` (largest first), as a fraction
    of the vocabulary: 0 is the top token, 1 the bottom."""
    scores = vector @ W_U
    return scores.argsort(descending=True).argsort().float() / len(scores)


@torch.no_grad()
def word_rank_baseline(vector: Float[Tensor, "d"], W_U: Float[Tensor, "d v"], pos_ids: Tensor, neg_ids: Tensor,
                       n_random: int = 1000, seed: int = 0) -> dict[str, float]:
    """How far ``vector`` separates the negative words from the positive ones in the unembedding, against
    random directions of the residual stream.

        gap(u) = mean rank of the positive words - mean rank of the negative words   (ranks: vocab_ranks(u))

    positive when the negative words rank higher (nearer the top). For ``vector`` and for ``n_random``
    directions drawn uniformly on the unit sphere (seeded; a rank ignores the length): the mean ranks
    of both lists for ``vector``, the random gaps' mean and standard deviation, and the fraction of
    random directions whose gap is at least ``vector``'s (near 0: the separation is unlikely by chance).
    """
    gen = torch.Generator().manual_seed(seed)
    directions = torch.randn(n_random, W_U.shape[0], generator=gen).to(W_U.device, W_U.dtype)  # [n d]
    ranks = torch.cat([vector[None].to(W_U.dtype), directions]) @ W_U  # [1 + n, v]: scores, then ranks
    ranks = ranks.argsort(dim=-1, descending=True).argsort(dim=-1).float() / W_U.shape[1]
    neg, pos = ranks[:, neg_ids.to(W_U.device)].mean(-1), ranks[:, pos_ids.to(W_U.device)].mean(-1)  # [1 + n]
    gaps = pos - neg
    return {"negative_words_mean_rank": float(neg[0]), "positive_words_mean_rank": float(pos[0]),
            "gap": float(gaps[0]), "random_gap_mean": float(gaps[1:].mean()), "random_gap_std": float(gaps[1:].std()),
            "random_negative_rank_mean": float(neg[1:].mean()),
            "random_at_least_gap": float((gaps[1:] >= gaps[0]).float().mean())}
