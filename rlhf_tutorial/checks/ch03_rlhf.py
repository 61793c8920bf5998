"""Checkers for chapter 03: RLHF with PPO on a HookedTransformer.

The pure functions are compared with the reference on seeded cases (``compare_to_reference``), with a
catalogue of known wrong versions for targeted hints. The stateful pieces (controllers, early
stopping, replay memory) are driven through scripted sequences. The phases run on the tiny world
(its policy, tokenizer and sentiment classifier) with small sizes, and are checked on their
mechanics: shapes, what the memory holds, KL starting at 0, the reference model left untouched, the
update matching a reference update, and the reward moving.

Regimes probed (where plausible implementations differ):
- get_logprobs: prefix_len None and given, one generated token, logits x 100 (log(softmax) underflows);
- calc_kl_penalty: logits x 50, identical logits (KL exactly 0), a single position;
- approx_kl: |logr| < 3 of both signs, logr = 0, a single token, then |logr| up to 30 for k1, k2 and k3
  (a clamp of the log-ratio or of the estimate shows only there); unknown estimators ("full", "k4");
- compute_advantages / compute_per_token_rewards: one generated token (first == last), a batch of 1
  (a squeeze() of values or rewards drops the batch dimension there), all-equal values; for the rewards also reference log-probs down to -250, where a ratio of
  probabilities (exp of each log-prob) underflows to 0 / 0 or x / 0;
- lr_schedule: step 0, the end of warmup, no warmup, steps past total_steps (the clamp), final_scale 0 in
  the warmup, the decay and after it; the type of the multiplier (a Python float);
- AdaptiveKLController: a mixed script (the error clip, n_steps), 30 updates far above target (x ~240)
  and 45 at KL = 0 (/ ~23000): a clamp or floor on the coefficient shows only on these runaways;
- EarlyStopping: values exactly at the thresholds, the reward threshold on and off, resets, thresholds of
  0.0 (a value, not unset);
- get_optimizer: base_lr = 0 (a learning rate of 0 taken for a missing one: a group dropped, `lr or default`);
- get_samples: prepend_bos=False (no BOS: the texts must keep the prompt's first token, which a decoding
  that always drops position 0 loses); a policy that samples EOS at every step (a generation that stops at
  EOS ends after one token there); top_k=1 (the greedy continuation); temperatures 0.5 and 2 (1500
  first tokens each: which of logits / T, logits, logits * T explains them best);
- ReplayMemory: 16 rows in 4 minibatches (where split(4) and reshape(4, -1) agree), then in ONE
  minibatch of all the rows (where they do not);
- TransformerWithValueHead: the hook's return value (replacing the activation), the initialisation,
  gradients into the trunk (a detached residual);
- compute_rlhf_objective: each term alone (coefficients and advantages set to 0 for the others), then
  together, at temperatures 0.7, 1 and 1.3 (the temperature of the reference logits), full and k3 KL;
- rollout_phase: the policy equal to the reference, a moved policy with an adaptive coefficient away
  from args.kl_coef, one-step advantages with whiten_rewards=False and top_k=3 at temperature 1.5 (every
  sampled token among the policy's 3 likeliest), a unigram repetition penalty that differs between
  samples; forward passes counted per chunk;
- learning_phase: a policy already away from the reference with kl_coef 0.5 (the objective's KL
  coefficient shows), clipping active, two passes of two minibatches, trainer.generator's state.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rlhf_tutorial import rlhf
from rlhf_tutorial.checks.ch00_tour import small_model
from rlhf_tutorial.checks.ch01_ppo import orthogonal_gain
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    check_device,
    checker,
    compare_to_reference,
    expect_tensor,
    failure,
    fmt,
    get_attr,
    is_cpu_pass,
    mismatch,
    seeded,
    to_device,
)
from rlhf_tutorial.devices import device_of
from rlhf_tutorial.notebooks import solution_code
from rlhf_tutorial.rewards import ngram_repetition, sentiment_reward_fn, whiten
from rlhf_tutorial.trainers.plug import DIFFERENTIATED
from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer
from rlhf_tutorial.worlds import PROMPT

CHAPTER = "03_rlhf_ppo"

# The contract of every exercise, clause by clause (its CURRICULUM.md row and its docstring); the tests
# write a version breaking each one (tests/checks/test_ch03_rlhf.py: VIOLATIONS), and
# tests/checks/test_contract_clauses.py holds the two maps together. Devices are left out: a layer or
# tensor on the wrong device is a wrong version only where the checks run on a GPU (or the simulated one),
# and the tests marked needs_gpu hold those verdicts.
CLAUSES: dict[str, dict[str, str]] = {
    "TransformerWithValueHead": {
        "architecture": "value_head is Linear(d_model, 4 d_model), ReLU, Linear(4 d_model, 1) in an nn.Sequential",
        "hook_point": "the head reads the residual at ln_final.hook_normalized, after the last LayerNorm",
        "logits_unchanged": "the hook only reads: the logits are those of the base model itself",
        "trunk_gradient": "the residual is not detached: the values' gradient reaches the transformer",
        "logits_gradient": "the logits keep their graph: the policy's gradient flows through them",
        "init": "both layers initialised as layer_init does: orthogonal with gain sqrt(2) then 1, zero biases",
        "values_shape": "values are [b, s]: only the head's trailing dimension is dropped (batch of 1, one position)",
        "hooks_removed": "no hook stays attached to the base model after forward",
        "same_base_model": "base_model is the model passed in, the same object (not a copy)",
    },
    "get_samples": {
        "no_eos_stop": "generation does not stop at the end-of-text token: every row has prompt_len + gen_len tokens",
        "prompt_first": "every row starts with the prompt's tokens, with BOS only when prepend_bos is True",
        "sampled": "tokens are sampled, not decoded greedily: the rows differ",
        "temperature": "each token is drawn from softmax(logits / temperature)",
        "top_k": "with top_k set, only the k likeliest tokens can be drawn",
        "not_inference": "the tokens are a normal tensor, not an inference tensor",
        "texts_skip_special": "texts are the decoded rows with special tokens (BOS/EOS) left out",
        "texts_no_bos": "with prepend_bos False the texts keep the prompt's first token",
        "long_dtype": "the tokens are int64 token ids",
    },
    "get_logprobs": {
        "previous_position": "each token's log-prob is read from the logits of the position before it",
        "normalised": "a log-probability over the vocabulary (log-softmax), not a raw logit nor a probability",
        "prefix_none": "with prefix_len None every token but the first is scored, g = s - 1",
        "prefix_given": "with prefix_len given only the generated tokens from prefix_len on are scored",
        "stable": "stable for large logits (no log of a softmax that underflows)",
        "differentiable": "differentiable in logits: the output carries their gradient",
        "not_in_place": "the input logits are never modified in place",
    },
    "calc_kl_penalty": {
        "direction": "KL(policy || reference): the expectation is under the policy's probabilities",
        "weighted": "the log-ratio is weighted by p, summed over the vocabulary",
        "mean_positions": "averaged (not summed) over batch and positions",
        "coef": "multiplied by kl_coef",
        "stable": "stable for large logits (log-probabilities from log-softmax)",
        "differentiable": "differentiable in logits",
        "scalar": "returns a 0-dim tensor",
    },
    "approx_kl": {
        "log_ratio": "log r is ref_logprobs minus logprobs, not the reverse",
        "k1": "k1 is -log r",
        "k2": "k2 is (log r) squared over 2",
        "k3": "k3 is (r - 1) - log r",
        "default_k3": "the default estimator is k3",
        "elementwise": "per token, no reduction: the output has the inputs' shape",
        "large_log_ratio": "exact for large log-ratios: no clamp of log r or of the estimate",
        "unknown_raises": "any other estimator raises a ValueError naming k1, k2 and k3",
        "differentiable": "differentiable in logprobs",
    },
    "compute_advantages": {
        "baseline": "the baseline is the value of the state that chose the token, the position before it",
        "next_value": "the one-step Q of a token before the last is the next state's value",
        "last_reward": "after the last token the Q estimate is the reward (the episode is over)",
        "reward_last_only": "the reward is the Q estimate of the last token only",
        "batch_of_one": "a batch of 1 keeps its batch dimension",
        "not_in_place": "the input values are never modified in place",
    },
    "compute_per_token_rewards": {
        "kl_sign": "each token pays -kl_coef * (logprobs - ref_logprobs)",
        "coef": "the KL term is multiplied by kl_coef",
        "score_last": "the score is added at the last position",
        "score_once": "the score is added once, not at every position",
        "own_row": "each row's score goes to its own row",
        "log_difference": "the log-ratio is a difference of log-probs, finite even where exp underflows",
        "not_in_place": "the input log-probs are never modified in place",
    },
    "ReplayMemory": {
        "returns": "the value targets are returns = advantages + values",
        "fresh_permutation": "each pass draws a fresh random permutation of the rows",
        "aligned_rows": "every field of a minibatch holds the same rows",
        "without_replacement": "each pass visits every row exactly once",
        "generator": "the permutation is drawn from the generator passed in",
        "num_minibatches": "num_minibatches is how many minibatches per pass (of batch / num_minibatches rows)",
        "update_epochs": "update_epochs passes over the memory",
    },
    "compute_rlhf_objective": {
        "surrogate": "the clipped surrogate of the minibatch's old log-probs and advantages, at args.clip_coef",
        "value_sign": "the value loss is subtracted",
        "value_slice": "the values at the states that chose the generated tokens enter the value loss",
        "value_clip": "with args.cliprange_value set the value loss is the clipped one, around the rollout's values",
        "value_clip_zero": "a cliprange_value of 0.0 is set (the value loss clipped to the rollout's values), only None is unset",
        "temperature": "the policy's logits are divided by args.temperature",
        "entropy_slice": "the entropy is averaged over the positions that predict generated tokens only",
        "ent_coef_once": "the entropy bonus is weighted by args.ent_coef, once",
        "kl_sign": "kl_coef times the KL is subtracted",
        "kl_coef_argument": "the KL weight is the kl_coef argument, not args.kl_coef",
        "kl_estimator": "args.kl_estimator decides the KL: the full one, or approx_kl's estimator",
        "ref_model": "the reference distribution comes from ref_model or the stored reference log-probs",
        "ref_temperature": "the reference logits are divided by the same temperature",
        "ref_no_grad": "the reference forward pass runs without gradient tracking",
        "stats_before_coef": "the logged entropy and kl are the terms before their coefficients",
        "differentiable": "the objective's gradient reaches the transformer and the value head",
    },
    "get_optimizer": {
        "adamw": "the optimizer is AdamW",
        "two_groups": "two parameter groups, the base model's and the value head's",
        "exact_params": "the groups hold exactly the base model's and exactly the value head's parameters",
        "learning_rates": "base_lr for the base model, head_lr for the value head",
        "maximize": "maximize=True: the objective is climbed",
        "no_weight_decay": "weight decay 0 in both groups",
        "zero_lr": "a learning rate of 0 is a value, not unset",
    },
    "lr_schedule": {
        "warmup": "step / warmup_steps while step < warmup_steps (0 at step 0)",
        "decay_start": "the decay starts at 1.0 at warmup_steps",
        "decay_end": "the decay reaches final_scale at total_steps",
        "after_total": "final_scale from total_steps on",
        "no_warmup": "warmup_steps 0 means no warmup (no division by zero)",
        "zero_final_scale": "a final_scale of 0 is a value, not unset",
        "python_float": "returns a Python float",
    },
    "AdaptiveKLController": {
        "error_clip": "the error current_kl / target - 1 is clipped to [-0.2, 0.2]",
        "direction": "KL above target raises the coefficient, below target lowers it",
        "proportional": "the error is relative: current_kl / target - 1, not current_kl - target",
        "n_steps": "the step is scaled by n_steps / horizon",
        "multiplicative": "the coefficient is multiplied by 1 + err * n_steps / horizon",
        "no_bounds": "the coefficient itself has no bounds (no clamp, no floor)",
        "init_value": "value starts at init_kl_coef",
    },
    "EarlyStopping": {
        "strict": "a value equal to its threshold is not a violation",
        "reset": "a call that violates nothing resets the count",
        "patience": "True once patience consecutive calls have violated, not one later",
        "reward_threshold": "with a reward threshold set a reward above it violates",
        "reward_unset": "with reward_threshold None rewards never violate",
        "zero_threshold": "a threshold of 0.0 is a value, not unset",
        "returns_bool": "should_stop returns True or False",
    },
    "rollout_phase": {
        "temperature": "the log-probs are of logits / temperature, for the policy and the reference",
        "ref_model": "the reference log-probs come from trainer.ref_model",
        "whitening_switch": "the scores are whitened only when args.whiten_rewards",
        "value_slice": "the memory keeps the values of the states that chose the generated tokens",
        "chunked": "forward passes run one chunk of at most args.minibatch_size rows at a time",
        "trainer_kl_coef": "the advantages use the trainer's current KL coefficient, not args.kl_coef",
        "shaping": "the rewards are the task rewards minus repetition_coef times the n-gram repetition",
        "top_k": "the samples are drawn with args.top_k",
        "no_grad": "the memory carries no gradients",
        "sample_temperature": "the samples are drawn at args.temperature (not only the log-probs)",
        "prepend_bos": "the samples start with a BOS token only when args.prepend_bos",
    },
    "learning_phase": {
        "zero_grad": "the gradients are cleared before each minibatch's backward pass",
        "clip": "the global gradient norm is clipped to max_grad_norm before each step",
        "update_epochs": "update_epochs passes over the memory",
        "scheduler_once": "the scheduler steps once per phase, after the last minibatch",
        "generator": "the minibatches are drawn with trainer.generator",
        "objective_kl_coef": "the objective takes trainer.objective_kl_coef",
        "ascent": "the update climbs the objective",
        "diagnostics": "the returned diagnostics are the mean of every minibatch's stats",
    },
}
if check_device().type == "simgpu":  # inference_mode runs as no_grad there: no tensor is an inference tensor,
    del CLAUSES["get_samples"]["not_inference"]  # so nothing can break that clause (a GPU and the CPU hold it)



# ----------------------------------------------------------------------------------------------------
# get_logprobs
# ----------------------------------------------------------------------------------------------------
def _logprob_cases() -> list[Case]:
    g = seeded(0)
    cases = []
    for label, (b, s, v), prefix_len, scale in [
        ("prefix_len=None", (2, 6, 11), None, 1.0),
        ("prefix_len=3", (3, 7, 13), 3, 1.0),
        ("a batch of 1, one generated token", (1, 5, 9), 4, 1.0),
        ("large logits (x100)", (2, 6, 11), 2, 100.0),
    ]:
        logits = torch.randn(b, s, v, generator=g) * scale
        tokens = torch.randint(0, v, (b, s), generator=g)
        cases.append(Case(label, (logits, tokens, prefix_len)))
    return cases


def _lp_own_position(logits, tokens, prefix_len=None):
    start = 1 if prefix_len is None else prefix_len
    return logits[:, start:].log_softmax(-1).gather(-1, tokens[:, start:, None]).squeeze(-1)


def _lp_shifted_tokens(logits, tokens, prefix_len=None):
    start = 1 if prefix_len is None else prefix_len
    return logits[:, start - 1 : -1].log_softmax(-1).gather(-1, tokens[:, start - 1 : -1, None]).squeeze(-1)


def _lp_raw_logits(logits, tokens, prefix_len=None):
    start = 1 if prefix_len is None else prefix_len
    return logits[:, start - 1 : -1].gather(-1, tokens[:, start:, None]).squeeze(-1)


def _lp_probs(logits, tokens, prefix_len=None):
    start = 1 if prefix_len is None else prefix_len
    return logits[:, start - 1 : -1].softmax(-1).gather(-1, tokens[:, start:, None]).squeeze(-1)


@checker(
    "get_logprobs",
    chapter=CHAPTER,
    hint=(
        "`log_softmax` over the vocabulary, then `gather` on the last dimension picks each token's log-prob; "
        "the logits that score token t are at position t - 1.",
        "Let start = 1 when prefix_len is None, else prefix_len. The tokens to score are those from position "
        "start to the end; the logits that score them are those from position start - 1 up to (not including) "
        "the last position. Take the log-softmax of those logits, gather along the vocabulary with the token "
        "ids given an extra trailing dimension, and drop that dimension again: [b, s - start].",
        solution_code(rlhf.get_logprobs),
    ),
)
def check_get_logprobs(candidate) -> str:
    cases = _logprob_cases()
    logits, tokens, _ = to_device(cases[1].args)
    out = call(candidate, logits, tokens, 3, _arg_names=["logits", "tokens", "prefix_len"])
    if isinstance(out, torch.Tensor) and tuple(out.shape) == (3, 6):
        raise CheckFailure(
            f"with prefix_len=3 and 7 tokens per row, your output has shape {tuple(out.shape)}, expected (3, 4).",
            hint="You ignored prefix_len: only the generated tokens tokens[:, prefix_len:] get log-probs.",
        )
    return compare_to_reference(
        candidate,
        rlhf.get_logprobs,
        cases,
        arg_names=["logits", "tokens", "prefix_len"],
        grad=DIFFERENTIATED["get_logprobs"],
        grad_cases=(1,),
        mistakes=[
            Mistake("Off by one: you read each token's log-prob from the logits at its OWN position. The "
                    "logits at position t predict the token at t+1: score each token with the logits of the "
                    "position before it.", _lp_own_position),
            Mistake("Off by one: you scored the tokens one position early; the logits at positions start - 1 .. "
                    "s - 2 predict the tokens at positions start .. s - 1.", _lp_shifted_tokens),
            Mistake("Those are raw logits: apply log_softmax over the vocabulary before gathering.", _lp_raw_logits),
            Mistake("Those are probabilities: use log_softmax, not softmax.", _lp_probs),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# calc_kl_penalty
# ----------------------------------------------------------------------------------------------------
def _kl_cases() -> list[Case]:
    g = seeded(1)
    cases = []
    for label, (b, n, v), coef, scale in [
        ("kl_coef=1", (2, 5, 7), 1.0, 1.0),
        ("kl_coef=0.3", (3, 4, 9), 0.3, 2.0),
        ("a batch of 1", (1, 1, 5), 0.8, 1.0),
        ("large logits (x50)", (2, 3, 11), 0.5, 50.0),
    ]:
        logits = torch.randn(b, n, v, generator=g) * scale
        ref = torch.randn(b, n, v, generator=g) * scale
        cases.append(Case(label, (logits, ref, coef)))
    same = torch.randn(2, 3, 6, generator=g)
    cases.append(Case("identical logits (KL = 0)", (same, same.clone(), 1.0)))
    return cases


def _kl_full(logits, ref_logits):
    logp, logq = logits.log_softmax(-1), ref_logits.log_softmax(-1)
    return (logp.exp() * (logp - logq)).sum(-1)  # [b g]


@checker(
    "calc_kl_penalty",
    chapter=CHAPTER,
    hint=(
        "Both distributions as log-probabilities (`log_softmax`), the probabilities of the POLICY from them "
        "(`exp`), a sum over the vocabulary, then a mean over batch and positions.",
        "log p = log_softmax(logits), log q = log_softmax(ref_logits); per position KL = sum over the "
        "vocabulary of p * (log p - log q), weighted by the policy's p (the other order is KL(ref || "
        "policy)); average over [b, g] and multiply by kl_coef. Never take log of a softmax: large logits "
        "give log 0.",
        solution_code(rlhf.calc_kl_penalty),
    ),
)
def check_calc_kl_penalty(candidate) -> str:
    detail = compare_to_reference(
        candidate,
        rlhf.calc_kl_penalty,
        _kl_cases(),
        arg_names=["logits", "ref_logits", "kl_coef"],
        grad=DIFFERENTIATED["calc_kl_penalty"],
        mistakes=[
            Mistake("This equals KL(ref || policy): the arguments are swapped. The expectation is under the "
                    "policy: sum_v p * (log p - log p_ref) with p = softmax(logits).",
                    lambda a, b, c: c * _kl_full(b, a).mean()),
            Mistake("kl_coef is missing: multiply the mean KL by kl_coef.", lambda a, b, c: _kl_full(a, b).mean()),
            Mistake("You summed over positions: average over batch and positions (mean), sum only over the "
                    "vocabulary.", lambda a, b, c: c * _kl_full(a, b).sum(-1).mean()),
            Mistake("The log ratio is not weighted by p: KL = sum_v p * (log p - log p_ref), with "
                    "p = logp.exp().", lambda a, b, c: c * (a.log_softmax(-1) - b.log_softmax(-1)).sum(-1).mean()),
            Mistake("You used the wrong sign: log p_ref - log p gives -KL.", lambda a, b, c: -c * _kl_full(a, b).mean()),
        ],
    )
    g = seeded(2)
    for _ in range(3):
        logits, ref_logits = to_device((torch.randn(2, 4, 6, generator=g), torch.randn(2, 4, 6, generator=g)))
        out = call(candidate, logits, ref_logits, 1.0)
        if float(out) < -1e-6:
            raise CheckFailure(f"your KL is negative ({float(out):.4g}): a KL divergence is always >= 0.")
    return detail + " KL >= 0 on random inputs."


# ----------------------------------------------------------------------------------------------------
# approx_kl
# ----------------------------------------------------------------------------------------------------
def _approx_cases() -> list[Case]:
    g = seeded(3)
    lp = -torch.rand(3, 5, generator=g) * 3
    ref = -torch.rand(3, 5, generator=g) * 3
    lp1, ref1 = -torch.rand(4, generator=g) * 2, -torch.rand(4, generator=g) * 2
    # Large |log ratio|: a reference far below and far above the policy at the sampled token (logr from
    # -30 to +25), where implementations that clamp the log-ratio or the estimate (to [-10, 10], say)
    # part from the contract. k3 at logr = 25 is ~7e10: still exact in float32.
    far_lp = torch.tensor([[-0.01, -0.5, -21.0, -26.0], [-2.0, -1.0, -0.2, -3.0]])
    far_ref = torch.tensor([[-30.01, -12.5, -1.0, -1.0], [-2.5, -1.0, -16.2, -14.0]])
    return [
        Case("k3", (lp, ref, "k3")),  # typical: |logr| < 3, all signs
        Case("k2", (lp, ref, "k2")),
        Case("k1", (lp, ref, "k1")),
        Case("the default estimator (k3), 1-d input", (lp1, ref1)),  # default argument, other rank
        Case("k3 on equal log-probs (0)", (lp1, lp1.clone(), "k3")),  # zeros: logr = 0 exactly
        Case("a single token", (torch.tensor([-1.3]), torch.tensor([-0.4]), "k3")),  # one element
        Case("k3 with |logr| up to 30 (reference far from the policy)", (far_lp, far_ref, "k3")),  # clamps
        Case("k1 with |logr| up to 30", (far_lp, far_ref, "k1")),  # clamps of the log-ratio
        Case("k2 with |logr| up to 30", (far_lp, far_ref, "k2")),
    ]


def _approx_clamp_diagnosis(case: Case, got, expected) -> str | None:
    """A clamp of the log-ratio or of the estimate: right where |logr| is small, too small where it is large."""
    logprobs, ref_logprobs = case.args[0], case.args[1]
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    small = (ref_logprobs - logprobs).abs() <= 5
    got, expected = got.detach().double(), expected.double()
    right_small = torch.allclose(got[small], expected[small], atol=1e-4, rtol=1e-4)
    smaller_large = bool((got[~small].abs() < expected[~small].abs() * (1 - 1e-3)).any())
    if small.any() and right_small and smaller_large:
        return ("Your estimate is clamped where the log-ratio is large: it is right for |logr| <= 5 but smaller "
                "for |logr| of 12 to 30. Do not clamp logr or the estimate (no .clamp(-10, 10)): k1 = -logr, "
                "k2 = logr**2 / 2, k3 = (exp(logr) - 1) - logr exactly, however far the reference is.")
    return None


def _approx_sign_flipped_k3(lp, ref, est="k3"):
    logr = ref - lp
    return {"k1": -logr, "k2": logr**2 / 2, "k3": logr - torch.expm1(logr)}[est]


def _approx_reversed_ratio(lp, ref, est="k3"):
    logr = lp - ref
    return {"k1": -logr, "k2": logr**2 / 2, "k3": torch.expm1(logr) - logr}[est]


def _approx_k2_no_half(lp, ref, est="k3"):
    logr = ref - lp
    return {"k1": -logr, "k2": logr**2, "k3": torch.expm1(logr) - logr}[est]


def _approx_k1_sign(lp, ref, est="k3"):
    logr = ref - lp
    return {"k1": logr, "k2": logr**2 / 2, "k3": torch.expm1(logr) - logr}[est]


def _unknown_estimator_failure(candidate, estimator: str) -> CheckFailure | None:
    """None when ``approx_kl(..., estimator)`` raises a ValueError naming k1, k2 and k3; else the failure."""
    raised: list[BaseException] = []

    def attempt(logprobs, ref_logprobs):
        try:
            return candidate(logprobs, ref_logprobs, estimator)
        except ValueError as exc:
            raised.append(exc)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything
            raised.append(exc)
        return None

    lp, ref = to_device((torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -0.5])))
    out = call(attempt, lp, ref, _arg_names=["logprobs", "ref_logprobs"])
    hint = ("An estimator the contract does not name must fail loudly: raise a ValueError whose message names "
            "the three accepted ones, k1, k2 and k3 (a typo must not train with another estimator).")
    if not raised:
        return failure(f"estimator={estimator!r} returned {fmt(out)}: any estimator other than 'k1', 'k2' and "
                       "'k3' must raise a ValueError.", hint)
    exc = raised[0]
    if not isinstance(exc, ValueError):
        return failure(f"estimator={estimator!r} raised {type(exc).__name__}, not a ValueError.", hint)
    missing = [name for name in ("k1", "k2", "k3") if name not in str(exc)]
    if missing:
        return failure(f"estimator={estimator!r} raised ValueError({str(exc)!r}), whose message does not name "
                       f"{', '.join(missing)}: name the three accepted estimators.", hint)
    return None


@checker(
    "approx_kl",
    chapter=CHAPTER,
    hint=(
        "Everything is a function of one tensor, log r = log p_ref - log p at the sampled tokens, "
        "element-wise; no reduction. `torch.expm1` computes e^x - 1 accurately for small x.",
        "Compute log r as the reference's log-probs minus the policy's (not the reverse). k1 = -log r; k2 = (log r)^2 / 2; "
        "k3 = (r - 1) - log r with r = e^{log r}. Return the one the estimator names, with the inputs' shape, "
        "and raise a ValueError for any other name.",
        solution_code(rlhf.approx_kl),
    ),
)
def check_approx_kl(candidate) -> str:
    detail = compare_to_reference(
        candidate,
        rlhf.approx_kl,
        _approx_cases(),
        arg_names=["logprobs", "ref_logprobs", "estimator"],
        diagnose=_approx_clamp_diagnosis,
        grad=DIFFERENTIATED["approx_kl"],
        grad_cases=(0, 1, 2),
        mistakes=[
            Mistake("Your k1 has the wrong sign: k1 = -logr = logprobs - ref_logprobs (its mean is the KL, "
                    "which is >= 0).", _approx_k1_sign),
            Mistake("The k3 sign is flipped: k3 = (exp(logr) - 1) - logr, which is >= 0 because "
                    "exp(x) >= 1 + x.", _approx_sign_flipped_k3),
            Mistake("Your log-ratio is log p - log p_ref; it must be logr = ref_logprobs - logprobs. Swapped, "
                    "k3 no longer estimates this KL: on tokens sampled from the policy it averages to "
                    "chi2(policy || ref) - KL(policy || ref).", _approx_reversed_ratio),
            Mistake("k2 is logr**2 / 2: the factor 1/2 is missing.", _approx_k2_no_half),
        ],
    )
    # Edge: an unknown name ("full" is chapter 03's other kl_estimator, "k4" a typo, "K3" the case).
    for estimator in ("full", "k4"):
        problem = _unknown_estimator_failure(candidate, estimator)
        if problem is not None:
            raise problem
    return detail + " Unknown estimators ('full', 'k4') raise a ValueError naming k1, k2 and k3."


# ----------------------------------------------------------------------------------------------------
# compute_advantages
# ----------------------------------------------------------------------------------------------------
def _adv_cases() -> list[Case]:
    g = seeded(4)
    return [
        Case("batch 2, seq 7, prefix_len 3", (torch.randn(2, 7, generator=g), torch.randn(2, generator=g), 3)),
        Case("a batch of 1", (torch.randn(1, 6, generator=g), torch.randn(1, generator=g), 2)),
        Case("one generated token", (torch.randn(3, 5, generator=g), torch.randn(3, generator=g), 4)),
        Case("all-equal values", (torch.full((2, 6), 0.5), torch.tensor([1.0, -1.0]), 3)),
    ]


def _adv_zero_step_shift(values, rewards, prefix_len):
    return torch.cat([values[:, prefix_len:-1], rewards[:, None]], -1) - values[:, prefix_len:]


def _adv_q_shift(values, rewards, prefix_len):
    return torch.cat([values[:, prefix_len + 1 :], rewards[:, None]], -1) - values[:, prefix_len - 1 : -1]


def _adv_no_reward(values, rewards, prefix_len):
    return values[:, prefix_len:] - values[:, prefix_len - 1 : -1]


def _adv_reward_everywhere(values, rewards, prefix_len):
    return rewards[:, None] - values[:, prefix_len - 1 : -1]


@checker(
    "compute_advantages",
    chapter=CHAPTER,
    hint=(
        "values[:, t] is V of the state that chooses token t + 1. For each generated token you need two "
        "values from that tensor (the state that chose it, and the next state) or, for the last token, the "
        "reward. `torch.cat` joins the pieces.",
        "The g = s - prefix_len generated tokens sit at positions prefix_len .. s - 1, so they were chosen by "
        "the states at positions prefix_len - 1 .. s - 2. Their one-step Q estimates are the values of the "
        "next states, positions prefix_len .. s - 2 (g - 1 of them), followed by the reward as the last "
        "column (the episode ends after the last token). A = Q - V of the choosing states: [b, g].",
        solution_code(rlhf.compute_advantages),
    ),
)
def check_compute_advantages(candidate) -> str:
    # Edge: the batch of 1 is where a squeeze() (of values shaped [b, s, 1] elsewhere) drops the batch
    # dimension and the slicing that follows raises: name the case and the squeeze.
    for case in map(to_device, _adv_cases()):
        try:
            call(candidate, *case.args, _arg_names=["values", "rewards", "prefix_len"])
        except CheckFailure as exc:
            if not exc.message.startswith("your code raised"):
                raise
            hint = ("A squeeze() without a dim dropped the batch dimension of a batch of 1: values is already "
                    "[batch, seq] and rewards [batch]; squeeze only a named dim, if any.") \
                if case.label == "a batch of 1" else exc.hint
            raise failure(f"On {case.label}, {exc.message}", hint) from None
    return compare_to_reference(
        candidate,
        rlhf.compute_advantages,
        _adv_cases(),
        arg_names=["values", "rewards", "prefix_len"],
        mistakes=[
            Mistake("The baseline uses the wrong slice: the state that chose a generated token is the position "
                    "just BEFORE it, so the baselines are the values at positions prefix_len - 1 .. s - 2.",
                    _adv_zero_step_shift),
            Mistake("The Q estimates use the wrong slice: the next state of a generated token is the token's own "
                    "position, so the Q estimates are the values at positions prefix_len .. s - 2, then the "
                    "reward.", _adv_q_shift),
            Mistake("The reward is missing: after the last token the episode is over, so its Q estimate is the "
                    "reward, not a value.", _adv_no_reward),
            Mistake("You used the reward as the Q estimate at every position: only the last token's Q is the "
                    "reward; earlier ones are the next state's value.", _adv_reward_everywhere),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# compute_per_token_rewards
# ----------------------------------------------------------------------------------------------------
def _ptr_cases() -> list[Case]:
    g = seeded(5)
    cases = []
    for label, (b, n), coef in [("batch 3, 5 tokens", (3, 5), 0.2), ("a batch of 1", (1, 4), 1.0),
                                ("one token", (2, 1), 0.5)]:
        lp, ref = -torch.rand(b, n, generator=g) * 3, -torch.rand(b, n, generator=g) * 3
        cases.append(Case(label, (torch.randn(b, generator=g), lp, ref, coef)))
    # Saturation: tokens the reference finds nearly impossible (log-probs -150 .. -250, both below
    # float32's smallest exp): only a difference of log-probs stays finite, a ratio of probabilities does not.
    lp, ref = -torch.rand(2, 3, generator=g) * 3, -150 - torch.rand(2, 3, generator=g) * 100
    cases.append(Case("reference log-probs down to -250 (exp underflows)", (torch.randn(2, generator=g), lp, ref, 0.1)))
    return cases


def _ptr_from_probabilities(scores, lp, ref, coef):
    """log(pi / pi_ref) from the probabilities: right until exp(ref_logprobs) underflows to 0."""
    rewards = -coef * torch.log(lp.exp() / ref.exp())
    bonus = torch.zeros_like(rewards)
    bonus[:, -1] = scores
    return rewards + bonus


def _ptr_with(scores, lp, ref, coef, sign=-1.0, where="last", use_coef=True):
    rewards = sign * (coef if use_coef else 1.0) * (lp - ref)
    bonus = torch.zeros_like(rewards)
    if where == "last":
        bonus[:, -1] = scores
    elif where == "first":
        bonus[:, 0] = scores
    else:
        bonus += scores[:, None]
    return rewards + bonus


@checker(
    "compute_per_token_rewards",
    chapter=CHAPTER,
    hint=(
        "Two parts: a KL penalty at every token from the two log-prob tensors (element-wise), and the score "
        "added at the last position only. Build a new tensor (`torch.zeros_like`) rather than writing into an "
        "input.",
        "r_t = -kl_coef * (logprobs_t - ref_logprobs_t) for every t (policy minus reference: a token the "
        "policy likes more than the reference costs); then add scores_b at t = g - 1 of row b, e.g. by adding "
        "a zeros tensor whose last column holds the scores. Shape [b, g]; the sum over t is score - kl_coef * "
        "log(pi / pi_ref).",
        solution_code(rlhf.compute_per_token_rewards),
    ),
)
def check_compute_per_token_rewards(candidate) -> str:
    return compare_to_reference(
        candidate,
        rlhf.compute_per_token_rewards,
        _ptr_cases(),
        arg_names=["scores", "logprobs", "ref_logprobs", "kl_coef"],
        mistakes=[
            Mistake("The KL term has the wrong sign: the reward is -kl_coef * (logprobs - ref_logprobs), a "
                    "penalty for tokens the policy likes more than the reference.",
                    functools.partial(_ptr_with, sign=1.0)),
            Mistake("The score goes at the LAST token (the episode ends there), not the first.",
                    functools.partial(_ptr_with, where="first")),
            Mistake("You added the score at every token: it is added once, at the last position.",
                    functools.partial(_ptr_with, where="all")),
            Mistake("kl_coef is missing from the KL term.", functools.partial(_ptr_with, use_coef=False)),
            Mistake("You took log(p / p_ref) from probabilities: exp of a log-prob below about -104 underflows "
                    "to 0 in float32, so the ratio is inf or NaN. Subtract the log-probs: logprobs - ref_logprobs.",
                    _ptr_from_probabilities),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# lr_schedule
# ----------------------------------------------------------------------------------------------------
def _lr_warmup_off_by_one(step, warmup_steps, total_steps, final_scale):
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return rlhf.lr_schedule(step, warmup_steps, total_steps, final_scale)


def _lr_to_zero(step, warmup_steps, total_steps, final_scale):
    return rlhf.lr_schedule(step, warmup_steps, total_steps, 0.0)


def _lr_decay_from_zero(step, warmup_steps, total_steps, final_scale):
    if step < warmup_steps:
        return step / warmup_steps
    return max(final_scale, 1.0 + (final_scale - 1.0) * step / total_steps)


def _lr_no_clamp(step, warmup_steps, total_steps, final_scale):
    if step < warmup_steps:
        return step / warmup_steps
    return 1.0 + (final_scale - 1.0) * (step - warmup_steps) / (total_steps - warmup_steps)


@checker(
    "lr_schedule",
    chapter=CHAPTER,
    hint=(
        "A piecewise-linear function of step with three pieces; write the conditions in the order warmup, "
        "decay, after the end.",
        "step < warmup_steps: step / warmup_steps (0 at step 0). warmup_steps <= step < total_steps: a "
        "straight line from 1.0 at warmup_steps to final_scale at total_steps, 1 + (final_scale - 1) times "
        "the fraction of the decay done. From total_steps on: final_scale. Return a Python float.",
        solution_code(rlhf.lr_schedule),
    ),
)
def check_lr_schedule(candidate) -> str:
    grid = [(0, 5, 20, 0.1), (3, 5, 20, 0.1), (5, 5, 20, 0.1), (12, 5, 20, 0.1), (19, 5, 20, 0.1),
            (20, 5, 20, 0.1), (27, 5, 20, 0.1), (0, 0, 10, 0.5), (7, 0, 10, 0.5), (1, 2, 4, 0.0),
            (3, 1, 5, 0.0), (8, 1, 5, 0.0)]  # final_scale 0 in the decay and after it: a value, not unset
    cases = [Case(f"step={s}, warmup={w}, total={t}, final_scale={f}", (s, w, t, f)) for s, w, t, f in grid]
    for case in cases:  # a multiplier for LambdaLR: a Python number, not a tensor
        out = call(candidate, *case.args, _arg_names=["step", "warmup_steps", "total_steps", "final_scale"])
        if isinstance(out, bool) or not isinstance(out, (int, float)):
            raise failure(f"On {case.label}, your multiplier is {fmt(out)} ({type(out).__name__}): return a Python "
                          "float.", "The schedule returns a plain Python float (the learning-rate scheduler multiplies "
                          "the base rate by it), not a tensor or an array.")
    return compare_to_reference(
        candidate,
        rlhf.lr_schedule,
        cases,
        arg_names=["step", "warmup_steps", "total_steps", "final_scale"],
        mistakes=[
            Mistake("Warmup off by one: the multiplier is step / warmup_steps, which is 0 at step 0.",
                    _lr_warmup_off_by_one),
            Mistake("The decay ends at 0: it should end at final_scale.", _lr_to_zero),
            Mistake("The decay is measured from step 0: it starts at 1.0 when step = warmup_steps, so use "
                    "(step - warmup_steps) / (total_steps - warmup_steps).", _lr_decay_from_zero),
            Mistake("After total_steps the multiplier keeps falling: it stays at final_scale.", _lr_no_clamp),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# AdaptiveKLController
# ----------------------------------------------------------------------------------------------------
class _KLNoClip:
    def __init__(self, init_kl_coef, target, horizon):
        self.value, self.target, self.horizon = init_kl_coef, target, horizon

    def update(self, current_kl, n_steps):
        self.value *= 1 + (current_kl / self.target - 1) * n_steps / self.horizon


class _KLInverted(_KLNoClip):
    def update(self, current_kl, n_steps):
        err = min(max(self.target / max(current_kl, 1e-12) - 1, -0.2), 0.2)
        self.value *= 1 + err * n_steps / self.horizon


class _KLNoSteps(_KLNoClip):
    def update(self, current_kl, n_steps):
        err = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + err / self.horizon


class _KLWholeSteps(_KLNoClip):
    def update(self, current_kl, n_steps):
        err = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + err * (n_steps // self.horizon)


class _KLAdditive(_KLNoClip):
    def update(self, current_kl, n_steps):
        err = min(max(current_kl / self.target - 1, -0.2), 0.2)
        self.value += err * n_steps / self.horizon


# The scripts, and the regime each probes:
# - "mixed": KL above and below target, inside and outside the clip range of the error, one huge KL
#   (the error clip), a zero KL, and n_steps from 1 to 20 (n_steps / horizon);
# - "runaway up": 30 updates with KL far above target, 40 steps each: the coefficient grows x1.2 per
#   update to ~120 (an implementation that clamps the coefficient to a range stops early);
# - "runaway down": 45 updates with KL = 0: it shrinks x0.8 per update to ~2e-5 (a floor on the
#   coefficient shows), then KL exactly at target (err = 0: no change).
_KL_SCRIPTS = {
    "mixed": [(12.0, 10), (3.0, 10), (6.6, 5), (100.0, 1), (0.0, 20), (5.0, 8)],
    "runaway up": [(60.0, 40)] * 30,
    "runaway down": [(0.0, 40)] * 45 + [(6.0, 40)] * 3,
}
_KL_SCRIPT = _KL_SCRIPTS["mixed"]


def _run_kl_controller(cls, init=0.5, target=6.0, horizon=40, script=None) -> list[float]:
    ctl = call(cls, init, target, horizon)
    values = [float(get_attr(ctl, "value"))]
    for kl, n in (_KL_SCRIPT if script is None else script):
        out = call(ctl.update, kl, n)
        if out is not None and not isinstance(out, (int, float)):
            raise CheckFailure(f"update() should return None (it changes .value), got {fmt(out)}.")
        values.append(float(get_attr(ctl, "value")))
    return values


@checker(
    "AdaptiveKLController",
    chapter=CHAPTER,
    hint=(
        "`__init__` stores the coefficient as `self.value` (and the target and horizon); `update` computes a "
        "clipped proportional error and multiplies `self.value` by a factor close to 1.",
        "error = current_kl / target - 1, clipped to [-0.2, 0.2] (a Python float: max and min, or math); then "
        "value <- value * (1 + error * n_steps / horizon). KL above target raises the coefficient, below "
        "lowers it.",
        solution_code(rlhf.AdaptiveKLController),
    ),
)
def check_adaptive_kl_controller(candidate) -> str:
    def same(a: list[float], b: list[float]) -> bool:
        return all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12) for x, y in zip(a, b))

    def agrees_everywhere(cls) -> bool:
        """A known mistake names the candidate's only when it gives the candidate's values on every script."""
        for other in _KL_SCRIPTS.values():
            try:
                if not same(_run_kl_controller(candidate, script=other), _run_kl_controller(cls, script=other)):
                    return False
            except CheckFailure:
                return False
        return True

    for label, script in _KL_SCRIPTS.items():
        expected = _run_kl_controller(rlhf.AdaptiveKLController, script=script)
        got = _run_kl_controller(candidate, script=script)
        if same(got, expected):
            continue
        hint = None
        for cls, text in [
            (_KLNoClip, "The error is not clipped: err = clip(current_kl / target - 1, -0.2, 0.2), so one huge "
                        "KL cannot blow up the coefficient."),
            (_KLInverted, "The error is inverted: KL above target must RAISE the coefficient, "
                          "err = current_kl / target - 1."),
            (_KLNoSteps, "n_steps is missing: the multiplier is 1 + err * n_steps / horizon."),
            (_KLAdditive, "The update is multiplicative: value *= 1 + err * n_steps / horizon (not +=)."),
            (_KLWholeSteps, "n_steps / horizon is rounded down to a whole number (an integer division): with "
                            "fewer steps than the horizon the step is 0 and the coefficient does not move. The "
                            "multiplier takes the fraction n_steps / horizon."),
        ]:
            if same(got, _run_kl_controller(cls, script=script)) and agrees_everywhere(cls):
                hint = text
                break
        first = next(i for i, (a, b) in enumerate(zip(got, expected))
                     if not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12))
        # a clamp: the coefficient followed the reference, moved, then stopped at a bound (one that never
        # moved at all is not "clamped")
        if hint is None and first > 0 and same(got[:first], expected[:first]) and got[first] != got[0]:
            stuck = got[first:]
            if max(stuck) - min(stuck) <= 1e-6 * max(abs(x) for x in stuck) and (
                    (expected[first] > expected[first - 1] and got[first] < expected[first])
                    or (expected[first] < expected[first - 1] and got[first] > expected[first])):
                side = "above" if expected[first] > expected[first - 1] else "below"
                hint = (f"Your coefficient is clamped: it stops at {got[first]:.4g} while the reference keeps "
                        f"going {'up' if side == 'above' else 'down'} ({expected[-1]:.4g} after "
                        f"{len(script)} updates). The controller bounds only the error, "
                        "clip(current_kl / target - 1, -0.2, 0.2); the coefficient itself has no bounds.")
        shown = [round(v, 5) for v in expected]
        raise failure(
            f"{label} script: with init 0.5, target 6, horizon 40, .value went (update {first} is the first "
            f"to differ)\n  expected: {shown if len(shown) <= 10 else shown[:first + 3]}\n"
            f"  got:      {[round(v, 5) for v in got][:len(shown) if len(shown) <= 10 else first + 3]}",
            hint,
        )
    final = {label: _run_kl_controller(rlhf.AdaptiveKLController, script=sc)[-1] for label, sc in _KL_SCRIPTS.items()}
    return (f"the coefficient follows the reference through {len(_KL_SCRIPTS)} scripts ("
            + ", ".join(f"{k}: ends at {v:.3g}" for k, v in final.items()) + ").")


# ----------------------------------------------------------------------------------------------------
# EarlyStopping
# ----------------------------------------------------------------------------------------------------
class _ESNoReset:
    def __init__(self, patience, kl_threshold, reward_threshold=None):
        self.patience, self.kl_threshold, self.reward_threshold, self.count = patience, kl_threshold, reward_threshold, 0

    def violates(self, kl, reward):
        return kl > self.kl_threshold or (self.reward_threshold is not None and reward > self.reward_threshold)

    def should_stop(self, kl, reward):
        self.count += self.violates(kl, reward)
        return self.count >= self.patience


class _ESGreaterEqual(_ESNoReset):
    def violates(self, kl, reward):
        return kl >= self.kl_threshold or (self.reward_threshold is not None and reward >= self.reward_threshold)

    def should_stop(self, kl, reward):
        self.count = self.count + 1 if self.violates(kl, reward) else 0
        return self.count >= self.patience


class _ESOffByOne(_ESNoReset):
    def should_stop(self, kl, reward):
        self.count = self.count + 1 if self.violates(kl, reward) else 0
        return self.count > self.patience


class _ESTruthyThreshold(_ESNoReset):
    def violates(self, kl, reward):
        return bool(self.kl_threshold and kl > self.kl_threshold) or bool(
            self.reward_threshold and reward > self.reward_threshold)

    def should_stop(self, kl, reward):
        self.count = self.count + 1 if self.violates(kl, reward) else 0
        return self.count >= self.patience


class _ESTruthyReward(_ESTruthyThreshold):
    def violates(self, kl, reward):
        return kl > self.kl_threshold or bool(self.reward_threshold and reward > self.reward_threshold)


class _ESTruthyKL(_ESTruthyThreshold):
    def violates(self, kl, reward):
        return bool(self.kl_threshold and kl > self.kl_threshold) or (
            self.reward_threshold is not None and reward > self.reward_threshold)


class _ESKLOnly(_ESNoReset):
    def violates(self, kl, reward):
        return kl > self.kl_threshold

    def should_stop(self, kl, reward):
        self.count = self.count + 1 if self.violates(kl, reward) else 0
        return self.count >= self.patience


class _ESRewardBelow(_ESKLOnly):
    def violates(self, kl, reward):
        return kl > self.kl_threshold or (self.reward_threshold is not None and reward < self.reward_threshold)


_ES_SCRIPTS = [
    ("patience 3, KL threshold 0.1", (3, 0.1, None),
     [(0.2, 0.0), (0.2, 0.0), (0.05, 0.0), (0.2, 0.0), (0.2, 0.0), (0.2, 0.0), (0.3, 0.0)]),
    # a fresh instance whose first calls violate: a counter that does not start at 0 shows here
    ("a fresh instance, patience 2: the first calls violate", (2, 0.1, None), [(0.2, 0.0), (0.3, 0.0), (0.0, 0.0)]),
    ("patience 2, reward threshold 0.9", (2, 1.0, 0.9), [(0.0, 0.5), (0.0, 0.95), (0.0, 0.95), (0.0, 0.2)]),
    ("values exactly at the thresholds (not violations)", (1, 0.1, 0.9), [(0.1, 0.9), (0.1, 0.9), (0.11, 0.0)]),
    ("no reward threshold, high rewards", (1, 0.5, None), [(0.0, 5.0), (0.0, 50.0), (0.6, 0.0)]),
    # rewards below, then above the threshold: a reversed reward test counts the low ones, and then differs
    # from one that ignores the rewards
    ("patience 1, reward threshold 0.5: a low reward, then high ones", (1, 1.0, 0.5), [(0.0, 0.2), (0.0, 0.8),
                                                                                      (0.0, 0.6)]),
    # Edge: a threshold of 0.0 is a value, not "unset": a truthiness test (`if self.reward_threshold:`)
    # reads it as None and never counts the rewards above it.
    ("reward threshold 0.0 (a value, not unset)", (2, 1.0, 0.0), [(0.0, 0.3), (0.0, 0.1), (0.0, -0.2), (0.0, 0.5)]),
    ("KL threshold 0.0", (1, 0.0, None), [(0.02, 0.0), (0.0, 0.0), (0.5, 0.0)]),
]


def _run_early_stopping(cls, init_args, script) -> list[bool]:
    es = call(cls, *init_args)
    out = []
    for kl, reward in script:
        result = call(es.should_stop, kl, reward)
        if not isinstance(result, bool):
            if result is None:
                raise CheckFailure("should_stop returned None: it must return True or False.")
            result = bool(result)
        out.append(result)
    return out


@checker(
    "EarlyStopping",
    chapter=CHAPTER,
    hint=(
        "A counter of consecutive violations kept on the object, reset by any call that violates nothing.",
        "A call violates when kl > kl_threshold, or when reward_threshold is set (not None) and reward > "
        "reward_threshold. On a violation add 1 to the counter, otherwise set it to 0; return whether the "
        "counter has reached patience.",
        solution_code(rlhf.EarlyStopping),
    ),
)
def check_early_stopping(candidate) -> str:
    def agrees_everywhere(cls) -> bool:
        """A known mistake names the candidate's only when it gives the candidate's answers on every script."""
        for _, args, calls in _ES_SCRIPTS:
            try:
                if _run_early_stopping(candidate, args, calls) != _run_early_stopping(cls, args, calls):
                    return False
            except CheckFailure:
                return False
        return True

    for label, init_args, script in _ES_SCRIPTS:
        expected = _run_early_stopping(rlhf.EarlyStopping, init_args, script)
        got = _run_early_stopping(candidate, init_args, script)
        if got == expected:
            continue
        hint = None
        for cls, text in [
            (_ESNoReset, "EarlyStopping is not resetting: a call that violates nothing must set the count of "
                         "consecutive violations back to 0."),
            (_ESGreaterEqual, "A value equal to a threshold is not a violation: use kl > kl_threshold and "
                              "reward > reward_threshold."),
            *[(cls, "A threshold of 0.0 is read as unset: 0.0 is a threshold like any other (only a "
                    "reward_threshold of None means none), so a value above 0.0 violates.")
              for cls in (_ESTruthyThreshold, _ESTruthyReward, _ESTruthyKL)],
            (_ESKLOnly, "The reward threshold is ignored: when reward_threshold is set, reward > "
                        "reward_threshold is a violation too."),
            (_ESRewardBelow, "The reward test is reversed: a reward ABOVE reward_threshold violates (a reward "
                             "that climbs past it is the sign of a policy exploiting the reward model), not one "
                             "below it."),
            (_ESOffByOne, "Off by one: stop as soon as `patience` consecutive calls have violated "
                          "(count >= patience)."),
        ]:
            if _run_early_stopping(cls, init_args, script) == got and agrees_everywhere(cls):
                hint = text
                break
        raise CheckFailure(
            f"{label}: calls (kl, reward) = {script}\n  expected: {expected}\n  got:      {got}", hint
        )
    return f"matches the reference on {len(_ES_SCRIPTS)} scripted sequences ({', '.join(s[0] for s in _ES_SCRIPTS)})."


# ----------------------------------------------------------------------------------------------------
# TransformerWithValueHead
# ----------------------------------------------------------------------------------------------------
@checker(
    "TransformerWithValueHead",
    chapter=CHAPTER,
    hint=(
        "Two parts: in __init__ an `nn.Sequential` MLP from d_model to one number, initialised with chapter "
        "01's `layer_init` and moved to the base model's device; in forward a hook on "
        "'ln_final.hook_normalized' passed to `self.base_model.run_with_hooks`, which applies that MLP to the "
        "activation it sees.",
        "__init__: keep base_model; value_head = Linear(d_model, 4 d_model) with gain sqrt(2), ReLU, Linear(4 "
        "d_model, 1) with gain 1 (zero biases), moved to device_of(base_model). forward: make a dict (or "
        "list) the hook can write into; the hook computes the head on the residual (no detach) and stores it "
        "with the trailing dimension of size 1 removed, and returns nothing; run the base model with that "
        "hook, asking for the logits; return (logits, the stored values).",
        solution_code(rlhf.TransformerWithValueHead),
    ),
)
def check_transformer_with_value_head(candidate) -> str:
    base = small_model(seed=3)
    d = base.cfg.d_model
    model = call(candidate, base)
    if get_attr(model, "base_model") is not base:
        raise CheckFailure("self.base_model should be the HookedTransformer passed in (the same object).")
    head = get_attr(model, "value_head")
    layers = list(head.children()) if isinstance(head, nn.Module) else []
    shapes_ok = (
        len(layers) == 3 and isinstance(layers[0], nn.Linear) and isinstance(layers[1], nn.ReLU)
        and isinstance(layers[2], nn.Linear) and layers[0].in_features == d and layers[0].out_features == 4 * d
        and layers[2].in_features == 4 * d and layers[2].out_features == 1
    )
    if not shapes_ok:
        raise CheckFailure(
            f"value_head should be nn.Sequential(Linear({d}, {4 * d}), ReLU(), Linear({4 * d}, 1)); got {head!r}"
        )
    if not isinstance(model, nn.Module) or not any(p is layers[0].weight for p in model.parameters()):
        raise CheckFailure("the value head's parameters are not among model.parameters(): subclass nn.Module, "
                           "call super().__init__() first, and assign the head as an attribute.")

    tokens = torch.randint(0, base.cfg.d_vocab, (3, 7), generator=seeded(6)).to(device_of(base))
    with _HookReturns(base) as returned:
        try:
            out = call(model, tokens)
        except CheckFailure as raised:
            if not returned:
                raise
            out = raised  # reported below: the hook's return value is the cause
    if returned:
        raise failure(
            f"your hook on {returned[0]} returns a tensor"
            + (f", and the forward pass then failed ({out.message.removeprefix('your code raised ')})"
               if isinstance(out, CheckFailure) else "")
            + ". A value a hook returns REPLACES the activation, so the unembedding reads your values instead.",
            "The hook returns a value: store the values (in a dict or a nonlocal variable) and return nothing "
            "from the hook function.")
    if not isinstance(out, tuple) or len(out) != 2:
        raise CheckFailure(f"forward should return a tuple (logits, values), got {fmt(out)}")
    logits, values = out
    with torch.no_grad():
        _, cache = base.run_with_cache(tokens)
        expected_logits = base(tokens)
    expect_tensor(logits, shape=expected_logits.shape, what="the logits")
    expect_tensor(values, shape=(3, 7), what="the values")
    if not torch.allclose(logits.detach(), expected_logits, atol=1e-4, rtol=1e-4):
        raise CheckFailure("the logits differ from base_model(tokens): the hook must not change the activation.",
                           hint="Return nothing from the hook function (a returned tensor replaces the activation).")
    leftover = base.hook_dict["ln_final.hook_normalized"].fwd_hooks
    if leftover:
        raise CheckFailure("a hook is still attached to ln_final.hook_normalized after forward.",
                           hint="Use run_with_hooks (it removes its hooks afterwards), or call reset_hooks().")

    with torch.no_grad():
        def head_on(name: str) -> torch.Tensor:
            return head(cache[name]).squeeze(-1)

        expected_values = head_on("ln_final.hook_normalized")
        if not torch.allclose(values.detach(), expected_values, atol=1e-4, rtol=1e-4):
            last = base.cfg.n_layers - 1
            hint = None
            for name, text in [
                (f"blocks.{last}.hook_resid_post", "The value head is hooked on the wrong activation: "
                 "blocks.L-1.hook_resid_post is BEFORE the final LayerNorm; hook 'ln_final.hook_normalized'."),
                (f"blocks.{last}.ln2.hook_normalized", "The value head is hooked on the wrong activation: that is "
                 "the last block's MLP LayerNorm; hook 'ln_final.hook_normalized'."),
                (f"blocks.{last}.hook_resid_mid", "The value head is hooked on the wrong activation "
                 "(blocks.L-1.hook_resid_mid); hook 'ln_final.hook_normalized'."),
            ]:
                if torch.allclose(values.detach(), head_on(name), atol=1e-4, rtol=1e-4):
                    hint = text
                    break
            raise CheckFailure(
                f"values differ from value_head(ln_final.hook_normalized).\n  expected: {fmt(expected_values)}\n"
                f"  got:      {fmt(values)}", hint)
    if not logits.requires_grad:
        raise failure("the logits carry no gradient: the policy's update cannot reach the transformer through them.",
                      "The logits are detached (a .detach(), or a forward pass under torch.no_grad()): the "
                      "clipped surrogate, the entropy and the KL are differentiated through them; return them as the "
                      "base model gives them.")
    values.sum().backward()
    if layers[0].weight.grad is None or layers[0].weight.grad.abs().sum() == 0:
        raise CheckFailure("no gradient reaches the value head from the values: do not compute them under "
                           "torch.no_grad() or detach them.")
    trunk = base.blocks[0].attn.W_Q.grad
    if trunk is None or trunk.abs().sum() == 0:
        raise failure("the values' gradient reaches the value head but not the transformer.",
                      "The head reads a detached residual (a .detach(), or run_with_cache, which stores detached "
                      "activations): the value loss must shape the shared trunk too. Read the activation in a "
                      "hook of run_with_hooks, without detaching it.")
    base.zero_grad(set_to_none=True)

    # Size-1 dims: a batch of one prompt (as in chapter 03's sampling of one row), and a single position.
    for shape in ((1, 7), (2, 1)):
        out = call(model, tokens[: shape[0], : shape[1]])
        values = out[1] if isinstance(out, tuple) and len(out) == 2 else out
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != shape:
            got = tuple(values.shape) if isinstance(values, torch.Tensor) else fmt(values)
            raise failure(f"with tokens of shape {shape}, the values have shape {got}, expected {shape}.",
                          "squeeze() drops every dim of size 1 (the batch of one, or the single position) with the "
                          "head's trailing 1: drop only that one, squeeze(-1).")

    # Initialisation (chapter 01's layer_init): orthogonal, gain sqrt(2) then 1, zero biases.
    for i, layer, gain in ((0, layers[0], math.sqrt(2)), (2, layers[2], 1.0)):
        got_gain = orthogonal_gain(layer.weight)
        if got_gain is None or not math.isclose(got_gain, gain, rel_tol=1e-3) or layer.bias.detach().abs().max() > 0:
            what = ("not orthogonal" if got_gain is None else f"orthogonal with gain {got_gain:.4g}, expected "
                    f"{gain:.4g}" if not math.isclose(got_gain, gain, rel_tol=1e-3) else "given a non-zero bias")
            raise failure(f"value_head[{i}] is {what}.",
                          "The value head is not initialised with layer_init: chapter 01's orthogonal weights with "
                          "gain sqrt(2) for the first layer and 1 for the second, and zero biases.")
    return ("value head architecture and initialisation, logits unchanged (the hook returns nothing), values from "
            "ln_final.hook_normalized, gradients flow to the head and the transformer.")


class _HookReturns:
    """While active, records the hook points whose hooks (added by the learner) return a new tensor."""

    def __init__(self, model):
        self.points = list(model.hook_dict.items())
        self.returned: list[str] = []

    def __enter__(self) -> list[str]:
        for name, point in self.points:
            original = point.add_hook

            def add_hook(hook, *args, _original=original, _name=name, **kwargs):
                def checked(tensor, *a, **k):
                    out = hook(tensor, *a, **k)
                    if out is not None and out is not tensor:
                        self.returned.append(_name)
                    return out

                return _original(checked, *args, **kwargs)

            point.add_hook = add_hook
        return self.returned

    def __exit__(self, *exc) -> None:
        for _, point in self.points:
            del point.add_hook


# ----------------------------------------------------------------------------------------------------
# get_optimizer
# ----------------------------------------------------------------------------------------------------
@checker(
    "get_optimizer",
    chapter=CHAPTER,
    hint=(
        "`torch.optim.AdamW` takes a list of parameter groups, each a dict with its own params and lr; it "
        "also has arguments for maximising and for the weight decay.",
        "Two groups: the base model's parameters at base_lr and the value head's at head_lr. maximize=True "
        "because the objective is climbed, and weight decay 0 for both (AdamW's default 0.01 would pull the "
        "pretrained weights towards zero).",
        solution_code(rlhf.get_optimizer),
    ),
)
def check_get_optimizer(candidate) -> str:
    model = rlhf.TransformerWithValueHead(small_model(seed=4))
    opt = call(candidate, model, 1e-5, 3e-4)
    if not isinstance(opt, torch.optim.Optimizer):
        raise CheckFailure(f"expected a torch optimizer, got {fmt(opt)}")
    if not isinstance(opt, torch.optim.AdamW):
        raise CheckFailure(f"expected torch.optim.AdamW, got {type(opt).__name__}.",
                           hint="Use torch.optim.AdamW (Adam with decoupled weight decay).")
    groups = opt.param_groups
    if len(groups) != 2:
        raise CheckFailure(f"expected 2 parameter groups (base model, value head), got {len(groups)}.",
                           hint="Pass a list of two dicts, each with its own 'params' and 'lr'.")
    base_ids = {id(p) for p in model.base_model.parameters()}
    head_ids = {id(p) for p in model.value_head.parameters()}
    got = [{id(p) for p in g["params"]} for g in groups]
    if got[0] == head_ids and got[1] == base_ids:
        got, groups = got[::-1], groups[::-1]
    if got[0] != base_ids or got[1] != head_ids:
        raise CheckFailure("the groups should hold exactly the base model's parameters and exactly the value "
                           "head's parameters.")
    if not (math.isclose(groups[0]["lr"], 1e-5) and math.isclose(groups[1]["lr"], 3e-4)):
        swapped = math.isclose(groups[0]["lr"], 3e-4) and math.isclose(groups[1]["lr"], 1e-5)
        raise CheckFailure(
            f"learning rates: base model {groups[0]['lr']}, value head {groups[1]['lr']}; expected 1e-05 and 0.0003.",
            hint="The learning rates are swapped: base_lr for the transformer, head_lr for the value head."
            if swapped else None)
    if not all(g.get("maximize", False) for g in groups):
        raise CheckFailure("the optimizer minimises: the RLHF objective is climbed.",
                           hint="Pass maximize=True to AdamW: the objective is something to maximise.")
    decays = [g.get("weight_decay", 0.0) for g in groups]
    if any(d != 0 for d in decays):
        raise CheckFailure(
            f"weight decay {decays}: expected 0 in both groups.",
            hint="Pass weight_decay=0.0: AdamW's default (0.01) pulls every weight towards zero, and the "
            "pretrained transformer should stay near the reference model, not near zero (the KL penalty is the "
            "tether).")
    # Edge: a learning rate of 0 (a frozen backbone while the value head warms up) is a value, not a
    # missing setting: a group left out when its lr is 0, or `lr or default`, shows only here.
    # (head_lr differs from the first call's too: a head_lr fixed at one value fails one of the two)
    frozen = call(candidate, model, 0.0, 1e-3)
    lrs = [g["lr"] for g in getattr(frozen, "param_groups", [])]
    if len(lrs) != 2 or sorted(lrs) != [0.0, 1e-3]:
        raise CheckFailure(
            f"with base_lr=0.0 and head_lr=0.001, the learning rates of your groups are {lrs}; expected "
            "[0.0, 0.001].",
            hint="A learning rate of 0 is a value (the backbone frozen, e.g. while the value head warms up), not "
            "a missing setting: keep both groups and give the base group lr=base_lr as it is (no `if base_lr`, "
            "no `base_lr or default`).")
    return "AdamW, two groups with the right parameters and learning rates (0 included), maximize=True, no " \
           "weight decay."


# ----------------------------------------------------------------------------------------------------
# get_samples (on the tiny world's policy: it needs a tokenizer)
# ----------------------------------------------------------------------------------------------------
def tiny_policy():
    """The tiny world's policy on the running check's device (loaded once per device)."""
    return _tiny_policy_on(str(check_device()))


@functools.lru_cache(maxsize=2)
def _tiny_policy_on(device: str):
    from rlhf_tutorial.worlds import load_policy

    return load_policy("tiny", device=device).eval()


def eos_policy():
    """A copy of the tiny world's policy that samples the end-of-text token (almost) always, on the running
    check's device: a generation that stops at EOS ends after one token there."""
    return _eos_policy_on(str(check_device()))


