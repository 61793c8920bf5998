"""Checkers of chapter 02: the reference passes, the stub fails, catalogued mistakes get their hint, and
correct code written differently passes."""

from collections import Counter

import einops
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from rlhf_tutorial import rewards
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.checks.core import check_device
from tests.checks.helpers import assert_fails_with

# A learner's own device bug (a tensor or a layer left on the CPU beside a model on the GPU) only shows
# where the checkers run on another device than the CPU.
needs_gpu = pytest.mark.skipif(check_device().type == "cpu", reason="needs a GPU or RLHF_TUTORIAL_DEVICE=simgpu")
DEVICE_MIX = "your code mixed devices"


# ----------------------------------------------------------------------------------------------------
# reward_fn_char_count
# ----------------------------------------------------------------------------------------------------
def count_length(samples, char="."):
    return torch.tensor([float(len(s)) for s in samples])


def count_dots_only(samples, char="."):
    return torch.tensor([float(s.count(".")) for s in samples])


def count_presence(samples, char="."):
    return torch.tensor([1.0 if char in s else 0.0 for s in samples])


def count_as_int(samples, char="."):
    return torch.tensor([s.count(char) for s in samples])


def count_as_list(samples, char="."):
    return [float(s.count(char)) for s in samples]


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (count_length, "length of each sample"),
        (count_dots_only, "use the `char` argument"),
        (count_presence, "count every occurrence"),
        (count_as_int, "float32"),
        (count_as_list, "torch.Tensor"),
    ],
)
def test_char_count_mistakes(wrong, fragment):
    assert_fails_with("reward_fn_char_count", wrong, fragment)


def test_char_count_written_differently():
    def by_loop(samples, char="."):
        out = torch.zeros(len(samples))
        for i, s in enumerate(samples):
            for c in s:
                if c == char:
                    out[i] += 1
        return out

    assert run_check("reward_fn_char_count", by_loop).passed


# ----------------------------------------------------------------------------------------------------
# reward_fn_sentiment
# ----------------------------------------------------------------------------------------------------
def _encode(tokenizer, samples, classifier):
    enc = tokenizer(samples, padding=True, truncation=True, return_tensors="pt")
    return {k: v.to(classifier.device) for k, v in enc.items()}


def sentiment_index_one(samples, classifier, tokenizer, direction="pos"):
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        probs = classifier(**enc).logits.softmax(-1)
    return probs[:, 1] if direction == "pos" else probs[:, 0]


def sentiment_logits(samples, classifier, tokenizer, direction="pos"):
    enc = _encode(tokenizer, samples, classifier)
    label = classifier.config.label2id["POSITIVE" if direction == "pos" else "NEGATIVE"]
    with torch.no_grad():
        return classifier(**enc).logits[:, label]


def sentiment_without_mask(samples, classifier, tokenizer, direction="pos"):
    enc = _encode(tokenizer, samples, classifier)
    label = classifier.config.label2id["POSITIVE" if direction == "pos" else "NEGATIVE"]
    with torch.no_grad():
        return classifier(enc["input_ids"]).logits.softmax(-1)[:, label]


def sentiment_with_grad(samples, classifier, tokenizer, direction="pos"):
    enc = _encode(tokenizer, samples, classifier)
    label = classifier.config.label2id["POSITIVE" if direction == "pos" else "NEGATIVE"]
    return classifier(**enc).logits.softmax(-1)[:, label]


def sentiment_one_by_one(samples, classifier, tokenizer, direction="pos"):
    label = classifier.config.label2id["POSITIVE" if direction == "pos" else "NEGATIVE"]
    out = []
    with torch.no_grad():
        for s in samples:
            out.append(classifier(**_encode(tokenizer, [s], classifier)).logits.softmax(-1)[0, label])
    return torch.stack(out)


def sentiment_ignores_direction(samples, classifier, tokenizer, direction="pos"):
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        return classifier(**enc).logits.softmax(-1)[:, classifier.config.label2id["POSITIVE"]]


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (sentiment_index_one, "label2id"),
        (sentiment_logits, "raw logits"),
        (sentiment_without_mask, "attention mask"),
        (sentiment_with_grad, "gradient tracking"),
        (sentiment_one_by_one, "one forward pass per sample"),
        (sentiment_ignores_direction, "NEGATIVE label"),
    ],
)
def test_sentiment_mistakes(wrong, fragment):
    assert_fails_with("reward_fn_sentiment", wrong, fragment)


def sentiment_batch_left_on_the_cpu(samples, classifier, tokenizer, direction="pos"):
    label = classifier.config.label2id[{"pos": "POSITIVE", "neg": "NEGATIVE"}[direction]]
    if not samples:
        return torch.zeros(0, device=classifier.device)
    enc = tokenizer(samples, padding=True, truncation=True, return_tensors="pt")  # never moved
    with torch.no_grad():
        return classifier(**enc).logits.float().softmax(-1)[:, label]


@needs_gpu
def test_sentiment_batch_left_on_the_cpu_gets_the_device_message():
    assert_fails_with("reward_fn_sentiment", sentiment_batch_left_on_the_cpu, DEVICE_MIX)
    assert_fails_with("reward_fn_sentiment", sentiment_batch_left_on_the_cpu, "classifier(**enc)")  # their line


def test_sentiment_written_differently():
    def via_id2label(samples, classifier, tokenizer, direction="pos"):
        wanted = {"pos": "POSITIVE", "neg": "NEGATIVE"}[direction]
        label = next(i for i, name in classifier.config.id2label.items() if name == wanted)
        device = classifier.device
        if not samples:
            return torch.empty(0, device=device)
        enc = {k: v.to(device) for k, v in tokenizer(samples, return_tensors="pt", padding="longest",
                                                     truncation="longest_first").items()}
        with torch.inference_mode():
            log_probs = classifier(**enc).logits.double().log_softmax(dim=1)
        return log_probs[:, label].exp().float()

    result = run_check("reward_fn_sentiment", via_id2label)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# whiten
