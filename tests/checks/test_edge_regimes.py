"""Edge regimes, probed over the registry and exercise by exercise, each with the wrong version written here.

- Size-1 dims: every ``.squeeze(-1)`` of every reference, replaced by ``.squeeze()`` (which also drops a
  batch of one, a single layer, a single head, a single position), must be rejected, except where a
  size-1 dim cannot change the result (listed with the reason).
- A module left in ``eval()`` mode by the learner's function (a caller's state mutated) is named.
- Fractions that overshoot 1 or go negative, changes smaller than ``torch.isclose``'s default rtol, a
  relative threshold where the contract's is absolute, and a product of many ratios that overflows
  where a sum of logs does not.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch

from rlhf_tutorial import interp, rlhf
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.notebooks import exercise_name, resolve
from tests.checks.helpers import assert_fails_with
from tests.checks.test_exercise_manifest import MANIFEST

#: (exercise, which squeeze(-1)) where squeeze() gives the same result on every input, with why.
BENIGN = {
    ("rollout_step", 0): "one env: the value of shape () is stored into buffer.values[step] of shape [1] alike",
    ("ppo_learning_phase", 0): "one env: next_value of shape () broadcasts in compute_gae as [1] does",
    ("ppo_learning_phase", 1): "a minibatch of one: the value loss of shape () values equals that of [1]",
    ("RewardModel", 1): "'mean_scores' of one row: pool_mean broadcasts the [s] scores against the [1, s] mask",
    ("sequence_logprobs", 0): "one row: the [s-1] log-probs broadcast against mask[:, 1:] of [1, s-1] before the sum",
    ("sft_loss", 0): "one row: torch.where broadcasts the [s-1] log-probs against mask[:, 1:] of [1, s-1] before the sum",
}


def _squeeze_calls(source: str) -> list[tuple[int, int, int]]:
    """(line, start column, end column) of every ``x.squeeze(-1)`` call in the code (not in a docstring)."""
    calls = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "squeeze"
                and node.end_lineno == node.lineno):
            dims = [*node.args, *(k.value for k in node.keywords if k.arg == "dim")]
            if len(dims) == 1 and ast.unparse(dims[0]) == "-1":
                calls.append((node.lineno, node.func.value.end_col_offset, node.end_col_offset))
    return sorted(calls)


def squeeze_mutants() -> list[tuple[str, int, str]]:
    """(exercise, index, source) for each .squeeze(-1) of each reference replaced by .squeeze()."""
    out = []
    for _, ref in MANIFEST:
        source = textwrap.dedent(inspect.getsource(resolve(ref)))
        for i, (line, start, end) in enumerate(_squeeze_calls(source)):
            lines = source.splitlines(keepends=True)
            lines[line - 1] = lines[line - 1][:start] + ".squeeze()" + lines[line - 1][end:]
            out.append((exercise_name(ref), i, "".join(lines)))
    return out


MUTANTS = squeeze_mutants()


def build(name: str, source: str):
    reference = resolve(next(ref for _, ref in MANIFEST if exercise_name(ref) == name))
    namespace = dict(vars(inspect.getmodule(reference)))
    exec(compile("from __future__ import annotations\n" + source, f"<{name} with squeeze()>", "exec"), namespace)
    return namespace[reference.__name__]


def test_the_squeeze_mutation_finds_the_references_squeezes():
    names = {name for name, _, _ in MUTANTS}
    assert {"get_logprobs", "TransformerWithValueHead", "value_lens", "RewardModel", "sequence_logprobs"} <= names
    assert set(BENIGN) <= {(name, i) for name, i, _ in MUTANTS}


@pytest.mark.parametrize("name, index, source", MUTANTS, ids=[f"{n}-{i}" for n, i, _ in MUTANTS])
def test_squeeze_without_a_dim_is_rejected_where_a_size_one_dim_matters(name, index, source):
    result = run_check(name, build(name, source))
    if (name, index) in BENIGN:
        assert result.passed, f"{name}: listed as benign, yet rejected (update BENIGN): {result.message}"
    else:
        assert not result.passed, f"{name}: squeeze() instead of squeeze(-1) (#{index}) passes"


def test_head_attribution_squeezed_to_a_scalar_for_one_layer_and_head_is_rejected():
    assert_fails_with("head_attribution", lambda h, s, d: interp.head_attribution(h, s, d).squeeze(),
                      "one example, a single layer and a single head")


# ----------------------------------------------------------------------------------------------------
# A module's train/eval mode is the caller's (except where the reference samples with generate(), which
# puts the model in eval mode by design: get_samples, sample_group, rollout_phase)
# ----------------------------------------------------------------------------------------------------
def objective_leaves_eval(model, ref_model, minibatch, prefix_len, kl_coef, args):
    model.eval()  # "no dropout in the objective": but the learning phase's model was in train() mode
    return rlhf.compute_rlhf_objective(model, ref_model, minibatch, prefix_len, kl_coef, args)


def objective_leaves_ref_train(model, ref_model, minibatch, prefix_len, kl_coef, args):
    ref_model.train()  # the frozen reference switched to train() mode
    return rlhf.compute_rlhf_objective(model, ref_model, minibatch, prefix_len, kl_coef, args)


def value_lens_leaves_head_eval(resid_stack, value_head, eps=1e-5):
    value_head.eval()
    return interp.value_lens(resid_stack, value_head, eps)


@pytest.mark.parametrize("name, wrong, fragment", [
    ("compute_rlhf_objective", objective_leaves_eval, "left `model` in eval() mode"),
    ("compute_rlhf_objective", objective_leaves_ref_train, "left `ref_model` in train() mode"),
    ("value_lens", value_lens_leaves_head_eval, "left `value_head` in eval() mode"),
], ids=["objective-model-eval", "objective-ref-train", "value-lens-head-eval"])
def test_a_module_left_in_another_mode_is_named(name, wrong, fragment):
    assert_fails_with(name, wrong, fragment)


def test_a_submodule_switched_is_named_too():
    def partly(resid_stack, value_head, eps=1e-5):
        value_head[1].eval()
        return interp.value_lens(resid_stack, value_head, eps)

    assert_fails_with("value_lens", partly, "changed the train/eval mode of a part of `value_head`")


# ----------------------------------------------------------------------------------------------------
# Fractions outside [0, 1], thresholds, tolerances, overflow
# ----------------------------------------------------------------------------------------------------
def restored_clamped(patched, base, tuned):
    return ((patched.mean() - base.mean()) / (tuned.mean() - base.mean())).clamp(0.0, 1.0)


def restored_abs(patched, base, tuned):
    return (patched.mean() - base.mean()).abs() / (tuned.mean() - base.mean()).abs()


def _entries(base_params, tuned_params):
    return [(base_params[k].double(), tuned_params[k].double()) for k in base_params if k in tuned_params]


def changed_isclose(base_params, tuned_params, atol=0.0):
    pairs = _entries(base_params, tuned_params)
    return sum(int((~torch.isclose(t, b, atol=atol)).sum()) for b, t in pairs) / sum(b.numel() for b, _ in pairs)


def changed_relative(base_params, tuned_params, atol=0.0):
    pairs = _entries(base_params, tuned_params)
    return sum(int(((t - b).abs() > atol * b.abs()).sum()) for b, t in pairs) / sum(b.numel() for b, _ in pairs)


def gspo_product_of_ratios(logprobs, old_logprobs, mask):
    ratios = torch.where(mask, (logprobs - old_logprobs).exp(), torch.ones_like(logprobs))
    return ratios.prod(-1).pow(1.0 / mask.sum(-1))


def sequence_prob_product(logits, tokens, mask):
    probs = logits[:, :-1].softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return torch.where(mask[:, 1:], probs, torch.ones_like(probs)).prod(-1).log()


@pytest.mark.parametrize("name, wrong, fragment", [
    ("restored_fraction", restored_clamped, "You clamped the fraction to [0, 1]"),
    ("restored_fraction", restored_abs, "You took an absolute value"),
    ("fraction_changed", changed_isclose, "default rtol of 1e-5"),
    ("fraction_changed", changed_relative, "Your threshold is relative to the weight"),
    ("gspo_sequence_ratio", gspo_product_of_ratios, "You multiplied the token ratios"),
    ("sequence_logprobs", sequence_prob_product, "You multiplied the token probabilities"),
], ids=["restored-clamped", "restored-abs", "changed-isclose", "changed-relative", "gspo-product",
        "seq-product"])
def test_fractions_thresholds_and_overflow_are_named(name, wrong, fragment):
    assert_fails_with(name, wrong, fragment)
