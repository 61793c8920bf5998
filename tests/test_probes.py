"""Probe environments: their dynamics, the reference passes every probe, and each probe fails for a
realistic bug (with the other probes that must still pass, passing).

cpu_only: the probe environments and agents never touch the course's device (the simulated GPU would only
slow them, by some 7 minutes of make unit-simgpu, and prove nothing more)."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Categorical

from rlhf_tutorial import ppo, probes

pytestmark = pytest.mark.cpu_only


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------
# The environments do what the table says
# ----------------------------------------------------------------------------------------------------
def rollout(env_cls, actions, seed=0):
    env = env_cls()
    obs, _ = env.reset(seed=seed)
    out = [("reset", float(obs[0]))]
    for a in actions:
        obs, reward, terminated, truncated, _ = env.step(a)
        out.append((float(obs[0]), reward, terminated, truncated))
        if terminated or truncated:
            obs, _ = env.reset()
            out.append(("reset", float(obs[0])))
    return out


def test_probe1_constant_reward_one_step():
    assert rollout(probes.Probe1, [0, 0]) == [("reset", 0.0), (0.0, 1.0, True, False), ("reset", 0.0),
                                              (0.0, 1.0, True, False), ("reset", 0.0)]


def test_probe2_reward_equals_observation():
    env = probes.Probe2()
    seen = set()
    obs, _ = env.reset(seed=3)
    for _ in range(40):
        _, reward, terminated, _, _ = env.step(0)
        assert reward == float(obs[0]) and terminated
        seen.add(float(obs[0]))
        obs, _ = env.reset()
    assert seen == {-1.0, 1.0}


def test_probe3_two_steps_reward_at_the_end():
    assert rollout(probes.Probe3, [0, 0]) == [("reset", 0.0), (1.0, 0.0, False, False), (1.0, 1.0, True, False),
                                              ("reset", 0.0)]


def test_probe4_reward_depends_on_action():
    env = probes.Probe4()
    env.reset(seed=0)
    assert env.step(0)[1:3] == (1.0, True)
    env.reset()
    assert env.step(1)[1:3] == (-1.0, True)
    assert env.action_space.n == 2


def test_probe5_action_must_match_observation():
    env = probes.Probe5()
    obs, _ = env.reset(seed=1)
    signs = set()
    for _ in range(20):
        signs.add(float(obs[0]))
        assert env.step(1 if obs[0] > 0 else 0)[1] == 1.0
        obs, _ = env.reset()
        assert env.step(0 if obs[0] > 0 else 1)[1] == -1.0
        obs, _ = env.reset()
    assert signs == {-1.0, 1.0}


# ----------------------------------------------------------------------------------------------------
# The reference passes
# ----------------------------------------------------------------------------------------------------
def test_reference_passes_every_probe():
    results = probes.run_probes(seed=0)
    assert [r.probe for r in results] == [1, 2, 3, 4, 5]
    assert all(r.passed for r in results), probes.format_report(results)
    report = probes.format_report(results)
    assert "All probes pass." in report


def test_cli_main_runs_selected_probes():
    summary = probes.main(["--probe", "1", "--seed", "2"])
    assert summary["all_passed"] is True
    assert sorted(summary["probes"]) == ["1"]
    assert abs(summary["probes"]["1"]["V(0)"] - 1.0) < probes.TOLERANCE


# ----------------------------------------------------------------------------------------------------
# Realistic bugs, each caught by a probe
# ----------------------------------------------------------------------------------------------------
def value_loss_not_squared(values, returns, vf_coef):
    return 0.5 * vf_coef * (values - returns).mean()


def rollout_stores_next_obs(agent, envs, obs, buffer, step):
    with torch.no_grad():
        dist = Categorical(logits=agent.actor(obs))
        value = agent.critic(obs).squeeze(-1)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32)
    buffer.obs[step] = next_obs  # bug: the observation after the step
    buffer.actions[step] = action
    buffer.logprobs[step] = dist.log_prob(action)
    buffer.values[step] = value
    buffer.rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
    buffer.dones[step] = torch.as_tensor(np.logical_or(terminated, truncated))
    return next_obs


def gae_with_next_dones(rewards, values, next_value, dones, gamma, gae_lambda):
    # CleanRL's convention (a flag on the *next* observation) applied to this course's dones
    not_done = 1.0 - torch.cat([dones[1:], torch.zeros_like(dones[:1])]).float()
    next_values = torch.cat([values[1:], next_value[None]])
    delta = rewards + gamma * not_done * next_values - values
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        last = delta[t] + gamma * gae_lambda * not_done[t] * last
        adv[t] = last
    return adv


def gae_without_discount(rewards, values, next_value, dones, gamma, gae_lambda):
    not_done = 1.0 - dones.float()
    next_values = torch.cat([values[1:], next_value[None]])
    delta = rewards + not_done * next_values - values  # bug: gamma forgotten
    adv, last = torch.zeros_like(rewards), torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        last = delta[t] + gamma * gae_lambda * not_done[t] * last
        adv[t] = last
    return adv


def surrogate_written_as_loss(logprobs, old_logprobs, advantages, clip_coef, eps=1e-8):
    a = (advantages - advantages.mean()) / (advantages.std() + eps)
    ratio = torch.exp(logprobs - old_logprobs)
    return -torch.min(ratio * a, ratio.clamp(1 - clip_coef, 1 + clip_coef) * a).mean()


def learning_phase_broadcast_logprobs(agent, optimizer, buffer, next_obs, args, generator=None):
    """A learning phase written here, with one bug: new log-probs as logp[:, actions], a [mb, mb] matrix
    that silently broadcasts against the [mb] old log-probs and advantages."""
    with torch.no_grad():
        next_value = agent.critic(next_obs).squeeze(-1)
        adv = ppo.compute_gae(buffer.rewards, buffer.values, next_value, buffer.dones, args.gamma, args.gae_lambda)
        returns = adv + buffer.values
    n = args.batch_size
    obs = buffer.obs.reshape(n, -1)
    actions, old, adv, returns = (x.reshape(n) for x in (buffer.actions, buffer.logprobs, adv, returns))
    for _ in range(args.update_epochs):
        for mb in ppo.get_minibatch_indices(n, args.minibatch_size, generator):
            logits = agent.actor(obs[mb])
            new = torch.log_softmax(logits, -1)[:, actions[mb]]  # bug: should be .gather(-1, actions[mb, None])
            objective = (ppo.calc_clipped_surrogate_objective(new, old[mb], adv[mb], args.clip_coef)
                         - ppo.calc_value_function_loss(agent.critic(obs[mb]).squeeze(-1), returns[mb], args.vf_coef)
                         + ppo.calc_entropy_bonus(logits, args.ent_coef))
            optimizer.zero_grad()
            objective.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
    return {"approx_kl": 0.0, "clipfrac": 0.0}


@pytest.mark.parametrize("overrides, must_pass, must_fail", [
    ({"calc_value_function_loss": value_loss_not_squared}, [], [1]),
    ({"rollout_step": rollout_stores_next_obs}, [1], [2]),
    ({"compute_gae": gae_with_next_dones}, [1, 2], [3]),
    ({"compute_gae": gae_without_discount}, [], [3]),
    ({"calc_clipped_surrogate_objective": surrogate_written_as_loss}, [], [4]),
    ({"ppo_learning_phase": learning_phase_broadcast_logprobs}, [2, 4], [5]),
], ids=["value-loss-not-squared", "rollout-stores-next-obs", "gae-next-dones", "gae-no-gamma",
        "surrogate-as-loss", "broadcast-logprobs"])
def test_probe_catches_bug(overrides, must_pass, must_fail):
    results = {p: probes.run_probe(p, seed=0, **overrides) for p in must_pass + must_fail}
    for p in must_pass:
        assert results[p].passed, results[p].line()
    for p in must_fail:
        assert not results[p].passed, results[p].line()
        assert results[p].diagnosis == probes.DIAGNOSIS[p]
    report = probes.format_report([results[p] for p in sorted(results)])
    assert f"Fix probe {must_fail[0]} first" in report


def test_a_crash_is_a_failed_probe_with_the_reason():
    def broken(*args, **kwargs):
        raise ValueError("boom")

    result = probes.run_probe(1, compute_gae=broken)
    assert not result.passed
    assert "ValueError: boom" in result.error and "boom" in result.line()