# ----------------------------------------------------------------------------------------------------
def whiten_unbiased(values, shift_mean=True, eps=1e-8):
    out = (values - values.mean()) / torch.sqrt(values.var() + eps)
    return out if shift_mean else out + values.mean()


def whiten_per_row(values, shift_mean=True, eps=1e-8):
    mean = values.mean(dim=-1, keepdim=True)
    var = values.var(dim=-1, unbiased=False, keepdim=True)
    out = (values - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


def whiten_always_centred(values, shift_mean=True, eps=1e-8):
    return (values - values.mean()) * torch.rsqrt(values.var(unbiased=False) + eps)


def whiten_scale_only_when_kept(values, shift_mean=True, eps=1e-8):
    var = values.var(unbiased=False)
    if shift_mean:
        return (values - values.mean()) * torch.rsqrt(var + eps)
    return values * torch.rsqrt(var + eps)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (whiten_unbiased, "unbiased variance"),
        (whiten_per_row, "per-row statistics"),
        (whiten_always_centred, "mean must be added back"),
        (whiten_scale_only_when_kept, "scaling the uncentred values"),
    ],
)
def test_whiten_mistakes(wrong, fragment):
    assert_fails_with("whiten", wrong, fragment)


def whiten_in_place(values, shift_mean=True, eps=1e-8):
    mean, var = values.mean(), values.var(unbiased=False)
    values -= mean
    values *= torch.rsqrt(var + eps)
    return values if shift_mean else values + mean


def test_whiten_rejects_in_place_updates():
    assert_fails_with("whiten", whiten_in_place, "in place")


def test_whiten_written_differently():
    def with_einops(values, shift_mean=True, eps=1e-8):
        flat = einops.rearrange(values, "... -> (...)")
        n = flat.numel()
        mu = flat.sum() / n
        sigma2 = ((flat - mu) ** 2).sum() / n
        out = (values - mu) / torch.sqrt(sigma2 + eps)
        if not shift_mean:
            out = out + mu
        return out

    result = run_check("whiten", with_einops)
    assert result.passed, result.message


def whiten_var_mean(values, shift_mean=True, eps=1e-8):
    var, mean = torch.var_mean(values, correction=0)
    out = (values - mean) / torch.sqrt(var + eps)
    return out if shift_mean else out + mean


def whiten_layer_norm(values, shift_mean=True, eps=1e-8):
    out = F.layer_norm(values, values.shape, eps=eps)  # one mean and biased variance over every element
    return out if shift_mean else out + values.mean()


def whiten_float64_statistics(values, shift_mean=True, eps=1e-8):
    x = values.double()
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    out = (x - mean) / torch.sqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out.to(values.dtype)


@pytest.mark.parametrize("right", [whiten_var_mean, whiten_layer_norm, whiten_float64_statistics])
def test_whiten_other_statistics_pass(right):
    """Where the values are all equal the exact answer is 0 (or the mean): a correct whitening whose mean is
    summed differently from the reference's must not be held to the reference's rounding there."""
    result = run_check("whiten", right)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# ngram_repetition
# ----------------------------------------------------------------------------------------------------
def repetition_characters(samples, n=3):
    out = []
    for s in samples:
        grams = [s[i : i + n] for i in range(len(s) - n + 1)]
        out.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return torch.tensor(out)


def repetition_unique_fraction(samples, n=3):
    out = []
    for s in samples:
        w = s.split()
        grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
        out.append(len(set(grams)) / len(grams) if grams else 0.0)
    return torch.tensor(out)


def repetition_split_space(samples, n=3):
    out = []
    for s in samples:
        w = s.split(" ")
        grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
        out.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return torch.tensor(out)


def repetition_over_words(samples, n=3):
    out = []
    for s in samples:
        w = s.split()
        grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
        out.append(1 - len(set(grams)) / len(w) if grams else 0.0)
    return torch.tensor(out)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (repetition_characters, "character n-grams"),
        (repetition_unique_fraction, "1 - unique / total"),
        (repetition_split_space, "split()"),
        (repetition_over_words, "w - n + 1"),
    ],
)
def test_ngram_mistakes(wrong, fragment):
    assert_fails_with("ngram_repetition", wrong, fragment)


def test_ngram_written_differently():
    def with_counter(samples, n=3):
        scores = torch.zeros(len(samples), dtype=torch.float32)
        for i, text in enumerate(samples):
            words = text.split()
            counts = Counter(zip(*(words[k:] for k in range(n))))
            total = sum(counts.values())
            if total:
                scores[i] = sum(c - 1 for c in counts.values()) / total
        return scores

    result = run_check("ngram_repetition", with_counter)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# bradley_terry_loss
# ----------------------------------------------------------------------------------------------------
def bt_swapped(chosen_rewards, rejected_rewards):
    return -F.logsigmoid(rejected_rewards - chosen_rewards).mean()


def bt_unstable(chosen_rewards, rejected_rewards):
    return -torch.log(torch.sigmoid(chosen_rewards - rejected_rewards)).mean()


def bt_eps_in_log(chosen_rewards, rejected_rewards):
    return -torch.log(torch.sigmoid(chosen_rewards - rejected_rewards) + 1e-6).mean()


def bt_tiny_clamp(chosen_rewards, rejected_rewards):
    return -torch.log(torch.sigmoid(chosen_rewards - rejected_rewards).clamp(min=1e-30)).mean()


