"""Checkers for chapter 01: PPO from scratch (the pieces of rlhf_tutorial/ppo.py).

Regimes probed (where plausible implementations differ):
- layer_init: tall, wide and square layers (orthogonal rows vs columns), gains 0.01 to 2, non-zero
  biases (a bias left at 0 shows only there);
- compute_gae: random episode ends, none, every step an end (the dones[t] vs dones[t+1] convention),
  a single step and env, gamma = lambda = 1 and lambda = 0 (the recursion's factors), equal rewards;
- calc_clipped_surrogate_objective: ratios inside and far outside the clip range, ratio exactly 1,
  all-equal advantages (std 0: a missing eps gives NaN), 2-d batches (per-row normalisation), ratios up
  to e^4 with negative advantages (the unclipped term chosen however large: a cap on it shows);
- calc_value_function_loss: 1-d and 2-d batches (len() is the number of rows), values == returns;
- calc_entropy_bonus: ties (all logits equal: log n), logits x 1e4 (log(softmax) underflows), a batch of 1;
- get_minibatch_indices: minibatch == batch, minibatches of 1 (a squeeze() drops the size-1 dimension
  there), 512 indices (order, seeding);
- rollout_step / ppo_learning_phase: scripted envs that end by termination and by truncation, with
  float64 observations (the returned one must be float32); one setting with the gradient clip inactive
  and one where it clips every step; 4 minibatches x 2 epochs in the learner's order, replayed on the
  reference, with every returned diagnostic compared.
"""

from __future__ import annotations

import copy
import math

import einops
import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from rlhf_tutorial import ppo
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    checker,
    compare_to_reference,
    expect_tensor,
    fmt,
    seeded,
)
from rlhf_tutorial.notebooks import solution_code
from rlhf_tutorial.trainers.plug import DIFFERENTIATED
from rlhf_tutorial.trainers.ppo import PPOArgs

CHAPTER = "01_ppo"
DEVICE = "cpu"  # chapter 01 trains gymnasium agents on the CPU on every machine: its code is checked there

#: The contract of each exercise (its CURRICULUM row and docstring), clause by clause; the tests write a
#: version that breaks each one (tests/checks/test_ch01_ppo.py: VIOLATIONS).
CLAUSES = {
    "layer_init": {
        "orthogonal": "the weight is orthogonal: orthonormal rows when out <= in, orthonormal columns when it widens",
        "gain": "the orthogonal matrix is scaled by exactly std (W W^T = std^2 I)",
        "default_std": "std defaults to sqrt(2)",
        "bias": "every entry of the bias equals bias_const",
        "default_bias": "bias_const defaults to 0",
        "same_layer": "the given layer is initialised in place and that same layer is returned",
    },
    "compute_gae": {
        "dones_t": "dones[t] masks transition t itself (True when the episode ended with it), not t+1",
        "no_bootstrap": "no V_{t+1} is bootstrapped across an episode end: (1 - dones[t]) in delta_t",
        "recursion_masked": "no advantage flows back across an episode end: (1 - dones[t]) in the recursion too",
        "lambda": "the recursion is weighted by gamma * gae_lambda",
        "gamma": "gamma discounts both V_{t+1} in delta_t and A_{t+1} in the recursion",
        "next_value": "V after the last step is next_value (not 0)",
        "backwards": "A_t depends on A_{t+1}: the recursion runs backwards in time from A_T = 0",
        "advantages": "the advantages are returned, not the returns A + V",
        "bool_dones": "dones is a Bool tensor (arithmetic on it needs a conversion)",
        "inputs_unchanged": "no input tensor is modified in place",
        "dtype": "the result has the rewards' shape [steps, env] and dtype",
    },
    "calc_clipped_surrogate_objective": {
        "normalised": "the advantages are normalised before use",
        "centred": "the normalisation subtracts the mean of the advantages",
        "unbiased_std": "the normalisation divides by torch's default (unbiased) std",
        "all_elements": "mean and std are over all elements of a batch of any shape, not per row",
        "eps": "eps (the argument, default 1e-8) is added to the std: all-equal advantages give no NaN",
        "ratio": "the ratio is exp(logprobs - old_logprobs) = pi / pi_old",
        "large_ratios": "no ratio or term is capped: large log-ratios with negative advantages take the unclipped term",
        "clip_ratio": "the ratio is clipped to [1 - clip_coef, 1 + clip_coef], not the advantages",
        "min": "each sample takes the min of the unclipped and clipped terms (both are needed)",
        "mean": "the result is the mean over samples, not their sum",
        "sign": "an objective to maximise, not a loss",
        "differentiable": "the gradient with respect to logprobs is the reference's (nothing detached)",
        "inputs_unchanged": "no input tensor is modified in place",
    },
    "calc_value_function_loss": {
        "half": "the loss carries the factor 0.5",
        "vf_coef": "the loss is scaled by vf_coef",
        "mean": "the mean over all elements of a batch of any shape (not a sum, not divided by the rows)",
        "squared": "of the squared differences (not absolute, not square-rooted, not the squared mean)",
        "sign": "a loss: positive, the objective subtracts it",
        "differentiable": "the gradient with respect to values is the reference's (nothing detached)",
        "inputs_unchanged": "no input tensor is modified in place",
    },
    "calc_entropy_bonus": {
        "coef": "the mean entropy is scaled by ent_coef",
        "sign": "a bonus to maximise: the entropy -sum p log p, which is >= 0",
        "mean_over_batch": "the mean of the per-state entropies over every batch dimension, not their sum",
        "last_dim": "the distribution is over the last dimension (the actions)",
        "sum_over_actions": "the entropy sums p log p over the actions (not a mean over them)",
        "weighted": "each log p is weighted by p (not a cross-entropy with the uniform distribution)",
        "stable": "large logits (scale 1e4) give a finite result",
        "differentiable": "the gradient with respect to logits is the reference's (nothing detached)",
    },
    "get_minibatch_indices": {
        "permutation": "every index of range(batch_size) appears exactly once per epoch",
        "shuffled": "the order is random, not 0, 1, 2, ...",
        "generator": "the permutation is drawn from the generator argument: same seed, same minibatches",
        "count": "batch_size // minibatch_size minibatches of minibatch_size each",
        "shape": "each minibatch is a 1-d index tensor, also with one minibatch or minibatches of 1",
        "integer": "the indices are integers",
    },
    "rollout_step": {
        "obs": "buffer.obs[step] is the observation the action was chosen in, not the next one",
        "samples": "the action is sampled from Categorical(logits=actor(obs)), not the argmax",
        "logprob": "buffer.logprobs[step] is log pi(a | obs) of the action taken",
        "value": "buffer.values[step] is V(obs) of the observation acted in",
        "rewards": "buffer.rewards[step] holds the rewards of the env step",
        "dones": "dones = terminated | truncated",
        "no_grad": "nothing stored carries a graph (no gradients needed during the rollout)",
        "returns_next_obs": "the next observation is returned as a float32 tensor",
        "row_step": "the transition goes into row `step` of the buffer; no other row is written",
    },
    "ppo_learning_phase": {
        "next_value": "next_value is the critic's value of next_obs",
        "returns": "the value targets are R = A + V",
        "targets_fixed": "advantages and returns are computed once, without gradients",
        "flatten": "every buffer field is flattened in the same [steps, env] order",
        "old_logprobs": "the ratio's old log-probs are the stored ones",
        "objective": "objective = L_clip - L_value + L_entropy, stepped by an optimizer that maximises",
        "zero_grad": "the gradients are zeroed before every backward",
        "grad_clip": "the gradient norm is clipped to max_grad_norm before every step",
        "minibatches": "update_epochs epochs of one optimizer step per minibatch",
        "generator": "the minibatches are drawn from the generator argument",
        "per_minibatch_normalisation": "the advantages are normalised per minibatch, not once over the batch",
        "buffer_read_only": "the buffer is read, never written",
        "keys": "the dict has policy_objective, value_loss, entropy, approx_kl, clipfrac and explained_variance",
        "approx_kl": "approx_kl is the k3 estimate mean((r - 1) - log r) with r = exp(new - stored log-probs)",
        "clipfrac": "clipfrac counts ratios outside the clip range on both sides (|r - 1| > clip_coef)",
        "mean_over_steps": "each diagnostic is the mean over every minibatch step of every epoch",
        "before_step": "approx_kl and clipfrac are measured before the minibatch's optimizer step",
        "explained_variance": "explained_variance is of the stored values against the returns",
        "entropy": "entropy is the policy's mean entropy, without ent_coef",
    },
}



