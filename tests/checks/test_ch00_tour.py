"""Checkers of chapter 00: reference passes, stub fails, known mistakes get their hint."""

import pytest

from rlhf_tutorial.checks import run_check


def probs_as_logits(model, tokens):
    return model(tokens)[:, -1, :]


def probs_from_first_position(model, tokens):
    return model(tokens)[:, 0, :].softmax(-1)


def probs_as_log_probs(model, tokens):
    return model(tokens)[:, -1, :].log_softmax(-1)


def probs_softmax_over_batch(model, tokens):
    return model(tokens)[:, -1, :].softmax(dim=0)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (probs_as_logits, "raw logits"),
        (probs_from_first_position, "LAST position"),
        (probs_as_log_probs, "log_softmax"),
        (probs_softmax_over_batch, "dim=-1"),
    ],
)
def test_next_token_probs_mistakes(wrong, fragment):
    result = run_check("next_token_probs", wrong)
    assert not result.passed
    assert fragment in result.hint


def test_next_token_probs_written_differently():
    import torch

    def by_hand(model, tokens):
        last = model(tokens)[:, -1, :]
        e = torch.exp(last - last.max(dim=-1, keepdim=True).values)
        return e / e.sum(dim=-1, keepdim=True)

    assert run_check("next_token_probs", by_hand).passed


def resid_post_of_last_block(model, tokens):
    _, cache = model.run_with_cache(tokens)
    return cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]


def mlp_layernorm_of_last_block(model, tokens):
    _, cache = model.run_with_cache(tokens)
    return cache[f"blocks.{model.cfg.n_layers - 1}.ln2.hook_normalized"]


def logits_instead(model, tokens):
    return model(tokens)


def normalized_squeezed(model, tokens):  # only a batch of 1 (or one-token rows) exposes it
    _, cache = model.run_with_cache(tokens)
    return cache["ln_final.hook_normalized"].squeeze()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (normalized_squeezed, "squeeze() dropped a dimension"),
        (resid_post_of_last_block, "BEFORE the final LayerNorm"),
        (mlp_layernorm_of_last_block, "MLP LayerNorm"),
        (logits_instead, "logits"),
    ],
)
def test_final_normalized_residual_mistakes(wrong, fragment):
    result = run_check("final_normalized_residual", wrong)
    assert not result.passed
    assert fragment in (result.hint or "") + result.message


def test_final_normalized_residual_written_differently():
    def via_cache(model, tokens):
        _, cache = model.run_with_cache(tokens, names_filter="ln_final.hook_normalized")
        return cache["ln_final.hook_normalized"]

    def by_applying_ln_final(model, tokens):
        _, cache = model.run_with_cache(tokens)
        return model.ln_final(cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])

    assert run_check("final_normalized_residual", via_cache).passed
    assert run_check("final_normalized_residual", by_applying_ln_final).passed


def probs_naive_softmax(model, tokens):  # only logits in the hundreds expose it: exp overflows to inf
    logits = model(tokens)[:, -1, :]
    return logits.exp() / logits.exp().sum(-1, keepdim=True)


def test_naive_softmax_is_caught_by_large_logits():
    result = run_check("next_token_probs", probs_naive_softmax)
    assert not result.passed and "logits in the hundreds" in result.message and "NaN or inf" in result.message
