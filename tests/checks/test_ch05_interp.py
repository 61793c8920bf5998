"""Checkers of chapter 05 (the reference passing and the stub failing are in test_exercise_manifest):
realistic wrong versions, written here and not taken from the checker's catalogue, fail with their hint,
and correct versions written differently pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlhf_tutorial import interp
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.checks.core import check_device
from tests.checks.helpers import assert_fails_with

#: A tensor built on the CPU beside the checker's cases is a mistake only on another device.
needs_gpu = pytest.mark.skipif(check_device().type == "cpu", reason="needs a GPU or RLHF_TUTORIAL_DEVICE=simgpu")


# ----------------------------------------------------------------------------------------------------
# sentiment_direction
# ----------------------------------------------------------------------------------------------------
def direction_pos_minus_neg(W_U, pos_ids, neg_ids):
    return W_U[:, pos_ids].mean(1) - W_U[:, neg_ids].mean(1)


def direction_summed(W_U, pos_ids, neg_ids):
    return W_U[:, neg_ids].sum(-1) - W_U[:, pos_ids].sum(-1)


def direction_unique(W_U, pos_ids, neg_ids):  # only a repeated id exposes it
    return W_U[:, sorted(set(neg_ids.tolist()))].mean(1) - W_U[:, sorted(set(pos_ids.tolist()))].mean(1)


@pytest.mark.parametrize("wrong, fragment", [
    (direction_pos_minus_neg, "sign is flipped"),
    (direction_summed, "summed the columns"),
    (direction_unique, "listed twice counts twice"),
])
def test_sentiment_direction_mistakes(wrong, fragment):
    assert_fails_with("sentiment_direction", wrong, fragment)


def test_sentiment_direction_rows_of_the_transpose_fail():
    result = run_check("sentiment_direction", lambda W_U, p, n: W_U.T[n].mean(0) - W_U.T[p].mean(1))
    assert not result.passed


def test_sentiment_direction_written_differently():
    def by_loops(W_U, pos_ids, neg_ids):
        neg = sum(W_U[:, int(i)] for i in neg_ids) / len(neg_ids)
        pos = sum(W_U[:, int(i)] for i in pos_ids) / len(pos_ids)
        return neg - pos

    assert run_check("sentiment_direction", by_loops).passed


# ----------------------------------------------------------------------------------------------------
# ln_pre
# ----------------------------------------------------------------------------------------------------
def ln_std_unbiased(x, eps=1e-5):
    c = x - x.mean(-1, keepdim=True)
    return c / torch.sqrt(c.var(-1, keepdim=True) + eps)


def ln_eps_outside(x, eps=1e-5):  # only tiny magnitudes expose it
    c = x - x.mean(-1, keepdim=True)
    return c / (c.pow(2).mean(-1, keepdim=True).sqrt() + eps)


def ln_no_eps(x, eps=1e-5):  # only a constant (or zero) vector exposes it
    c = x - x.mean(-1, keepdim=True)
    return c / c.pow(2).mean(-1, keepdim=True).sqrt()


def ln_rms_only(x, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("wrong, fragment", [
    (ln_std_unbiased, "unbiased variance"),
    (ln_eps_outside, "eps is outside the square root"),
    (ln_no_eps, "eps is missing"),
    (ln_rms_only, "did not centre"),
    (lambda x, eps=1e-5: torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=eps), "that is an RMSNorm"),
])
def test_ln_pre_mistakes(wrong, fragment):
    assert_fails_with("ln_pre", wrong, fragment)


def test_ln_pre_written_differently():
    def with_layer_norm(x, eps=1e-5):
        return F.layer_norm(x, x.shape[-1:], eps=eps)

    assert run_check("ln_pre", with_layer_norm).passed


# ----------------------------------------------------------------------------------------------------
# logit_lens_score
# ----------------------------------------------------------------------------------------------------
def lens_raw(resid_stack, direction, eps=1e-5):
    return resid_stack @ direction


def lens_unit_norm(resid_stack, direction, eps=1e-5):
    c = resid_stack - resid_stack.mean(-1, keepdim=True)
    return F.normalize(c, dim=-1) @ direction


def lens_drops_eps(resid_stack, direction, eps=1e-5):  # only a non-default eps exposes it
    return interp.ln_pre(resid_stack) @ direction


@pytest.mark.parametrize("wrong, fragment", [
    (lens_raw, "raw residual stream"),
    (lens_unit_norm, "norm of each vector"),
    (lens_drops_eps, "eps was not passed on"),
])
def test_logit_lens_score_mistakes(wrong, fragment):
    assert_fails_with("logit_lens_score", wrong, fragment)


def test_logit_lens_score_written_differently():
    def with_einsum(resid_stack, direction, eps=1e-5):
        mu = resid_stack.mean(-1, keepdim=True)
        sigma = torch.sqrt(((resid_stack - mu) ** 2).mean(-1, keepdim=True) + eps)
        return torch.einsum("...d,d->...", (resid_stack - mu) / sigma, direction)

    assert run_check("logit_lens_score", with_einsum).passed


# ----------------------------------------------------------------------------------------------------
# value_lens
# ----------------------------------------------------------------------------------------------------
def value_no_ln(resid_stack, value_head, eps=1e-5):
    return value_head(resid_stack).squeeze(-1)


def value_no_squeeze(resid_stack, value_head, eps=1e-5):
    return value_head(interp.ln_pre(resid_stack, eps))


def value_zero_grad(resid_stack, value_head, eps=1e-5):  # right numbers; only the property check sees it
    value_head.zero_grad()
    return value_head(interp.ln_pre(resid_stack, eps)).squeeze(-1)


def value_freezes_head(resid_stack, value_head, eps=1e-5):  # right numbers; only the property check sees it
    value_head.requires_grad_(False)
    return value_head(interp.ln_pre(resid_stack, eps)).squeeze(-1)


@pytest.mark.parametrize("wrong, fragment", [
    (value_no_ln, "raw residual stream"),
    (value_no_squeeze, "trailing dim of size 1"),
    (value_zero_grad, "zero_grad"),
    (value_freezes_head, "requires_grad_(False)"),
])
def test_value_lens_mistakes(wrong, fragment):
    assert_fails_with("value_lens", wrong, fragment)


def value_head_to_float64(resid_stack, value_head, eps=1e-5):
    # "read it in float64 for precision": the caller's head is converted in place, and stays float64
    value_head.double()
    return value_head(interp.ln_pre(resid_stack.double(), eps)).squeeze(-1).to(resid_stack.dtype)


def test_value_lens_head_cast_in_place_is_the_learners_change():
    result = run_check("value_lens", value_head_to_float64)
    assert not result.passed
    assert "checker" not in result.message, result.message
    assert "changed the module passed as `value_head`" in result.message and "float64" in result.message, \
        result.message


def test_value_lens_float64_on_a_copy_passes():
    """Computing in float64 on a copy of the head is a right answer: only the caller's module must stay as it was."""
    def on_a_copy(resid_stack, value_head, eps=1e-5):
        wide = {name: t.double() for name, t in value_head.state_dict().items()}  # float64 copies of the weights
        out = torch.func.functional_call(value_head, wide, (interp.ln_pre(resid_stack.double(), eps),))
        return out.squeeze(-1).to(resid_stack.dtype)

    result = run_check("value_lens", on_a_copy)
    assert result.passed, result.message