def bt_sum(chosen_rewards, rejected_rewards):
    return -F.logsigmoid(chosen_rewards - rejected_rewards).sum()


def bt_no_log(chosen_rewards, rejected_rewards):
    return -torch.sigmoid(chosen_rewards - rejected_rewards).mean()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (bt_swapped, "swapped"),
        (bt_unstable, "sigmoid underflows"),
        (bt_eps_in_log, "saturates"),
        (bt_tiny_clamp, "saturates for large differences"),
        (bt_sum, "take the mean"),
        (bt_no_log, "LOG of the sigmoid"),
    ],
)
def test_bradley_terry_mistakes(wrong, fragment):
    assert_fails_with("bradley_terry_loss", wrong, fragment)


def test_bradley_terry_written_differently():
    def softplus_form(chosen_rewards, rejected_rewards):
        return F.softplus(rejected_rewards - chosen_rewards).mean()

    def by_cases(chosen_rewards, rejected_rewards):
        d = chosen_rewards - rejected_rewards
        # log(1 + e^-d) computed so that the exponent is never positive
        loss = torch.where(d > 0, torch.log1p(torch.exp(-d.abs())), -d + torch.log1p(torch.exp(-d.abs())))
        return loss.sum() / d.numel()

    for fn in (softplus_form, by_cases):
        result = run_check("bradley_terry_loss", fn)
        assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# pooling
# ----------------------------------------------------------------------------------------------------
def last_position(x, attention_mask):
    return x[:, -1]


def last_by_count(x, attention_mask):
    idx = attention_mask.long().sum(dim=1) - 1
    return x[torch.arange(x.shape[0]), idx]


def first_real_by_argmax(x, attention_mask):
    return x[torch.arange(x.shape[0]), attention_mask.long().argmax(dim=1)]


def last_by_one_hot(x, attention_mask):  # only inf at a padding position exposes it: 0 * inf = NaN
    positions = torch.where(attention_mask.bool(), torch.arange(x.shape[1], device=x.device), -1)
    one_hot = F.one_hot(positions.max(dim=1).values, x.shape[1]).to(x.dtype)
    return (x * one_hot.reshape(*one_hot.shape, *([1] * (x.ndim - 2)))).sum(1)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (last_by_one_hot, "0 * inf = NaN"),
        (last_position, "padding for the shorter rows"),
        (last_by_count, "only with right padding"),
        (first_real_by_argmax, "FIRST real position"),
    ],
)
def test_pool_last_token_mistakes(wrong, fragment):
    assert_fails_with("pool_last_token", wrong, fragment)


def last_with_positions_on_the_cpu(x, attention_mask):
    positions = torch.arange(x.shape[1])  # no device=x.device: on the CPU
    last = torch.where(attention_mask.bool(), positions, -1).max(dim=1).values
    return x[torch.arange(x.shape[0]), last]


@needs_gpu
def test_pool_last_token_positions_on_the_cpu_get_the_device_message():
    assert_fails_with("pool_last_token", last_with_positions_on_the_cpu, DEVICE_MIX)
    assert_fails_with("pool_last_token", last_with_positions_on_the_cpu, "device=x.device")  # the fix


def test_pool_last_token_written_differently():
    def by_loop(x, attention_mask):
        rows = []
        for b in range(x.shape[0]):
            last = attention_mask[b].nonzero()[-1].item()
            rows.append(x[b, last])
        return torch.stack(rows)

    def by_flip(x, attention_mask):
        seq = attention_mask.shape[1]
        from_end = attention_mask.long().flip(1).argmax(1)  # first real token counted from the end
        return x[torch.arange(x.shape[0]), seq - 1 - from_end]

    for fn in (by_loop, by_flip):
        result = run_check("pool_last_token", fn)
        assert result.passed, result.message


def mean_with_padding(x, attention_mask):
    return x.mean(dim=1)


def mean_over_full_length(x, attention_mask):
    m = attention_mask.float().reshape(*attention_mask.shape, *([1] * (x.ndim - 2)))
    return (x * m).sum(1) / x.shape[1]


def masked_sum(x, attention_mask):
    m = attention_mask.float().reshape(*attention_mask.shape, *([1] * (x.ndim - 2)))
    return (x * m).sum(1)


def mean_by_multiplying_the_mask(x, attention_mask):  # only inf at a padding position exposes it
    m = attention_mask.to(x.dtype).reshape(*attention_mask.shape, *([1] * (x.ndim - 2)))
    return (x * m).sum(1) / m.sum(1)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (mean_by_multiplying_the_mask, "0 * inf = NaN"),
        (mean_with_padding, "averages the padding"),
        (mean_over_full_length, "divided by the full length"),
        (masked_sum, "That is a sum"),
    ],
)
def test_pool_mean_mistakes(wrong, fragment):
    assert_fails_with("pool_mean", wrong, fragment)


def test_pool_mean_written_differently():
    def by_loop(x, attention_mask):
        return torch.stack([x[b][attention_mask[b].bool()].mean(0) for b in range(x.shape[0])])

    result = run_check("pool_mean", by_loop)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# RewardModel: variants subclass the reference so that __init__ (given to learners) is the same
# ----------------------------------------------------------------------------------------------------
def _hidden(model, tokens, attention_mask, use_mask=True, hook="ln_final.hook_normalized"):
    store = []
    model.base_model.run_with_hooks(
        tokens, attention_mask=attention_mask if use_mask else None, return_type=None,
        fwd_hooks=[(hook, lambda act, hook: store.append(act))],
    )
    return store[0]


def _pool(model, h, mask):
    if model.pooling == "last":
        return model.head(rewards.pool_last_token(h, mask)).squeeze(-1)
    if model.pooling == "mean_scores":
        return rewards.pool_mean(model.head(h).squeeze(-1), mask)
    return model.head(rewards.pool_mean(h, mask)).squeeze(-1)


