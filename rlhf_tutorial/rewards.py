"""Chapter 02 reference: rewards for language models, and a Bradley-Terry reward model.

For a language model an episode is one completion: the policy writes tokens one at a time and is
scored once, when it has finished. So a reward here is a function of a whole text, r(x) -> a number
per sample, and it is sparse (it arrives at the last token). This module holds every kind of r the
course uses:

- toy and scripted rewards: :func:`reward_fn_char_count`, :func:`reward_fn_sentiment` (a classifier's
  probability for one label);
- normalisation and shaping: :func:`whiten`, :func:`ngram_repetition`, :func:`length_penalty`,
  :func:`missing_eos_penalty`, :func:`shaped_reward`;
- a learned reward: :class:`RewardModel`, a HookedTransformer backbone with a scalar head, trained on
  preference pairs with the Bradley-Terry loss (:func:`bradley_terry_loss`,
  :func:`reward_model_train_step`).

The loop that trains the reward model (``RewardModelArgs``, ``train_reward_model``, the
``train-reward-model`` command) is running code: it lives in ``rlhf_tutorial.trainers.rewards``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from rlhf_tutorial.devices import device_of

# ----------------------------------------------------------------------------------------------------
# Rewards computed from text
# ----------------------------------------------------------------------------------------------------


def reward_fn_char_count(samples: list[str], char: str = ".") -> Float[Tensor, "batch"]:
    """The toy reward r(x) = number of occurrences of ``char`` in x, one float per sample (float32;
    an empty list of samples gives an empty tensor).

    A policy optimised against it learns to emit ``char`` over and over: the simplest reward hack.
    """
    counts = [float(sample.count(char)) for sample in samples]
    return torch.tensor(counts, dtype=torch.float32)


def reward_fn_sentiment(
    samples: list[str], classifier, tokenizer, direction: str = "pos"
) -> Float[Tensor, "batch"]:
    """r(x) = p_classifier(label | x), label POSITIVE for ``direction="pos"``, NEGATIVE for "neg".

    The label's index is read from ``classifier.config.label2id`` (never assumed), the texts are
    tokenized together with padding (one forward pass per chunk of samples, the attention mask
    passed along so padding changes nothing) and truncated to the classifier's maximum length (a
    longer text is scored on its beginning), on the classifier's device, without gradients.
    Returns float32 probabilities (whatever the classifier's dtype) on the classifier's device; an
    empty list of samples gives an empty tensor. Any other ``direction`` raises a ValueError naming it.
    """
    if direction not in ("pos", "neg"):
        raise ValueError(f"direction must be 'pos' or 'neg', got {direction!r}")
    label = classifier.config.label2id["POSITIVE" if direction == "pos" else "NEGATIVE"]
    device = next(classifier.parameters()).device
    chunk = 64
    probs = []
    with torch.no_grad():
        for start in range(0, len(samples), chunk):
            batch = tokenizer(
                samples[start : start + chunk], padding=True, truncation=True, return_tensors="pt"
            )
            logits: Float[Tensor, "chunk n_labels"] = classifier(
                input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)
            ).logits
            probs.append(logits.float().softmax(dim=-1)[:, label])
    if not probs:
        return torch.zeros(0, dtype=torch.float32, device=device)
    return torch.cat(probs)


def sentiment_reward_fn(world: str | None, direction: str,
                        device: Any = None) -> Callable[[list[str]], Float[Tensor, "batch"]]:
    """The task reward of chapters 03 and 04: ``reward_fn_sentiment`` with the world's classifier (on
    ``device``, default the course's), as a function of the texts alone."""
    from rlhf_tutorial.worlds import load_sentiment_classifier

    classifier, tokenizer = load_sentiment_classifier(world, device=device)

    def reward_fn(texts: list[str]) -> Float[Tensor, "batch"]:
        return reward_fn_sentiment(texts, classifier, tokenizer, direction)

    return reward_fn


def whiten(values: Float[Tensor, "*b"], shift_mean: bool = True, eps: float = 1e-8) -> Float[Tensor, "*b"]:
    """Normalise with statistics over ALL elements: (x - mu) / sqrt(sigma^2 + eps).

    mu and sigma^2 are the mean and the biased variance (divide by N) of every element of ``values``.
    With ``shift_mean=False`` the mean is added back, (x - mu) / sqrt(sigma^2 + eps) + mu: the spread is
    rescaled but the sign and level of the rewards survive.
    """
    mean = values.mean()
    var = ((values - mean) ** 2).mean()  # biased: / N
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def ngram_repetition(samples: list[str], n: int = 3) -> Float[Tensor, "batch"]:
    """Fraction of repeated word n-grams: 1 - (#distinct n-grams) / (#n-grams), per sample.

    Words come from ``str.split()``; an n-gram is a sequence of n consecutive words (("ab", "c") and
    ("a", "bc") are two different ones); a sample with w >= n words has w - n + 1 n-grams. A sample with
    fewer than n words scores 0.0. 0 means no n-gram repeats; it tends to 1 for "great great great ...".
    One float32 per sample (an empty list of samples gives an empty tensor).
    """
    scores = []
    for sample in samples:
        words = sample.split()
        if len(words) < n:
            scores.append(0.0)
            continue
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        scores.append(1.0 - len(set(grams)) / len(grams))
    return torch.tensor(scores, dtype=torch.float32)


# ----------------------------------------------------------------------------------------------------
# Shaping terms: small corrections added to a reward
# ----------------------------------------------------------------------------------------------------


def length_penalty(
    lengths: Int[Tensor, "batch"], coef: float = 0.01, target: int | None = None
) -> Float[Tensor, "batch"]:
    """-coef * length, or -coef * |length - target| when a target length is given."""
    lengths = lengths.float()
    if target is None:
        return -coef * lengths
    return -coef * (lengths - target).abs()


def missing_eos_penalty(
    completion_tokens: Int[Tensor, "batch g"], eos_token_id: int, penalty: float = 1.0
) -> Float[Tensor, "batch"]:
    """-penalty for each completion that never emits the end-of-sequence token, 0 for the others."""
    has_eos = (completion_tokens == eos_token_id).any(dim=-1)
    return torch.where(has_eos, 0.0, -penalty).float()


def shaped_reward(
    scores: Float[Tensor, "batch"],
    samples: list[str],
    *,
    repetition_coef: float = 0.0,
    n: int = 3,
    lengths: Int[Tensor, "batch"] | None = None,
    length_coef: float = 0.0,
    length_target: int | None = None,
    completion_tokens: Int[Tensor, "batch g"] | None = None,
    eos_token_id: int | None = None,
    eos_penalty: float = 0.0,
) -> Float[Tensor, "batch"]:
    """r = scores - repetition_coef * ngram_repetition(samples, n) + length term + missing-EOS term.

    Each term is only added when its coefficient is non-zero (and, for the last two, its inputs are
    given).
    """
    shaped = scores.float().clone()
    if repetition_coef:
        shaped = shaped - repetition_coef * ngram_repetition(samples, n).to(shaped.device)
    if length_coef and lengths is not None:
        shaped = shaped + length_penalty(lengths, length_coef, length_target).to(shaped.device)
    if eos_penalty and completion_tokens is not None and eos_token_id is not None:
        shaped = shaped + missing_eos_penalty(completion_tokens, eos_token_id, eos_penalty).to(shaped.device)
    return shaped


# ----------------------------------------------------------------------------------------------------
# Preference reward model
# ----------------------------------------------------------------------------------------------------


def bradley_terry_loss(
    chosen_rewards: Float[Tensor, "b"], rejected_rewards: Float[Tensor, "b"]
) -> Float[Tensor, ""]:
    """L = -mean_i log sigma(r_chosen_i - r_rejected_i).

    Under the Bradley-Terry model P(chosen > rejected) = sigma(r_c - r_r), so L is the negative
    log-likelihood of the human preferences. log sigma(z) is computed directly, as a log-sigmoid, not
    as the log of a sigmoid: sigmoid(z) underflows to 0, and its log to -inf, once z < -100 or so.
    """
    return -F.logsigmoid(chosen_rewards - rejected_rewards).mean()


def pool_last_token(
    x: Float[Tensor, "b s *feat"], attention_mask: Int[Tensor, "b s"]
) -> Float[Tensor, "b *feat"]:
    """out[b] = x[b, t_b], t_b = the last position with attention_mask[b, t] = 1.

    Works for right padding (real tokens first) and left padding (padding first) alike. Every row
    needs at least one real token. ``x`` may be per-token scores [batch, seq] or hidden states
    [batch, seq, d_model]; the mask may be integer or boolean. ``x`` and the mask are on one device,
    and so is the result (any helper tensor, a range of positions say, is built on ``x``'s device).
    """
    positions = torch.arange(x.shape[1], device=x.device)  # [seq]
    # >>> exercise
    # Real positions keep their index, padding gets -1; the max is the last real position.
    last = torch.where(attention_mask.bool(), positions, -1).max(dim=1).values  # [batch]
    rows = torch.arange(x.shape[0], device=x.device)
    return x[rows, last]
    # <<< exercise


def pool_mean(
    x: Float[Tensor, "b s *feat"], attention_mask: Int[Tensor, "b s"]
) -> Float[Tensor, "b *feat"]:
    """out[b] = sum_t m[b, t] x[b, t] / sum_t m[b, t], the mean over real (unmasked) positions only.

    Padding positions are left out by selection, never multiplied by 0, so that a NaN or inf computed
    at a padding position cannot leak into the mean. ``x`` may be [batch, seq] or [batch, seq, d]; every
    row has at least one real token. The result is on ``x``'s device.
    """
    mask = attention_mask.bool()
    mask = mask.reshape(*mask.shape, *([1] * (x.ndim - 2)))  # [batch, seq, 1, ...] to broadcast
    # >>> exercise
    total = torch.where(mask, x, 0.0).sum(dim=1)  # [batch, *feat]
    count = mask.sum(dim=1).clamp(min=1)  # [batch, 1, ...]
    return total / count
    # <<< exercise


POOLINGS = ("last", "mean_scores", "mean_hidden")


class RewardModel(nn.Module):
    """r_phi(x): a HookedTransformer backbone, a pooling over positions and a scalar head.

    The features are the backbone's final normalised residual stream h[b, t] (the activation at
    ``ln_final.hook_normalized``, what the unembedding reads). Pooling turns [batch, seq, d_model]
    into one number per sequence:

    - "last":        r = head(h[b, last real t]): the last token has attended to the whole text;
    - "mean_scores": r = mean over real t of head(h[b, t]): a score per token, averaged;
    - "mean_hidden": r = head(mean over real t of h[b, t]).

    With a linear head the last two are equal (a linear map commutes with a mean); they differ when
    ``head_hidden`` makes the head a small MLP. The head is created on the base model's device (a GPU
    when the model is on one), so the reward model lives on one device: the backbone's.
    """

    def __init__(self, base_model: HookedTransformer, pooling: str = "last", head_hidden: int | None = None):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.base_model = base_model
        self.pooling = pooling
        d_model = base_model.cfg.d_model
        if head_hidden:
            self.head = nn.Sequential(nn.Linear(d_model, head_hidden), nn.ReLU(), nn.Linear(head_hidden, 1))
        else:
            self.head = nn.Linear(d_model, 1)
        self.head.to(device_of(base_model))  # new layers go where the model is

    def forward(
        self, tokens: Int[Tensor, "b s"], attention_mask: Int[Tensor, "b s"] | None = None
    ) -> Float[Tensor, "b"]:
        """One reward per sequence. ``attention_mask`` (1 = real token, 0 = padding) defaults to all ones
        (on the tokens' device). ``tokens`` and the mask are on the model's device, and so is the result.

        Step 1: run the backbone with the attention mask (so that no real token attends to padding,
        and positions count from the first real token) and keep ``ln_final.hook_normalized`` from a
        hook (not from ``run_with_cache``, which detaches it: no gradient would reach the backbone);
        the unembedding is not needed. Step 2: pool as ``self.pooling`` says, one reward per sequence
        (shape [batch], a batch of one included). Gradients reach the backbone and the head whatever
        the pooling.
        """
        # >>> exercise
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens)
        stored: list[Tensor] = []

        def keep(activation: Float[Tensor, "b s d_model"], hook) -> None:
            stored.append(activation)

        self.base_model.run_with_hooks(
            tokens,
            attention_mask=attention_mask,
            return_type=None,
            fwd_hooks=[("ln_final.hook_normalized", keep)],
        )
        hidden: Float[Tensor, "b s d_model"] = stored[0]
        if self.pooling == "last":
            return self.head(pool_last_token(hidden, attention_mask)).squeeze(-1)
        if self.pooling == "mean_scores":
            scores: Float[Tensor, "b s"] = self.head(hidden).squeeze(-1)
            return pool_mean(scores, attention_mask)
        return self.head(pool_mean(hidden, attention_mask)).squeeze(-1)
        # <<< exercise