def test_value_lens_written_differently():
    def no_grad_loop(resid_stack, value_head, eps=1e-5):
        with torch.no_grad():
            flat = resid_stack.reshape(-1, resid_stack.shape[-1])
            out = torch.stack([value_head(F.layer_norm(v, v.shape, eps=eps))[0] for v in flat])
        return out.reshape(resid_stack.shape[:-1])

    assert run_check("value_lens", no_grad_loop).passed


# ----------------------------------------------------------------------------------------------------
# head_attribution
# ----------------------------------------------------------------------------------------------------
def attr_not_centred(head_out, ln_scale, direction):
    return ((head_out @ direction) / ln_scale[:, None, None]).mean(0)


def attr_mean_scale(head_out, ln_scale, direction):  # only differing scales expose it
    c = head_out - head_out.mean(-1, keepdim=True)
    return (c @ direction).mean(0) / ln_scale.mean()


def attr_summed(head_out, ln_scale, direction):  # a batch of 1 hides it
    c = head_out - head_out.mean(-1, keepdim=True)
    return ((c @ direction) / ln_scale[:, None, None]).sum(0)


def attr_times_scale(head_out, ln_scale, direction):
    c = head_out - head_out.mean(-1, keepdim=True)
    return ((c @ direction) * ln_scale[:, None, None]).mean(0)


