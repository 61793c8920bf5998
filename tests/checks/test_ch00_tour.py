"""Checkers of chapter 00: reference passes, stub fails, known mistakes get their hint."""

import pytest

from rlhf_tutorial.checks import run_check
from tests.checks.helpers import assert_fails_with


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
    import torch

    def with_hooks_context(model, tokens):
        found = {}

        def keep(activation, hook):
            found[hook.name] = activation

        with model.hooks(fwd_hooks=[("ln_final.hook_normalized", keep)]):
            model(tokens)
        return found["ln_final.hook_normalized"]

    def added_and_reset(model, tokens):
        kept = []
        model.add_hook("ln_final.hook_normalized", lambda activation, hook: kept.append(activation))
        try:
            model(tokens)
        finally:
            model.reset_hooks()
        return kept[-1]

    def in_float64_then_back(model, tokens):  # the LayerNorm by hand on the residual a hook reads
        kept = []
        name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
        model.run_with_hooks(tokens, fwd_hooks=[(name, lambda activation, hook: kept.append(activation))])
        x = kept[0].double()
        x = x - x.mean(-1, keepdim=True)
        return (x / (x.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()).to(torch.float32)

    for fn in (with_hooks_context, added_and_reset, in_float64_then_back):
        result = run_check("final_normalized_residual", fn)
        assert result.passed, (fn.__name__, result.message)


def probs_naive_softmax(model, tokens):  # only logits in the hundreds expose it: exp overflows to inf
    logits = model(tokens)[:, -1, :]
    return logits.exp() / logits.exp().sum(-1, keepdim=True)


def test_naive_softmax_is_caught_by_large_logits():
    result = run_check("next_token_probs", probs_naive_softmax)
    assert not result.passed and "logits in the hundreds" in result.message and "NaN or inf" in result.message


# ----------------------------------------------------------------------------------------------------
# The contract, clause by clause (tests/checks/test_contract_clauses.py runs every version below)
# ----------------------------------------------------------------------------------------------------
def probs_squeezed(model, tokens):  # only the batch of 1 exposes it
    return model(tokens)[:, -1, :].softmax(-1).squeeze()


def _read_with_hook(model, tokens, name):
    kept = []
    model.run_with_hooks(tokens, fwd_hooks=[(name, lambda activation, hook: kept.append(activation))])
    return kept[0]


def resid_post_by_hook(model, tokens):
    return _read_with_hook(model, tokens, f"blocks.{model.cfg.n_layers - 1}.hook_resid_post")


def ln2_by_hook(model, tokens):
    return _read_with_hook(model, tokens, f"blocks.{model.cfg.n_layers - 1}.ln2.hook_normalized")


def normalized_squeezed_by_hook(model, tokens):
    return _read_with_hook(model, tokens, "ln_final.hook_normalized").squeeze()


_KEPT_ACROSS_CALLS = []  # a list at module level: the first call's activation is returned forever


def normalized_first_ever(model, tokens):
    model.run_with_hooks(tokens, fwd_hooks=[("ln_final.hook_normalized",
                                             lambda activation, hook: _KEPT_ACROSS_CALLS.append(activation))])
    return _KEPT_ACROSS_CALLS[0]


def normalized_from_cache(model, tokens):  # the cache holds detached copies
    _, cache = model.run_with_cache(tokens)
    return cache["ln_final.hook_normalized"]


def normalized_detached_in_hook(model, tokens):
    kept = []
    model.run_with_hooks(tokens, fwd_hooks=[("ln_final.hook_normalized",
                                             lambda activation, hook: kept.append(activation.detach()))])
    return kept[0]


def normalized_under_no_grad(model, tokens):
    import torch

    with torch.no_grad():
        return _read_with_hook(model, tokens, "ln_final.hook_normalized")


def ln_final_applied_to_cached_resid(model, tokens):
    _, cache = model.run_with_cache(tokens)
    return model.ln_final(cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"])


def normalized_hook_left_on(model, tokens):
    kept = []
    model.add_hook("ln_final.hook_normalized", lambda activation, hook: kept.append(activation))
    model(tokens)
    return kept[0]


def probs_detached(model, tokens):
    return model(tokens)[:, -1, :].softmax(-1).detach()


def probs_under_no_grad(model, tokens):
    import torch

    with torch.no_grad():
        return model(tokens)[:, -1, :].softmax(-1)


VIOLATIONS = {
    "next_token_probs": {
        "last_position": [probs_from_first_position],
        "softmax_over_vocab": [probs_softmax_over_batch, probs_as_logits, probs_as_log_probs],
        "shape": [probs_squeezed],
        "stable": [probs_naive_softmax],
        "differentiable": [probs_detached, probs_under_no_grad],
    },
    "final_normalized_residual": {
        "which_activation": [resid_post_by_hook, ln2_by_hook, logits_instead],
        "as_stored": [normalized_squeezed_by_hook],
        "each_call": [normalized_first_ever],
        "differentiable": [normalized_from_cache, normalized_detached_in_hook, normalized_under_no_grad,
                           ln_final_applied_to_cached_resid],
        "hooks_removed": [normalized_hook_left_on],
    },
}


@pytest.mark.parametrize("wrong, fragment", [
    (normalized_from_cache, "detached"),
    (normalized_detached_in_hook, "detached"),
    (normalized_under_no_grad, "no gradient reaches"),
    (ln_final_applied_to_cached_resid, "detached"),
    (normalized_hook_left_on, "hook(s) on it"),
])
def test_final_normalized_residual_graph_and_hooks(wrong, fragment):
    assert_fails_with("final_normalized_residual", wrong, fragment)


def test_next_token_probs_detached_is_named():
    assert_fails_with("next_token_probs", probs_under_no_grad, "detached from the model")