def reward_model_train_step(
    model: RewardModel,
    optimizer: torch.optim.Optimizer,
    chosen_tokens: Int[Tensor, "b s1"],
    chosen_mask: Int[Tensor, "b s1"],
    rejected_tokens: Int[Tensor, "b s2"],
    rejected_mask: Int[Tensor, "b s2"],
) -> dict[str, float]:
    """One optimizer step on the Bradley-Terry loss of a batch of preference pairs.

    r_c = model(chosen), r_r = model(rejected), L = bradley_terry_loss(r_c, r_r); clear old gradients,
    backpropagate L, step. The token batches and masks are on the model's device. Returns, measured
    on this batch before the step: ``loss`` (L), ``accuracy`` (fraction of pairs with r_c > r_r) and
    ``margin`` (mean of r_c - r_r), as Python floats.
    """
    chosen_rewards = model(chosen_tokens, chosen_mask)
    rejected_rewards = model(rejected_tokens, rejected_mask)
    loss = bradley_terry_loss(chosen_rewards, rejected_rewards)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    margin = (chosen_rewards - rejected_rewards).detach()
    return {
        "loss": loss.item(),
        "accuracy": (margin > 0).float().mean().item(),
        "margin": margin.mean().item(),
    }


# ----------------------------------------------------------------------------------------------------
# Data: preference pairs -> padded token batches
# ----------------------------------------------------------------------------------------------------