@pytest.mark.parametrize("wrong, fragment", [
    (attr_not_centred, "did not centre"),
    (attr_mean_scale, "mean scale"),
    (attr_summed, "summed over the batch"),
    (attr_times_scale, "multiplied by the scale"),
])
def test_head_attribution_mistakes(wrong, fragment):
    assert_fails_with("head_attribution", wrong, fragment)


def attr_by_loops(head_out, ln_scale, direction, device=None):
    b, n_layers, n_heads, _ = head_out.shape
    out = torch.zeros(n_layers, n_heads, device=device)
    d_centred = direction - direction.mean()  # centring the output = centring the direction
    for i in range(b):
        out += torch.einsum("lhd,d->lh", head_out[i], d_centred) / ln_scale[i]
    return out / b


def test_head_attribution_written_differently():
    def by_loops(head_out, ln_scale, direction):
        return attr_by_loops(head_out, ln_scale, direction, device=head_out.device)

    assert run_check("head_attribution", by_loops).passed


@needs_gpu
def test_head_attribution_accumulated_on_the_cpu_is_named():
    """torch.zeros(...) without device=: right on a CPU, a device mix at the first += on a GPU."""
    result = run_check("head_attribution", attr_by_loops)
    assert not result.passed and "mixed devices" in result.message, result.message
    assert "out += " in result.message and "checker" not in result.message


# ----------------------------------------------------------------------------------------------------
# patch_activation
# ----------------------------------------------------------------------------------------------------
def patch_empty_means_all(activation, hook, source, positions=None):  # only positions=[] exposes it
    if not positions:
        activation[:] = source
    else:
        activation[:, positions] = source[:, positions]
    return activation


def patch_writes_source(activation, hook, source, positions=None):
    idx = slice(None) if positions is None else positions
    source[:, idx] = activation[:, idx]
    return activation


def patch_no_return(activation, hook, source, positions=None):
    idx = slice(None) if positions is None else positions
    activation[:, idx] = source[:, idx]


def patch_batch_dim(activation, hook, source, positions=None):
    if positions is None:
        return source.clone()
    activation[positions] = source[positions]
    return activation


def patch_positive_range(activation, hook, source, positions=None):  # only [-1] (negative) exposes it
    if positions is None:
        positions = list(range(activation.shape[1]))
    for p in positions:
        if 0 <= p < activation.shape[1]:
            activation[:, p] = source[:, p]
    return activation


@pytest.mark.parametrize("wrong, fragment", [
    (patch_empty_means_all, "treats [] like None"),
    (patch_writes_source, "modified `source`"),
    (patch_no_return, "returned None"),
    (patch_batch_dim, "indexed the batch dim"),
])
def test_patch_activation_mistakes(wrong, fragment):
    assert_fails_with("patch_activation", wrong, fragment)


def test_patch_activation_negative_positions_are_checked():
    result = run_check("patch_activation", patch_positive_range)
    assert not result.passed and "[-1]" in result.message


def patch_returns_source(activation, hook, source, positions=None):
    # "every position is replaced: that is just source" (issue 38): the right values, but the model then
    # runs on the cached source's memory
    if positions is None:
        return source
    activation[:, positions] = source[:, positions]
    return activation


def patch_returns_source_view(activation, hook, source, positions=None):
    if positions is None:
        return source.view(activation.shape)
    activation[:, positions] = source[:, positions]
    return activation


@pytest.mark.parametrize("wrong", [patch_returns_source, patch_returns_source_view])
def test_patch_activation_returning_source_is_rejected(wrong):
    result = run_check("patch_activation", wrong)
    assert not result.passed, "a hook returning source itself passed"
    assert "returned `source` itself" in result.message and "checker" not in result.message, result.message


def patch_one_position_later(activation, hook, source, positions=None):
    # positions counted from 1: every listed position is patched one place to the right
    if positions is None:
        activation[:] = source
        return activation
    later = [p + 1 for p in positions if 0 <= p + 1 < activation.shape[1]]
    activation[:, later] = source[:, later]
    return activation