class RMLastPosition(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        h = _hidden(self, tokens, mask)
        if self.pooling == "last":
            return self.head(h[:, -1]).squeeze(-1)
        return _pool(self, h, mask)


class RMBackboneWithoutMask(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        return _pool(self, _hidden(self, tokens, mask, use_mask=False), mask)


class RMBeforeLayerNorm(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        hook = f"blocks.{self.base_model.cfg.n_layers - 1}.hook_resid_post"
        return _pool(self, _hidden(self, tokens, mask, hook=hook), mask)


class RMRunWithCache(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        _, cache = self.base_model.run_with_cache(tokens, attention_mask=mask, return_type=None)
        return _pool(self, cache["ln_final.hook_normalized"], mask)


class RMMeanIncludesPadding(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        h = _hidden(self, tokens, mask)
        if self.pooling == "mean_scores":
            return self.head(h).squeeze(-1).mean(1)
        if self.pooling == "mean_hidden":
            return self.head(h.mean(1)).squeeze(-1)
        return _pool(self, h, mask)


class RMSwappedMeans(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        h = _hidden(self, tokens, mask)
        if self.pooling == "mean_scores":
            return self.head(rewards.pool_mean(h, mask)).squeeze(-1)
        if self.pooling == "mean_hidden":
            return rewards.pool_mean(self.head(h).squeeze(-1), mask)
        return _pool(self, h, mask)


class RMNoSqueeze(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        return _pool(self, _hidden(self, tokens, mask), mask).unsqueeze(-1)


class RMSqueezeEverything(rewards.RewardModel):  # only a batch of 1 exposes it: the output is 0-d there
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        return _pool(self, _hidden(self, tokens, mask), mask).unsqueeze(-1).squeeze()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (RMSqueezeEverything, "squeeze() without a dim"),
        (RMLastPosition, "padding for the shorter rows"),
        (RMBackboneWithoutMask, "without the attention mask"),
        (RMBeforeLayerNorm, "BEFORE the final LayerNorm"),
        (RMRunWithCache, "run_with_cache stores DETACHED"),
        (RMMeanIncludesPadding, "includes the padding"),
        (RMSwappedMeans, "'mean_scores' applies the head to every position"),
        (RMNoSqueeze, "missing squeeze"),
    ],
)
def test_reward_model_mistakes(wrong, fragment):
    assert_fails_with("RewardModel", wrong, fragment)


def test_reward_model_written_differently():
    class ViaStopAtLayer(rewards.RewardModel):
        """Features from stop_at_layer + ln_final (equal to hook_normalized while ln_final's affine
        weights are the identity, as in a freshly initialised model), pooling written inline."""

        def forward(self, tokens, attention_mask=None):
            if attention_mask is None:
                attention_mask = torch.ones(tokens.shape, dtype=torch.long, device=tokens.device)
            resid = self.base_model(tokens, attention_mask=attention_mask, stop_at_layer=self.base_model.cfg.n_layers)
            h = self.base_model.ln_final(resid)
            m = attention_mask.float()
            if self.pooling == "last":
                idx = (m * torch.arange(1, m.shape[1] + 1, device=m.device)).argmax(1)
                return self.head(h[torch.arange(h.shape[0]), idx])[:, 0]
            if self.pooling == "mean_scores":
                s = self.head(h)[..., 0]
                return (s * m).sum(1) / m.sum(1)
            pooled = einops.einsum(h, m, "b s d, b s -> b d") / m.sum(1, keepdim=True)
            return self.head(pooled)[:, 0]

    result = run_check("RewardModel", ViaStopAtLayer)
    assert result.passed, result.message


class RMHeadLeftOnTheCPU(rewards.RewardModel):
    """A head built in __init__ with nn.Linear(d_model, 1) and never moved to the model's device."""

    def __init__(self, base_model, pooling="last", head_hidden=None):
        super().__init__(base_model, pooling, head_hidden)
        d = base_model.cfg.d_model
        if head_hidden:
            self.head = nn.Sequential(nn.Linear(d, head_hidden), nn.ReLU(), nn.Linear(head_hidden, 1))
        else:
            self.head = nn.Linear(d, 1)


class RMDefaultMaskOnTheCPU(rewards.RewardModel):
    """Right everywhere, except the default mask: torch.ones(tokens.shape) with no device."""

    def forward(self, tokens, attention_mask=None):
        mask = torch.ones(tokens.shape, dtype=torch.long) if attention_mask is None else attention_mask
        return _pool(self, _hidden(self, tokens, mask), mask)


@needs_gpu
def test_reward_model_head_on_the_cpu_gets_the_device_message():
    result = run_check("RewardModel", RMHeadLeftOnTheCPU)
    assert not result.passed
    assert f"your head is on cpu, the model on {check_device()}" in result.message, result.message


@needs_gpu
def test_reward_model_default_mask_on_the_cpu_gets_the_device_message():
    result = run_check("RewardModel", RMDefaultMaskOnTheCPU)
    assert not result.passed
    assert DEVICE_MIX in result.message and "not in your code" not in result.message, result.message


# ----------------------------------------------------------------------------------------------------
# reward_model_train_step
# ----------------------------------------------------------------------------------------------------
def _metrics(rc, rr, loss):
    d = (rc - rr).detach()
    return {"loss": loss.item(), "accuracy": (d > 0).float().mean().item(), "margin": d.mean().item()}


def step_swapped(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rr - rc).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return _metrics(rc, rr, loss)


def step_no_zero_grad(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).mean()
    loss.backward()
    optimizer.step()
    return _metrics(rc, rr, loss)


def step_no_step(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).mean()
    optimizer.zero_grad()
    loss.backward()
    return _metrics(rc, rr, loss)


def step_no_masks(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct), model(rt)
    loss = -F.logsigmoid(rc - rr).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return _metrics(rc, rr, loss)


def step_returns_loss_only(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def step_ties_count_as_correct(model, optimizer, ct, cm, rt, rm):  # only a tied pair exposes it
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    d = (rc - rr).detach()
    return {"loss": loss.item(), "accuracy": (d >= 0).float().mean().item(), "margin": d.mean().item()}


@pytest.mark.cpu_only  # a wrong version is judged on the CPU pass, which make unit runs: no GPU pass follows
@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (step_ties_count_as_correct, "A tie"),
        (step_swapped, "swapped"),
        (step_no_zero_grad, "zero_grad"),
        (step_no_step, "optimizer must step"),
        (step_no_masks, "masks were not passed"),
        (step_returns_loss_only, "expected a dict"),
    ],
)
def test_train_step_mistakes(wrong, fragment):
    assert_fails_with("reward_model_train_step", wrong, fragment)


def test_train_step_written_differently():
    def one_forward(model, optimizer, ct, cm, rt, rm):
        """Both sides in one right-padded batch, zero_grad after the step, the softplus form of the loss."""
        width = max(ct.shape[1], rt.shape[1])
        pad = lambda t: F.pad(t, (0, width - t.shape[1]))  # noqa: E731
        tokens = torch.cat([pad(ct), pad(rt)])
        mask = torch.cat([pad(cm), pad(rm)])
        rc, rr = model(tokens, mask).chunk(2)
        loss = F.softplus(rr - rc).mean()
        loss.backward()
        optimizer.step()
        model.zero_grad()
        return {"loss": loss, "accuracy": float((rc > rr).sum()) / len(rc), "margin": (rc - rr).mean()}

    result = run_check("reward_model_train_step", one_forward)
    assert result.passed, result.message


def step_bce_with_cpu_labels(model, optimizer, ct, cm, rt, rm):
    """The Bradley-Terry loss as a binary cross-entropy with target 1, the targets built on the CPU."""
    rc, rr = model(ct, cm), model(rt, rm)
    loss = F.binary_cross_entropy_with_logits(rc - rr, torch.ones(rc.shape[0]))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return _metrics(rc, rr, loss)


def step_bce_with_labels_on_the_device(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = F.binary_cross_entropy_with_logits(rc - rr, torch.ones_like(rc))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return _metrics(rc, rr, loss)


@needs_gpu
def test_train_step_targets_on_the_cpu_get_the_device_message():
    result = run_check("reward_model_train_step", step_bce_with_cpu_labels)
    assert not result.passed
    assert DEVICE_MIX in result.message and "not in your code" not in result.message, result.message
    # the same step with its targets on the model's device is right
    fixed = run_check("reward_model_train_step", step_bce_with_labels_on_the_device)
    assert fixed.passed, fixed.message


# ----------------------------------------------------------------------------------------------------
# Escapes only a variant or an edge case exposes (issue 15)
# ----------------------------------------------------------------------------------------------------
def ngram_lowercased(samples, n=3):
    scores = []
    for sample in samples:
        words = sample.lower().split()
        grams = list(zip(*(words[i:] for i in range(n))))
        scores.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return torch.tensor(scores)


def ngram_punctuation_stripped(samples, n=3):
    scores = []
    for sample in samples:
        words = [w.strip(".,!?") for w in sample.split()]
        grams = list(zip(*(words[i:] for i in range(n))))
        scores.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return torch.tensor(scores)


@pytest.mark.parametrize("wrong, fragment", [(ngram_lowercased, "lowercased"),
                                             (ngram_punctuation_stripped, "punctuation")])
def test_ngram_text_variants_are_rejected(wrong, fragment):
    assert_fails_with("ngram_repetition", wrong, fragment)


def sentiment_index_one_and_no_mask(samples, classifier, tokenizer, direction="pos"):
    batch = tokenizer(samples, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = classifier(batch["input_ids"].to(classifier.device)).logits
    return logits.softmax(-1)[:, 1 if direction == "pos" else 0]


def test_sentiment_two_mistakes_at_once_names_the_label_index():
    assert_fails_with("reward_fn_sentiment", sentiment_index_one_and_no_mask, "label2id")


def bt_log1p_exp(chosen_rewards, rejected_rewards):
    return torch.log(1 + torch.exp(-(chosen_rewards - rejected_rewards))).mean()


def bt_exp_positive(chosen_rewards, rejected_rewards):
    x = chosen_rewards - rejected_rewards
    return -(x - torch.log1p(torch.exp(x))).mean()


def bt_log_sigmoid(chosen_rewards, rejected_rewards):
    return -torch.log(torch.sigmoid(chosen_rewards - rejected_rewards)).mean()


@pytest.mark.parametrize("wrong, fragment", [(bt_log1p_exp, "exp overflows"), (bt_exp_positive, "exp overflows"),
                                             (bt_log_sigmoid, "sigmoid underflows")])
def test_bradley_terry_infinite_loss_names_the_true_cause(wrong, fragment):
    assert_fails_with("bradley_terry_loss", wrong, fragment)


def char_count_case_insensitive(samples, char="."):  # only a capital letter in the text exposes it
    return torch.tensor([float(s.lower().count(char.lower())) for s in samples])


def test_char_count_case_variant_is_rejected():
    assert_fails_with("reward_fn_char_count", char_count_case_insensitive, "lowercased")


def whiten_without_eps(values, shift_mean=True, eps=1e-8):  # only all-equal values (variance 0) expose it
    mean = values.mean()
    out = (values - mean) / values.std(unbiased=False)
    return out if shift_mean else out + mean


def test_whiten_without_eps_is_rejected():
    assert_fails_with("whiten", whiten_without_eps, "all-equal values")


# ----------------------------------------------------------------------------------------------------
# The contract clause by clause (CLAUSES in rlhf_tutorial/checks/ch02_rewards.py): more wrong versions,
# each breaking one clause; tests/checks/test_contract_clauses.py runs every one against its checker
# ----------------------------------------------------------------------------------------------------
def count_words(samples, char="."):
    return torch.tensor([float(len(s.split())) for s in samples])


def count_by_stacking(samples, char="."):  # torch.stack of nothing fails: an empty batch is a batch
    return torch.stack([torch.tensor(float(s.count(char))) for s in samples])


def _sentiment_column(classifier, direction):
    return classifier.config.label2id["POSITIVE" if direction == "pos" else "NEGATIVE"]


def sentiment_label_from_key_order(samples, classifier, tokenizer, direction="pos"):
    """The label's position among label2id's keys: its id only while the keys are listed in id order."""
    names = list(classifier.config.label2id)
    label = names.index("POSITIVE" if direction == "pos" else "NEGATIVE")
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        return classifier(**enc).logits.softmax(-1)[:, label]


def sentiment_label_from_id2label_order(samples, classifier, tokenizer, direction="pos"):
    """The scores as a dict {label name: column}, the columns paired with id2label's names in its key order."""
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        probs = classifier(**enc).logits.softmax(-1)
    by_name = dict(zip(classifier.config.id2label.values(), probs.unbind(-1)))
    return by_name["POSITIVE" if direction == "pos" else "NEGATIVE"]


def sentiment_softmax_over_batch(samples, classifier, tokenizer, direction="pos"):
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        return classifier(**enc).logits.softmax(0)[:, _sentiment_column(classifier, direction)]


def sentiment_sigmoid(samples, classifier, tokenizer, direction="pos"):
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        return classifier(**enc).logits[:, _sentiment_column(classifier, direction)].sigmoid()


def sentiment_without_truncation(samples, classifier, tokenizer, direction="pos"):
    enc = tokenizer(samples, padding=True, return_tensors="pt").to(classifier.device)
    with torch.no_grad():
        return classifier(**enc).logits.softmax(-1)[:, _sentiment_column(classifier, direction)]


def sentiment_truncated_to_512(samples, classifier, tokenizer, direction="pos"):  # DistilBERT's, not this one's
    enc = tokenizer(samples, padding=True, truncation=True, max_length=512, return_tensors="pt").to(classifier.device)
    with torch.no_grad():
        return classifier(**enc).logits.softmax(-1)[:, _sentiment_column(classifier, direction)]


def sentiment_keeps_last_chunk(samples, classifier, tokenizer, direction="pos"):
    for start in range(0, len(samples), 32):  # in chunks, but each chunk's scores replace the last ones
        enc = _encode(tokenizer, samples[start:start + 32], classifier)
        with torch.no_grad():
            probs = classifier(**enc).logits.softmax(-1)[:, _sentiment_column(classifier, direction)]
    return probs


def sentiment_one_batch(samples, classifier, tokenizer, direction="pos"):  # right, but not for no samples
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        return classifier(**enc).logits.softmax(-1)[:, _sentiment_column(classifier, direction)]


def sentiment_softmax_in_bfloat16(samples, classifier, tokenizer, direction="pos"):  # no cast to float32
    label = classifier.config.label2id[{"pos": "POSITIVE", "neg": "NEGATIVE"}[direction]]
    if not samples:
        return torch.zeros(0, device=classifier.device)
    with torch.no_grad():
        return classifier(**_encode(tokenizer, samples, classifier)).logits.softmax(-1)[:, label]


def sentiment_cast_after_softmax(samples, classifier, tokenizer, direction="pos"):  # right: float32, to ~3 digits
    return sentiment_softmax_in_bfloat16(samples, classifier, tokenizer, direction).float()


def test_sentiment_cast_after_a_bfloat16_softmax_passes():
    result = run_check("reward_fn_sentiment", sentiment_cast_after_softmax)
    assert result.passed, result.message


def whiten_eps_on_std(values, shift_mean=True, eps=1e-8):
    mean = values.mean()
    out = (values - mean) / (values.std(unbiased=False) + eps)
    return out if shift_mean else out + mean


def whiten_fixed_eps(values, shift_mean=True, eps=1e-8):
    mean = values.mean()
    out = (values - mean) * torch.rsqrt(values.var(unbiased=False) + 1e-8)
    return out if shift_mean else out + mean


def whiten_flattened(values, shift_mean=True, eps=1e-8):
    flat = values.flatten()
    out = (flat - flat.mean()) * torch.rsqrt(flat.var(unbiased=False) + eps)
    return out if shift_mean else out + flat.mean()


def _repetition(samples, n, words=str.split, short=0.0, key=tuple):
    out = []
    for s in samples:
        w = words(s)
        if len(w) < n:
            out.append(short)
            continue
        grams = [key(w[i:i + n]) for i in range(len(w) - n + 1)]
        out.append(1 - len(set(grams)) / len(grams))
    return torch.tensor(out)


def ngram_short_is_one(samples, n=3):
    return _repetition(samples, n, short=1.0)


def ngram_joined_without_separator(samples, n=3):
    return _repetition(samples, n, key="".join)


def ngram_always_trigrams(samples, n=3):
    return _repetition(samples, 3)


def ngram_int_zero_for_short(samples, n=3):  # all samples short: torch.tensor([0, 0, 0]) is int64
    return _repetition(samples, n, short=0)


def ngram_stacked(samples, n=3):
    return torch.stack([_repetition([s], n)[0] for s in samples])


def bt_log_likelihood(chosen_rewards, rejected_rewards):
    return F.logsigmoid(chosen_rewards - rejected_rewards).mean()


def bt_raw_margin(chosen_rewards, rejected_rewards):
    return -(chosen_rewards - rejected_rewards).mean()


def bt_rejected_detached(chosen_rewards, rejected_rewards):
    return -F.logsigmoid(chosen_rewards - rejected_rewards.detach()).mean()


def bt_rebuilt_from_numbers(chosen_rewards, rejected_rewards):
    return torch.tensor(-F.logsigmoid(chosen_rewards - rejected_rewards).mean().item())


def bt_keepdim(chosen_rewards, rejected_rewards):
    return -F.logsigmoid(chosen_rewards - rejected_rewards).mean(0, keepdim=True)


def last_by_gather(x, attention_mask):  # picks one number per row: right for scores, not for hidden states
    positions = torch.arange(x.shape[1], device=x.device)
    last = torch.where(attention_mask.bool(), positions, -1).max(dim=1).values
    return x.gather(1, last[:, None]).squeeze(1)


def last_by_flip_argmax(x, attention_mask):  # argmax takes no boolean tensor
    seq = attention_mask.shape[1]
    return x[torch.arange(x.shape[0], device=x.device), seq - 1 - attention_mask.flip(1).argmax(1)]


def last_detached(x, attention_mask):
    positions = torch.arange(x.shape[1], device=x.device)
    last = torch.where(attention_mask.bool(), positions, -1).max(dim=1).values
    return x.detach()[torch.arange(x.shape[0], device=x.device), last]


def mean_unbroadcast_mask(x, attention_mask):  # the mask never gets x's feature dimensions
    mask = attention_mask.bool()
    return torch.where(mask, x, 0.0).sum(1) / mask.sum(1)


def mean_rebuilt_from_numbers(x, attention_mask):
    rows = [x[b][attention_mask[b].bool()].mean(0).tolist() for b in range(x.shape[0])]
    return torch.tensor(rows, dtype=x.dtype, device=x.device)


class RMLastByCount(rewards.RewardModel):
    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        h = _hidden(self, tokens, mask)
        if self.pooling == "last":
            return self.head(h[torch.arange(h.shape[0], device=h.device), mask.sum(1) - 1]).squeeze(-1)
        return _pool(self, h, mask)


class RMDefaultMaskFromPadId(rewards.RewardModel):
    """Without a mask, token id 0 is taken for padding."""

    def forward(self, tokens, attention_mask=None):
        mask = (tokens != 0).long() if attention_mask is None else attention_mask
        return _pool(self, _hidden(self, tokens, mask), mask)


class RMMeanScoresRebuilt(rewards.RewardModel):
    """'mean_scores' averaged as Python numbers and rebuilt into a tensor: right values, no gradient."""

    def forward(self, tokens, attention_mask=None):
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask
        h = _hidden(self, tokens, mask)
        if self.pooling == "mean_scores":
            scores = self.head(h).squeeze(-1)
            means = [scores[b][mask[b].bool()].mean().item() for b in range(scores.shape[0])]
            return torch.tensor(means, device=scores.device)
        return _pool(self, h, mask)


def step_summed_loss(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return _metrics(rc, rr, loss)


def step_accuracy_count(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    d = (rc - rr).detach()
    return {"loss": loss.item(), "accuracy": (d > 0).sum().item(), "margin": d.mean().item()}


def step_margin_summed(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    d = (rc - rr).detach()
    return {"loss": loss.item(), "accuracy": (d > 0).float().mean().item(), "margin": d.sum().item()}


def step_metrics_after_step(model, optimizer, ct, cm, rt, rm):
    rc, rr = model(ct, cm), model(rt, rm)
    loss = -F.logsigmoid(rc - rr).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        return _metrics(model(ct, cm), model(rt, rm), -F.logsigmoid(model(ct, cm) - model(rt, rm)).mean())


def sentiment_any_other_direction_is_negative(samples, classifier, tokenizer, direction="pos"):
    name = "POSITIVE" if direction == "pos" else "NEGATIVE"  # 'positive', a typo, scores NEGATIVE
    if not samples:
        return torch.zeros(0, device=classifier.device)
    enc = _encode(tokenizer, samples, classifier)
    with torch.no_grad():
        return classifier(**enc).logits.float().softmax(-1)[:, classifier.config.label2id[name]]



VIOLATIONS = {
    "reward_fn_char_count": {
        "counts_char": [count_length, count_words],
        "every_occurrence": [count_presence],
        "char_honoured": [count_dots_only],
        "case_exact": [char_count_case_insensitive],
        "float32": [count_as_int],
        "one_tensor": [count_as_list],
        "empty_batch": [count_by_stacking],
    },
    "reward_fn_sentiment": {
        "label_from_label2id": [sentiment_index_one, sentiment_label_from_key_order,
                                sentiment_label_from_id2label_order],
        "direction": [sentiment_ignores_direction],
        "probabilities": [sentiment_logits, sentiment_softmax_over_batch, sentiment_sigmoid],
        "attention_mask": [sentiment_without_mask],
        "too_long": [sentiment_without_truncation, sentiment_truncated_to_512],
        "no_grad": [sentiment_with_grad],
        "direction_checked": [sentiment_any_other_direction_is_negative],
        "batched": [sentiment_one_by_one],
        "more_than_a_chunk": [sentiment_keeps_last_chunk],
        "empty_batch": [sentiment_one_batch],
        "float32": [sentiment_softmax_in_bfloat16],
    },
    "whiten": {
        "all_elements": [whiten_per_row],
        "biased_variance": [whiten_unbiased],
        "eps_inside_sqrt": [whiten_eps_on_std],
        "eps_honoured": [whiten_fixed_eps],
        "all_equal": [whiten_without_eps],
        "mean_added_back": [whiten_always_centred],
        "centred_when_kept": [whiten_scale_only_when_kept],
        "shape_kept": [whiten_flattened],
        "not_in_place": [whiten_in_place],
    },
    "ngram_repetition": {
        "word_ngrams": [repetition_characters, repetition_split_space],
        "one_minus_distinct": [repetition_unique_fraction],
        "total_ngrams": [repetition_over_words],
        "short_is_zero": [ngram_short_is_one],
        "words_exact": [ngram_lowercased, ngram_punctuation_stripped],
        "ngram_is_word_sequence": [ngram_joined_without_separator],
        "n_honoured": [ngram_always_trigrams],
        "float32": [ngram_int_zero_for_short],
        "empty_batch": [ngram_stacked],
    },
    "bradley_terry_loss": {
        "chosen_minus_rejected": [bt_swapped],
        "negative_log_likelihood": [bt_log_likelihood],
        "log_sigmoid": [bt_no_log, bt_raw_margin],
        "mean_over_pairs": [bt_sum],
        "stable": [bt_unstable, bt_eps_in_log, bt_tiny_clamp, bt_log1p_exp, bt_exp_positive],
        "differentiable": [bt_rejected_detached, bt_rebuilt_from_numbers],
        "scalar": [bt_keepdim],
    },
    "pool_last_token": {
        "last_real": [last_position, first_real_by_argmax],
        "left_padding": [last_by_count],
        "padding_unread": [last_by_one_hot],
        "features": [last_by_gather],
        "bool_mask": [last_by_flip_argmax],
        "differentiable": [last_detached],
    },
    "pool_mean": {
        "real_only": [mean_with_padding],
        "divides_by_real": [mean_over_full_length],
        "mean_not_sum": [masked_sum],
        "padding_unread": [mean_by_multiplying_the_mask],
        "features": [mean_unbroadcast_mask],
        "differentiable": [mean_rebuilt_from_numbers],
    },
    "RewardModel": {
        "final_ln_features": [RMBeforeLayerNorm],
        "mask_to_backbone": [RMBackboneWithoutMask],
        "last_real_token": [RMLastPosition, RMLastByCount],
        "means_over_real": [RMMeanIncludesPadding],
        "mean_scores_vs_hidden": [RMSwappedMeans],
        "shape_batch": [RMNoSqueeze, RMSqueezeEverything],
        "default_mask": [RMDefaultMaskFromPadId],
        "gradient_every_pooling": [RMRunWithCache, RMMeanScoresRebuilt],
    },
    "reward_model_train_step": {
        "chosen_minus_rejected": [step_swapped],
        "masks": [step_no_masks],
        "zero_grad": [step_no_zero_grad],
        "step": [step_no_step],
        "loss_is_mean": [step_summed_loss],
        "returns_dict": [step_returns_loss_only],
        "accuracy_strict": [step_ties_count_as_correct],
        "accuracy_fraction": [step_accuracy_count],
        "margin_mean": [step_margin_summed],
        "measured_before_step": [step_metrics_after_step],
    },
}


@pytest.mark.parametrize("wrong, fragment", [
    (sentiment_label_from_key_order, "order a dict lists its keys"),
    (sentiment_without_truncation, "truncate"),
    (sentiment_truncated_to_512, "truncate"),
    (sentiment_keeps_last_chunk, "150 samples"),
    (sentiment_one_batch, "empty"),
])
def test_sentiment_regimes_name_the_cause(wrong, fragment):
    assert_fails_with("reward_fn_sentiment", wrong, fragment)


def test_ngram_glued_words_get_their_hint():
    assert_fails_with("ngram_repetition", ngram_joined_without_separator, "boundaries between their words")


@pytest.mark.parametrize("wrong", [RMRunWithCache, RMMeanScoresRebuilt])
def test_reward_model_gradient_under_every_pooling(wrong):
    result = run_check("RewardModel", wrong)
    assert not result.passed and "grad" in result.message, result.message


@pytest.mark.cpu_only  # a wrong version is judged on the CPU pass, which make unit runs: no GPU pass follows
@pytest.mark.parametrize("wrong, fragment", [
    (step_summed_loss, "summed over the pairs"),
    (step_accuracy_count, "count of pairs"),
    (step_margin_summed, "MEAN of r_chosen - r_rejected"),
    (step_metrics_after_step, "measured after the step"),
])
def test_train_step_diagnostics_name_the_cause(wrong, fragment):
    assert_fails_with("reward_model_train_step", wrong, fragment)


@pytest.mark.parametrize("wrong, fragment", [(whiten_eps_on_std, "added to the standard deviation"),
                                             (whiten_fixed_eps, "`eps` argument is ignored")])
def test_whiten_eps_mistakes_get_their_hint(wrong, fragment):
    assert_fails_with("whiten", wrong, fragment)


def test_reward_model_default_mask_from_a_token_id_gets_its_hint():
    assert_fails_with("RewardModel", RMDefaultMaskFromPadId, "every token is real")


@pytest.mark.parametrize("wrong", [count_by_stacking, ngram_stacked])
def test_an_empty_batch_is_named(wrong):
    name = "reward_fn_char_count" if wrong is count_by_stacking else "ngram_repetition"
    assert_fails_with(name, wrong, "On no samples")



def test_sentiment_unknown_direction_gets_its_hint():
    assert_fails_with("reward_fn_sentiment", sentiment_any_other_direction_is_negative, "ValueError")