# ----------------------------------------------------------------------------------------------------
# layer_init
# ----------------------------------------------------------------------------------------------------
def orthogonal_gain(weight: torch.Tensor) -> float | None:
    """The gain g when ``weight`` is g times a matrix with orthonormal rows (or columns), else None."""
    w = weight.detach().double()
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w  # = g^2 I for a scaled orthogonal matrix
    scale = gram.diagonal().mean().item()
    off_diag = (gram - torch.diag(gram.diagonal())).abs().max().item()
    if off_diag < 1e-4 * max(1.0, scale) and gram.diagonal().std(unbiased=False).item() < 1e-4 * max(1.0, scale):
        return math.sqrt(scale)
    return None


@checker(
    "layer_init",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "`torch.nn.init` has an in-place initialiser for each half: one that makes a matrix orthogonal (with a "
        "gain) and one that fills a tensor with a constant. Both end in an underscore.",
        "Call the orthogonal initialiser on the layer's weight with gain `std`, and the constant one on its bias "
        "with `bias_const`. Both modify the parameters in place, so return the very layer you were given (not a "
        "copy), and do it without building new tensors.",
        solution_code(ppo.layer_init),
    ),
)
def check_layer_init(candidate) -> str:
    cases = [((64, 4), {}), ((4, 64), {"std": 0.01}), ((8, 8), {"std": 1.0, "bias_const": 0.5}),
             ((3, 16), {"std": 2.0, "bias_const": -0.25})]
    for (out_f, in_f), kwargs in cases:
        torch.manual_seed(out_f * 100 + in_f)
        layer = nn.Linear(in_f, out_f)
        std = kwargs.get("std", math.sqrt(2))
        bias_const = kwargs.get("bias_const", 0.0)
        label = f"nn.Linear({in_f}, {out_f}) with {kwargs or 'the defaults'}"
        got = call(candidate, layer, **kwargs)
        if got is None:
            raise CheckFailure(f"On {label}, your function returned None.",
                               hint="End with `return layer`, so it can be used inline in nn.Sequential.")
        if got is not layer:
            raise CheckFailure(f"On {label}, your function returned a different object than the layer it got.",
                               hint="Initialise the given layer in place and return that same layer "
                                    "(do not build a new nn.Linear).")
        w = layer.weight.detach().double()
        gram = w @ w.T if out_f <= in_f else w.T @ w  # = std^2 I for a scaled orthogonal matrix
        off_diag = (gram - torch.diag(gram.diagonal())).abs().max().item()
        gain = orthogonal_gain(layer.weight)
        if gain is None:
            raise CheckFailure(
                f"On {label}, the weight is not a scaled orthogonal matrix: W W^T has off-diagonal entries "
                f"up to {off_diag:.3g} (expected 0).",
                hint="The weight must be an orthogonal matrix (orthonormal rows, or columns when the layer widens) "
                     "scaled by std; normal, uniform, xavier or kaiming initialisation do not make one.",
            )
        if not math.isclose(gain**2, std**2, rel_tol=1e-3, abs_tol=1e-8):
            hint = ("The gain is 1: the orthogonal matrix must be scaled by std." if math.isclose(gain, 1.0, rel_tol=1e-3)
                    else "The weight was scaled twice: gain=std already scales it, do not also multiply by std."
                    if math.isclose(gain, std**2, rel_tol=1e-3)
                    else "The orthogonal matrix must be scaled by exactly `std`.")
            raise CheckFailure(f"On {label}, the weight is orthogonal with gain {gain:.4g}, expected std = {std:.4g}.",
                               hint=hint)
        if not torch.allclose(layer.bias.detach(), torch.full_like(layer.bias, bias_const)):
            raise CheckFailure(f"On {label}, the bias is {fmt(layer.bias)}, expected every entry = {bias_const}.",
                               hint="Every entry of the bias must equal bias_const (its default is 0).")
    return f"orthogonal weights with gain std and constant bias on {len(cases)} layer shapes."


# ----------------------------------------------------------------------------------------------------
# compute_gae
# ----------------------------------------------------------------------------------------------------
def _gae_case(label: str, steps: int, envs: int, seed: int, p_done: float = 0.3, gamma: float = 0.99,
              lam: float = 0.95, rewards: torch.Tensor | None = None, dones: torch.Tensor | None = None) -> Case:
    g = seeded(seed)
    r = torch.randn(steps, envs, generator=g) if rewards is None else rewards
    v = torch.randn(steps, envs, generator=g)
    nv = torch.randn(envs, generator=g)
    d = (torch.rand(steps, envs, generator=g) < p_done) if dones is None else dones
    return Case(label, (r, v, nv, d, gamma, lam))


def _gae_loop(rewards, values, next_value, dones, gamma, lam, *, mask="t", use_next_value=True,
              lam_in=True, gamma_in_rec=True, gamma_in_delta=True, accumulate=True, add_values=False):
    """A configurable GAE used to build the catalogue of wrong variants."""
    steps = rewards.shape[0]
    d = dones.float()
    if mask == "t+1":  # the CleanRL 'next_done' convention applied to this contract's dones
        d = torch.cat([d[1:], torch.zeros_like(d[:1])])
    elif mask == "none":
        d = torch.zeros_like(d)
    nv = next_value if use_next_value else torch.zeros_like(next_value)
    nxt = torch.cat([values[1:], nv[None]])
    g_delta = gamma if gamma_in_delta else 1.0
    delta = rewards + g_delta * (1 - d) * nxt - values
    if not accumulate:
        return delta + (values if add_values else 0)
    out, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    coef = (gamma if gamma_in_rec else 1.0) * (lam if lam_in else 1.0)
    for t in reversed(range(steps)):
        last = delta[t] + coef * (1 - d[t]) * last
        out[t] = last
    return out + (values if add_values else 0)


def _gae_forward(rewards, values, next_value, dones, gamma, lam):
    d = dones.float()
    nxt = torch.cat([values[1:], next_value[None]])
    delta = rewards + gamma * (1 - d) * nxt - values
    out, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in range(rewards.shape[0]):
        last = delta[t] + gamma * lam * (1 - d[t]) * last
        out[t] = last
    return out