@pytest.mark.parametrize("wrong", [patch_one_position_later, patch_positive_range])
def test_patch_activation_failure_shows_where_it_differs(wrong):
    """The expected and got previews are those of a position that differs (the first entries of a [b, s, d]
    activation are position 0's, the same in both when position 0 is not patched), and the positions are named."""
    result = run_check("patch_activation", wrong)
    assert not result.passed
    lines = result.message.splitlines()
    expected = next(line for line in lines if line.strip().startswith("expected:"))
    got = next(line for line in lines if line.strip().startswith("got:"))
    assert expected.split(":", 1)[1].strip() != got.split(":", 1)[1].strip(), result.message
    assert "positions (dim 1) whose values differ" in result.message, result.message


def patch_out_of_place(activation, hook, source, positions=None, device=None):
    if positions is None:
        return source.clone()
    mask = torch.zeros(activation.shape[1], dtype=torch.bool, device=device)
    mask[positions] = True
    shape = (1, -1) + (1,) * (activation.ndim - 2)
    return torch.where(mask.view(shape), source, activation)


def test_patch_activation_written_differently():
    def out_of_place(activation, hook, source, positions=None):
        return patch_out_of_place(activation, hook, source, positions, device=activation.device)

    assert run_check("patch_activation", out_of_place).passed


@needs_gpu
def test_patch_activation_mask_on_the_cpu_is_named():
    """A position mask built without device=: the hook mixes devices on a GPU, with the learner's line."""
    result = run_check("patch_activation", patch_out_of_place)
    assert not result.passed and "mixed devices" in result.message, result.message
    assert "torch.where(mask.view(shape), source, activation)" in result.message
    assert "device=activation.device" in result.hint and "checker" not in result.message


# ----------------------------------------------------------------------------------------------------
# restored_fraction
# ----------------------------------------------------------------------------------------------------
def restored_remaining(patched, base, tuned):
    return (tuned.mean() - patched.mean()) / (tuned.mean() - base.mean())


def restored_mean_of_ratios(patched, base, tuned):  # a single example hides it
    return ((patched - base) / (tuned - base)).mean()


def restored_over_tuned(patched, base, tuned):
    return (patched.mean() - base.mean()) / tuned.mean()


def restored_mean_over_dim0(patched, base, tuned):  # only the 2-d batch exposes it (and 0-d: one example)
    return (patched.mean(0) - base.mean(0)) / (tuned.mean(0) - base.mean(0))


@pytest.mark.parametrize("wrong, fragment", [
    (restored_mean_over_dim0, "averaged over dim 0 only"),
    (restored_remaining, "1 - restored"),
    (restored_mean_of_ratios, "mean of per-example ratios"),
    (restored_over_tuned, "divided by mean(tuned)"),
])
def test_restored_fraction_mistakes(wrong, fragment):
    assert_fails_with("restored_fraction", wrong, fragment)


def test_restored_fraction_as_python_float_fails():
    result = run_check("restored_fraction", lambda p, b, t: ((p.mean() - b.mean()) / (t.mean() - b.mean())).item())
    assert not result.passed and "torch.Tensor" in result.message


def test_restored_fraction_written_differently():
    def via_sums(patched, base, tuned):
        n = patched.numel()
        return (patched.sum() / n - base.sum() / n) / ((tuned - base).sum() / n)

    assert run_check("restored_fraction", via_sums).passed


# ----------------------------------------------------------------------------------------------------
# activation_difference
# ----------------------------------------------------------------------------------------------------
def diff_base_minus_tuned(base_resid, tuned_resid, n_positions=5):
    return (base_resid - tuned_resid)[:, :n_positions].mean((0, 1))


def diff_all_positions(base_resid, tuned_resid, n_positions=5):
    return (tuned_resid - base_resid).mean((0, 1))


def diff_batch_sliced(base_resid, tuned_resid, n_positions=5):
    return (tuned_resid[:n_positions] - base_resid[:n_positions]).mean((0, 1))


def diff_sum_positions(base_resid, tuned_resid, n_positions=5):  # n_positions=1 hides it
    return (tuned_resid - base_resid)[:, :n_positions].sum(1).mean(0)