def pair_texts(pair: dict) -> tuple[str, str]:
    """The two full texts a reward model scores for one pair: prompt + chosen, prompt + rejected.

    The completions are appended to the prompt as they are when either side already carries the
    separating whitespace, and joined with one space otherwise.
    """

    def join(prompt: str, completion: str) -> str:
        if not prompt or not completion or prompt[-1].isspace() or completion[0].isspace():
            return prompt + completion
        if completion[0] in ".,;:!?'":
            return prompt + completion
        return prompt + " " + completion

    prompt = pair.get("prompt", "")
    return join(prompt, pair["chosen"]), join(prompt, pair["rejected"])


def tokenize_texts(
    model: HookedTransformer, texts: Sequence[str], max_len: int | None = None
) -> tuple[Int[Tensor, "n s"], Int[Tensor, "n s"]]:
    """Tokenize with a BOS token, keep at most ``max_len`` tokens, right-pad; return (tokens, mask),
    on the CPU: a data set, kept in host memory; batches go to the model's device when they are used
    (:meth:`PairBatch.select`).

    The mask is built from the lengths, not from the pad id: GPT-2's pad, BOS and EOS are one token.
    """
    max_len = max_len or model.cfg.n_ctx
    rows = [model.to_tokens(text, prepend_bos=True)[0, :max_len] for text in texts]
    seq = max((len(r) for r in rows), default=1)
    pad_id = getattr(model.tokenizer, "pad_token_id", None) or 0
    tokens = torch.full((len(rows), seq), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), seq), dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row.cpu()
        mask[i, : len(row)] = 1
    return tokens, mask