@functools.lru_cache(maxsize=2)
def _eos_policy_on(device: str):
    model = copy.deepcopy(_tiny_policy_on(device))
    with torch.no_grad():
        model.b_U[model.tokenizer.eos_token_id] += 60.0  # the tiny model's logits span about 20
    return model


def _decodings(model, tokens: torch.Tensor, n_bos: int) -> tuple[list[str], list[str]]:
    return (model.tokenizer.batch_decode(tokens, skip_special_tokens=True),
            [model.to_string(row[n_bos:]) for row in tokens])


@checker(
    "get_samples",
    chapter=CHAPTER,
    hint=(
        "Three calls on the model: `to_tokens` for the prompt, `generate` for the continuation (it has "
        "arguments for the length, the temperature, top_k and whether to stop at EOS), and the tokenizer's "
        "batch decoding.",
        "Tokenize the prompt once (prepend_bos as asked) and repeat it batch_size times along the batch "
        "dimension; generate exactly gen_len new tokens (do not stop at EOS) at the given temperature and "
        "top_k, quietly, returning tokens; clone the result (generate works in inference mode); decode every "
        "row, skipping special tokens. Return (tokens, texts).",
        solution_code(rlhf.get_samples),
    ),
)
def check_get_samples(candidate) -> str:
    model = tiny_policy()
    sample = functools.partial(call, _keep_modes=False)  # generate() puts the model in eval mode, by design
    prompt = PROMPT
    prompt_tokens = model.to_tokens(prompt)
    p = prompt_tokens.shape[1]
    out = sample(candidate, model, prompt, 5, 7)
    if not isinstance(out, tuple) or len(out) != 2:
        raise CheckFailure(f"expected a tuple (tokens, texts), got {fmt(out)}")
    tokens, texts = out
    expect_tensor(tokens, shape=(5, p + 7), what="the tokens", allow_nan=True)
    if tokens.dtype != torch.long:
        raise CheckFailure(f"the tokens should be int64 (torch.long), got {tokens.dtype}.")
    if tokens.is_inference():
        raise CheckFailure("the tokens are an inference tensor: they cannot enter a forward pass with gradients.",
                           hint="The tokens are an inference tensor: generate makes its output under "
                                "torch.inference_mode(); return an ordinary copy of it (a clone).")
    if not torch.equal(tokens[:, :p], prompt_tokens.expand(5, -1)):
        raise CheckFailure(f"each row should start with the prompt's tokens {prompt_tokens[0].tolist()}, got "
                           f"{tokens[0, :p].tolist()}.")
    if len({tuple(r) for r in tokens.tolist()}) == 1:
        raise CheckFailure("all 5 samples are identical: sample (do_sample) rather than decoding greedily.")
    if not isinstance(texts, list) or len(texts) != 5 or not all(isinstance(t, str) for t in texts):
        raise CheckFailure(f"texts should be a list of 5 strings, got {fmt(texts)}")
    skip, no_bos = _decodings(model, tokens, 1)
    if texts != skip and texts != no_bos:
        hint = None
        if texts == [model.to_string(row) for row in tokens]:
            hint = "Your texts include the BOS token's text: leave special tokens out (skip_special_tokens=True)."
        raise CheckFailure(f"texts[0] = {texts[0]!r} is not the decoding of tokens[0] ({skip[0]!r}).", hint)

    out = sample(candidate, model, prompt, 3, 4, prepend_bos=False)
    p_nobos = model.to_tokens(prompt, prepend_bos=False).shape[1]
    expect_tensor(out[0], shape=(3, p_nobos + 4), what="with prepend_bos=False, the tokens", allow_nan=True)
    # Edge: no BOS, so position 0 is the prompt's first word: a decoding that always drops it loses text.
    skip, as_is = _decodings(model, out[0], 0)
    if out[1] != skip and out[1] != as_is:
        hint = None
        if out[1] == [model.to_string(row[1:]) for row in out[0]]:
            hint = ("You drop position 0 as if it were always BOS: with prepend_bos=False it is the prompt's first "
                    "token. Let the tokenizer leave out special tokens instead (batch_decode(tokens, "
                    "skip_special_tokens=True)).")
        raise CheckFailure(f"with prepend_bos=False, texts[0] = {out[1][0]!r} is not the decoding of tokens[0] "
                           f"({skip[0]!r}).", hint)

    # Edge: a policy that samples the end-of-text token at every step. The contract keeps sampling after
    # it: every row still has prompt_len + gen_len tokens (generate's default stops at EOS, and ends the
    # batch once every row has hit it).
    eos_model = eos_policy()
    out = sample(candidate, eos_model, prompt, 3, 6)
    rows = out[0] if isinstance(out, tuple) and len(out) == 2 else out
    if not isinstance(rows, torch.Tensor) or tuple(rows.shape) != (3, p + 6):
        got = tuple(rows.shape) if isinstance(rows, torch.Tensor) else fmt(rows)
        raise failure(f"with a policy that samples the end-of-text token at every step, batch_size=3 and gen_len=6, "
                      f"your tokens have shape {got}, expected (3, {p + 6}): the generation stopped at the "
                      "end-of-text token.",
                      "Generation must not stop at the end-of-text token: every row has exactly gen_len new tokens "
                      "(prompt_len + gen_len in all), whatever is sampled; generate stops at it unless told not to.")

    greedy = model.generate(prompt_tokens, max_new_tokens=5, do_sample=False, verbose=False, stop_at_eos=False)
    tokens, _ = sample(candidate, model, prompt, 4, 5, top_k=1)
    if not torch.equal(tokens, greedy.expand(4, -1)):
        raise CheckFailure("with top_k=1 every sample should be the greedy continuation.",
                           hint="top_k is ignored, or lets more than k tokens through: with top_k set, only the k "
                                "likeliest tokens may be drawn (with top_k=1, the likeliest one: the greedy "
                                "continuation).")

    # Temperature: which of softmax(l / T), softmax(l), softmax(l * T), softmax(l / T^2) best explains the
    # first new tokens (the largest log-likelihood of 1500 draws)? And does the winner fit at all: under the
    # distribution a hypothesis names, the draws' log-likelihood has a known mean and spread (z below); a
    # sampler that cuts off the unlikely tokens (a top_p, a fixed top_k) draws likelier tokens than
    # softmax(l / T) ever gives (z far above 0), and a hypothesis that wins without fitting is not named.
    with torch.no_grad():
        last_logits = model(prompt_tokens)[0, -1].double()
    n = 1500
    for temperature in (0.5, 2.0):  # below and above 1: a fixed temperature fits at most one of them
        tokens, _ = sample(candidate, model, prompt, n, 1, temperature=temperature)
        first = tokens[:, -1].to(last_logits.device)
        scores, fits = {}, {}
        for name, scale in [("logits / T", 1 / temperature), ("logits (T ignored)", 1.0), ("logits * T", temperature),
                            ("logits / T squared", 1 / temperature ** 2)]:
            logp = (last_logits * scale).log_softmax(-1)
            mean = (logp.exp() * logp).sum()
            spread = ((logp.exp() * logp ** 2).sum() - mean ** 2).clamp_min(1e-12).sqrt()
            scores[name] = logp[first].sum().item()
            fits[name] = ((scores[name] - n * mean) / (spread * n ** 0.5)).item()
        best = max(scores, key=scores.get)
        truncated = fits["logits / T"] > 6.0
        if best == "logits / T" and not truncated:
            continue
        if best != "logits / T" and abs(fits[best]) < 6.0:
            hint = {"logits (T ignored)": "The temperature is ignored: draw each token from softmax(logits / "
                                          "temperature).",
                    "logits * T": "The temperature multiplies the logits (or is fixed): sampling divides them by it.",
                    "logits / T squared": "The logits are divided by the temperature twice (by its square): "
                                          "sampling divides them by the temperature once."}[best]
            raise CheckFailure(f"with temperature={temperature}, the first sampled tokens look drawn from "
                               f"softmax({best}), not softmax(logits / T).", hint)
        if truncated:
            raise failure(f"with temperature={temperature} and top_k=None, the first sampled tokens are likelier "
                          "than draws from softmax(logits / T) can be: the unlikely tokens are drawn too rarely, or never.",
                          "Something cuts off the unlikely tokens (a top_p, or a top_k when none was given): "
                          "without top_k every token keeps its probability under softmax(logits / temperature); "
                          "only top_k, when it is set, restricts the draw.")
        raise CheckFailure(f"with temperature={temperature}, the first sampled tokens do not follow "
                           "softmax(logits / T).")
    return ("shapes, prompt kept (with and without BOS), cloned int64 tokens, texts decoded without special tokens, "
            "no stop at the end-of-text token, top_k and temperatures 0.5 and 2 respected (nothing else cuts the "
            "distribution).")