def diff_sum_over_n_positions(base_resid, tuned_resid, n_positions=5):  # only texts shorter than n expose it
    return (tuned_resid - base_resid)[:, :n_positions].sum(1).mean(0) / n_positions


def diff_one_too_many(base_resid, tuned_resid, n_positions=5):
    return (tuned_resid[:, : n_positions + 1] - base_resid[:, : n_positions + 1]).mean((0, 1))


def diff_one_too_few(base_resid, tuned_resid, n_positions=5):
    return (tuned_resid[:, : n_positions - 1] - base_resid[:, : n_positions - 1]).mean((0, 1))


def diff_skip_bos(base_resid, tuned_resid, n_positions=5):
    return (tuned_resid[:, 1 : n_positions + 1] - base_resid[:, 1 : n_positions + 1]).mean((0, 1))


def diff_skip_bos_short(base_resid, tuned_resid, n_positions=5):
    return (tuned_resid[:, 1:n_positions] - base_resid[:, 1:n_positions]).mean((0, 1))


@pytest.mark.parametrize("wrong, fragment", [
    (diff_one_too_many, "[:, :n_positions + 1]"),
    (diff_one_too_few, "[:, :n_positions - 1]"),
    (diff_skip_bos, "You skipped position 0 (the BOS):"),
    (diff_skip_bos_short, "skipped position 0 (the BOS) and kept n_positions - 1"),
    (diff_sum_over_n_positions, "divided the sum by n_positions"),
    (diff_base_minus_tuned, "sign is flipped"),
    (diff_all_positions, "averaged over every position"),
    (diff_batch_sliced, "sliced the batch dim"),
    (diff_sum_positions, "summed over positions"),
])
def test_activation_difference_mistakes(wrong, fragment):
    assert_fails_with("activation_difference", wrong, fragment)


def test_activation_difference_written_differently():
    def by_loops(base_resid, tuned_resid, n_positions=5):
        n = min(n_positions, base_resid.shape[1])
        total = torch.zeros(base_resid.shape[-1], device=base_resid.device)
        for b in range(base_resid.shape[0]):
            for t in range(n):
                total += tuned_resid[b, t] - base_resid[b, t]
        return total / (base_resid.shape[0] * n)

    assert run_check("activation_difference", by_loops).passed


# ----------------------------------------------------------------------------------------------------
# param_change
# ----------------------------------------------------------------------------------------------------
def change_absolute(base_params, tuned_params):
    return {k: (tuned_params[k] - v).norm().item() for k, v in base_params.items() if k in tuned_params}


def change_no_clamp(base_params, tuned_params):  # only a zero base tensor exposes it
    return {k: ((tuned_params[k] - v).norm() / v.norm()).item() for k, v in base_params.items() if k in tuned_params}


def change_all_names(base_params, tuned_params):  # only a name missing from one dict exposes it
    return {k: ((tuned_params[k] - v).norm() / v.norm().clamp(min=1e-8)).item() for k, v in base_params.items()}


def change_tensors(base_params, tuned_params):
    return {k: (tuned_params[k] - v).norm() / v.norm().clamp(min=1e-8) for k, v in base_params.items() if k in tuned_params}


@pytest.mark.parametrize("wrong, fragment", [
    (change_absolute, "absolute change"),
    (change_no_clamp, "clamp the denominator"),
    (change_all_names, "BOTH dicts"),
    (change_tensors, "Python floats"),
])
def test_param_change_mistakes(wrong, fragment):
    assert_fails_with("param_change", wrong, fragment)


def test_param_change_written_differently():
    def with_sums(base_params, tuned_params):
        out = {}
        for name in set(base_params) & set(tuned_params):
            b, t = base_params[name].double(), tuned_params[name].double()
            out[name] = float(((t - b) ** 2).sum().sqrt() / max(float((b**2).sum().sqrt()), 1e-8))
        return out

    assert run_check("param_change", with_sums).passed


# ----------------------------------------------------------------------------------------------------
# fraction_changed
# ----------------------------------------------------------------------------------------------------
def fraction_ge(base_params, tuned_params, atol=0.0):  # only ties at atol (or atol=0) expose it
    names = [k for k in base_params if k in tuned_params]
    hits = sum(int(((tuned_params[k] - base_params[k]).abs() >= atol).sum()) for k in names)
    return hits / sum(base_params[k].numel() for k in names)