@dataclass
class PairBatch:
    """Tokenized preference pairs (right-padded, with masks)."""

    chosen_tokens: Int[Tensor, "n s1"]
    chosen_mask: Int[Tensor, "n s1"]
    rejected_tokens: Int[Tensor, "n s2"]
    rejected_mask: Int[Tensor, "n s2"]

    def __len__(self) -> int:
        return self.chosen_tokens.shape[0]

    def select(self, idx: Tensor, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Rows ``idx``, with the columns that are padding in every selected row trimmed off."""

        def trim(tokens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
            tokens, mask = tokens[idx], mask[idx]
            width = int(mask.sum(dim=1).max())
            return tokens[:, :width].to(device), mask[:, :width].to(device)

        return (*trim(self.chosen_tokens, self.chosen_mask), *trim(self.rejected_tokens, self.rejected_mask))


def tokenize_pairs(model: HookedTransformer, pairs: Sequence[dict], max_len: int | None = None) -> PairBatch:
    """Both sides of every pair (see :func:`pair_texts`) tokenized with :func:`tokenize_texts`."""
    texts = [pair_texts(p) for p in pairs]
    chosen = tokenize_texts(model, [c for c, _ in texts], max_len)
    rejected = tokenize_texts(model, [r for _, r in texts], max_len)
    return PairBatch(*chosen, *rejected)


@torch.no_grad()
def score_texts(
    model: RewardModel, texts: Sequence[str], batch_size: int = 64, max_len: int | None = None
) -> Float[Tensor, "n"]:
    """The reward model's score of each text (no gradients), on CPU (the texts are scored on the
    model's device)."""
    device = device_of(model)
    tokens, mask = tokenize_texts(model.base_model, texts, max_len)
    scores = []
    for start in range(0, len(texts), batch_size):
        t, m = tokens[start : start + batch_size], mask[start : start + batch_size]
        width = int(m.sum(dim=1).max())
        scores.append(model(t[:, :width].to(device), m[:, :width].to(device)).float().cpu())
    return torch.cat(scores) if scores else torch.zeros(0)


@torch.no_grad()
def evaluate_pairs(model: RewardModel, data: PairBatch, batch_size: int = 64) -> dict[str, float]:
    """Held-out metrics: pairwise accuracy (fraction with r_c > r_r; ties count as wrong), BT loss, margin.
    ``data`` may stay on the CPU: each batch is moved to the model's device."""
    device = device_of(model)
    length = torch.maximum(data.chosen_mask.sum(1), data.rejected_mask.sum(1))
    margins = []
    for idx in length.argsort(stable=True).split(batch_size):  # similar lengths together: less padding
        ct, cm, rt, rm = data.select(idx, device)
        margins.append((model(ct, cm) - model(rt, rm)).float().cpu())
    margin = torch.cat(margins)
    return {
        "accuracy": (margin > 0).float().mean().item(),
        "loss": -F.logsigmoid(margin).mean().item(),
        "margin": margin.mean().item(),
    }