# ----------------------------------------------------------------------------------------------------
# ReplayMemory.get_minibatches
# ----------------------------------------------------------------------------------------------------
def _memory_fields(batch: int = 16, seq: int = 6, gen: int = 3) -> dict[str, torch.Tensor]:
    """Tensors whose rows can be recognised: row i of every field encodes i. On the checkers' device,
    as a rollout's are on the policy's."""
    rows = torch.arange(batch, dtype=torch.float32)[:, None]
    g = seeded(7)
    return to_device({
        "tokens": (torch.arange(batch)[:, None] * 100 + torch.arange(seq)[None]).long(),
        "logprobs": -rows - 0.1 * torch.arange(gen)[None],
        "ref_logprobs": -rows - 0.5 - 0.1 * torch.arange(gen)[None],
        "values": torch.randn(batch, gen, generator=g) + rows * 10,
        "advantages": torch.randn(batch, gen, generator=g) - rows * 1000,
    })


def on_device(tensor: torch.Tensor, where: Any, what: str, other: str) -> torch.Tensor:
    """``tensor``, after failing with both devices named when it is not on ``where``'s device (before the
    checker computes with it: a device mix in the checker would hide the learner's slip)."""
    problem = mismatch(what, tensor, where, other)
    if problem:
        raise CheckFailure(problem, hint="The same code must run on a CPU and on a GPU: keep every tensor on the "
                           "device of the inputs (index them, or build new ones with device=x.device).",
                           about_devices=True)
    return tensor