def fraction_mean_per_tensor(base_params, tuned_params, atol=0.0):
    names = [k for k in base_params if k in tuned_params]
    per = [((tuned_params[k] - base_params[k]).abs() > atol).float().mean().item() for k in names]
    return sum(per) / len(per)


def fraction_no_abs(base_params, tuned_params, atol=0.0):
    names = [k for k in base_params if k in tuned_params]
    hits = sum(int(((tuned_params[k] - base_params[k]) > atol).sum()) for k in names)
    return hits / sum(base_params[k].numel() for k in names)


@pytest.mark.parametrize("wrong, fragment", [
    (fraction_ge, "strictly greater"),
    (fraction_mean_per_tensor, "per-tensor fractions"),
    (fraction_no_abs, "only entries that went UP"),
])
def test_fraction_changed_mistakes(wrong, fragment):
    assert_fails_with("fraction_changed", wrong, fragment)


def test_fraction_changed_written_differently():
    def with_isclose(base_params, tuned_params, atol=0.0):
        same, total = 0, 0
        for name in base_params.keys() & tuned_params.keys():
            b, t = base_params[name].double(), tuned_params[name].double()
            same += int(((t - b).abs() <= atol).sum())
            total += b.numel()
        return 1.0 - same / total

    assert run_check("fraction_changed", with_isclose).passed


# ----------------------------------------------------------------------------------------------------
# The contract, clause by clause: a version breaking each (tests/checks/test_contract_clauses.py)
# ----------------------------------------------------------------------------------------------------
def direction_unit(W_U, pos_ids, neg_ids):
    d = W_U[:, neg_ids].mean(1) - W_U[:, pos_ids].mean(1)
    return d / d.norm()


def direction_rows(W_U, pos_ids, neg_ids):
    return W_U[neg_ids].mean(0) - W_U[pos_ids].mean(0)


def ln_fixed_eps(x, eps=1e-5):
    c = x - x.mean(-1, keepdim=True)
    return c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + 1e-5)


def ln_first_dim(x, eps=1e-5):
    c = x - x.mean(0, keepdim=True)
    return c / torch.sqrt(c.pow(2).mean(0, keepdim=True) + eps)


def ln_moments(x, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x * x).mean(-1, keepdim=True) - mean ** 2  # E[x^2] - E[x]^2
    return (x - mean) / torch.sqrt(var + eps)


def ln_in_place(x, eps=1e-5):
    x -= x.mean(-1, keepdim=True)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def lens_over_layers(resid_stack, direction, eps=1e-5):
    c = resid_stack - resid_stack.mean(0, keepdim=True)
    return (c / torch.sqrt(c.pow(2).mean(0, keepdim=True) + eps)) @ direction


def lens_three_dims(resid_stack, direction, eps=1e-5):
    return torch.einsum("lbd,d->lb", interp.ln_pre(resid_stack, eps), direction)


def lens_unit_direction(resid_stack, direction, eps=1e-5):
    return interp.ln_pre(resid_stack, eps) @ (direction / direction.norm())


def value_drops_eps(resid_stack, value_head, eps=1e-5):
    return value_head(interp.ln_pre(resid_stack)).squeeze(-1)


def value_squeeze_all(resid_stack, value_head, eps=1e-5):
    return value_head(interp.ln_pre(resid_stack, eps)).squeeze()


def value_folds_centring_into_head(resid_stack, value_head, eps=1e-5):
    """Right values: the centring is folded into the head's first weight, in place (the head changes)."""
    weight = value_head[0].weight
    with torch.no_grad():
        weight -= weight.mean(1, keepdim=True)
    c = resid_stack - resid_stack.mean(-1, keepdim=True)
    return value_head(resid_stack / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + eps)).squeeze(-1)


def value_backward(resid_stack, value_head, eps=1e-5):
    out = value_head(interp.ln_pre(resid_stack, eps)).squeeze(-1)
    out.sum().backward()  # "to see which inputs matter"
    return out.detach()


def attr_no_scale(head_out, ln_scale, direction):
    c = head_out - head_out.mean(-1, keepdim=True)
    return (c @ direction).mean(0)