@checker(
    "compute_gae",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "The recursion A_t = delta_t + gamma * lambda * (1 - d_t) * A_{t+1} runs BACKWARDS in time: a Python loop "
        "over reversed(range(steps)) carrying A_{t+1}. What is V_{t+1} at the last step?",
        "First the TD residuals for all steps at once: V_{t+1} is the values shifted up by one step with "
        "next_value appended as the last row, and (1 - d_t) is the done mask as floats. Then start from "
        "A_{T} = 0 (a zero vector of shape [env]) and, for t from T-1 down to 0, set A_t from delta_t and A_{t+1}; "
        "write each A_t into row t of a result of zeros the shape of the rewards. The (1 - d_t) factor must be "
        "in both delta_t (no bootstrap) and the recursion (no advantage flows back across an episode end).",
        solution_code(ppo.compute_gae),
    ),
)
def check_compute_gae(candidate) -> str:
    cases = [
        _gae_case("6 steps x 3 envs with random episode ends", 6, 3, seed=1),
        _gae_case("a batch of 1 (1 step, 1 env)", 1, 1, seed=2),
        _gae_case("no episode ends", 5, 2, seed=3, p_done=0.0),
        _gae_case("every step ends an episode", 4, 2, seed=4, p_done=1.1),
        _gae_case("gamma = gae_lambda = 1 (Monte Carlo)", 7, 2, seed=5, gamma=1.0, lam=1.0),
        _gae_case("gae_lambda = 0 (one-step TD)", 5, 3, seed=6, lam=0.0),
        _gae_case("gamma = 0.9, gae_lambda = 0.8", 8, 4, seed=7, gamma=0.9, lam=0.8),
        _gae_case("all-equal rewards", 6, 2, seed=8, rewards=torch.ones(6, 2)),
    ]
    return compare_to_reference(
        candidate, ppo.compute_gae, cases,
        arg_names=["rewards", "values", "next_value", "dones", "gamma", "gae_lambda"],
        mistakes=[
            Mistake("You bootstrap across episode ends: multiply both the V_{t+1} term and the A_{t+1} term "
                    "by (1 - dones[t]).", lambda *a: _gae_loop(*a, mask="none")),
            Mistake("You mask with dones[t+1] (CleanRL's 'next_done' convention). Here dones[t] is True when "
                    "transition t itself ended the episode: use (1 - dones[t]).", lambda *a: _gae_loop(*a, mask="t+1")),
            Mistake("gae_lambda is missing: A_t = delta_t + gamma * gae_lambda * (1 - dones[t]) * A_{t+1}.",
                    lambda *a: _gae_loop(*a, lam_in=False)),
            Mistake("gamma is missing from the recursion: A_t = delta_t + gamma * gae_lambda * (1 - dones[t]) * A_{t+1}.",
                    lambda *a: _gae_loop(*a, gamma_in_rec=False)),
            Mistake("gamma is missing from delta: delta_t = r_t + gamma * (1 - dones[t]) * V_{t+1} - V_t.",
                    lambda *a: _gae_loop(*a, gamma_in_delta=False)),
            Mistake("next_value is unused: at t = T-1, V_{t+1} is next_value (the value after the last step), not 0.",
                    lambda *a: _gae_loop(*a, use_next_value=False)),
            Mistake("That is delta_t alone: accumulate A_t = delta_t + gamma * gae_lambda * (1 - dones[t]) * A_{t+1} "
                    "backwards in time.", lambda *a: _gae_loop(*a, accumulate=False)),
            Mistake("Those are returns (A + V): return the advantages only.", lambda *a: _gae_loop(*a, add_values=True)),
            Mistake("You accumulate forwards in time: A_t depends on A_{t+1}, so loop t = T-1, ..., 0.", _gae_forward),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# calc_clipped_surrogate_objective
# ----------------------------------------------------------------------------------------------------
def _surrogate(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8, *, norm="unbiased", op="min",
               clip_what="ratio", invert=False, sign=1.0, dim=None):
    if norm == "unbiased":
        a = (advantages - advantages.mean()) / (advantages.std() + eps)
    elif norm == "biased":
        a = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)
    elif norm == "no_center":
        a = advantages / (advantages.std() + eps)
    elif norm == "per_row":
        a = (advantages - advantages.mean(-1, keepdim=True)) / (advantages.std(-1, keepdim=True) + eps)
    else:
        a = advantages
    ratio = torch.exp(old_logprobs - logprobs) if invert else torch.exp(logprobs - old_logprobs)
    unclipped = ratio * a
    clipped = (torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * a if clip_what == "ratio"
               else ratio * torch.clamp(a, 1 - clip_coef, 1 + clip_coef))
    if op == "min":
        out = torch.minimum(unclipped, clipped)
    elif op == "max":
        out = torch.maximum(unclipped, clipped)
    elif op == "clipped":
        out = clipped
    else:
        out = unclipped
    return sign * out.mean()


def _surrogate_case(label: str, shape: tuple[int, ...], seed: int, spread: float, clip_coef: float = 0.2,
                    advantages: torch.Tensor | None = None, **kwargs) -> Case:
    g = seeded(seed)
    old = -torch.rand(shape, generator=g) * 2 - 0.1
    new = old + spread * torch.randn(shape, generator=g)
    adv = torch.randn(shape, generator=g) * 3 + 0.5 if advantages is None else advantages
    return Case(label, (new, old, adv, clip_coef), kwargs)


@checker(
    "calc_clipped_surrogate_objective",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "Three quantities: normalised advantages (mean and torch's default std), the probability ratio from the "
        "log-probabilities (`torch.exp` of a difference), and its clipped copy (`torch.clamp`). Then an "
        "element-wise `torch.minimum`.",
        "A_hat = (A - mean A) / (std A + eps); r = exp(logprobs - old_logprobs); the objective is the mean over "
        "samples of min(r * A_hat, clip(r, 1 - clip_coef, 1 + clip_coef) * A_hat). It is maximised: no minus "
        "sign, and the min (not the max) makes it the pessimistic bound.",
        solution_code(ppo.calc_clipped_surrogate_objective),
    ),
)
def check_calc_clipped_surrogate_objective(candidate) -> str:
    cases = [
        # seed 10: every known mistake gives a different value here (none is named for another)
        _surrogate_case("5 samples, ratios inside and outside the clip range", (5,), seed=10, spread=0.4),
        _surrogate_case("a [4, 6] batch", (4, 6), seed=2, spread=0.3),
        _surrogate_case("ratios far from 1", (16,), seed=3, spread=1.5, clip_coef=0.1),
        _surrogate_case("new == old (ratio 1)", (7,), seed=4, spread=0.0),
        _surrogate_case("all-equal advantages", (6,), seed=5, spread=0.5, advantages=torch.full((6,), 2.0)),
        _surrogate_case("eps = 1e-3, clip_coef = 0.3", (3, 4), seed=6, spread=0.5, clip_coef=0.3, eps=1e-3),
        # eps matters only where the std is small: here it is 1e-4, so eps = 1e-3 shrinks A tenfold
        _surrogate_case("near-constant advantages (std 1e-4), eps = 1e-3", (8,), seed=7, spread=0.5, eps=1e-3,
                        advantages=2.0 + 1e-4 * torch.randn(8, generator=seeded(8))),
        # Large log-ratios (ratios up to e^4 ~ 55) with negative advantages: there the min takes the unclipped
        # term however large the ratio, so a ratio or term capped at some bound shows.
        Case("large log-ratios (up to 4) with negative advantages", (
            torch.tensor([-2.0, -1.4, -1.0, -8.0, -4.9, -2.2, -5.2, -1.5]),
            torch.tensor([-5.0, -4.0, -5.0, -5.0, -5.0, -5.0, -5.0, -5.0]),
            torch.tensor([-1.0, -2.0, 1.5, 0.5, -0.5, -1.5, 2.0, -0.3]), 0.2)),
    ]
    return compare_to_reference(
        candidate, ppo.calc_clipped_surrogate_objective, cases,
        arg_names=["logprobs", "old_logprobs", "advantages", "clip_coef", "eps"],
        grad=DIFFERENTIATED["calc_clipped_surrogate_objective"],
        mistakes=[
            Mistake("The advantages are not normalised: start with A_hat = (A - mean(A)) / (std(A) + eps).",
                    lambda *a, **k: _surrogate(*a, **k, norm="none")),
            Mistake("The eps argument is ignored (a fixed 1e-8, or none): A_hat = (A - mean(A)) / (std(A) + eps), with the "
                    "eps you are given; it matters when the advantages are nearly equal.",
                    lambda lp, old, adv, c, eps=1e-8: _surrogate(lp, old, adv, c)),
            Mistake("You used the biased std (the population std, dividing by n): the contract uses torch's default, "
                    "the unbiased std (dividing by n - 1).", lambda *a, **k: _surrogate(*a, **k, norm="biased")),
            Mistake("You divided by the std but did not subtract the mean: A_hat = (A - mean(A)) / (std(A) + eps).",
                    lambda *a, **k: _surrogate(*a, **k, norm="no_center")),
            Mistake("You normalised each row separately: normalise over all elements (one mean and one std for the whole "
                    "tensor).",
                    lambda *a, **k: _surrogate(*a, **k, norm="per_row")),
            Mistake("That takes the max of the two terms: PPO takes the min (a pessimistic bound).",
                    lambda *a, **k: _surrogate(*a, **k, op="max")),
            Mistake("You clipped the advantages: clip the ratio, clip(ratio, 1 - clip_coef, 1 + clip_coef) * A.",
                    lambda *a, **k: _surrogate(*a, **k, clip_what="advantages")),
            Mistake("The ratio is inverted: ratio = exp(logprobs - old_logprobs) = pi_new / pi_old.",
                    lambda *a, **k: _surrogate(*a, **k, invert=True)),
            Mistake("The sign is flipped: this function returns an objective to maximise, not a loss.",
                    lambda *a, **k: _surrogate(*a, **k, sign=-1.0)),
            Mistake("That is only the clipped term: take the min of ratio * A and the clipped term.",
                    lambda *a, **k: _surrogate(*a, **k, op="clipped")),
            Mistake("That is the unclipped ratio * A: take the min with the clipped term.",
                    lambda *a, **k: _surrogate(*a, **k, op="unclipped")),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# calc_value_function_loss
# ----------------------------------------------------------------------------------------------------
def _vcase(label: str, shape: tuple[int, ...], seed: int, vf_coef: float, equal: bool = False) -> Case:
    g = seeded(seed)
    v = torch.randn(shape, generator=g) * 2
    r = v.clone() if equal else torch.randn(shape, generator=g) * 2 + 0.5
    return Case(label, (v, r, vf_coef))


@checker(
    "calc_value_function_loss",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "The mean squared error between the critic's values and the returns, with the 1/2 and vf_coef applied "
        "inside the function.",
        "L = 0.5 * vf_coef * mean over all elements of (values - returns)^2: a positive number (a loss); the "
        "objective subtracts it. No sum, no square root.",
        solution_code(ppo.calc_value_function_loss),
    ),
)
def check_calc_value_function_loss(candidate) -> str:
    cases = [
        _vcase("8 values, vf_coef = 0.7", (8,), 1, 0.7),  # not 0.5: a missing 0.5 and a missing vf_coef differ
        _vcase("a [3, 5] batch, vf_coef = 1", (3, 5), 2, 1.0),
        _vcase("a batch of 1", (1,), 3, 0.5),
        _vcase("vf_coef = 0.25", (10,), 4, 0.25),
        _vcase("values == returns", (4,), 5, 0.5, equal=True),
    ]
    return compare_to_reference(
        candidate, ppo.calc_value_function_loss, cases, arg_names=["values", "returns", "vf_coef"],
        grad=DIFFERENTIATED["calc_value_function_loss"],
        mistakes=[
            Mistake("The 0.5 is missing: 0.5 * vf_coef * mean((values - returns) ** 2).",
                    lambda v, r, c: c * (v - r).pow(2).mean()),
            Mistake("vf_coef is missing: 0.5 * vf_coef * mean(...).", lambda v, r, c: 0.5 * (v - r).pow(2).mean()),
            Mistake("You summed the squared errors: take their mean.", lambda v, r, c: 0.5 * c * (v - r).pow(2).sum()),
            Mistake("That is an absolute (L1) error: square the differences.",
                    lambda v, r, c: 0.5 * c * (v - r).abs().mean()),
            Mistake("That is a root mean squared error: no square root.",
                    lambda v, r, c: 0.5 * c * (v - r).pow(2).mean().sqrt()),
            Mistake("You squared the mean difference: take the mean of the squared differences.",
                    lambda v, r, c: 0.5 * c * (v - r).mean().pow(2)),
            Mistake("The sign is flipped: this is a loss (>= 0); the objective subtracts it.",
                    lambda v, r, c: -0.5 * c * (v - r).pow(2).mean()),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# calc_entropy_bonus
# ----------------------------------------------------------------------------------------------------
def _ecase(label: str, shape: tuple[int, ...], seed: int, ent_coef: float, scale: float = 2.0) -> Case:
    logits = torch.randn(shape, generator=seeded(seed)) * scale
    return Case(label, (logits, ent_coef))


def _entropy(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    logp = torch.log_softmax(logits, dim=dim)
    return -(logp.exp() * logp).sum(dim)


@checker(
    "calc_entropy_bonus",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "Entropy needs p_a and log p_a of every action: get the log-probabilities with `torch.log_softmax` "
        "and the probabilities from them with `exp` (or use torch.distributions.Categorical's entropy).",
        "H = -sum over the action (last) dimension of p * log p, one value per state; the bonus is ent_coef "
        "times the mean of H over the states. softmax then log underflows to log 0 = -inf for large logits "
        "(0 * -inf = NaN); log_softmax stays finite.",
        solution_code(ppo.calc_entropy_bonus),
    ),
)
def check_calc_entropy_bonus(candidate) -> str:
    cases = [
        _ecase("5 x 4 logits, ent_coef = 0.01", (5, 4), 1, 0.01),
        _ecase("[2, 3, 6] logits", (2, 3, 6), 2, 0.1),
        _ecase("a batch of 1", (1, 3), 3, 0.5),
        Case("ties (all logits equal: entropy log n)", (torch.zeros(3, 5), 1.0)),
        _ecase("large logits (scale 1e4)", (4, 6), 4, 0.2, scale=1e4),
    ]
    return compare_to_reference(
        candidate, ppo.calc_entropy_bonus, cases, arg_names=["logits", "ent_coef"],
        grad=DIFFERENTIATED["calc_entropy_bonus"],
        mistakes=[
            Mistake("ent_coef is missing: ent_coef * mean(entropy).", lambda x, c: _entropy(x).mean()),
            Mistake("The sign is flipped: entropy -sum p log p is >= 0, and this bonus is maximised.",
                    lambda x, c: -c * _entropy(x).mean()),
            Mistake("You summed the entropies over the batch: take their mean.", lambda x, c: c * _entropy(x).sum()),
            Mistake("The softmax is over the wrong dimension: the actions are on the last dim (dim=-1).",
                    lambda x, c: c * _entropy(x, dim=0).mean()),
            Mistake("You averaged p log p over the actions: entropy sums over actions, then average over the batch.",
                    lambda x, c: c * (-(x.softmax(-1) * x.log_softmax(-1))).mean()),
            Mistake("That is -mean(log p) (a cross-entropy with the uniform distribution): weight each log p by p.",
                    lambda x, c: c * (-x.log_softmax(-1)).mean(-1).mean()),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# get_minibatch_indices
# ----------------------------------------------------------------------------------------------------
@checker(
    "get_minibatch_indices",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "`torch.randperm` (with the generator) gives every index exactly once, in random order; then cut it into "
        "equal pieces.",
        "Draw one permutation of range(batch_size) from `generator`, reshape it to [num_minibatches, "
        "minibatch_size] with num_minibatches = batch_size // minibatch_size, and return its rows as a list of "
        "index tensors. Drawing a new permutation per minibatch would repeat some indices and drop others.",
        solution_code(ppo.get_minibatch_indices),
    ),
)
def check_get_minibatch_indices(candidate) -> str:
    def run(batch_size: int, minibatch_size: int, seed: int) -> list[torch.Tensor]:
        out = call(candidate, batch_size, minibatch_size, seeded(seed))
        label = f"batch_size={batch_size}, minibatch_size={minibatch_size}"
        if out is None:
            raise CheckFailure(f"On {label}, your function returned None: did you forget a `return`?")
        if isinstance(out, torch.Tensor) and out.ndim == 1:
            raise CheckFailure(f"On {label}, you returned one flat tensor of {out.numel()} indices: return a list of "
                               "minibatches (one index tensor each).")
        try:
            mbs = list(out)
        except TypeError:
            raise CheckFailure(f"On {label}, expected a list of index tensors, got {fmt(out)}.") from None
        if any(isinstance(mb, torch.Tensor) and mb.ndim == 0 for mb in mbs):
            # Edge: one minibatch (minibatch == batch) or minibatches of 1 make a [n, m] tensor with a
            # dimension of size 1, which a squeeze() drops: the list then holds single numbers.
            raise CheckFailure(
                f"On {label}, your minibatches are single numbers (0-d tensors), not index tensors of "
                f"{minibatch_size}.",
                hint="A squeeze() dropped a dimension of size 1 (one minibatch, or minibatches of 1): keep the "
                "[num_minibatches, minibatch_size] shape: each minibatch a 1-d tensor of indices.")
        n_expected = batch_size // minibatch_size
        if len(mbs) != n_expected:
            hint = ("You made minibatch_size minibatches of batch_size // minibatch_size each: the arguments are "
                    "the size of the batch and of ONE minibatch." if len(mbs) == minibatch_size else None)
            raise CheckFailure(f"On {label}, you returned {len(mbs)} minibatches, expected "
                               f"{batch_size} // {minibatch_size} = {n_expected}.", hint=hint)
        for i, mb in enumerate(mbs):
            mb = expect_tensor(mb, shape=(minibatch_size,), what=f"On {label}, minibatch {i}")
            if mb.dtype.is_floating_point or mb.dtype == torch.bool:
                raise CheckFailure(f"On {label}, minibatch {i} has dtype {mb.dtype}: indices must be integers "
                                   "(torch.long).")
        flat = torch.cat([mb.long() for mb in mbs])
        if flat.unique().numel() != batch_size or flat.min() < 0 or flat.max() >= batch_size:
            raise CheckFailure(f"On {label}, the minibatches do not use every index 0..{batch_size - 1} exactly once "
                               f"({flat.unique().numel()} distinct indices).",
                               hint="Draw without replacement: one random permutation of the indices per epoch, cut "
                                    "into pieces (indices drawn independently repeat some and miss others).")
        return mbs

    for batch_size, minibatch_size in [(16, 4), (12, 12), (6, 1), (512, 128)]:
        run(batch_size, minibatch_size, seed=0)
    flat = torch.cat(list(run(512, 128, seed=0)))
    if torch.equal(flat.long(), torch.arange(512)):
        raise CheckFailure("The minibatches are in order 0, 1, 2, ...: shuffle the indices every epoch.",
                           hint="The order must be a random permutation of range(batch_size), drawn from the generator, "
                                "not the indices in order.")
    again = torch.cat(list(run(512, 128, seed=0)))
    if not torch.equal(flat, again):
        raise CheckFailure("Two calls with generators seeded the same gave different minibatches: the order must "
                           "come from `generator`.",
                           hint="The permutation must be drawn from the `generator` argument, not the global random "
                                "state: the same seed must give the same minibatches.")
    other = torch.cat(list(run(512, 128, seed=1)))
    if torch.equal(flat, other):
        raise CheckFailure("Generators with different seeds gave the same minibatches: draw the permutation from "
                           "`generator` rather than a fixed seed.")
    return "every index once per epoch, shuffled, reproducible from the generator, on 4 batch shapes."


# ----------------------------------------------------------------------------------------------------
# rollout_step
# ----------------------------------------------------------------------------------------------------
class _ScriptedEnv(gym.Env):
    """A deterministic env for checking rollouts: 3-d float64 observations (as many gymnasium envs give:
    the rollout must convert them to float32), 3 actions, reward = action + t / 10.

    Env ``k`` ends its episodes after ``k + 2`` steps, by truncation when ``k`` is odd, by termination
    otherwise; the observation records (time, env, episode, last action).
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.observation_space = gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float64)
        self.action_space = gym.spaces.Discrete(3)
        self.t, self.episode = 0, 0

    def _obs(self, last_action: int) -> np.ndarray:
        return np.array([self.t / 4 + self.k / 10, self.episode / 3 - self.k, last_action - 1.0], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episode += 1
        return self._obs(1), {}

    def step(self, action):
        self.t += 1
        reward = float(action) + self.t / 10
        end = self.t >= self.k + 2
        terminated, truncated = (end and self.k % 2 == 0), (end and self.k % 2 == 1)
        return self._obs(int(action)), reward, terminated, truncated, {}


def _scripted_envs(num_envs: int) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv([lambda k=k: _ScriptedEnv(k) for k in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


@checker(
    "rollout_step",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "Four stores and one env step: sample an action from torch.distributions.Categorical over the actor's "
        "logits (no gradients needed), ask the critic for V(obs), then `envs.step` with the actions as a NumPy "
        "array.",
        "Under torch.no_grad(): actor logits and critic values (drop the critic's trailing dimension of size 1) "
        "for the current obs. Build the categorical distribution, sample the actions, and step the envs with "
        "them. At row `step` of the buffer store: the obs you acted in (not the next one), the actions, their "
        "log-probabilities under the distribution, the values, the rewards (float32) and dones = terminated OR "
        "truncated. Return the next observation converted to a float32 tensor.",
        solution_code(ppo.rollout_step),
    ),
)
def check_rollout_step(candidate) -> str:
    num_envs, num_steps = 3, 7
    torch.manual_seed(0)
    agent = ppo.Agent(3, 3, hidden=16)
    envs, twin = _scripted_envs(num_envs), _scripted_envs(num_envs)
    obs = torch.as_tensor(envs.reset(seed=0)[0], dtype=torch.float32)
    twin.reset(seed=0)
    buffer = ppo.RolloutBuffer.zeros(num_steps, num_envs, (3,))
    verified: list[dict[str, torch.Tensor]] = []
    names = ["agent", "envs", "obs", "buffer", "step"]
    for step in range(num_steps):
        where = f"at step {step}"
        obs_before = obs.clone()
        out = call(candidate, agent, envs, obs, buffer, step, _arg_names=names)
        out = expect_tensor(out, shape=(num_envs, 3), dtype=torch.float32, what=f"{where}, the observation you returned")

        actions = buffer.actions[step]
        if ((actions < 0) | (actions > 2)).any():
            raise CheckFailure(f"{where}, buffer.actions[step] = {fmt(actions)} is not a valid action (0, 1 or 2).")
        next_obs, reward, terminated, truncated, _ = twin.step(actions.numpy())
        next_obs = torch.as_tensor(next_obs, dtype=torch.float32)
        if not torch.equal(out, next_obs):
            raise CheckFailure(f"{where}, the observation you returned is {fmt(out)}, but stepping the envs with the "
                               f"actions you stored gives {fmt(next_obs)}.",
                               hint="Call envs.step(actions) exactly once per call, with the actions you store, and "
                                    "return its observation (do not reset: the vector env resets finished episodes).")
        if torch.equal(buffer.obs[step], next_obs) and not torch.equal(obs_before, next_obs):
            raise CheckFailure(f"{where}, buffer.obs[step] holds the observation after the step.",
                               hint="Store the observation the action was chosen in (the `obs` argument), not the "
                                    "one envs.step returns.")
        if not torch.equal(buffer.obs[step], obs_before):
            raise CheckFailure(f"{where}, buffer.obs[step] = {fmt(buffer.obs[step])}, expected the obs argument "
                               f"{fmt(obs_before)}.")
        with torch.no_grad():
            logits = agent.actor(obs_before)
            values = agent.critic(obs_before).squeeze(-1)
        logp = torch.log_softmax(logits, -1)
        want_logp = logp.gather(-1, actions[:, None]).squeeze(-1)
        got_logp = buffer.logprobs[step]
        if not torch.allclose(got_logp, want_logp, atol=1e-5):
            hint = None
            if torch.allclose(got_logp, want_logp.exp(), atol=1e-5):
                hint = "Those are probabilities: store the log-probability of the action taken."
            elif torch.allclose(got_logp, Categorical(logits=logits).entropy(), atol=1e-5):
                hint = "That is the entropy: store the log-probability of the action taken."
            elif torch.allclose(got_logp, logp[:, 0], atol=1e-5) or torch.allclose(got_logp, logits.gather(
                    -1, actions[:, None]).squeeze(-1), atol=1e-5):
                hint = "Store the log-probability of the action you took, under the distribution you sampled it from."
            raise CheckFailure(f"{where}, buffer.logprobs[step] = {fmt(got_logp)}, expected log pi(action | obs) = "
                               f"{fmt(want_logp)}.", hint=hint)
        if buffer.values.requires_grad or buffer.logprobs.requires_grad:
            raise CheckFailure(f"{where}, the buffer holds tensors that require grad.",
                               hint="Compute the logits and values under torch.no_grad(): the rollout only "
                                    "collects data, and the stored graphs would waste memory.")
        if not torch.allclose(buffer.values[step], values, atol=1e-5):
            with torch.no_grad():
                v_next = agent.critic(next_obs).squeeze(-1)
            hint = ("That is the value of the next observation: store V(obs) of the observation you acted in."
                    if torch.allclose(buffer.values[step], v_next, atol=1e-5) else None)
            raise CheckFailure(f"{where}, buffer.values[step] = {fmt(buffer.values[step])}, expected "
                               f"V(obs), one value per env = {fmt(values)}.", hint=hint)
        want_rewards = torch.as_tensor(reward, dtype=torch.float32)
        if not torch.allclose(buffer.rewards[step], want_rewards):
            raise CheckFailure(f"{where}, buffer.rewards[step] = {fmt(buffer.rewards[step])}, expected the rewards "
                               f"from envs.step: {fmt(want_rewards)}.")
        want_dones = torch.as_tensor(np.logical_or(terminated, truncated))
        if not torch.equal(buffer.dones[step].bool(), want_dones):
            hint = None
            if torch.equal(buffer.dones[step].bool(), torch.as_tensor(terminated)):
                hint = ("You stored only `terminated`: an episode also ends when it is truncated (a time limit): "
                        "dones = terminated | truncated.")
            raise CheckFailure(f"{where}, buffer.dones[step] = {fmt(buffer.dones[step])}, expected terminated | "
                               f"truncated = {fmt(want_dones)}.", hint=hint)
        verified.append({k: getattr(buffer, k)[step].clone() for k in
                         ("obs", "actions", "logprobs", "values", "rewards", "dones")})
        obs = out

    for step, row in enumerate(verified):
        for k, v in row.items():
            if not torch.equal(getattr(buffer, k)[step], v):
                raise CheckFailure(f"buffer.{k}[{step}] changed after step {step}: write only row `step` of the buffer.")
    with torch.no_grad():
        greedy = agent.actor(buffer.obs).argmax(-1)
    if torch.equal(greedy, buffer.actions):
        raise CheckFailure("Every stored action is the most probable one: the rollout must sample.",
                           hint="Sample each env's action from the categorical distribution its logits define: the "
                                "most probable action (the argmax) is not a sample, and the policy would never explore.")
    return (f"{num_steps} steps of {num_envs} scripted envs (episode ends by termination and truncation): obs, "
            "actions, log-probs, values, rewards, dones and the next obs all as expected.")


# ----------------------------------------------------------------------------------------------------
# ppo_learning_phase
# ----------------------------------------------------------------------------------------------------
def _learning_setup(seed: int, num_envs: int, num_steps: int, obs_dim: int = 4, n_actions: int = 3):
    g = seeded(seed)
    torch.manual_seed(seed)
    agent = ppo.Agent(obs_dim, n_actions, hidden=16)
    ppo.layer_init(agent.actor[-1], std=1.0)  # a policy far from uniform, so the entropy term has a gradient
    buffer = ppo.RolloutBuffer.zeros(num_steps, num_envs, (obs_dim,))
    buffer.obs[:] = torch.randn(num_steps, num_envs, obs_dim, generator=g)
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(buffer.obs))
        buffer.actions[:] = dist.sample()
        # Old log-probs a little off the current policy, so that ratios differ from 1 and some get clipped.
        buffer.logprobs[:] = dist.log_prob(buffer.actions) + 0.3 * torch.randn(num_steps, num_envs, generator=g)
        buffer.values[:] = agent.critic(buffer.obs).squeeze(-1)
    buffer.rewards[:] = torch.randn(num_steps, num_envs, generator=g)
    buffer.dones[:] = torch.rand(num_steps, num_envs, generator=g) < 0.2
    next_obs = torch.randn(num_envs, obs_dim, generator=g)
    return agent, buffer, next_obs


def _buffer_copy(buffer: ppo.RolloutBuffer) -> ppo.RolloutBuffer:
    return ppo.RolloutBuffer(*(getattr(buffer, k).clone() for k in
                               ("obs", "actions", "logprobs", "values", "rewards", "dones")))


def _learning_variant(agent, optimizer, buffer, next_obs, args, generator=None, *, bug: str, minibatches=None):
    """The reference learning phase with one deliberate bug (for the hints); ``minibatches(batch_size,
    minibatch_size, generator)`` gives each epoch's minibatches (get_minibatch_indices by default)."""
    minibatches = minibatches or ppo.get_minibatch_indices
    with torch.no_grad():
        next_value = agent.critic(next_obs).squeeze(-1)
        if bug == "next_value_zero":
            next_value = torch.zeros_like(next_value)
        adv = ppo.compute_gae(buffer.rewards, buffer.values, next_value, buffer.dones, args.gamma, args.gae_lambda)
        returns = adv if bug == "returns_are_advantages" else adv + buffer.values
    flat = [einops.rearrange(x, "s e ... -> (s e) ...") for x in
            (buffer.obs, buffer.actions, buffer.logprobs, adv, returns)]
    b_obs, b_act, b_logp, b_adv, b_ret = flat
    if bug == "batch_normalised":  # once over the whole batch, and a surrogate that does not normalise again
        b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
    for _ in range(args.update_epochs):
        for mb in minibatches(args.batch_size, args.minibatch_size, generator):
            logits = agent.actor(b_obs[mb])
            new_logp = Categorical(logits=logits).log_prob(b_act[mb])
            old_logp = new_logp.detach() if bug == "old_is_new" else b_logp[mb]
            if bug == "batch_normalised":
                ratio = (new_logp - old_logp).exp()
                pol = torch.minimum(ratio * b_adv[mb],
                                    ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef) * b_adv[mb]).mean()
            else:
                pol = ppo.calc_clipped_surrogate_objective(new_logp, old_logp, b_adv[mb], args.clip_coef)
            vl = ppo.calc_value_function_loss(agent.critic(b_obs[mb]).squeeze(-1), b_ret[mb], args.vf_coef)
            ent = ppo.calc_entropy_bonus(logits, args.ent_coef)
            objective = {"value_sign": pol + vl + ent, "minimise": -(pol - vl + ent),
                         "no_entropy": pol - vl}.get(bug, pol - vl + ent)
            if bug != "no_zero_grad":
                optimizer.zero_grad()
            objective.backward()
            if bug != "no_clip":
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
    return {"approx_kl": 0.0, "clipfrac": 0.0}


_LEARNING_MISTAKES = {
    "no_clip": "The gradient is not clipped: scale the agent's gradients so that their global norm is at most "
               "args.max_grad_norm, after backward() and before optimizer.step().",
    "no_zero_grad": "Gradients pile up across minibatches: call optimizer.zero_grad() before every backward().",
    "minimise": "The update goes the wrong way: the optimizer maximises (maximize=True), so step on "
                "objective = L_clip - L_value + L_entropy itself, not on its negative.",
    "value_sign": "The value loss enters with the wrong sign: objective = L_clip - L_value + L_entropy (the "
                  "optimizer maximises, and the value loss must go down).",
    "no_entropy": "The entropy bonus is missing from the objective: objective = L_clip - L_value + L_entropy.",
    "returns_are_advantages": "The value targets are the advantages: returns = advantages + buffer.values.",
    "next_value_zero": "next_value should be the critic's value of next_obs (the observation after the rollout), "
                       "not 0.",
    "old_is_new": "old_logprobs must be the stored buffer.logprobs (the policy that collected the data), not the "
                  "new log-probs detached: then the ratio is always 1 and nothing is clipped.",
    "batch_normalised": "The advantages are normalised once over the whole batch: the contract normalises them per "
                        "minibatch (calc_clipped_surrogate_objective does it on the minibatch it is given), which "
                        "differs as soon as there are several minibatches.",
}

#: The returned diagnostics: the mean over every minibatch step of each of the first five, measured on the
#: minibatch before its optimizer step, and the rollout's explained variance.
STAT_KEYS = ("policy_objective", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance")
_STAT_MEANING = {
    "policy_objective": "the mean over every minibatch step of calc_clipped_surrogate_objective's value",
    "value_loss": "the mean over every minibatch step of calc_value_function_loss's value (vf_coef included)",
    "entropy": "the mean over every minibatch step of the policy's mean entropy on the minibatch (without "
               "ent_coef)",
    "approx_kl": "the mean over every minibatch step of mean((r - 1) - log r), r = exp(new log-probs - stored "
                 "log-probs), measured before that minibatch's optimizer step",
    "clipfrac": "the mean over every minibatch step of the share of ratios with |r - 1| > clip_coef, measured "
                "before that minibatch's optimizer step",
    "explained_variance": "explained_variance(values, returns) of the rollout: the stored values against the "
                          "returns, flattened",
}


def _stat_variants(agent_before, buffer, next_obs, args, steps: list[torch.Tensor], agent_after) -> dict:
    """Wrong versions of the returned diagnostics, computed along the reference's own run with the same
    minibatches: {key: [(hint, value), ...]} (the k1 estimate, swapped arguments, one side of the clip
    range, the last minibatch only, measured after the step, the returns' roles swapped...)."""
    agent = copy.deepcopy(agent_before)
    optimizer = torch.optim.SGD(agent.parameters(), lr=0.05, maximize=True)
    with torch.no_grad():
        next_value = agent.critic(next_obs).squeeze(-1)
        adv = ppo.compute_gae(buffer.rewards, buffer.values, next_value, buffer.dones, args.gamma, args.gae_lambda)
        returns = adv + buffer.values
    b_obs = einops.rearrange(buffer.obs, "s e ... -> (s e) ...")
    b_act, b_logp, b_adv, b_ret, b_val = (einops.rearrange(x, "s e -> (s e)") for x in
                                          (buffer.actions, buffer.logprobs, adv, returns, buffer.values))
    per: dict[str, list[float]] = {k: [] for k in ("k1", "k3_swapped", "upper", "lower", "k3", "clipfrac",
                                                  "k3_after", "clipfrac_after", "entropy_bonus", "entropy",
                                                  "policy_objective", "value_loss")}
    for mb in steps:
        logits = agent.actor(b_obs[mb])
        dist = Categorical(logits=logits)
        new_logp = dist.log_prob(b_act[mb])
        pol = ppo.calc_clipped_surrogate_objective(new_logp, b_logp[mb], b_adv[mb], args.clip_coef)
        vl = ppo.calc_value_function_loss(agent.critic(b_obs[mb]).squeeze(-1), b_ret[mb], args.vf_coef)
        objective = pol - vl + ppo.calc_entropy_bonus(logits, args.ent_coef)
        per["policy_objective"].append(pol.item())
        per["value_loss"].append(vl.item())
        optimizer.zero_grad()
        objective.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
        with torch.no_grad():
            log_r = new_logp - b_logp[mb]
            r = log_r.exp()
            per["k1"].append((-log_r).mean().item())
            per["k3_swapped"].append(((1 / r - 1) + log_r).mean().item())
            per["k3"].append(((r - 1) - log_r).mean().item())
            per["upper"].append((r > 1 + args.clip_coef).float().mean().item())
            per["lower"].append((r < 1 - args.clip_coef).float().mean().item())
            per["clipfrac"].append(((r - 1).abs() > args.clip_coef).float().mean().item())
            per["entropy"].append(dist.entropy().mean().item())
            per["entropy_bonus"].append(args.ent_coef * dist.entropy().mean().item())
        optimizer.step()
        with torch.no_grad():
            log_r = Categorical(logits=agent.actor(b_obs[mb])).log_prob(b_act[mb]) - b_logp[mb]
            per["k3_after"].append(((log_r.exp() - 1) - log_r).mean().item())
            per["clipfrac_after"].append(((log_r.exp() - 1).abs() > args.clip_coef).float().mean().item())
    mean = {k: float(np.mean(v)) for k, v in per.items()}
    with torch.no_grad():
        new_values = einops.rearrange(agent_after.critic(buffer.obs).squeeze(-1), "s e -> (s e)")
    last = "You reported the last minibatch's value only: return the mean over every minibatch step of every epoch."
    after = ("You measured it after the optimizer step: measure it on the log-probabilities the loss used, before "
             "optimizer.step() changes the policy.")
    return {
        "policy_objective": [(last, per["policy_objective"][-1])],
        "value_loss": [(last, per["value_loss"][-1]),
                       ("That is the value loss without vf_coef: report calc_value_function_loss's value.",
                        mean["value_loss"] / args.vf_coef)],
        "approx_kl": [
            ("That is the k1 estimate mean(-log r): the contract's is the k3 estimate mean((r - 1) - log r), "
             "never negative.", mean["k1"]),
            ("The ratio is inverted (log r = old - new): r = exp(new log-probs - stored log-probs), "
             "approx_kl = mean((r - 1) - log r).", mean["k3_swapped"]),
            (last, per["k3"][-1]),
            (after, mean["k3_after"]),
        ],
        "clipfrac": [
            ("You counted only the ratios above 1 + clip_coef: a ratio below 1 - clip_coef is clipped too "
             "(|r - 1| > clip_coef).", mean["upper"]),
            ("You counted only the ratios below 1 - clip_coef: a ratio above 1 + clip_coef is clipped too "
             "(|r - 1| > clip_coef).", mean["lower"]),
            (last, per["clipfrac"][-1]),
            (after, mean["clipfrac_after"]),
        ],
        "entropy": [
            ("That is the entropy bonus (ent_coef times the entropy): report the policy's entropy itself.",
             mean["entropy_bonus"]),
            (last, per["entropy"][-1]),
        ],
        "explained_variance": [
            ("The arguments are swapped: explained_variance(values, returns) divides by the variance of the "
             "returns.", ppo.explained_variance(b_ret, b_val)),
            ("That uses the critic's values after the updates: the contract's explained variance is of the values "
             "stored at rollout time (buffer.values) against the returns.",
             ppo.explained_variance(new_values, b_ret)),
        ],
    }


class _CountingSGD(torch.optim.SGD):
    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.steps = 0
        self.marks: list[int] = []  # with a recording hook: how many actor inputs it had seen at each step
        self.seen: list[torch.Tensor] | None = None

    def step(self, closure=None):
        self.steps += 1
        if self.seen is not None:
            self.marks.append(len(self.seen))
        return super().step(closure)


def _run_learning(fn, agent, buffer, next_obs, args, seed: int, via_call: bool, seen: list | None = None):
    agent = copy.deepcopy(agent)
    buffer = _buffer_copy(buffer)
    # SGD, not Adam: Adam divides out the scale of the gradient, which would hide a missing gradient clip.
    optimizer = _CountingSGD(agent.parameters(), lr=0.05, maximize=True)
    if seen is not None:  # the observations the actor sees with gradients on, and where each step falls
        optimizer.seen = seen
        agent.actor.register_forward_pre_hook(
            lambda module, inputs: seen.append(inputs[0].detach().clone()) if torch.is_grad_enabled() else None)
    if via_call:
        stats = call(fn, agent, optimizer, buffer, next_obs.clone(), args, seeded(seed),
                     _arg_names=["agent", "optimizer", "buffer", "next_obs", "args", "generator"])
    else:
        stats = fn(agent, optimizer, buffer, next_obs.clone(), args, seeded(seed))
    return agent, optimizer, buffer, stats


def _params(agent) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in agent.parameters()])


def _same_update(got: torch.Tensor, want: torch.Tensor, start: torch.Tensor) -> bool:
    """Whether two parameter updates agree to 0.1% of the update's size."""
    return bool((got - want).norm() <= 1e-3 * (want - start).norm() + 1e-7)


@checker(
    "ppo_learning_phase",
    chapter=CHAPTER,
    device=DEVICE,
    hint=(
        "Two parts: once per rollout and without gradients, the critic's value of next_obs, your compute_gae and "
        "the returns; then epochs x minibatches of the objective from your three functions, with "
        "zero_grad / backward / clip_grad_norm_ / step.",
        "1. no_grad: next_value = V(next_obs) (squeezed to [env]), advantages from compute_gae with args.gamma "
        "and args.gae_lambda, returns R = A + V. 2. Flatten obs, actions, logprobs, advantages, returns, values "
        "from [steps, env] to one batch dimension, in the same order for all. 3. For each of args.update_epochs "
        "epochs and each minibatch of indices that get_minibatch_indices draws with the generator you are "
        "given: the new logits and log-probs of the stored actions, the new values; objective = "
        "clipped surrogate - value loss + entropy bonus; zero the gradients, backpropagate, clip the gradient "
        "norm to args.max_grad_norm, step. 4. Per minibatch, from the log-probabilities the loss used (so before "
        "the step), record clip_diagnostics, the two terms' values and the policy's entropy (without ent_coef); "
        "return their means over every step, and the explained variance of the stored values against the returns.",
        solution_code(ppo.ppo_learning_phase),
    ),
)
def check_learning_phase(candidate) -> str:
    # 1. One minibatch per epoch: the update is deterministic whatever the minibatch order, so the
    #    parameters must match the reference's after two epochs; once with a gradient-norm limit far
    #    above the gradient's norm (about 1 here), once with one that clips every step.
    for max_grad_norm, label in ((10.0, "without gradient clipping active"), (0.3, "with gradient clipping active")):
        args = PPOArgs(num_envs=2, num_steps=8, num_minibatches=1, update_epochs=2,
                           max_grad_norm=max_grad_norm, ent_coef=0.05, hidden=16)
        agent, buffer, next_obs = _learning_setup(0, args.num_envs, args.num_steps)
        before = _buffer_copy(buffer)
        start = _params(agent)
        ref_agent, _, _, ref_stats = _run_learning(ppo.ppo_learning_phase, agent, buffer, next_obs, args, 0,
                                                   via_call=False)
        got_agent, opt, got_buffer, stats = _run_learning(candidate, agent, buffer, next_obs, args, 0, via_call=True)
        for k in ("obs", "actions", "logprobs", "values", "rewards", "dones"):
            if not torch.equal(getattr(got_buffer, k), getattr(before, k)):
                raise CheckFailure(f"Your learning phase changed buffer.{k}: read the buffer, do not write to it.")
        if opt.steps != args.update_epochs * args.num_minibatches:
            raise CheckFailure(f"With update_epochs = {args.update_epochs} and num_minibatches = "
                               f"{args.num_minibatches} your code called optimizer.step() {opt.steps} times, expected "
                               f"{args.update_epochs * args.num_minibatches}.",
                               hint="One optimizer step per minibatch, for every epoch.")
        got, want = _params(got_agent), _params(ref_agent)
        if torch.equal(got, start):
            raise CheckFailure("The agent's parameters did not change.",
                               hint="Build the objective from the recomputed logits and values (with gradients), "
                                    "call backward() on it and optimizer.step().")
        if not _same_update(got, want, start):
            message = (f"{label.capitalize()}, your update of the agent's parameters differs from the reference's "
                       f"(by {(got - want).norm() / (want - start).norm():.1%} of its size).")
            for bug, hint in _LEARNING_MISTAKES.items():
                wrong = lambda *a, bug=bug: _learning_variant(*a, bug=bug)  # noqa: E731
                if _same_update(got, _params(_run_learning(wrong, agent, buffer, next_obs, args, 0, False)[0]), start):
                    raise CheckFailure(message, hint=hint)
            raise CheckFailure(message)
    _check_stats_form(stats, ref_stats)

    # 2. Several minibatches and epochs: the order is the learner's, so check the structure, then replay the
    #    learner's minibatches (read from what its actor saw) on the reference and compare the update and
    #    every returned diagnostic.
    args = PPOArgs(num_envs=4, num_steps=8, num_minibatches=4, update_epochs=2, ent_coef=0.05, hidden=16)
    agent, buffer, next_obs = _learning_setup(1, args.num_envs, args.num_steps)
    seen: list[torch.Tensor] = []
    got_agent, opt, _, stats = _run_learning(candidate, agent, buffer, next_obs, args, 1, via_call=True, seen=seen)
    expected_steps = args.update_epochs * args.num_minibatches
    if opt.steps != expected_steps:
        raise CheckFailure(f"With update_epochs = {args.update_epochs} and num_minibatches = {args.num_minibatches} "
                           f"your code called optimizer.step() {opt.steps} times, expected {expected_steps}.",
                           hint="Loop over epochs, and inside over the minibatches of get_minibatch_indices: one "
                                "optimizer step per minibatch.")
    sizes = sorted({x.shape[0] for x in seen})
    if sizes != [args.minibatch_size]:
        raise CheckFailure(f"The actor was trained on batches of {sizes} observations, expected minibatches of "
                           f"{args.minibatch_size} (batch_size {args.batch_size} / {args.num_minibatches}).",
                           hint="Compute the logits of each minibatch's observations only (the flattened buffer "
                                "indexed with the minibatch's indices).")
    flat_obs = einops.rearrange(buffer.obs, "s e d -> (s e) d")
    index_of = {tuple(r.tolist()): i for i, r in enumerate(flat_obs)}
    rows = {tuple(r.tolist()) for x in seen for r in x}
    if rows != set(index_of):
        raise CheckFailure("The minibatches do not cover the whole rollout.",
                           hint="Each epoch, use every minibatch of indices that get_minibatch_indices gives.")
    # The minibatch of each step: the last observations the actor saw with gradients before that step.
    if not opt.marks or opt.marks[0] == 0:
        raise CheckFailure("Your code called optimizer.step() before computing any logits of a minibatch.",
                           hint="Per minibatch: logits and values, the objective, backward, then the step.")
    steps = [torch.tensor([index_of[tuple(r.tolist())] for r in seen[end - 1]])
             for end in opt.marks]
    _compare_replayed(candidate, agent, buffer, next_obs, args, steps, got_agent, stats)

    # 3. The order comes from the generator it is given: the same generator seed gives the same minibatches,
    #    whatever the global random state (a learner's code that ignores the generator draws from the latter).
    first = seen[:]
    seen.clear()
    torch.manual_seed(12345)
    _run_learning(candidate, agent, buffer, next_obs, args, 1, via_call=True, seen=seen)
    if len(seen) != len(first) or any(not torch.equal(a, b) for a, b in zip(seen, first)):
        raise CheckFailure("Two runs with generators of the same seed drew different minibatches: your code does "
                           "not take its order from the generator argument.",
                           hint="Draw the minibatches with the generator argument you are given (get_minibatch_indices "
                                "takes one): a run must be reproducible from its seed.")
    return ("matches the reference's update with one minibatch (two epochs, with and without clipped gradients) and "
            f"with {args.num_minibatches} minibatches x {args.update_epochs} epochs in your order (advantages "
            "normalised per minibatch), covering the rollout in the order its generator gives; every returned "
            f"diagnostic ({', '.join(STAT_KEYS)}) equals the reference's.")


def _check_stats_form(stats, ref_stats) -> None:
    if not isinstance(stats, dict):
        raise CheckFailure(f"Your learning phase returned {fmt(stats)}: return a dict of diagnostics.")
    for key in STAT_KEYS:
        if key not in stats:
            raise CheckFailure(f"The dict you returned has no {key!r} (keys: {sorted(stats)}).",
                               hint=f"Return {', '.join(STAT_KEYS)}: {key} is {_STAT_MEANING[key]}.")
        try:
            value = float(stats[key])
        except (TypeError, ValueError):
            raise CheckFailure(f"stats[{key!r}] = {fmt(stats[key])} is not a number.") from None
        if not math.isfinite(value):
            raise CheckFailure(f"stats[{key!r}] = {value} is not finite.")
    if not 0.0 <= float(stats["clipfrac"]) <= 1.0:
        raise CheckFailure(f"clipfrac = {float(stats['clipfrac']):.4g} is a fraction: it must lie in [0, 1].")
    if float(stats["clipfrac"]) == 0.0 and ref_stats["clipfrac"] > 0.05:
        raise CheckFailure(f"clipfrac = 0, but {ref_stats['clipfrac']:.0%} of the ratios are outside the clip range.",
                           hint="clipfrac is the share of samples whose ratio exp(new log-prob - stored log-prob) "
                                "lies outside [1 - clip_coef, 1 + clip_coef].")
    if float(stats["approx_kl"]) < -1e-6:
        raise CheckFailure(f"approx_kl = {float(stats['approx_kl']):.4g} < 0.",
                           hint="Use the estimator that is never negative: mean((r - 1) - log r).")


def _replayer(steps: list[torch.Tensor], per_epoch: int):
    """A get_minibatch_indices that hands out the given minibatches, one epoch's worth per call."""
    epochs = [steps[i:i + per_epoch] for i in range(0, len(steps), per_epoch)]

    def replay(batch_size, minibatch_size, generator=None):
        return [mb.clone() for mb in epochs.pop(0)]

    return replay


def _compare_replayed(candidate, agent, buffer, next_obs, args, steps, got_agent, stats) -> None:
    """The reference run on the candidate's minibatches: the same parameters, the same diagnostics."""
    from rlhf_tutorial.trainers.plug import bind
    from rlhf_tutorial.trainers.ppo import PLUGGABLE

    per_epoch = args.num_minibatches
    reference = bind(ppo, PLUGGABLE, {"get_minibatch_indices": _replayer(steps, per_epoch)})["ppo_learning_phase"]
    ref_agent, _, _, ref_stats = _run_learning(reference, agent, buffer, next_obs, args, 1, via_call=False)
    start, got, want = _params(agent), _params(got_agent), _params(ref_agent)
    label = f"With {args.num_minibatches} minibatches x {args.update_epochs} epochs (your minibatches, replayed on the reference)"
    if not _same_update(got, want, start):
        message = (f"{label}, your update of the agent's parameters differs from the reference's (by "
                   f"{(got - want).norm() / (want - start).norm():.1%} of its size).")
        for bug, hint in _LEARNING_MISTAKES.items():
            wrong = lambda *a, bug=bug: _learning_variant(  # noqa: E731
                *a, bug=bug, minibatches=_replayer(steps, per_epoch))
            if _same_update(got, _params(_run_learning(wrong, agent, buffer, next_obs, args, 1, False)[0]), start):
                raise CheckFailure(message, hint=hint)
        raise CheckFailure(message)
    _check_stats_form(stats, ref_stats)
    variants = None
    for key in STAT_KEYS:
        value, want_value = float(stats[key]), float(ref_stats[key])
        if math.isclose(value, want_value, rel_tol=1e-3, abs_tol=1e-5):
            continue
        if variants is None:
            variants = _stat_variants(agent, buffer, next_obs, args, steps, ref_agent)
        hint = next((h for h, v in variants.get(key, []) if math.isclose(value, v, rel_tol=1e-3, abs_tol=1e-5)
                     and not math.isclose(v, want_value, rel_tol=1e-3, abs_tol=1e-5)), None)
        raise CheckFailure(f"{label}, the update is right but you returned {key} = {value:.6g}, expected "
                           f"{want_value:.6g}: {_STAT_MEANING[key]}.", hint=hint)