def _minibatch_rows(mb, fields: dict[str, torch.Tensor], label: str) -> tuple[list[int], torch.Tensor]:
    where = fields["tokens"].device
    tokens = expect_tensor(get_attr(mb, "tokens"), what=f"{label}.tokens", allow_nan=True)
    on_device(tokens, where, f"{label}.tokens", "the memory")
    rows = (tokens[:, 0] // 100).tolist()
    idx = torch.tensor(rows, dtype=torch.long)  # CPU indices select rows on any device
    for name in ("logprobs", "ref_logprobs", "advantages"):
        got = on_device(expect_tensor(get_attr(mb, name), what=f"{label}.{name}"), where, f"{label}.{name}",
                        "the memory")
        if got.shape != (len(rows), fields[name].shape[1]) or not torch.allclose(got, fields[name][idx]):
            raise CheckFailure(f"{label}.{name} does not hold the same rows as {label}.tokens.",
                               hint="Index every tensor of the memory with the SAME indices.")
    returns = on_device(expect_tensor(get_attr(mb, "returns"), what=f"{label}.returns"), where, f"{label}.returns",
                        "the memory")
    return rows, returns


@checker(
    "ReplayMemory",
    chapter=CHAPTER,
    hint=(
        "The value targets are the returns R = A + V; each pass is one `torch.randperm` of the rows drawn "
        "from `generator`, cut into num_minibatches equal parts.",
        "Compute the returns once. For each of update_epochs passes: draw a permutation of range(batch) from "
        "the (CPU) generator, reshape it to [num_minibatches, batch // num_minibatches], and for each row of "
        "indices build a ReplayMinibatch whose tokens, logprobs, ref_logprobs, advantages and returns are the "
        "rows of the memory's tensors at those indices. Return the list of minibatches.",
        solution_code(rlhf.ReplayMemory),
    ),
)
def check_replay_memory(candidate) -> str:
    fields = _memory_fields()
    memory = call(candidate, **{k: v.clone() for k, v in fields.items()})
    try:
        minibatches = call(get_attr(memory, "get_minibatches"), 4, 3, seeded(11))
    except CheckFailure as failed:
        if "device type for generator" not in failed.message:
            raise
        raise failure(failed.message, "The permutation is drawn on the GPU with the CPU generator: draw it on the "
                      "CPU, where the generator is (torch.randperm(batch, generator=generator), no device=); CPU "
                      "indices select rows of tensors on any device.") from None
    if not isinstance(minibatches, list) or len(minibatches) != 12:
        raise CheckFailure(f"with num_minibatches=4 and update_epochs=3, expected a list of 12 "
                           f"minibatches, got {fmt(minibatches)}",
                           hint="One pass = num_minibatches minibatches; make update_epochs passes.")
    expected_returns = fields["advantages"] + fields["values"]
    passes = []
    for k, mb in enumerate(minibatches):
        rows, returns = _minibatch_rows(mb, fields, f"minibatch {k}")
        if len(rows) != 4:
            raise CheckFailure(f"minibatch {k} has {len(rows)} rows; 16 rows in 4 minibatches is 4 each.")
        idx = torch.tensor(rows, dtype=torch.long)
        if not torch.allclose(returns, expected_returns[idx]):
            hint = "The value targets are returns = advantages + values."
            if torch.allclose(returns, fields["advantages"][idx]):
                hint = "returns equal the advantages: add the values, returns = advantages + values."
            elif torch.allclose(returns, fields["values"][idx]):
                hint = "returns equal the values: add the advantages, returns = advantages + values."
            raise CheckFailure(f"minibatch {k}: wrong returns.\n  expected: {fmt(expected_returns[idx])}\n"
                               f"  got:      {fmt(returns)}", hint)
        passes.append(rows)
    orders = []
    for p in range(3):
        order = sum(passes[4 * p : 4 * p + 4], [])
        if sorted(order) != list(range(16)):
            hint = ("Shuffle without replacement: each pass is one random permutation of all the rows, cut into "
                    "num_minibatches parts.")
            if sorted(sum(passes, [])) == sorted(list(range(16)) * 3):  # every row 3 times: the passes interleaved
                hint = ("Every row comes update_epochs times, but the passes are interleaved: the list holds pass 0's "
                        "num_minibatches minibatches first, then pass 1's, and so on.")
            raise CheckFailure(f"pass {p} (minibatches {4 * p} to {4 * p + 3}) does not visit every row exactly once "
                               f"(rows {order}).", hint=hint)
        orders.append(order)
    if orders[0] == orders[1] == orders[2]:
        raise CheckFailure("every pass visits the rows in the same order.",
                           hint="Draw a fresh permutation for every pass over the memory.")
    if orders[0] == list(range(16)):
        raise CheckFailure("the first pass is not shuffled (rows in order 0..15).",
                           hint="The first pass is not shuffled: draw a random permutation of the rows from the "
                                "generator passed in.")
    again = call(get_attr(call(candidate, **{k: v.clone() for k, v in fields.items()}), "get_minibatches"),
                 4, 3, seeded(11))
    rows_again = [(get_attr(mb, "tokens")[:, 0] // 100).tolist() for mb in again]
    if rows_again != passes:
        raise CheckFailure("two calls with identically seeded generators gave different minibatches.",
                           hint="Use the generator passed in: draw every permutation from it, so that the same "
                                "seed gives the same minibatches.")
    other = call(get_attr(call(candidate, **{k: v.clone() for k, v in fields.items()}), "get_minibatches"),
                 4, 3, seeded(13))
    if [(get_attr(mb, "tokens")[:, 0] // 100).tolist() for mb in other] == passes:
        raise CheckFailure("generators seeded differently gave the same minibatches: the order does not come from "
                           "the generator passed in.",
                           hint="The order must be drawn from the generator argument: a generator of your own, seeded "
                                "the same way every call, repeats the same minibatches every phase.")
    # Edge: one minibatch of all 16 rows. With 16 rows and 4 minibatches, perm.split(4) (pieces of 4
    # rows) and perm.reshape(4, -1) (4 pieces) agree; with 1 minibatch they do not.
    whole = call(get_attr(call(candidate, **{k: v.clone() for k, v in fields.items()}), "get_minibatches"),
                 1, 2, seeded(12))
    sizes = [len(get_attr(mb, "tokens")) for mb in whole] if isinstance(whole, list) else None
    if sizes != [16, 16]:
        raise CheckFailure(
            f"with num_minibatches=1 and update_epochs=2, expected 2 minibatches of all 16 rows, got "
            f"{fmt(whole) if sizes is None else f'{len(sizes)} minibatches of sizes {sizes[:8]}'}.",
            hint="num_minibatches is how MANY pieces, not how many rows per piece: each pass's permutation is cut "
            "into num_minibatches equal parts of batch / num_minibatches rows (pieces of num_minibatches rows are "
            "the same only when num_minibatches squared equals the batch).")
    return "12 minibatches, rows aligned across fields, returns = advantages + values, each pass a fresh " \
           "permutation; one minibatch of every row when num_minibatches=1."


# ----------------------------------------------------------------------------------------------------
# compute_rlhf_objective
# ----------------------------------------------------------------------------------------------------
def _objective_setup(prefix_len: int = 4):
    """The objective's fixtures on the running check's device (built once per device and prefix)."""
    return _objective_setup_on(prefix_len, str(check_device()))


@functools.lru_cache(maxsize=4)
def _objective_setup_on(prefix_len: int, device: str) -> tuple[rlhf.TransformerWithValueHead, Any, int, rlhf.ReplayMinibatch]:
    torch.manual_seed(5)
    model = rlhf.TransformerWithValueHead(small_model(seed=5))
    ref = small_model(seed=5)
    device = device_of(ref)  # every case on the models' device; drawn on the CPU (the same numbers anywhere)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=seeded(8)).to(device))
    ref.requires_grad_(False)
    g = seeded(9)
    tokens = torch.randint(0, ref.cfg.d_vocab, (4, 9), generator=g).to(device)
    with torch.no_grad():
        logits, values = model(tokens)
        logprobs = rlhf.get_logprobs(logits, tokens, prefix_len)
        ref_logprobs = rlhf.get_logprobs(ref(tokens), tokens, prefix_len)

    def noise() -> torch.Tensor:
        return torch.randn(logprobs.shape, generator=g).to(device)

    minibatch = rlhf.ReplayMinibatch(
        tokens=tokens,
        logprobs=logprobs + 0.4 * noise(),
        ref_logprobs=ref_logprobs,
        advantages=noise(),
        returns=values[:, prefix_len - 1 : -1] + noise(),
    )
    return model, ref, prefix_len, minibatch


def _objective_variant(model, ref_model, mb, prefix_len, kl_coef, args, *, kl_sign=-1.0, value_sign=-1.0,
                       temperature=True, value_shift=0, logit_shift=0, ref_is_policy=False, always_full=False,
                       entropy_coef_twice=False, ref_temperature=True, entropy_all=False, args_kl_coef=False,
                       no_coef=None, value_clip=True):
    """The reference objective with one thing changed (for targeted hints)."""
    logits, values = model(mb.tokens)
    t = args.temperature if temperature else 1.0
    logits = logits / t
    if args_kl_coef:
        kl_coef = args.kl_coef
    s = logits.shape[1]
    gen_v = slice(prefix_len - 1 + value_shift, s - 1 + value_shift)
    gen_l = slice(prefix_len - 1 + logit_shift, s - 1 + logit_shift)
    logprobs = rlhf.get_logprobs(logits, mb.tokens, prefix_len)
    clipped = rlhf.calc_clipped_surrogate_objective(logprobs, mb.logprobs, mb.advantages, args.clip_coef)
    if args.cliprange_value is not None and value_clip:
        value_loss = rlhf.calc_clipped_value_loss(values[:, gen_v], mb.returns - mb.advantages, mb.returns,
                                                  args.vf_coef, args.cliprange_value)
    else:
        value_loss = rlhf.calc_value_function_loss(values[:, gen_v], mb.returns, args.vf_coef)
    if no_coef is not None:  # one coefficient left out of the objective
        args = dataclasses.replace(args, **{no_coef: 1.0}) if no_coef != "kl_coef" else args
        kl_coef = 1.0 if no_coef == "kl_coef" else kl_coef
    entropy = rlhf.calc_entropy_bonus(logits if entropy_all else logits[:, gen_l], args.ent_coef)
    if entropy_coef_twice:
        entropy = entropy * args.ent_coef
    if args.kl_estimator == "full" or always_full:
        ref_logits = (logits.detach() if ref_is_policy else ref_model(mb.tokens) / (t if ref_temperature else 1.0))
        kl = rlhf.calc_kl_penalty(logits[:, gen_l], ref_logits[:, gen_l], 1.0)
    else:
        ref_lp = logprobs.detach() if ref_is_policy else mb.ref_logprobs
        kl = rlhf.approx_kl(logprobs, ref_lp, args.kl_estimator).mean()
    return clipped + value_sign * value_loss + entropy + kl_sign * kl_coef * kl


_OBJECTIVE_MISTAKES = [
    ("The KL term has the wrong sign: the objective SUBTRACTS kl_coef * KL (it is maximised).",
     dict(kl_sign=1.0)),
    ("The value loss has the wrong sign: the objective is L_clip - L_value + entropy - KL.", dict(value_sign=1.0)),
    ("The temperature is missing: divide the logits by args.temperature before taking log-probs, entropy "
     "and KL (the rollout's log-probs were taken that way).", dict(temperature=False)),
    ("The values use the wrong slice: the state that chose generated token i is one position before it, "
     "values[:, prefix_len - 1:-1].", dict(value_shift=1)),
    ("The logits for entropy/KL use the wrong slice: the logits that predict the generated tokens are "
     "logits[:, prefix_len - 1:-1].", dict(logit_shift=1)),
    ("Your KL is 0: the reference distribution must come from ref_model (or the stored ref_logprobs), "
     "not from the policy itself.", dict(ref_is_policy=True)),
    ("The reference logits are not divided by the temperature: the reference distribution is taken at the "
     "same temperature as the policy's, ref_model(tokens) / args.temperature.", dict(ref_temperature=False)),
    ("The entropy is averaged over every position, prompt included: only the positions that predict "
     "generated tokens count, logits[:, prefix_len - 1:-1].", dict(entropy_all=True)),
    ("The KL term uses args.kl_coef: use the kl_coef argument (the trainer passes its current coefficient, "
     "0 with GAE).", dict(args_kl_coef=True)),
    ("ent_coef is applied twice: the objective adds args.ent_coef * the mean entropy, once.",
     dict(entropy_coef_twice=True)),
    ("The entropy bonus is not multiplied by args.ent_coef: the objective adds args.ent_coef * the mean entropy.",
     dict(no_coef="ent_coef")),
    ("The value loss is not weighted by args.vf_coef: calc_value_function_loss(values[:, gen], returns, "
     "args.vf_coef).", dict(no_coef="vf_coef")),
    ("The KL is not multiplied by kl_coef: the objective subtracts kl_coef * KL.", dict(no_coef="kl_coef")),
    ("You used the full KL although args.kl_estimator is a sampled estimator: with 'k1'/'k2'/'k3' use "
     "approx_kl(logprobs, minibatch.ref_logprobs, estimator).mean().", dict(always_full=True)),
    # The clipped value loss depends on the old values only through their distance |advantages| to the returns:
    # it is max((v - R)^2, relu(|R - old| - clip)^2) elementwise. A clip centred on the returns themselves
    # (distance 0) or on the current values (|v - R|) is then exactly the unclipped loss, so this one diagnosis
    # covers the three. (Old values R + A instead of R - A give the same loss: nothing to tell apart.)
    ("With args.cliprange_value set, your value loss is the unclipped one: either cliprange_value is ignored, or "
     "the clip is centred where it never bites (on the returns themselves, or on the current values). The clipped "
     "value loss keeps the new values within cliprange_value of the rollout's values, which are the returns minus "
     "the advantages.", dict(value_clip=False)),
]


@checker(
    "compute_rlhf_objective",
    chapter=CHAPTER,
    hint=(
        "One forward pass of `model` gives logits and values; divide the logits by the temperature; then "
        "chapter 01's three functions and the KL term. The names the diagnostics read (objective, "
        "clipped_surrogate, value_loss, entropy, kl, logprobs, values, gen) must be defined.",
        "gen is the slice of positions prefix_len - 1 up to the last (excluded): their logits predict the "
        "generated tokens and their values are the states that chose them. logprobs from get_logprobs on the "
        "tempered logits. clipped_surrogate from the old log-probs and advantages of the minibatch; "
        "value_loss on the values at gen against the returns (calc_clipped_value_loss with old values = "
        "returns - advantages when args.cliprange_value is set); entropy = the entropy bonus of the logits at "
        "gen with coefficient 1. kl: if kl_coef is 0, the k3 estimate from the stored reference log-probs (no "
        "gradient needed); if args.kl_estimator is 'full', calc_kl_penalty with coefficient 1 against "
        "ref_model's logits at gen, computed without gradients and divided by the same temperature; else the "
        "mean of approx_kl on the stored reference log-probs. objective = clipped_surrogate - value_loss + "
        "ent_coef * entropy - kl_coef * kl.",
        solution_code(rlhf.compute_rlhf_objective),
    ),
)
def check_compute_rlhf_objective(candidate) -> str:
    model, ref, prefix_len, mb = _objective_setup()
    model.train()  # as in the learning phase (the reference stays in eval mode): your code must leave both so
    still = dataclasses.replace(mb, advantages=torch.zeros_like(mb.advantages))  # the surrogate is then 0
    off = dict(vf_coef=0.0, ent_coef=0.0)
    # Each term alone first (the others switched off by their coefficient, the surrogate by zero
    # advantages), so that a failure names the term; then all together. Temperatures other than 1
    # everywhere but one setting, so that a missing temperature shows in every term.
    configs = [
        ("the clipped surrogate alone (vf_coef = ent_coef = kl_coef = 0, clip_coef = 0.15)", "clipped surrogate", mb,
         RLHFArgs(kl_estimator="k3", temperature=0.7, clip_coef=0.15, **off), 0.0),
        ("the value loss alone (zero advantages, ent_coef = kl_coef = 0)", "value loss", still,
         RLHFArgs(kl_estimator="k3", temperature=0.7, vf_coef=0.5, ent_coef=0.0), 0.0),
        ("the entropy bonus alone (zero advantages, vf_coef = kl_coef = 0, ent_coef = 0.1)", "entropy", still,
         RLHFArgs(kl_estimator="k3", temperature=0.7, vf_coef=0.0, ent_coef=0.1), 0.0),
        ("the full KL alone (zero advantages, vf_coef = ent_coef = 0, kl_coef = 1)", "KL", still,
         RLHFArgs(kl_estimator="full", temperature=0.7, **off), 1.0),
        ("the k3 KL alone (zero advantages, vf_coef = ent_coef = 0, kl_coef = 1)", "KL", still,
         RLHFArgs(kl_estimator="k3", temperature=0.7, **off), 1.0),
        ("full KL, temperature 1", None, mb, RLHFArgs(kl_estimator="full", temperature=1.0), 0.5),
        ("k3 KL, temperature 0.7", None, mb, RLHFArgs(kl_estimator="k3", temperature=0.7, ent_coef=0.05), 0.8),
        ("full KL, temperature 1.3, other coefficients", None, mb,
         RLHFArgs(kl_estimator="full", temperature=1.3, clip_coef=0.1, vf_coef=0.5, ent_coef=0.1), 2.0),
        ("value clipping 0.2, k2 KL", None, mb,
         RLHFArgs(kl_estimator="k2", temperature=0.7, cliprange_value=0.2, vf_coef=0.5), 0.3),
        ("KL coefficient 0 (as with GAE), value clipping 0.5", None, mb,
         RLHFArgs(kl_estimator="k3", temperature=0.7, cliprange_value=0.5, vf_coef=0.5), 0.0),
        ("value clipping 0.0 (a clip range of 0 is set: only None is unset)", None, mb,
         RLHFArgs(kl_estimator="k3", temperature=0.7, cliprange_value=0.0, vf_coef=0.5), 0.3),
    ]
    # another prompt length (6 of 9 tokens: 3 generated): a prefix_len fixed at 4 fails here
    model6, ref6, _, mb6 = _objective_setup(prefix_len=6)
    ref_calls: list[bool] = []
    handles = [r.register_forward_pre_hook(lambda module, inputs: ref_calls.append(torch.is_grad_enabled()))
               for r in (ref, ref6)]
    try:
        for label, term, minibatch, args, kl_coef in configs:
            _check_objective_setting(candidate, model, ref, prefix_len, minibatch, args, kl_coef, label, term)
        _check_objective_setting(candidate, model6, ref6, 6, mb6, RLHFArgs(kl_estimator="full", temperature=0.7,
                                 ent_coef=0.05), 0.5, "prefix_len = 6, full KL", None)
    finally:
        for handle in handles:
            handle.remove()
    if any(ref_calls):
        raise failure("the reference model ran with gradient tracking on.",
                      "The reference logits are computed with gradients: wrap ref_model(tokens) in torch.no_grad() "
                      "(the reference is frozen; its graph would only cost memory).")
    return (f"matches the reference objective term by term (surrogate, value loss, entropy, full and k3 KL, each "
            f"alone) and on {len(configs) - 4} full settings (one with another prefix_len); the stats match; gradients flow to the transformer "
            "and the value head, not to the reference.")


_STATS_TERMS = ("clipped_surrogate", "value_loss", "entropy", "kl")


def _check_objective_setting(candidate, model, ref, prefix_len, mb, args, kl_coef, label, term) -> None:
    out = call(candidate, model, ref, mb, prefix_len, kl_coef, args,
               _arg_names=["model", "ref_model", "minibatch", "prefix_len", "kl_coef", "args"])
    if not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[1], dict):
        raise CheckFailure(f"expected a tuple (objective, stats dict), got {fmt(out)}")
    expected, expected_stats = rlhf.compute_rlhf_objective(model, ref, mb, prefix_len, kl_coef, args)
    objective = on_device(expect_tensor(out[0], shape=(), dtype=expected.dtype, what="the objective"), model,
                          "objective", "the model")
    stats = out[1]
    if not torch.allclose(objective.detach(), expected.detach(), atol=1e-5, rtol=1e-5):
        got_v, want_v = objective.item(), expected.item()
        hint = None
        for text, change in _OBJECTIVE_MISTAKES:
            try:
                wrong = _objective_variant(model, ref, mb, prefix_len, kl_coef, args, **change)
            except Exception:  # noqa: BLE001 - a variant may not apply
                continue
            if not torch.allclose(wrong.detach(), expected.detach(), atol=1e-5, rtol=1e-5) and torch.allclose(
                    objective.detach(), wrong.detach(), atol=1e-5, rtol=1e-5):
                hint = text
                break
        if hint is None and term is not None and math.isclose(got_v, -want_v, rel_tol=1e-4):
            hint = f"The {term} term has the wrong sign: objective = L_clip - L_value + ent_coef * H - kl_coef * KL."
        if hint is not None:
            raise failure(f"{label}: objective {got_v:.6g}, expected {want_v:.6g}.", hint)
        where = (f"the {term} term is wrong" if term else
                 "each term was right in the settings that test it alone, but not in this one (its coefficients, "
                 "temperature or KL estimator differ from those)")
        raise failure(f"{label}: objective {got_v:.6g}, expected {want_v:.6g}: {where}.", _TERM_HINTS.get(term))
    own = {"clipped surrogate": "clipped_surrogate", "value loss": "value_loss", "entropy": "entropy", "KL": "kl"}
    for key in _STATS_TERMS if term is None else (own[term],):
        if key not in stats:
            continue  # your own stats dict: only the entries it has are checked
        try:
            value = float(stats[key])
        except (TypeError, ValueError):
            raise CheckFailure(f"stats[{key!r}] = {fmt(stats[key])} is not a number.") from None
        want = expected_stats[key]
        if not math.isclose(value, want, rel_tol=1e-4, abs_tol=1e-6):
            hint = None
            if key == "entropy" and math.isclose(value, want * args.ent_coef, rel_tol=1e-4, abs_tol=1e-9):
                hint = ("stats['entropy'] includes ent_coef: keep `entropy` the mean entropy itself (calc_entropy_bonus("
                        "logits[:, gen], 1.0)) and multiply by args.ent_coef only in the objective.")
            elif key == "kl" and kl_coef and math.isclose(value, want * kl_coef, rel_tol=1e-4, abs_tol=1e-9):
                hint = "stats['kl'] includes kl_coef: keep `kl` the KL itself and multiply by kl_coef in the objective."
            name = {v: k for k, v in own.items()}[key]
            raise failure(f"{label}: the objective is right, but stats[{key!r}] = {value:.6g}, expected {want:.6g}: "
                          f"the {name} term as your code names it (`{key}`) is wrong.",
                          hint or _TERM_HINTS[name])
    if not objective.requires_grad:
        raise CheckFailure("the objective has no gradient: compute it from a forward pass WITH gradients "
                           "(only the reference logits go under torch.no_grad()).")
    model.zero_grad()
    objective.backward()
    head_grad = model.value_head[0].weight.grad
    base_grad = model.base_model.W_U.grad
    needs_base = term in (None, "clipped surrogate", "entropy", "KL")
    needs_head = term in (None, "value loss")
    if (needs_head and (head_grad is None or head_grad.abs().sum() == 0)) or (
            needs_base and (base_grad is None or base_grad.abs().sum() == 0)):
        raise CheckFailure(f"{label}: the gradient does not reach "
                           + ("the value head" if needs_head and term else "both the transformer and the value head")
                           + ": do not detach the logits or the values.")
    model.zero_grad()
    if any(p.grad is not None and p.grad.abs().sum() > 0 for p in ref.parameters()):
        raise CheckFailure("the reference model got gradients: compute its logits under torch.no_grad().")


_TERM_HINTS = {
    "clipped surrogate": "The clipped surrogate takes the policy's log-probs of the generated tokens "
                         "(from the logits divided by args.temperature), the minibatch's old log-probs and "
                         "advantages, and args.clip_coef.",
    "value loss": "The value loss compares the values of the states that chose the generated tokens "
                  "(positions prefix_len - 1 .. s - 2) with the minibatch's returns, weighted by args.vf_coef.",
    "entropy": "The entropy bonus is args.ent_coef times the mean entropy of the logits divided by "
               "args.temperature, at the positions that predict generated tokens only.",
    "KL": "The KL term is, with kl_estimator 'full', the full KL(policy || reference) of the two distributions "
          "at the temperature (the reference's computed without gradients) at the positions that predict generated "
          "tokens; otherwise the mean of approx_kl with that estimator on the stored reference log-probs; times the "
          "kl_coef argument.",
}


# ----------------------------------------------------------------------------------------------------
# The phases, on the tiny world
# ----------------------------------------------------------------------------------------------------
def phase_args(**overrides: Any) -> RLHFArgs:
    """Small settings for checking the phases on the tiny world in seconds."""
    base = dict(batch_size=8, gen_len=6, num_minibatches=2, update_epochs=2,
                num_phases=6, warmup_steps=0, temperature=0.8, repetition_coef=0.2, early_stopping=False,
                eval_samples=8)
    return RLHFArgs.preset("tiny", **{**base, **overrides})


def _tiny_reward(direction: str) -> Callable:
    """The tiny world's sentiment reward, its classifier on the running check's device."""
    return _tiny_reward_on(direction, str(check_device()))


@functools.lru_cache(maxsize=4)
def _tiny_reward_on(direction: str, device: str) -> Callable:
    return sentiment_reward_fn("tiny", direction, device=device)


def _tiny_policy_weights():
    """The tiny world's policy on the running check's device (to copy: the checks train copies)."""
    return _tiny_policy_weights_on(str(check_device()))


@functools.lru_cache(maxsize=2)
def _tiny_policy_weights_on(device: str):
    from rlhf_tutorial.worlds import load_policy

    return load_policy("tiny", device=device)


def make_trainer(args: RLHFArgs, **overrides: Callable) -> RLHFTrainer:
    """A trainer on fresh copies of the tiny world's policy (the same seed gives the same trainer)."""
    policy = _tiny_policy_weights()
    return RLHFTrainer(args, copy.deepcopy(policy), copy.deepcopy(policy), _tiny_reward(args.direction),
                            **overrides)


def _params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _expected_memory(trainer: RLHFTrainer, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the memory should hold for these tokens, recomputed with the reference pieces, and what
    each plausible deviation would hold instead (for the hints)."""
    args, p = trainer.args, trainer.prefix_len
    with torch.no_grad():
        logits, values = trainer.model(tokens)
        ref_logits = trainer.ref_model(tokens)
    texts = trainer.model.base_model.tokenizer.batch_decode(tokens, skip_special_tokens=True)
    task = trainer.reward_fn(texts)  # on the policy's device
    repetition = ngram_repetition(texts, args.repetition_n).to(task.device)  # computed from texts, on the CPU
    shaped = task - args.repetition_coef * repetition
    logprobs = rlhf.get_logprobs(logits / args.temperature, tokens, p)
    ref_logprobs = rlhf.get_logprobs(ref_logits / args.temperature, tokens, p)

    def advantages_of(rewards: torch.Tensor, whitened: bool = args.whiten_rewards,
                      kl_coef: float = trainer.kl_coef) -> torch.Tensor:
        scores = whiten(rewards) if whitened else rewards
        return rlhf.rollout_advantages(scores, logprobs, ref_logprobs, values, p, kl_coef, args)

    return {
        "logprobs": logprobs, "ref_logprobs": ref_logprobs, "values": values[:, p - 1 : -1],
        "advantages": advantages_of(shaped),
        "logprobs_no_temperature": rlhf.get_logprobs(logits, tokens, p),
        "values_shifted": values[:, p:],
        "advantages_toggled_whitening": advantages_of(shaped, whitened=not args.whiten_rewards),
        "advantages_unshaped": advantages_of(task),
        "advantages_args_kl_coef": advantages_of(shaped, kl_coef=args.kl_coef),
        "repetition_std": repetition.std(),
    }


_MEMORY_HINTS = [  # (field, variant, hint): the first variant the field matches (and the truth does not) names it
    ("logprobs", "logprobs_no_temperature",
     "The log-probs ignore the temperature: take them of logits / args.temperature."),
    ("ref_logprobs", "logprobs", "memory.ref_logprobs equal the policy's log-probs: compute them from trainer.ref_model."),
    ("values", "values_shifted",
     "The values use the wrong slice: the state that chose generated token i is values[:, prefix_len - 1:-1]."),
    ("advantages", "advantages_args_kl_coef",
     "The per-token KL penalty uses args.kl_coef, the START value: use the trainer's current coefficient, "
     "trainer.kl_coef (the adaptive controller's value when args.adaptive_kl is on)."),
    ("advantages", "advantages_toggled_whitening",
     "The whitening switch is ignored: whiten the (shaped) rewards only when args.whiten_rewards is True, "
     "and use them as they are when it is False."),
    ("advantages", "advantages_unshaped",
     "The repetition shaping is missing: rewards = trainer.reward_fn(texts) - args.repetition_coef * "
     "ngram_repetition(texts, args.repetition_n). Without it the reward-hacking experiment measures nothing."),
]


def _check_memory(memory, trainer: RLHFTrainer, label: str) -> dict[str, torch.Tensor]:
    args, p = trainer.args, trainer.prefix_len
    if memory is None:
        raise CheckFailure(f"{label}: rollout_phase returned None: return the ReplayMemory.")
    tokens = expect_tensor(get_attr(memory, "tokens"), shape=(args.batch_size, p + args.gen_len),
                           what=f"{label}: memory.tokens", allow_nan=True)
    on_device(tokens, trainer.device, "memory.tokens", "the policy")
    expected = _expected_memory(trainer, tokens)

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.allclose(a, b, atol=2e-4, rtol=1e-3)

    g = args.gen_len
    for name in ("logprobs", "ref_logprobs", "values", "advantages"):
        got = expect_tensor(get_attr(memory, name), shape=(args.batch_size, g), dtype=torch.float32,
                            what=f"{label}: memory.{name}")
        on_device(got, trainer.device, f"memory.{name}", "the policy")
        if got.requires_grad:
            raise CheckFailure(f"{label}: memory.{name} carries gradients: compute the rollout under torch.no_grad().")
        if close(got, expected[name]):
            continue
        hint = next((text for field, variant, text in _MEMORY_HINTS if field == name
                     and not close(expected[variant], expected[name]) and close(got, expected[variant])), None)
        raise failure(f"{label}: memory.{name} differs from a recomputation on memory.tokens.\n"
                      f"  expected: {fmt(expected[name])}\n  got:      {fmt(got)}", hint)
    return expected


def call_on_trainer(fn: Callable, trainer: RLHFTrainer, *args: Any, keep_modes: bool = True) -> Any:
    """``call(fn, trainer, *args)``, with a device mix in the learner's code explained by the trainer's device
    (a trainer is not a tensor: ``call`` cannot tell where its inputs live). ``keep_modes=False`` for the
    rollout: sampling with generate() puts the policy in eval mode, by design."""
    return call(fn, trainer, *args, _arg_names=["trainer", "memory"], _keep_modes=keep_modes, _device_hint=(
        f"A CPU tensor met one on the trainer's device ({trainer.device}): the policy, the reference, the rewards of "
        "trainer.reward_fn and everything computed from them are on trainer.device; ngram_repetition (it reads "
        "texts) gives a CPU tensor: .to(trainer.device) it, and build any new tensor with "
        "device=trainer.device."))


class _BatchSizes:
    """Records the number of rows of every no-grad forward pass of the policy and the reference."""

    def __init__(self, trainer: RLHFTrainer):
        self.sizes: list[int] = []
        self.handles = [m.register_forward_pre_hook(self._record) for m in (trainer.model, trainer.ref_model)]

    def _record(self, module, inputs) -> None:
        if inputs and isinstance(inputs[0], torch.Tensor):
            self.sizes.append(inputs[0].shape[0])

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _rollout(candidate, trainer: RLHFTrainer, label: str, inspect: Callable | None = None):
    """Run the learner's rollout_phase, check its forward passes were chunked, then its memory (after
    ``inspect(memory)``, a check of its own that names a mistake before the memory's shapes do)."""
    sizes = _BatchSizes(trainer)
    try:
        memory = call_on_trainer(candidate, trainer, keep_modes=False)
    finally:
        sizes.remove()
    args = trainer.args
    if sizes.sizes and max(sizes.sizes) > args.minibatch_size:
        raise failure(
            f"{label}: your rollout ran the policy or the reference on {max(sizes.sizes)} rows at once (batch_size "
            f"{args.batch_size}); the forward passes must go one chunk of at most args.minibatch_size = "
            f"{args.minibatch_size} rows at a time.",
            "The rollout is not chunked: a [batch, seq, vocab] logits tensor for the whole batch is what runs out of "
            "memory at GPT-2 sizes. Loop over tokens.split(args.minibatch_size), keep only the log-probs and "
            "values of each chunk, and torch.cat them.")
    if not sizes.sizes:
        raise CheckFailure(f"{label}: your rollout never called trainer.model or trainer.ref_model on the samples.")
    if inspect is not None:
        inspect(memory)
    return memory, _check_memory(memory, trainer, label)


@checker(
    "rollout_phase",
    chapter=CHAPTER,
    hint=(
        "Your functions in order: get_samples, the reward (minus the repetition shaping), then per chunk "
        "without gradients the policy's and the reference's log-probs and the policy's values, then "
        "rollout_advantages and a ReplayMemory.",
        "1. tokens and texts from get_samples with trainer.model.base_model and the args' prefix, sizes, "
        "temperature, top_k, prepend_bos. 2. The task rewards come from trainer.reward_fn on the texts; the shaped rewards are those "
        "- repetition_coef * ngram_repetition(texts, repetition_n), moved to the rewards' device. 3. Under "
        "no_grad, for each chunk of args.minibatch_size rows: logits and values from trainer.model, reference "
        "logits from trainer.ref_model; keep get_logprobs of both logits divided by the temperature, and the "
        "values; concatenate the chunks. 4. scores = whitened rewards only when args.whiten_rewards. 5. "
        "advantages from rollout_advantages with trainer.kl_coef. 6. memory = ReplayMemory with the values of "
        "the states that chose the generated tokens (positions prefix_len - 1 up to the last, excluded).",
        solution_code(rlhf.rollout_phase),
    ),
)
def check_rollout_phase(candidate) -> str:
    # Three rollouts, each probing its own decisions:
    # 1. the policy IS the reference, GAE, whitening on, a unigram repetition penalty (every sample
    #    repeats words, by different amounts): KL 0 at the start, the shaping, the chunking, the log;
    # 2. a policy moved away from the reference, GAE, the adaptive controller at 0.37 != args.kl_coef:
    #    temperature 1, which KL coefficient enters the per-token rewards;
    # 3. one-step advantages with whiten_rewards=False and the shaping on: the whitening switch.
    trainer = make_trainer(phase_args(repetition_coef=0.5, repetition_n=1))
    ref_before = _params(trainer.ref_model)
    memory, expected = _rollout(candidate, trainer, "first rollout (repetition penalty on)")
    assert expected["repetition_std"] > 0, "checker: the samples must repeat words by different amounts"
    kl = rlhf.approx_kl(memory.logprobs, memory.ref_logprobs, "k3").mean().item()
    if abs(kl) > 1e-5:
        raise CheckFailure(f"before any update the policy IS the reference, so KL should be 0; got {kl:.3g}.")
    if len(trainer.history) != 1:
        raise CheckFailure("trainer.log_rollout was not called once: keep the line that logs the rollout.")

    trainer = make_trainer(phase_args(advantage_estimator="gae", temperature=1.0, repetition_coef=0.0,
                                      adaptive_kl=True, kl_coef=0.1))
    trainer.kl_controller.value = 0.37  # the controller has moved: the current coefficient is not args.kl_coef
    with torch.no_grad():
        for prm in trainer.model.base_model.parameters():
            prm.add_(0.02 * torch.randn(prm.shape, generator=seeded(12)).to(prm.device))
    _rollout(candidate, trainer, "rollout of a moved policy with GAE and an adaptive KL coefficient at 0.37")
    if any(not torch.equal(a, b) for a, b in zip(ref_before, _params(trainer.ref_model))):
        raise CheckFailure("the reference model's weights changed during the rollout.")

    trainer = make_trainer(phase_args(advantage_estimator="one_step", whiten_rewards=False, repetition_coef=0.5,
                                      repetition_n=1, top_k=TOP_K, temperature=1.5))
    label = f"rollout with one-step advantages, whiten_rewards=False and top_k={TOP_K}"
    memory, _ = _rollout(candidate, trainer, label)
    outside = _outside_top_k(trainer, memory.tokens, TOP_K)
    if outside:
        raise failure(f"{label}: {outside} of the {memory.tokens.shape[0] * trainer.args.gen_len} sampled tokens are "
                      f"not among the policy's {TOP_K} likeliest at their position.",
                      "args.top_k is ignored: the samples must come from the top k tokens only when args.top_k is set "
                      "(pass it on to get_samples with the other sampling settings).")

    # 4. a near-greedy temperature and no BOS: the samples are drawn at args.temperature, and with
    #    args.prepend_bos (both passed on to get_samples; the log-probs alone do not show the first).
    trainer = make_trainer(phase_args(temperature=COLD, prepend_bos=False, repetition_coef=0.0))
    label = f"rollout at temperature {COLD} with prepend_bos=False"
    p = trainer.prefix_len
    prompt = trainer.model.base_model.to_tokens(trainer.args.prefix, prepend_bos=False)[0]

    def starts_with_the_prompt(memory: Any) -> None:
        tokens = get_attr(memory, "tokens") if memory is not None else None
        if not (isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[1] > 0):
            return  # _check_memory names it
        if tokens.shape[1] == p + trainer.args.gen_len and torch.equal(tokens[0, :p].cpu(), prompt.cpu()):
            return
        bos = trainer.model.base_model.tokenizer.bos_token_id
        start = "a BOS token" if int(tokens[0, 0]) == bos else f"token {int(tokens[0, 0])}"
        raise failure(f"{label}: memory.tokens has {tokens.shape[1]} columns and starts with {start}; expected "
                      f"{p + trainer.args.gen_len} columns starting with the prompt's own tokens (no BOS).",
                      "args.prepend_bos is ignored: pass it on to get_samples with the other sampling settings "
                      "(trainer.prefix_len counts a BOS only when it is True).")

    memory, _ = _rollout(candidate, trainer, label, inspect=starts_with_the_prompt)
    far = _far_below_greedy(trainer, memory.tokens)
    if far:
        raise failure(f"{label}: {far} of the {memory.tokens.shape[0] * trainer.args.gen_len} sampled tokens have a "
                      f"logit more than {FAR} below the likeliest token's at their position; at temperature {COLD} "
                      f"each such draw has a chance below 1e-8.",
                      "The samples are not drawn at args.temperature (the log-probs are, the sampling is not): pass "
                      "the temperature on to get_samples with the other sampling settings.")
    return ("memory shapes and contents match a recomputation in four rollouts (GAE with the shaping, GAE with an "
            f"adaptive KL coefficient, one-step without whitening and top_k={TOP_K}, temperature {COLD} without "
            "BOS), computed in chunks of args.minibatch_size; KL is 0 at the start; the samples respect top_k, the "
            "temperature and prepend_bos.")


#: The near-greedy sampling temperature of the fourth rollout, and how far below the likeliest token's logit a
#: sampled token may not be there: a token FAR below has probability at most exp(-FAR / COLD) = e^-40.
COLD, FAR = 0.05, 2.0


def _far_below_greedy(trainer: RLHFTrainer, tokens: torch.Tensor) -> int:
    """How many generated tokens have a logit more than FAR below the likeliest one at their position."""
    p = trainer.prefix_len
    with torch.no_grad():
        logits = trainer.model.base_model(tokens)[:, p - 1 : -1]  # [b g v]
    chosen = logits.gather(-1, tokens[:, p:, None])[..., 0]
    return int((logits.max(-1).values - chosen > FAR).sum())


TOP_K = 3


def _outside_top_k(trainer: RLHFTrainer, tokens: torch.Tensor, k: int) -> int:
    """How many generated tokens are not among the policy's k likeliest at their position (ties admitted,
    and a margin for the difference between a cached and a full forward pass)."""
    p = trainer.prefix_len
    with torch.no_grad():
        logits = trainer.model.base_model(tokens)[:, p - 1 : -1]  # [b g v]: the logits that chose each token
    chosen = logits.gather(-1, tokens[:, p:, None])
    above = (logits > chosen + 1e-3).sum(-1)  # how many tokens were strictly likelier
    return int((above >= k).sum())


def _learning_phase_wrong(kind: str) -> Callable:
    """Wrong learning phases for targeted hints."""

    def wrong(trainer, memory):
        args = trainer.args
        passes = 1 if kind == "one_pass" else args.update_epochs
        generator = None if kind == "global_rng" else trainer.generator
        stats = []
        for mb in memory.get_minibatches(args.num_minibatches, passes, generator):
            if kind != "no_zero_grad":
                trainer.optimizer.zero_grad()
            kl_coef = trainer.kl_coef if kind == "reward_kl_coef" else trainer.objective_kl_coef
            objective, s = rlhf.compute_rlhf_objective(trainer.model, trainer.ref_model, mb, trainer.prefix_len,
                                                       kl_coef, args)
            objective.backward()
            if kind != "no_clip":
                nn.utils.clip_grad_norm_(trainer.model.parameters(), args.max_grad_norm)
            trainer.optimizer.step()
            if kind == "scheduler_per_minibatch":
                trainer.scheduler.step()
            stats.append(s)
        if kind not in ("scheduler_per_minibatch", "no_scheduler"):
            trainer.scheduler.step()
        return {k: sum(x[k] for x in stats) / len(stats) for k in stats[0]}

    return wrong


_LEARNING_MISTAKES = [
    ("reward_kl_coef", "The objective's KL term uses trainer.kl_coef: with GAE the KL is already in the per-token "
                       "rewards, so the objective takes trainer.objective_kl_coef (0 with GAE, trainer.kl_coef with "
                       "one-step advantages). Using kl_coef counts the KL twice."),
    ("no_zero_grad", "Gradients accumulate across minibatches: call trainer.optimizer.zero_grad() before each "
                     "backward pass."),
    ("no_clip", "The gradient norm does not limit the update: clip the global norm of all the policy's gradients "
                "to args.max_grad_norm after the backward pass and before the optimizer's step."),
    ("one_pass", "Only one pass over the memory: pass args.update_epochs to get_minibatches."),
    ("scheduler_per_minibatch", "The learning-rate schedule counts phases: step trainer.scheduler once, after the "
                                "last minibatch."),
    ("no_scheduler", "The learning-rate scheduler is never stepped: call trainer.scheduler.step() once per phase."),
    ("global_rng", "The minibatches are shuffled with the global random generator: pass trainer.generator to "
                   "get_minibatches (the trainer's minibatch order is seeded by it)."),
]


_CLIPPED_AFTER_STEP = ("The gradient norm is clipped after the optimizer's step: the step has already used the "
                       "unclipped gradients, so the clip changes nothing. Clip the global norm to args.max_grad_norm "
                       "between the backward pass and the step.")


def _clipped_last(trainer: RLHFTrainer, max_grad_norm: float) -> bool:
    """Whether the gradients the phase left behind have a global norm within max_grad_norm: an update that
    was not clipped (it matches the unclipped one, whose gradients are far above that norm) with clipped
    gradients left over was clipped after its step."""
    grads = [p.grad.detach().double().flatten() for p in trainer.model.parameters() if p.grad is not None]
    if not grads:
        return False
    norm = torch.cat(grads).norm().item()
    return 0.0 < norm <= max_grad_norm * (1 + 1e-4)


def _moved_trainer(args: RLHFArgs) -> RLHFTrainer:
    """A fresh trainer whose policy has moved away from the reference (seeded), so that the KL to the
    reference, and its gradient, are not 0 from the first minibatch on."""
    trainer = make_trainer(args)
    with torch.no_grad():
        g = seeded(31)
        for prm in trainer.model.base_model.parameters():
            prm.add_(0.03 * torch.randn(prm.shape, generator=g).to(prm.device))
    return trainer


def _rollout_memory(args: RLHFArgs) -> rlhf.ReplayMemory:
    """One reference rollout (seeded) of a fresh trainer: every learning run starts from it."""
    trainer = _moved_trainer(args)
    torch.manual_seed(21)
    return rlhf.rollout_phase(trainer)


def _run_learning(fn: Callable, args: RLHFArgs, memory: rlhf.ReplayMemory) -> tuple[RLHFTrainer, list[torch.Tensor], Any]:
    """A fresh trainer (identical to the one that made ``memory``) runs ``fn(trainer, memory)``."""
    trainer = _moved_trainer(args)
    memory = rlhf.ReplayMemory(**{f: getattr(memory, f).clone() for f in
                                  ("tokens", "logprobs", "ref_logprobs", "values", "advantages")})
    before = _params(trainer.model)
    torch.manual_seed(22)  # every run starts from the same global RNG state too
    out = call_on_trainer(fn, trainer, memory)
    return trainer, before, out


def _delta(trainer, before) -> torch.Tensor:
    return torch.cat([(p.detach() - b).flatten() for p, b in zip(trainer.model.parameters(), before)])


@checker(
    "learning_phase",
    chapter=CHAPTER,
    hint=(
        "A loop over `memory.get_minibatches(...)` with the four calls of every gradient step (zero, "
        "backward, clip, step) around `compute_rlhf_objective`, then the scheduler once.",
        "The order is the point. Per minibatch: clear the gradients the last step left (else they add up); "
        "the objective's KL coefficient is the trainer's objective_kl_coef (0 with GAE, whose per-token "
        "rewards already hold the KL: do not count it twice); backpropagate the objective; clip the global norm of all the policy's gradients together, after the "
        "backward pass and before the step; then step. Draw the minibatches with the trainer's own "
        "generator (a fresh one repeats the same order every phase), and keep each minibatch's stats. The "
        "schedule steps once per phase, not once per minibatch.",
        solution_code(rlhf.learning_phase),
    ),
)
def check_learning_phase(candidate) -> str:
    # One phase, decision by decision: no warmup (the first phase learns); a small max_grad_norm (clipping
    # active); GAE with kl_coef 0.5 and a policy already away from the reference (the objective's KL
    # coefficient shows); two passes of four minibatches of 2 rows (zero_grad, the number of passes, the
    # order from trainer.generator; num_minibatches != update_epochs, so the two swapped show); the
    # scheduler's steps. Tolerance 0.2% of the update: the reference is deterministic, and the closest
    # catalogued deviation differs by several percent.
    args = phase_args(learning_rate=3e-4, head_lr=3e-3, max_grad_norm=0.05, warmup_steps=0, kl_coef=0.5,
                      num_minibatches=4, update_epochs=2)
    memory = _rollout_memory(args)
    trainer, before, out = _run_learning(candidate, args, memory)
    ref_trainer, ref_before, ref_out = _run_learning(rlhf.learning_phase, args, memory)
    fresh = seeded(args.seed).get_state()
    if torch.equal(trainer.generator.get_state(), fresh) and not torch.equal(ref_trainer.generator.get_state(), fresh):
        raise failure("trainer.generator was never drawn from: the minibatch order did not come from it.",
                      "The generator is forgotten: pass trainer.generator to memory.get_minibatches(num_minibatches, "
                      "update_epochs, trainer.generator), so that the same seed gives the same run.")
    expected = _delta(ref_trainer, ref_before)
    ref_params = _params(_tiny_policy_weights())
    if any(not torch.equal(a, b.detach()) for a, b in zip(ref_params, trainer.ref_model.parameters())):
        raise CheckFailure("the reference model's weights changed: only trainer.model is optimised.")
    if not isinstance(out, dict) or not out:
        raise CheckFailure(f"learning_phase should return a dict of mean diagnostics, got {fmt(out)}")
    got = _delta(trainer, before)
    if got.abs().sum() == 0:
        raise CheckFailure("the policy's weights did not change: call trainer.optimizer.step() after backward().")
    steps = {int(s["step"]) for s in trainer.optimizer.state.values() if "step" in s}
    expected_steps = args.num_minibatches * args.update_epochs
    rel = ((got - expected).norm() / expected.norm()).item()
    if rel > 2e-3 or trainer.scheduler.last_epoch != ref_trainer.scheduler.last_epoch:
        hint = None
        for kind, text in _LEARNING_MISTAKES:
            wrong_trainer, wrong_before, _ = _run_learning(_learning_phase_wrong(kind), args, memory)
            same = ((got - _delta(wrong_trainer, wrong_before)).norm() / expected.norm()).item() < 2e-3
            if same and trainer.scheduler.last_epoch == wrong_trainer.scheduler.last_epoch:
                hint = text
                if kind == "no_clip" and _clipped_last(trainer, args.max_grad_norm):
                    hint = _CLIPPED_AFTER_STEP
                break
        raise failure(
            f"after one learning phase the weights differ from the reference update by {rel:.1%} (optimizer "
            f"steps taken: {sorted(steps)}, expected {expected_steps}; scheduler steps: "
            f"{trainer.scheduler.last_epoch}, expected {ref_trainer.scheduler.last_epoch}).", hint)
    _check_phase_diagnostics(out, ref_out, expected_steps)

    # The update must raise the log-probs of tokens with positive advantage, and the reward must move.
    with torch.no_grad():
        logits, _ = trainer.model(memory.tokens)
        new = rlhf.get_logprobs(logits / args.temperature, memory.tokens, trainer.prefix_len)
    improvement = ((new - memory.logprobs) * memory.advantages).sum().item()
    if improvement <= 0:
        raise CheckFailure("the update lowered the log-probs of high-advantage tokens: the optimizer must "
                           "maximise the objective (maximize=True), not minimise it.")
    if is_cpu_pass():  # the training run below repeats the code run above: the GPU pass runs it
        return "the update matches the reference on the CPU."
    before_reward, after_reward = reward_moves(candidate)
    if not after_reward > before_reward:
        raise CheckFailure(f"after {MOVE_PHASES} phases with your learning_phase the mean reward went from "
                           f"{before_reward:.3f} to {after_reward:.3f}: it should rise.")
    return (f"the update matches the reference ({rel:.1e} relative difference, {expected_steps} optimizer steps, "
            f"one scheduler step), the reference model is untouched, high-advantage tokens became likelier, and "
            f"{MOVE_PHASES} phases of training raised the mean reward from {before_reward:.3f} to {after_reward:.3f}.")


#: The diagnostics a learning phase returns that do not depend on how the learner's compute_rlhf_objective
#: logs a KL it does not weigh (with GAE the objective's KL coefficient is 0, and computing the full KL anyway
#: is right too, so "kl" may differ).
_PHASE_DIAGNOSTICS = ("objective", "clipped_surrogate", "value_loss", "entropy", "approx_kl", "clipfrac")


def _check_phase_diagnostics(out: dict, expected: dict, n_minibatches: int) -> None:
    """The returned diagnostics are the mean over every minibatch of the phase (the update already matched the
    reference's, so the per-minibatch stats are the reference's to rounding): not the last minibatch's, not one
    pass's."""
    for key in _PHASE_DIAGNOSTICS:
        if key not in expected:
            continue
        if key not in out:
            raise CheckFailure(f"the returned diagnostics have no {key!r} (keys: {sorted(out)}): return the mean of "
                               f"the stats dicts of every minibatch, as the given last line does.")
        got, want = float(out[key]), float(expected[key])
        if not abs(got - want) <= 1e-3 + 0.02 * abs(want):
            raise failure(
                f"the update is right, but the returned diagnostics are not: {key} = {got:.6g}, expected "
                f"{want:.6g}, the mean over all {n_minibatches} minibatches of the phase.",
                "The returned dict is the mean of every minibatch's stats: append each minibatch's dict to "
                "all_stats inside the loop (not only the last one's, nor one pass's).")


MOVE_PHASES = 4


def reward_moves(learning_phase_fn: Callable | None = None, seed: int = 0) -> tuple[float, float]:
    """Mean reward (32 samples, the same draws) before and after ``MOVE_PHASES`` short phases on the tiny
    world towards 'neg', with ``learning_phase_fn`` as the learning phase (default: the reference)."""
    args = phase_args(batch_size=16, gen_len=8, num_phases=MOVE_PHASES, learning_rate=1e-3, head_lr=1e-2,
                      temperature=1.0, repetition_coef=0.0, seed=seed)
    overrides = {"learning_phase": learning_phase_fn} if learning_phase_fn is not None else {}
    trainer = make_trainer(args, **overrides)
    before = trainer.evaluate(32, seed=100)["reward"]
    trainer.train(progress=False)
    return before, trainer.evaluate(32, seed=100)["reward"]