def attr_squeezed(head_out, ln_scale, direction):
    c = head_out - head_out.mean(-1, keepdim=True)
    return ((c @ direction) / ln_scale[:, None, None]).mean(0).squeeze()


def attr_in_place(head_out, ln_scale, direction):
    head_out -= head_out.mean(-1, keepdim=True)
    return ((head_out @ direction) / ln_scale[:, None, None]).mean(0)


def patch_none_is_nothing(activation, hook, source, positions=None):
    if positions is not None:
        activation[:, positions] = source[:, positions]
    return activation


def patch_second_to_last_dim(activation, hook, source, positions=None):
    idx = slice(None) if positions is None else positions
    activation[..., idx, :] = source[..., idx, :]  # the position dim, counted from the end
    return activation


def restored_clamped(patched, base, tuned):
    return ((patched.mean() - base.mean()) / (tuned.mean() - base.mean())).clamp(0, 1)


def restored_abs(patched, base, tuned):
    return ((patched.mean() - base.mean()) / (tuned.mean() - base.mean())).abs()


def restored_float32(patched, base, tuned):
    return ((patched.mean() - base.mean()) / (tuned.mean() - base.mean())).float()


def restored_item(patched, base, tuned):
    return ((patched.mean() - base.mean()) / (tuned.mean() - base.mean())).item()


def diff_default_three(base_resid, tuned_resid, n_positions=3):
    return (tuned_resid[:, :n_positions] - base_resid[:, :n_positions]).mean(dim=(0, 1))


def diff_per_position(base_resid, tuned_resid, n_positions=5):
    return (tuned_resid[:, :n_positions] - base_resid[:, :n_positions]).mean(0)


def change_over_tuned(base_params, tuned_params):
    return {k: ((tuned_params[k] - v).norm() / tuned_params[k].norm().clamp(min=1e-8)).item()
            for k, v in base_params.items() if k in tuned_params}


def change_norm_growth(base_params, tuned_params):
    return {k: (tuned_params[k].norm() / v.norm().clamp(min=1e-8) - 1).item()
            for k, v in base_params.items() if k in tuned_params}


def change_per_entry(base_params, tuned_params):
    return {k: ((tuned_params[k] - v).abs() / v.abs().clamp(min=1e-8)).mean().item()
            for k, v in base_params.items() if k in tuned_params}


def change_norm_in_own_dtype(base_params, tuned_params):
    out = {}
    for k, v in base_params.items():
        if k in tuned_params:
            delta = (tuned_params[k].float() - v.float()).norm()
            out[k] = (delta / v.norm().clamp(min=1e-8)).item()  # ||base|| in the parameters' own dtype
    return out


def change_with_numpy(base_params, tuned_params):
    out = {}
    for k, v in base_params.items():
        if k in tuned_params:
            b, t = v.cpu().numpy(), tuned_params[k].cpu().numpy()
            out[k] = float(np.linalg.norm(t - b) / max(np.linalg.norm(b), 1e-8))
    return out


def _shared(base_params, tuned_params):
    return [(base_params[k], tuned_params[k]) for k in base_params if k in tuned_params]


def fraction_isclose(base_params, tuned_params, atol=0.0):
    pairs = _shared(base_params, tuned_params)
    moved = sum(int((~torch.isclose(t, b, atol=atol)).sum()) for b, t in pairs)
    return moved / sum(b.numel() for b, _ in pairs)


def fraction_relative(base_params, tuned_params, atol=0.0):
    pairs = _shared(base_params, tuned_params)
    moved = sum(int(((t - b).abs() > atol * b.abs()).sum()) for b, t in pairs)
    return moved / sum(b.numel() for b, _ in pairs)


def fraction_unchanged(base_params, tuned_params, atol=0.0):
    pairs = _shared(base_params, tuned_params)
    same = sum(int(((t - b).abs() <= atol).sum()) for b, t in pairs)
    return same / sum(b.numel() for b, _ in pairs)


def fraction_all_names(base_params, tuned_params, atol=0.0):
    moved = sum(int(((tuned_params[k] - v).abs() > atol).sum()) for k, v in base_params.items())
    return moved / sum(v.numel() for v in base_params.values())


