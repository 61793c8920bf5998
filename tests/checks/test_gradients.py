"""Checkers watch gradients: registry-driven.

Every exercise whose output training differentiates (``plug.DIFFERENTIATED``) has a checker that
compares the gradient as well as the value. Generic wrong versions of the reference, built here for
each of them, must be rejected with a message that names the lost gradient: the output detached,
the function run under ``torch.no_grad()``, and each differentiated input detached on its own (one
half of a pair). Then the named variants the issue found passing (a detached rejected side in
``dpo_loss``, ``h`` detached, ``sequence_logprobs`` under no_grad, ``gspo_sequence_ratio`` detached),
and a correct version written differently, whose gradient is the same, passes.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
import torch.nn.functional as F

from rlhf_tutorial.checks import load_all, run_check
from rlhf_tutorial.checks.core import REGISTRY
from rlhf_tutorial.notebooks import exercise_name, resolve
from rlhf_tutorial.trainers.plug import DIFFERENTIATED
from tests.checks.helpers import assert_fails_with
from tests.checks.test_exercise_manifest import MANIFEST

REFERENCES = {exercise_name(ref): ref for _, ref in MANIFEST}


def _detach_all(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, (tuple, list)):
        return type(obj)(_detach_all(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _detach_all(v) for k, v in obj.items()}
    return obj


def detached_output(reference):
    @functools.wraps(reference)
    def fn(*args, **kwargs):
        return _detach_all(reference(*args, **kwargs))

    return fn


def under_no_grad(reference):
    @functools.wraps(reference)
    def fn(*args, **kwargs):
        with torch.no_grad():
            return reference(*args, **kwargs)

    return fn


def detached_input(reference, name: str):
    signature = inspect.signature(reference)

    @functools.wraps(reference)
    def fn(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments[name] = bound.arguments[name].detach()
        return reference(*bound.args, **bound.kwargs)

    return fn


def test_every_differentiated_exercise_has_a_checker():
    load_all()
    assert set(DIFFERENTIATED) <= set(REGISTRY), sorted(set(DIFFERENTIATED) - set(REGISTRY))
    for name, inputs in DIFFERENTIATED.items():
        params = inspect.signature(resolve(REFERENCES[name])).parameters
        assert set(inputs) <= set(params), f"{name}: {inputs} are not all arguments of the contract"


@pytest.mark.parametrize("name", sorted(DIFFERENTIATED))
def test_a_detached_output_is_rejected(name):
    reference = resolve(REFERENCES[name])
    assert run_check(name, reference).passed
    assert_fails_with(name, detached_output(reference), "no gradient")


@pytest.mark.parametrize("name", sorted(DIFFERENTIATED))
def test_a_function_under_no_grad_is_rejected(name):
    assert_fails_with(name, under_no_grad(resolve(REFERENCES[name])), "no gradient")


CASES = [(name, arg) for name, inputs in sorted(DIFFERENTIATED.items()) for arg in inputs if arg != "model"]


@pytest.mark.parametrize("name, arg", CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_a_detached_input_is_rejected(name, arg):
    """One differentiated input detached (for a pair, one half): named when the output keeps a graph."""
    result = run_check(name, detached_input(resolve(REFERENCES[name]), arg))
    assert not result.passed
    text = f"{result.message}\n{result.hint}"
    if len(DIFFERENTIATED[name]) > 1:
        assert f"no gradient reaches `{arg}`" in text, text
    else:
        assert "carries no gradient" in text, text


# ----------------------------------------------------------------------------------------------------
# The variants the issue found passing, as a learner writes them
# ----------------------------------------------------------------------------------------------------
def _dpo_from_h(h, beta, loss_type, label_smoothing):
    if loss_type == "sigmoid":
        return -((1 - label_smoothing) * F.logsigmoid(beta * h) + label_smoothing * F.logsigmoid(-beta * h)).mean()
    if loss_type == "ipo":
        return ((h - 1 / (2 * beta)) ** 2).mean()
    if loss_type == "hinge":
        return torch.relu(1 - beta * h).mean()
    raise ValueError(loss_type)


def dpo_rejected_detached(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    return _dpo_from_h((pc - rc) - (pr - rr).detach(), beta, loss_type, label_smoothing)


def dpo_h_detached(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    return _dpo_from_h(((pc - rc) - (pr - rr)).detach(), beta, loss_type, label_smoothing)


@torch.no_grad()
def sequence_logprobs_no_grad(logits, tokens, mask):
    lp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.where(mask[:, 1:], lp, 0.0).sum(-1)


def gspo_detached(logprobs, old_logprobs, mask):
    d = torch.where(mask, logprobs - old_logprobs, 0.0).detach()
    return torch.exp(d.sum(-1) / mask.sum(-1))


def simpo_rejected_item(c, r, lc, lr, beta=2.0, gamma=0.5):
    rejected = torch.tensor((r / lr).tolist(), device=r.device)  # rebuilt from Python numbers: no graph
    return -F.logsigmoid(beta * (c / lc - rejected) - gamma).mean()


def surrogate_ratio_detached(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = (advantages - advantages.mean()) / (advantages.std() + eps)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.detach().clamp(1 - clip_coef, 1 + clip_coef) * a  # the clipped branch loses its graph
    return torch.minimum(ratio * a, clipped).mean()


@pytest.mark.parametrize("name, candidate, fragment", [
    ("dpo_loss", dpo_rejected_detached, "no gradient reaches `policy_rejected_logps`"),
    ("dpo_loss", dpo_h_detached, "carries no gradient"),
    ("sequence_logprobs", sequence_logprobs_no_grad, "torch.no_grad()"),
    ("gspo_sequence_ratio", gspo_detached, "carries no gradient"),
    ("simpo_loss", simpo_rejected_item, "no gradient reaches `rejected_logps`"),
    ("calc_clipped_surrogate_objective", surrogate_ratio_detached, "the gradient with respect to `logprobs`"),
], ids=["dpo-rejected-detached", "dpo-h-detached", "seq-no-grad", "gspo-detached", "simpo-item",
        "surrogate-partly-detached"])
def test_learner_detaches_are_named(name, candidate, fragment):
    assert_fails_with(name, candidate, fragment)


def bt_loss_softplus(chosen_rewards, rejected_rewards):
    return F.softplus(rejected_rewards - chosen_rewards).mean()  # -logsigmoid(x) = softplus(-x)


def entropy_categorical(logits, ent_coef):
    return ent_coef * torch.distributions.Categorical(logits=logits).entropy().mean()


def value_loss_mse(values, returns, vf_coef):
    return 0.5 * vf_coef * F.mse_loss(values, returns)


def logprobs_cross_entropy(logits, tokens, prefix_len=None):
    start = 1 if prefix_len is None else prefix_len
    pred = logits[:, start - 1 : -1]
    return -F.cross_entropy(pred.transpose(1, 2), tokens[:, start:], reduction="none")


@pytest.mark.parametrize("name, candidate", [
    ("bradley_terry_loss", bt_loss_softplus), ("calc_entropy_bonus", entropy_categorical),
    ("calc_value_function_loss", value_loss_mse), ("get_logprobs", logprobs_cross_entropy),
], ids=["bt-softplus", "entropy-categorical", "value-mse", "logprobs-cross-entropy"])
def test_correct_versions_written_differently_pass_the_gradient_case(name, candidate):
    result = run_check(name, candidate)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# The modules whose forward training differentiates: the same generic wrappers, on forward
# ----------------------------------------------------------------------------------------------------
MODULES = ["TransformerWithValueHead", "RewardModel", "LoRA"]


def with_forward(reference: type, wrap) -> type:
    """A subclass of the reference module whose forward is ``wrap(reference.forward)``."""
    return type(reference.__name__, (reference,), {"forward": wrap(reference.forward)})


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("wrap", [detached_output, under_no_grad], ids=["detached-forward", "forward-under-no-grad"])
def test_a_module_whose_forward_loses_the_graph_is_rejected(name, wrap):
    result = run_check(name, with_forward(resolve(REFERENCES[name]), wrap))
    assert not result.passed
    text = f"{result.message}\n{result.hint}"
    assert any(words in text for words in ("no gradient reaches", "does not require grad", "carry no gradient")), text


def test_a_graph_broken_by_an_in_place_edit_is_a_failure_not_a_checker_crash():
    def in_place(values, returns, vf_coef):
        squared = (values - returns).exp()
        out = 0.5 * vf_coef * squared.log().pow(2).mean()
        squared.mul_(1.0)  # exp's output, needed by its backward, modified in place
        return out

    result = run_check("calc_value_function_loss", in_place)
    assert not result.passed and "backpropagating through your output failed" in result.message, result.message
    assert "bug in the checker" not in result.message
