"""Checkers of chapter 01: the reference passes, the stub fails, known mistakes get their hint, and a
correct implementation written differently passes."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

from rlhf_tutorial import ppo
from rlhf_tutorial.checks import run_check
from tests.checks.helpers import assert_fails_with

SQRT2 = math.sqrt(2)


# ----------------------------------------------------------------------------------------------------
# layer_init
# ----------------------------------------------------------------------------------------------------
def init_gain_ignored(layer, std=SQRT2, bias_const=0.0):
    nn.init.orthogonal_(layer.weight)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def init_normal(layer, std=SQRT2, bias_const=0.0):
    nn.init.normal_(layer.weight, std=std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def init_bias_untouched(layer, std=SQRT2, bias_const=0.0):
    nn.init.orthogonal_(layer.weight, gain=std)
    return layer


def init_new_layer(layer, std=SQRT2, bias_const=0.0):
    new = nn.Linear(layer.in_features, layer.out_features)
    nn.init.orthogonal_(new.weight, gain=std)
    nn.init.constant_(new.bias, bias_const)
    return new


def init_no_return(layer, std=SQRT2, bias_const=0.0):
    nn.init.orthogonal_(layer.weight, gain=std)
    nn.init.constant_(layer.bias, bias_const)


def init_scaled_twice(layer, std=SQRT2, bias_const=0.0):
    nn.init.orthogonal_(layer.weight, gain=std)
    with torch.no_grad():
        layer.weight.mul_(std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


@pytest.mark.parametrize("fn, fragment", [
    (init_gain_ignored, "The gain is 1"),
    (init_normal, "orthogonal matrix"),
    (init_bias_untouched, "bias_const"),
    (init_new_layer, "same layer"),
    (init_no_return, "return layer"),
    (init_scaled_twice, "scaled twice"),
])
def test_layer_init_mistakes(fn, fragment):
    assert_fails_with("layer_init", fn, fragment)


def test_layer_init_written_differently():
    def by_qr(layer, std=SQRT2, bias_const=0.0):
        out_f, in_f = layer.weight.shape
        q, r = torch.linalg.qr(torch.randn(max(out_f, in_f), min(out_f, in_f)))
        q = q * torch.sign(torch.diagonal(r))  # columns orthonormal
        with torch.no_grad():
            layer.weight.copy_(std * (q if out_f >= in_f else q.T))
            layer.bias.fill_(bias_const)
        return layer

    assert run_check("layer_init", by_qr).passed


# ----------------------------------------------------------------------------------------------------
# compute_gae
# ----------------------------------------------------------------------------------------------------
def _deltas(rewards, values, next_value, not_done, gamma):
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    return rewards + gamma * not_done * next_values - values


def gae_ignores_dones(rewards, values, next_value, dones, gamma, gae_lambda):
    ones = torch.ones_like(rewards)
    delta = _deltas(rewards, values, next_value, ones, gamma)
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        last = delta[t] + gamma * gae_lambda * last
        adv[t] = last
    return adv


def gae_next_done_convention(rewards, values, next_value, dones, gamma, gae_lambda):
    # CleanRL stores "the next obs starts a new episode" flags: used here with dones[t+1]
    next_dones = torch.cat([dones[1:], torch.zeros_like(dones[:1])]).float()
    delta = _deltas(rewards, values, next_value, 1 - next_dones, gamma)
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        last = delta[t] + gamma * gae_lambda * (1 - next_dones[t]) * last
        adv[t] = last
    return adv


def gae_without_lambda(rewards, values, next_value, dones, gamma, gae_lambda):
    nd = 1 - dones.float()
    delta = _deltas(rewards, values, next_value, nd, gamma)
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        last = delta[t] + gamma * nd[t] * last
        adv[t] = last
    return adv


def gae_forwards(rewards, values, next_value, dones, gamma, gae_lambda):
    nd = 1 - dones.float()
    delta = _deltas(rewards, values, next_value, nd, gamma)
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in range(len(rewards)):
        last = delta[t] + gamma * gae_lambda * nd[t] * last
        adv[t] = last
    return adv


def gae_no_bootstrap(rewards, values, next_value, dones, gamma, gae_lambda):
    nd = 1 - dones.float()
    delta = _deltas(rewards, values, torch.zeros_like(next_value), nd, gamma)
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        last = delta[t] + gamma * gae_lambda * nd[t] * last
        adv[t] = last
    return adv


def gae_bool_arithmetic(rewards, values, next_value, dones, gamma, gae_lambda):
    return rewards + gamma * (1 - dones) * values  # `1 - bool tensor` raises in torch


@pytest.mark.parametrize("fn, fragment", [
    (gae_ignores_dones, "bootstrap across episode ends"),
    (gae_next_done_convention, "dones[t+1]"),
    (gae_without_lambda, "gae_lambda is missing"),
    (gae_forwards, "forwards in time"),
    (gae_no_bootstrap, "next_value is unused"),
    (gae_bool_arithmetic, "raised RuntimeError"),
])
def test_compute_gae_mistakes(fn, fragment):
    assert_fails_with("compute_gae", fn, fragment)


def test_compute_gae_written_differently():
    def gae_as_explicit_sums(rewards, values, next_value, dones, gamma, gae_lambda):
        # A_t = sum_l (gamma lambda)^l delta_{t+l}, stopping after the first episode end
        steps, envs = rewards.shape
        out = torch.zeros(steps, envs)
        for e in range(envs):
            for t in range(steps):
                total, weight = 0.0, 1.0
                for k in range(t, steps):
                    v_next = next_value[e] if k == steps - 1 else values[k + 1, e]
                    live = 0.0 if dones[k, e] else 1.0
                    total += weight * (rewards[k, e] + gamma * live * v_next - values[k, e])
                    if dones[k, e]:
                        break
                    weight *= gamma * gae_lambda
                out[t, e] = total
        return out

    result = run_check("compute_gae", gae_as_explicit_sums)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# calc_clipped_surrogate_objective
# ----------------------------------------------------------------------------------------------------
def _norm(a, eps):
    return (a - a.mean()) / (a.std() + eps)


def surrogate_not_normalised(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    ratio = (logprobs - old_logprobs).exp()
    return torch.min(ratio * advantages, ratio.clamp(1 - clip_coef, 1 + clip_coef) * advantages).mean()


def surrogate_max(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    ratio = (logprobs - old_logprobs).exp()
    return torch.max(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_inverted_ratio(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    ratio = (old_logprobs - logprobs).exp()
    return torch.min(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_as_loss(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    ratio = (logprobs - old_logprobs).exp()
    return -torch.min(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_biased_std(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)
    ratio = (logprobs - old_logprobs).exp()
    return torch.min(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_clips_advantages(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    ratio = (logprobs - old_logprobs).exp()
    return torch.min(ratio * a, ratio * a.clamp(1 - clip_coef, 1 + clip_coef)).mean()


@pytest.mark.parametrize("fn, fragment", [
    (surrogate_not_normalised, "not normalised"),
    (surrogate_max, "takes the max"),
    (surrogate_inverted_ratio, "ratio is inverted"),
    (surrogate_as_loss, "not a loss"),
    (surrogate_biased_std, "biased std"),
    (surrogate_clips_advantages, "clip the ratio"),
])
def test_surrogate_mistakes(fn, fragment):
    assert_fails_with("calc_clipped_surrogate_objective", fn, fragment)


def test_surrogate_written_differently():
    def by_cases(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
        n = advantages.numel()
        mean = advantages.sum() / n
        std = torch.sqrt(((advantages - mean) ** 2).sum() / (n - 1))
        a = (advantages - mean) / (std + eps)
        ratio = torch.exp(logprobs) / torch.exp(old_logprobs)
        # A >= 0: capped above at 1 + eps; A < 0: capped below at 1 - eps
        per_sample = torch.where(a >= 0, torch.clamp(ratio, max=1 + clip_coef) * a,
                                 torch.clamp(ratio, min=1 - clip_coef) * a)
        return per_sample.sum() / n

    result = run_check("calc_clipped_surrogate_objective", by_cases)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# calc_value_function_loss
# ----------------------------------------------------------------------------------------------------
def value_no_half(values, returns, vf_coef):
    return vf_coef * ((values - returns) ** 2).mean()


def value_summed(values, returns, vf_coef):
    return 0.5 * vf_coef * ((values - returns) ** 2).sum()


def value_l1(values, returns, vf_coef):
    return 0.5 * vf_coef * (values - returns).abs().mean()


def value_negated(values, returns, vf_coef):
    return -0.5 * vf_coef * ((values - returns) ** 2).mean()


def value_not_squared(values, returns, vf_coef):
    return 0.5 * vf_coef * (values - returns).mean()


@pytest.mark.parametrize("fn, fragment", [
    (value_no_half, "0.5 is missing"),
    (value_summed, "summed"),
    (value_l1, "L1"),
    (value_negated, "sign is flipped"),
])
def test_value_loss_mistakes(fn, fragment):
    assert_fails_with("calc_value_function_loss", fn, fragment)


def test_value_loss_not_squared_fails():
    assert not run_check("calc_value_function_loss", value_not_squared).passed


def test_value_loss_written_differently():
    def with_mse(values, returns, vf_coef):
        return vf_coef * F.mse_loss(values, returns) / 2

    assert run_check("calc_value_function_loss", with_mse).passed


# ----------------------------------------------------------------------------------------------------
# calc_entropy_bonus
# ----------------------------------------------------------------------------------------------------
def entropy_naive_log(logits, ent_coef):
    p = torch.softmax(logits, dim=-1)
    return ent_coef * (-(p * torch.log(p)).sum(-1)).mean()


def entropy_no_coef(logits, ent_coef):
    logp = logits.log_softmax(-1)
    return (-(logp.exp() * logp).sum(-1)).mean()


def entropy_summed_over_batch(logits, ent_coef):
    logp = logits.log_softmax(-1)
    return ent_coef * (-(logp.exp() * logp).sum(-1)).sum()


def entropy_wrong_dim(logits, ent_coef):
    logp = logits.log_softmax(0)
    return ent_coef * (-(logp.exp() * logp).sum(0)).mean()


@pytest.mark.parametrize("fn, fragment", [
    (entropy_naive_log, "log_softmax"),
    (entropy_no_coef, "ent_coef is missing"),
    (entropy_summed_over_batch, "summed the entropies"),
    (entropy_wrong_dim, "wrong dimension"),
])
def test_entropy_mistakes(fn, fragment):
    assert_fails_with("calc_entropy_bonus", fn, fragment)


def test_entropy_written_differently():
    def with_distribution(logits, ent_coef):
        return Categorical(logits=logits).entropy().mean() * ent_coef

    assert run_check("calc_entropy_bonus", with_distribution).passed


# ----------------------------------------------------------------------------------------------------
# get_minibatch_indices
# ----------------------------------------------------------------------------------------------------
def minibatches_in_order(batch_size, minibatch_size, generator=None):
    return list(torch.arange(batch_size).split(minibatch_size))


def minibatches_with_replacement(batch_size, minibatch_size, generator=None):
    return [torch.randint(0, batch_size, (minibatch_size,), generator=generator)
            for _ in range(batch_size // minibatch_size)]


def minibatches_ignore_generator(batch_size, minibatch_size, generator=None):
    return list(torch.randperm(batch_size).split(minibatch_size))


def minibatches_squeezed(batch_size, minibatch_size, generator=None):
    # Only one minibatch (minibatch == batch) or minibatches of 1 expose it: squeeze drops that dimension.
    return list(torch.randperm(batch_size, generator=generator).reshape(-1, minibatch_size).squeeze())


def minibatches_swapped_sizes(batch_size, minibatch_size, generator=None):
    return list(torch.randperm(batch_size, generator=generator).split(batch_size // minibatch_size))


@pytest.mark.parametrize("fn, fragment", [
    (minibatches_in_order, "shuffle"),
    (minibatches_with_replacement, "without replacement"),
    (minibatches_ignore_generator, "`generator` argument"),
    (minibatches_swapped_sizes, "ONE minibatch"),
    (minibatches_squeezed, "squeeze()"),
])
def test_minibatch_mistakes(fn, fragment):
    assert_fails_with("get_minibatch_indices", fn, fragment)


def test_minibatches_written_differently():
    def by_argsort(batch_size, minibatch_size, generator=None):
        order = torch.argsort(torch.rand(batch_size, generator=generator))
        return tuple(order[i:i + minibatch_size] for i in range(0, batch_size, minibatch_size))

    assert run_check("get_minibatch_indices", by_argsort).passed


# ----------------------------------------------------------------------------------------------------
# rollout_step
# ----------------------------------------------------------------------------------------------------
def _store(buffer, step, obs, action, logprob, value, reward, terminated, truncated):
    buffer.obs[step] = obs
    buffer.actions[step] = action
    buffer.logprobs[step] = logprob
    buffer.values[step] = value
    buffer.rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
    buffer.dones[step] = torch.as_tensor(np.logical_or(terminated, truncated))


def rollout_stores_next_obs(agent, envs, obs, buffer, step):
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32)
    _store(buffer, step, next_obs, action, dist.log_prob(action), value, reward, terminated, truncated)
    return next_obs


def rollout_greedy(agent, envs, obs, buffer, step):
    with torch.no_grad():
        logits = agent.actor(obs)
        value = agent.critic(obs).squeeze(-1)
    action = logits.argmax(-1)
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, Categorical(logits=logits).log_prob(action), value, reward, terminated,
           truncated)
    return torch.as_tensor(next_obs, dtype=torch.float32)


def rollout_ignores_truncation(agent, envs, obs, buffer, step):
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, dist.log_prob(action), value, reward, terminated, np.zeros_like(truncated))
    return torch.as_tensor(next_obs, dtype=torch.float32)


def rollout_stores_probs(agent, envs, obs, buffer, step):
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, dist.probs.gather(-1, action[:, None]).squeeze(-1), value, reward,
           terminated, truncated)
    return torch.as_tensor(next_obs, dtype=torch.float32)


def rollout_with_grad(agent, envs, obs, buffer, step):
    dist = Categorical(logits=agent.actor(obs))
    value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, dist.log_prob(action), value, reward, terminated, truncated)
    return torch.as_tensor(next_obs, dtype=torch.float32)


@pytest.mark.parametrize("fn, fragment", [
    (rollout_stores_next_obs, "not the one envs.step returns"),
    (rollout_greedy, "not a sample"),
    (rollout_ignores_truncation, "truncated"),
    (rollout_stores_probs, "probabilities"),
    (rollout_with_grad, "torch.no_grad()"),
])
def test_rollout_step_mistakes(fn, fragment):
    assert_fails_with("rollout_step", fn, fragment)


def test_rollout_step_written_differently():
    def rollout_by_hand(agent, envs, obs, buffer, step):
        with torch.inference_mode():
            logp_all = torch.log_softmax(agent.actor(obs), dim=-1)
            value = agent.critic(obs)[:, 0]
        action = torch.multinomial(logp_all.exp(), 1).squeeze(1)
        next_obs, reward, terminated, truncated, _ = envs.step(action.tolist())
        for e in range(obs.shape[0]):
            buffer.obs[step, e] = obs[e]
            buffer.actions[step, e] = int(action[e])
            buffer.logprobs[step, e] = float(logp_all[e, action[e]])
            buffer.values[step, e] = float(value[e])
            buffer.rewards[step, e] = float(reward[e])
            buffer.dones[step, e] = bool(terminated[e] or truncated[e])
        return torch.tensor(np.asarray(next_obs), dtype=torch.float32)

    result = run_check("rollout_step", rollout_by_hand)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# ppo_learning_phase
# ----------------------------------------------------------------------------------------------------
def _learning(agent, optimizer, buffer, next_obs, args, generator=None, *, bug=None):
    """An implementation written here (reshape instead of einops, its own diagnostics), with one optional bug."""
    if bug == "buffer_written":  # rewards scaled in place
        buffer.rewards /= buffer.rewards.std() + 1e-8
    with torch.enable_grad() if bug == "targets_with_grad" else torch.no_grad():
        next_value = torch.zeros(next_obs.shape[0]) if bug == "next_value_zero" else agent.critic(next_obs).squeeze(-1)
        adv = ppo.compute_gae(buffer.rewards, buffer.values, next_value, buffer.dones, args.gamma,
                              args.gae_lambda)
        returns = adv if bug == "returns_are_advantages" else adv + buffer.values
    n = args.batch_size
    b_obs = buffer.obs.transpose(0, 1).reshape(n, -1) if bug == "flatten_mismatch" else buffer.obs.reshape(n, -1)
    b_act, b_logp, b_adv, b_ret, b_val = (x.reshape(n) for x in (buffer.actions, buffer.logprobs, adv, returns,
                                                                  buffer.values))
    if bug == "batch_normalised":
        b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
    per = {k: [] for k in ("policy_objective", "value_loss", "entropy", "approx_kl", "clipfrac")}
    for _ in range(args.update_epochs):
        if bug == "full_batch":
            batches = [torch.arange(n)]
        elif bug == "ignore_generator":
            batches = list(torch.randperm(n).reshape(-1, args.minibatch_size))
        else:
            batches = ppo.get_minibatch_indices(n, args.minibatch_size, generator)
        for mb in batches:
            logits = agent.actor(b_obs[mb])
            dist = Categorical(logits=logits)
            new_logp = dist.log_prob(b_act[mb])
            old_logp = new_logp.detach() if bug == "old_is_new" else b_logp[mb]
            if bug == "batch_normalised":  # its own surrogate, on advantages normalised once over the batch
                ratio = (new_logp - old_logp).exp()
                pol = torch.minimum(ratio * b_adv[mb], ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef) * b_adv[mb])
                pol = pol.mean()
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
            if bug != "after_step":
                before = new_logp.detach()
            optimizer.step()
            if bug == "after_step":
                with torch.no_grad():
                    before = Categorical(logits=agent.actor(b_obs[mb])).log_prob(b_act[mb])
            with torch.no_grad():
                logratio = before - old_logp if bug != "kl_swapped" else old_logp - before
                ratio = logratio.exp()
                per["approx_kl"].append((-logratio).mean().item() if bug == "k1" else
                                        ((ratio - 1) - logratio).mean().item())
                clipped = ratio > 1 + args.clip_coef if bug == "clipfrac_one_sided" else \
                    (ratio - 1).abs() > args.clip_coef
                per["clipfrac"].append(clipped.float().mean().item())
                h = dist.entropy().mean().item()
                per["entropy"].append(args.ent_coef * h if bug == "entropy_bonus_reported" else h)
            per["policy_objective"].append(pol.item())
            per["value_loss"].append(vl.item())
    stats = {k: (v[-1] if bug == "last_only" else sum(v) / len(v)) for k, v in per.items()}
    if bug == "ev_swapped":
        stats["explained_variance"] = ppo.explained_variance(b_ret, b_val)
    elif bug == "ev_new_values":
        with torch.no_grad():
            stats["explained_variance"] = ppo.explained_variance(agent.critic(b_obs).squeeze(-1), b_ret)
    else:
        stats["explained_variance"] = ppo.explained_variance(b_val, b_ret)
    if bug == "no_diagnostics":
        return {}
    if bug == "no_explained_variance":
        del stats["explained_variance"]
    return stats


def _with_bug(bug):
    def learning_phase(agent, optimizer, buffer, next_obs, args, generator=None):
        return _learning(agent, optimizer, buffer, next_obs, args, generator, bug=bug)

    learning_phase.__name__ = f"learning_{bug}"
    return learning_phase


@pytest.mark.parametrize("bug, fragment", [
    ("no_clip", "not clipped"),
    ("no_zero_grad", "zero_grad()"),
    ("value_sign", "wrong sign"),
    ("returns_are_advantages", "returns = advantages + buffer.values"),
    ("no_diagnostics", "approx_kl"),
    ("full_batch", "optimizer.step()"),
])
def test_learning_phase_mistakes(bug, fragment):
    assert_fails_with("ppo_learning_phase", _with_bug(bug), fragment)


def test_learning_phase_written_differently():
    def learning_own_minibatches(agent, optimizer, buffer, next_obs, args, generator=None):
        # Its own permutation (not get_minibatch_indices), the entropy from Categorical, and the
        # objective assembled as a single expression.
        with torch.no_grad():
            next_value = agent.critic(next_obs)[:, 0]
            adv = ppo.compute_gae(buffer.rewards, buffer.values, next_value, buffer.dones, args.gamma,
                                  args.gae_lambda)
            ret = adv + buffer.values
        flat = lambda x: x.flatten(0, 1)  # noqa: E731
        obs, act, old, adv, ret = map(flat, (buffer.obs, buffer.actions, buffer.logprobs, adv, ret))
        sums = {"policy_objective": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clipfrac": 0.0}
        count = 0
        for _ in range(args.update_epochs):
            perm = torch.argsort(torch.rand(args.batch_size, generator=generator))  # another order than randperm's
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = perm[start:start + args.minibatch_size]
                dist = Categorical(logits=agent.actor(obs[mb]))
                new = dist.log_prob(act[mb])
                values = agent.critic(obs[mb])[:, 0]
                surrogate = ppo.calc_clipped_surrogate_objective(new, old[mb], adv[mb], args.clip_coef)
                value_loss = 0.5 * args.vf_coef * ((values - ret[mb]) ** 2).mean()
                entropy = dist.entropy().mean()
                objective = surrogate - value_loss + args.ent_coef * entropy
                with torch.no_grad():  # before the step
                    ratio = torch.exp(new - old[mb]).double()
                    sums["approx_kl"] += (ratio - 1 - ratio.log()).mean().item()
                    sums["clipfrac"] += ((ratio < 1 - args.clip_coef) | (ratio > 1 + args.clip_coef)).double().mean().item()
                    sums["policy_objective"] += surrogate.item()
                    sums["value_loss"] += value_loss.item()
                    sums["entropy"] += entropy.item()
                    count += 1
                optimizer.zero_grad()
                objective.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
        stats = {k: v / count for k, v in sums.items()}
        v, r = buffer.values.flatten().double(), ret.double()
        stats["explained_variance"] = 1 - ((r - v).var() / r.var()).item()
        return stats

    result = run_check("ppo_learning_phase", learning_own_minibatches)
    assert result.passed, result.message
    result = run_check("ppo_learning_phase", _with_bug(None))  # the helper above, without a bug
    assert result.passed, result.message


def surrogate_without_eps(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    # only all-equal advantages (std 0) expose it: 0 / 0 = NaN
    a = (advantages - advantages.mean()) / advantages.std()
    ratio = (logprobs - old_logprobs).exp()
    return torch.minimum(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def value_loss_divided_by_len(values, returns, vf_coef):  # only a 2-d batch exposes it: len() is the rows
    return 0.5 * vf_coef * ((values - returns) ** 2).sum() / len(values)


@pytest.mark.parametrize("name, wrong, fragment", [
    ("calc_clipped_surrogate_objective", surrogate_without_eps, "NaN or inf"),
    ("calc_value_function_loss", value_loss_divided_by_len, "a [3, 5] batch"),
])
def test_edge_only_mistakes(name, wrong, fragment):
    result = run_check(name, wrong)
    assert not result.passed and fragment in result.message, result.message


# ----------------------------------------------------------------------------------------------------
# The contract, clause by clause (tests/checks/test_contract_clauses.py runs every version below)
# ----------------------------------------------------------------------------------------------------
def init_default_std_one(layer, std=1.0, bias_const=0.0):
    nn.init.orthogonal_(layer.weight, gain=std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def init_default_bias_small(layer, std=SQRT2, bias_const=0.01):
    nn.init.orthogonal_(layer.weight, gain=std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def init_bias_zeroed(layer, std=SQRT2, bias_const=0.0):
    nn.init.orthogonal_(layer.weight, gain=std)
    nn.init.zeros_(layer.bias)
    return layer


def gae_mask_in_delta_only(rewards, values, next_value, dones, gamma, gae_lambda):
    nd = 1 - dones.float()
    delta = _deltas(rewards, values, next_value, nd, gamma)
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        last = delta[t] + gamma * gae_lambda * last
        adv[t] = last
    return adv


def gae_gamma_not_in_recursion(rewards, values, next_value, dones, gamma, gae_lambda):
    nd = 1 - dones.float()
    delta = _deltas(rewards, values, next_value, nd, gamma)
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        last = delta[t] + gae_lambda * nd[t] * last
        adv[t] = last
    return adv


def gae_returns(rewards, values, next_value, dones, gamma, gae_lambda):
    return ppo.compute_gae(rewards, values, next_value, dones, gamma, gae_lambda) + values


def gae_in_place(rewards, values, next_value, dones, gamma, gae_lambda):
    nd = 1 - dones.float()
    rewards += gamma * nd * torch.cat([values[1:], next_value[None]]) - values  # the deltas, over the rewards
    last = torch.zeros_like(next_value)
    for t in reversed(range(len(rewards))):
        last = rewards[t] + gamma * gae_lambda * nd[t] * last
        rewards[t] = last
    return rewards


def gae_float64(rewards, values, next_value, dones, gamma, gae_lambda):
    return ppo.compute_gae(rewards.double(), values.double(), next_value.double(), dones, gamma, gae_lambda)


def _surrogate_from(a, logprobs, old_logprobs, clip_coef):
    ratio = (logprobs - old_logprobs).exp()
    return torch.minimum(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_not_centred(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    return _surrogate_from(advantages / (advantages.std() + eps), logprobs, old_logprobs, clip_coef)


def surrogate_per_row(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = (advantages - advantages.mean(-1, keepdim=True)) / (advantages.std(-1, keepdim=True) + eps)
    return _surrogate_from(a, logprobs, old_logprobs, clip_coef)


def surrogate_fixed_eps(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    return _surrogate_from(_norm(advantages, 1e-8), logprobs, old_logprobs, clip_coef)


def surrogate_clipped_term_only(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    return ((logprobs - old_logprobs).exp().clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_unclipped_only(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    return ((logprobs - old_logprobs).exp() * _norm(advantages, eps)).mean()


def surrogate_summed(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    ratio = (logprobs - old_logprobs).exp()
    return torch.minimum(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).sum()


def surrogate_log_ratio_capped(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    # a cap "for stability": ratios above e^2 never show, which the min needs where advantages are negative
    ratio = (logprobs - old_logprobs).clamp(max=2.0).exp()
    a = _norm(advantages, eps)
    return torch.minimum(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_term_capped(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    ratio = (logprobs - old_logprobs).exp()
    return torch.minimum((ratio * a).clamp(-10, 10), ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_detached(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    return _surrogate_from(_norm(advantages, eps), logprobs.detach(), old_logprobs, clip_coef)


def surrogate_clipped_term_detached(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = _norm(advantages, eps)
    ratio = (logprobs - old_logprobs).exp()
    return torch.minimum(ratio * a, ratio.detach().clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def surrogate_normalises_in_place(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    advantages -= advantages.mean()
    advantages /= advantages.std() + eps
    return _surrogate_from(advantages, logprobs, old_logprobs, clip_coef)


def value_rmse(values, returns, vf_coef):
    return 0.5 * vf_coef * ((values - returns) ** 2).mean().sqrt()


def value_squared_mean(values, returns, vf_coef):
    return 0.5 * vf_coef * (values - returns).mean() ** 2


def value_no_coef(values, returns, vf_coef):
    return 0.5 * ((values - returns) ** 2).mean()


def value_detached(values, returns, vf_coef):
    return 0.5 * vf_coef * ((values.detach() - returns) ** 2).mean()


def value_in_place(values, returns, vf_coef):
    return 0.5 * vf_coef * values.sub_(returns).pow(2).mean()


def entropy_negated(logits, ent_coef):
    logp = logits.log_softmax(-1)
    return -ent_coef * (-(logp.exp() * logp).sum(-1)).mean()


def entropy_mean_over_actions(logits, ent_coef):
    logp = logits.log_softmax(-1)
    return ent_coef * (-(logp.exp() * logp)).mean()


def entropy_unweighted(logits, ent_coef):
    return ent_coef * (-logits.log_softmax(-1)).mean()


def entropy_mean_over_first_dim(logits, ent_coef):  # only a batch with two batch dimensions exposes it
    return ent_coef * Categorical(logits=logits).entropy().mean(0)


def entropy_detached(logits, ent_coef):
    return ent_coef * Categorical(logits=logits.detach()).entropy().mean()


def minibatches_float(batch_size, minibatch_size, generator=None):
    return list(torch.randperm(batch_size, generator=generator).reshape(-1, minibatch_size).float())


def rollout_value_of_next_obs(agent, envs, obs, buffer, step):
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32)
    with torch.no_grad():
        value = agent.critic(next_obs).squeeze(-1)
    _store(buffer, step, obs, action, dist.log_prob(action), value, reward, terminated, truncated)
    return next_obs


def rollout_forgets_rewards(agent, envs, obs, buffer, step):
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, dist.log_prob(action), value, np.zeros_like(reward), terminated, truncated)
    return torch.as_tensor(next_obs, dtype=torch.float32)


def rollout_returns_float64(agent, envs, obs, buffer, step):
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, dist.log_prob(action), value, reward, terminated, truncated)
    return torch.as_tensor(next_obs, dtype=torch.float64)


def rollout_returns_env_dtype(agent, envs, obs, buffer, step):  # right while the env gives float32
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, dist.log_prob(action), value, reward, terminated, truncated)
    return torch.as_tensor(next_obs)


def rollout_values_broadcast(agent, envs, obs, buffer, step):  # every row of values gets this step's
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    _store(buffer, step, obs, action, dist.log_prob(action), value, reward, terminated, truncated)
    buffer.values[:] = value
    return torch.as_tensor(next_obs, dtype=torch.float32)


VIOLATIONS = {
    "layer_init": {
        "orthogonal": [init_normal],
        "gain": [init_gain_ignored, init_scaled_twice],
        "default_std": [init_default_std_one],
        "bias": [init_bias_untouched, init_bias_zeroed],
        "default_bias": [init_default_bias_small],
        "same_layer": [init_new_layer, init_no_return],
    },
    "compute_gae": {
        "dones_t": [gae_next_done_convention],
        "no_bootstrap": [gae_ignores_dones],
        "recursion_masked": [gae_mask_in_delta_only],
        "lambda": [gae_without_lambda],
        "gamma": [gae_gamma_not_in_recursion],
        "next_value": [gae_no_bootstrap],
        "backwards": [gae_forwards],
        "advantages": [gae_returns],
        "bool_dones": [gae_bool_arithmetic],
        "inputs_unchanged": [gae_in_place],
        "dtype": [gae_float64],
    },
    "calc_clipped_surrogate_objective": {
        "normalised": [surrogate_not_normalised],
        "centred": [surrogate_not_centred],
        "unbiased_std": [surrogate_biased_std],
        "all_elements": [surrogate_per_row],
        "eps": [surrogate_fixed_eps, surrogate_without_eps],
        "ratio": [surrogate_inverted_ratio],
        "large_ratios": [surrogate_log_ratio_capped, surrogate_term_capped],
        "clip_ratio": [surrogate_clips_advantages],
        "min": [surrogate_max, surrogate_clipped_term_only, surrogate_unclipped_only],
        "mean": [surrogate_summed],
        "sign": [surrogate_as_loss],
        "differentiable": [surrogate_detached, surrogate_clipped_term_detached],
        "inputs_unchanged": [surrogate_normalises_in_place],
    },
    "calc_value_function_loss": {
        "half": [value_no_half],
        "vf_coef": [value_no_coef],
        "mean": [value_summed, value_loss_divided_by_len],
        "squared": [value_l1, value_not_squared, value_rmse, value_squared_mean],
        "sign": [value_negated],
        "differentiable": [value_detached],
        "inputs_unchanged": [value_in_place],
    },
    "calc_entropy_bonus": {
        "coef": [entropy_no_coef],
        "sign": [entropy_negated],
        "mean_over_batch": [entropy_summed_over_batch, entropy_mean_over_first_dim],
        "last_dim": [entropy_wrong_dim],
        "sum_over_actions": [entropy_mean_over_actions],
        "weighted": [entropy_unweighted],
        "stable": [entropy_naive_log],
        "differentiable": [entropy_detached],
    },
    "get_minibatch_indices": {
        "permutation": [minibatches_with_replacement],
        "shuffled": [minibatches_in_order],
        "generator": [minibatches_ignore_generator],
        "count": [minibatches_swapped_sizes],
        "shape": [minibatches_squeezed],
        "integer": [minibatches_float],
    },
    "rollout_step": {
        "obs": [rollout_stores_next_obs],
        "samples": [rollout_greedy],
        "logprob": [rollout_stores_probs],
        "value": [rollout_value_of_next_obs],
        "rewards": [rollout_forgets_rewards],
        "dones": [rollout_ignores_truncation],
        "no_grad": [rollout_with_grad],
        "returns_next_obs": [rollout_returns_float64, rollout_returns_env_dtype],
        "row_step": [rollout_values_broadcast],
    },
    "ppo_learning_phase": {
        "next_value": [_with_bug("next_value_zero")],
        "returns": [_with_bug("returns_are_advantages")],
        "targets_fixed": [_with_bug("targets_with_grad")],
        "flatten": [_with_bug("flatten_mismatch")],
        "old_logprobs": [_with_bug("old_is_new")],
        "objective": [_with_bug("value_sign"), _with_bug("no_entropy"), _with_bug("minimise")],
        "zero_grad": [_with_bug("no_zero_grad")],
        "grad_clip": [_with_bug("no_clip")],
        "minibatches": [_with_bug("full_batch")],
        "generator": [_with_bug("ignore_generator")],
        "per_minibatch_normalisation": [_with_bug("batch_normalised")],
        "buffer_read_only": [_with_bug("buffer_written")],
        "keys": [_with_bug("no_diagnostics"), _with_bug("no_explained_variance")],
        "approx_kl": [_with_bug("k1"), _with_bug("kl_swapped")],
        "clipfrac": [_with_bug("clipfrac_one_sided")],
        "mean_over_steps": [_with_bug("last_only")],
        "before_step": [_with_bug("after_step")],
        "explained_variance": [_with_bug("ev_swapped"), _with_bug("ev_new_values")],
        "entropy": [_with_bug("entropy_bonus_reported")],
    },
}


@pytest.mark.parametrize("bug, fragment", [
    ("batch_normalised", "normalised once over the whole batch"),
    ("k1", "k1 estimate"),
    ("kl_swapped", "ratio is inverted"),
    ("clipfrac_one_sided", "only the ratios above"),
    ("last_only", "last minibatch"),
    ("after_step", "after the optimizer step"),
    ("ev_swapped", "arguments are swapped"),
    ("ev_new_values", "after the updates"),
    ("entropy_bonus_reported", "entropy bonus"),
    ("no_explained_variance", "explained_variance"),
])
def test_learning_phase_diagnostics_compared(bug, fragment):
    assert_fails_with("ppo_learning_phase", _with_bug(bug), fragment)


@pytest.mark.parametrize("name, wrong, fragment", [
    ("calc_clipped_surrogate_objective", surrogate_unclipped_only, "unclipped ratio * A"),
    ("calc_clipped_surrogate_objective", surrogate_clipped_term_only, "only the clipped term"),
    ("calc_value_function_loss", value_no_coef, "vf_coef is missing"),
])
def test_diagnosis_names_the_right_mistake(name, wrong, fragment):
    assert_fails_with(name, wrong, fragment)