def fraction_tensor(base_params, tuned_params, atol=0.0):
    pairs = _shared(base_params, tuned_params)
    moved = sum(((t - b).abs() > atol).sum() for b, t in pairs)
    return moved / sum(b.numel() for b, _ in pairs)


def fraction_with_numpy(base_params, tuned_params, atol=0.0):
    pairs = [(b.float().cpu().numpy(), t.float().cpu().numpy()) for b, t in _shared(base_params, tuned_params)]
    return float(sum(int((np.abs(t - b) > atol).sum()) for b, t in pairs) / sum(b.size for b, _ in pairs))


VIOLATIONS = {
    "sentiment_direction": {
        "sign": [direction_pos_minus_neg],
        "mean": [direction_summed],
        "duplicates": [direction_unique],
        "unnormalised": [direction_unit],
        "columns": [direction_rows],
    },
    "ln_pre": {
        "centred": [ln_rms_only],
        "biased_variance": [ln_std_unbiased],
        "eps_inside": [ln_eps_outside],
        "eps_honoured": [ln_no_eps, ln_fixed_eps],
        "last_dim": [ln_first_dim],
        "centred_variance": [ln_moments],
        "not_in_place": [ln_in_place],
    },
    "logit_lens_score": {
        "layer_norm_first": [lens_raw],
        "layer_norm_scale": [lens_unit_norm],
        "eps_passed": [lens_drops_eps],
        "last_dim": [lens_over_layers],
        "leading_dims": [lens_three_dims],
        "direction_as_given": [lens_unit_direction],
    },
    "value_lens": {
        "layer_norm_first": [value_no_ln],
        "eps_passed": [value_drops_eps],
        "squeeze_last": [value_no_squeeze, value_squeeze_all],
        "parameters_untouched": [value_folds_centring_into_head, value_head_to_float64],
        "grads_untouched": [value_zero_grad, value_backward],
        "requires_grad_untouched": [value_freezes_head],
    },
    "head_attribution": {
        "centred": [attr_not_centred],
        "own_scale": [attr_mean_scale],
        "divides": [attr_times_scale, attr_no_scale],
        "mean_over_batch": [attr_summed],
        "shape": [attr_squeezed],
        "not_in_place": [attr_in_place],
    },
    "patch_activation": {
        "positions_dim": [patch_batch_dim],
        "none_is_all": [patch_none_is_nothing],
        "empty_is_none": [patch_empty_means_all],
        "negative_positions": [patch_positive_range],
        "trailing_dims": [patch_second_to_last_dim],
        "source_untouched": [patch_writes_source],
        "returns_activation": [patch_no_return],
        "not_source_itself": [patch_returns_source, patch_returns_source_view],
    },
    "restored_fraction": {
        "ratio_of_means": [restored_mean_of_ratios],
        "all_entries": [restored_mean_over_dim0],
        "orientation": [restored_remaining, restored_over_tuned],
        "signed": [restored_clamped, restored_abs],
        "zero_dim_tensor": [restored_float32, restored_item],
    },
    "activation_difference": {
        "orientation": [diff_base_minus_tuned],
        "first_positions": [diff_all_positions, diff_one_too_many, diff_one_too_few, diff_skip_bos,
                            diff_skip_bos_short],
        "positions_dim": [diff_batch_sliced],
        "mean": [diff_sum_positions],
        "short_texts": [diff_sum_over_n_positions],
        "default": [diff_default_three],
        "shape": [diff_per_position],
    },
    "param_change": {
        "relative": [change_absolute, change_over_tuned],
        "clamped": [change_no_clamp],
        "norm_of_change": [change_norm_growth],
        "whole_tensor": [change_per_entry],
        "names_in_both": [change_all_names],
        "python_floats": [change_tensors],
        "parameters": [change_with_numpy],
        "wide_dtype": [change_norm_in_own_dtype],
    },
    "fraction_changed": {
        "strict": [fraction_ge],
        "entries_together": [fraction_mean_per_tensor],
        "absolute_value": [fraction_no_abs],
        "absolute_threshold": [fraction_isclose, fraction_relative],
        "changed": [fraction_unchanged],
        "names_in_both": [fraction_all_names],
        "python_float": [fraction_tensor],
        "parameters": [fraction_with_numpy],
    },
}
