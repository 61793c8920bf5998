"""Chapter 01: PPO from scratch, in one readable file (CleanRL style).

The pieces, in the order the chapter builds them:

1. ``layer_init``                        orthogonal initialisation of a linear layer
2. ``Agent``                             actor and critic MLPs
3. ``compute_gae``                       generalised advantage estimation
4. ``calc_clipped_surrogate_objective``  the PPO-clip policy objective (to maximise)
5. ``calc_value_function_loss``          the critic's squared error (to minimise)
6. ``calc_entropy_bonus``                the exploration bonus (to maximise)
7. ``get_minibatch_indices``             shuffled minibatches over one epoch
8. ``rollout_step``                      one step of every env, stored in a ``RolloutBuffer``
9. ``ppo_learning_phase``                several epochs of minibatch updates on one rollout

The objective follows the course convention: it is a value to *maximise* and the optimizer is built
with ``maximize=True``::

    objective = L_clip - L_value + L_entropy

The loop that runs them (``PPOArgs``, ``train``, the ``train-ppo`` command) is running code, not an
exercise: it lives in ``rlhf_tutorial.trainers.ppo``, and can run any of these functions in place of
the reference ones, so a learner's own ``compute_gae`` (say) can be trained on CartPole or on the
probe environments with everything else left as the reference:
``train(args, compute_gae=my_compute_gae)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import einops
import gymnasium as gym
import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from torch.distributions import Categorical

if TYPE_CHECKING:
    from rlhf_tutorial.trainers.ppo import PPOArgs


# ---------------------------------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------------------------------


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """Orthogonal initialisation: ``W`` gets orthonormal rows (or columns) scaled by ``std``.

    ``W W^T = std^2 I`` when ``out <= in``, ``W^T W = std^2 I`` when the layer widens (``out > in``);
    every bias is ``bias_const``. The same layer is
    returned, so the call can be written inline in an ``nn.Sequential``.
    """
    # >>> exercise
    nn.init.orthogonal_(layer.weight, gain=std)
    nn.init.constant_(layer.bias, bias_const)
    # <<< exercise
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs (two tanh hidden layers each).

    ``actor(obs)`` gives action logits, ``critic(obs)`` a value of shape ``[..., 1]``. The last
    layers get small gains: the actor's (0.01) so the initial policy is close to uniform, the
    critic's (1.0) so initial values are of order 1.
    """

    def __init__(
        self, obs_dim: int, n_actions: int, hidden: int = 64, init_layer: Callable = layer_init
    ) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            init_layer(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            init_layer(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            init_layer(nn.Linear(hidden, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            init_layer(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            init_layer(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            init_layer(nn.Linear(hidden, n_actions), std=0.01),
        )


# ---------------------------------------------------------------------------------------------------
# The pieces of the objective
# ---------------------------------------------------------------------------------------------------


def compute_gae(
    rewards: Float[Tensor, "steps env"],
    values: Float[Tensor, "steps env"],
    next_value: Float[Tensor, "env"],
    dones: Bool[Tensor, "steps env"],
    gamma: float,
    gae_lambda: float,
) -> Float[Tensor, "steps env"]:
    """Generalised advantage estimation, walking backwards in time.

    ``dones[t]`` is True when the episode ended with transition ``t``: nothing after it counts.
    With ``V_T = next_value`` (the value of the observation after the last step)::

        delta_t = r_t + gamma * (1 - dones[t]) * V_{t+1} - V_t
        A_t     = delta_t + gamma * gae_lambda * (1 - dones[t]) * A_{t+1},    A_T = 0
    """
    # >>> exercise
    num_steps = rewards.shape[0]
    not_done = 1.0 - dones.float()
    next_values = torch.cat([values[1:], next_value[None]])  # [steps env]: V_{t+1}
    deltas = rewards + gamma * not_done * next_values - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)  # A_{t+1}, zero after the last step
    for t in reversed(range(num_steps)):
        last = deltas[t] + gamma * gae_lambda * not_done[t] * last
        advantages[t] = last
    # <<< exercise
    return advantages


def calc_clipped_surrogate_objective(
    logprobs: Float[Tensor, "*b"],
    old_logprobs: Float[Tensor, "*b"],
    advantages: Float[Tensor, "*b"],
    clip_coef: float,
    eps: float = 1e-8,
) -> Float[Tensor, ""]:
    """The PPO-clip objective (to maximise), with the advantages normalised first.

    First the advantages are standardised over all their elements: their mean subtracted, then divided by
    their standard deviation (the unbiased one, torch's default) plus ``eps``. The probability ratio of
    each sample is pi_theta(a|s) / pi_old(a|s), recovered from the two log-probabilities. Each sample
    contributes the smaller of two terms: the ratio times its normalised advantage, and the same with the
    ratio first clipped to the interval [1 - clip_coef, 1 + clip_coef]. The objective is the mean of those
    contributions over all samples.
    """
    # >>> exercise
    advantages = (advantages - advantages.mean()) / (advantages.std() + eps)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages
    return torch.minimum(unclipped, clipped).mean()
    # <<< exercise


def masked_mean(x: Float[Tensor, "*b"] | Bool[Tensor, "*b"], mask: Bool[Tensor, "*b"] | None = None) -> Float[Tensor, ""]:
    """The mean of ``x`` (in float32) over the elements where ``mask`` is True: sum of x over them divided
    by their count, 0 where there is none (a count of 0 is taken as 1); the plain mean when ``mask`` is
    None. ``x`` and ``mask`` have the same shape."""
    if mask is None:
        return x.float().mean()
    return (x.float() * mask).sum() / mask.sum().clamp(min=1)


@torch.no_grad()
def clip_diagnostics(
    logprobs: Float[Tensor, "*b"],
    old_logprobs: Float[Tensor, "*b"],
    clip_coef: float,
    mask: Bool[Tensor, "*b"] | None = None,
) -> dict[str, float]:
    """The diagnostics of a clipped update, beside its loss (the same two in every chapter).

        log r     = logprobs - old_logprobs
        approx_kl = mean((r - 1) - log r)         k3 estimate of KL(pi_old || pi_theta) from pi_old's samples
        clipfrac  = mean(|r - 1| > clip_coef)     the share of ratios outside the clip range, either side

    With ``mask`` the means are over the True elements only.
    """
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    return {
        "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).item(),
        "clipfrac": masked_mean((ratio - 1).abs() > clip_coef, mask).item(),
    }



def calc_value_function_loss(
    values: Float[Tensor, "*b"], returns: Float[Tensor, "*b"], vf_coef: float
) -> Float[Tensor, ""]:
    """The critic's loss (to minimise, so it enters the objective with a minus sign).

        L_value = 0.5 * vf_coef * mean((values - returns) ** 2)
    """
    # >>> exercise
    return 0.5 * vf_coef * (values - returns).pow(2).mean()
    # <<< exercise


def calc_clipped_value_loss(
    values: Float[Tensor, "*b"],
    old_values: Float[Tensor, "*b"],
    returns: Float[Tensor, "*b"],
    vf_coef: float,
    clip: float,
) -> Float[Tensor, ""]:
    """The value loss with PPO-style clipping of the value update (TRL's ``cliprange_value``).

        values_clipped = old_values + clamp(values - old_values, -clip, clip)
        L_value = 0.5 * vf_coef * mean(max((values - returns) ** 2, (values_clipped - returns) ** 2))

    The max makes it pessimistic, as the clipped surrogate is: a value may move towards its target by
    at most ``clip`` from where it was at rollout time before the gradient stops helping. With
    ``clip = inf`` it is ``calc_value_function_loss``.
    """
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * vf_coef * torch.maximum((values - returns).pow(2), (clipped - returns).pow(2)).mean()


def calc_entropy_bonus(logits: Float[Tensor, "*b n"], ent_coef: float) -> Float[Tensor, ""]:
    """The entropy bonus (to maximise): ``ent_coef * mean(H(softmax(logits)))``.

        H(p) = -sum_a p_a log p_a,  computed from log_softmax so that large logits stay finite
    """
    # >>> exercise
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    return ent_coef * entropy.mean()
    # <<< exercise


# ---------------------------------------------------------------------------------------------------
# Rollouts
# ---------------------------------------------------------------------------------------------------


@dataclass
class RolloutBuffer:
    """What one rollout stores, indexed ``[step, env]``.

    ``obs[t]`` is the observation the action ``actions[t]`` was chosen in; ``logprobs[t]`` and
    ``values[t]`` are the policy's log-probability of that action and the critic's value of
    ``obs[t]`` at collection time; ``rewards[t]`` and ``dones[t]`` come from the env step that
    followed (``dones[t]``: the episode ended with this transition, terminated or truncated).
    """

    obs: Float[Tensor, "steps env *obs_shape"]
    actions: Int[Tensor, "steps env"]
    logprobs: Float[Tensor, "steps env"]
    values: Float[Tensor, "steps env"]
    rewards: Float[Tensor, "steps env"]
    dones: Bool[Tensor, "steps env"]

    @classmethod
    def zeros(cls, num_steps: int, num_envs: int, obs_shape: tuple[int, ...]) -> RolloutBuffer:
        size = (num_steps, num_envs)
        return cls(
            obs=torch.zeros(size + tuple(obs_shape)),
            actions=torch.zeros(size, dtype=torch.long),
            logprobs=torch.zeros(size),
            values=torch.zeros(size),
            rewards=torch.zeros(size),
            dones=torch.zeros(size, dtype=torch.bool),
        )


def make_vector_env(make_env: Callable[[], gym.Env], num_envs: int) -> gym.vector.SyncVectorEnv:
    """``num_envs`` copies in a SyncVectorEnv that resets an env in the same step it ends.

    With ``SAME_STEP`` autoreset the observation returned with ``done = True`` is already the first
    observation of the next episode, which is what ``compute_gae``'s ``dones`` convention assumes.
    """
    return gym.vector.SyncVectorEnv(
        [make_env for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def rollout_step(
    agent: Agent,
    envs: gym.vector.VectorEnv,
    obs: Float[Tensor, "env *obs_shape"],
    buffer: RolloutBuffer,
    step: int,
) -> Float[Tensor, "env *obs_shape"]:
    """Act once in every env and store the transition in ``buffer`` at index ``step``.

    Sample ``a ~ Categorical(logits=actor(obs))`` (no gradients are needed here), step the envs,
    and store ``obs``, ``a``, ``log pi(a|obs)``, ``V(obs)``, the rewards and
    ``dones = terminated | truncated``. Returns the next observation as a float32 tensor.
    """
    # >>> exercise
    with torch.no_grad():
        logits = agent.actor(obs)
        value = agent.critic(obs).squeeze(-1)
    dist = Categorical(logits=logits)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    buffer.obs[step] = obs
    buffer.actions[step] = action
    buffer.logprobs[step] = dist.log_prob(action)
    buffer.values[step] = value
    buffer.rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
    buffer.dones[step] = torch.as_tensor(np.logical_or(terminated, truncated))
    return torch.as_tensor(next_obs, dtype=torch.float32)
    # <<< exercise


# ---------------------------------------------------------------------------------------------------
# Learning
# ---------------------------------------------------------------------------------------------------


def get_minibatch_indices(
    batch_size: int, minibatch_size: int, generator: torch.Generator | None = None
) -> list[Int[Tensor, "minibatch"]]:
    """One epoch of minibatches: a random permutation of ``range(batch_size)`` cut into
    ``batch_size // minibatch_size`` chunks of ``minibatch_size`` (every index exactly once).

    Draw the permutation from ``generator`` so that the order is reproducible.
    """
    assert batch_size % minibatch_size == 0, "minibatch_size must divide batch_size"
    # >>> exercise
    perm = torch.randperm(batch_size, generator=generator)
    return list(perm.reshape(-1, minibatch_size))  # [num_minibatches, minibatch_size] -> rows
    # <<< exercise


def explained_variance(
    values: Float[Tensor, "*b"], returns: Float[Tensor, "*b"]
) -> float:
    """``1 - Var(returns - values) / Var(returns)``: 1 is a perfect critic, 0 no better than a
    constant, negative worse. NaN when the returns do not vary."""
    var_returns = returns.var()
    if var_returns == 0:
        return float("nan")
    return float(1 - (returns - values).var() / var_returns)


def ppo_learning_phase(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    buffer: RolloutBuffer,
    next_obs: Float[Tensor, "env *obs_shape"],
    args: PPOArgs,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """Learn from one rollout: GAE, then ``update_epochs`` epochs of minibatch steps.

    1. ``A = compute_gae(...)`` with ``next_value = V(next_obs)``; value targets ``R = A + V``.
    2. Flatten ``[steps, env]`` to one batch. For every epoch, for every minibatch from
       ``get_minibatch_indices(batch_size, minibatch_size, generator)``: recompute logits and values,
       ``objective = L_clip - L_value + L_entropy``, ``zero_grad``, ``backward``, clip the gradient
       norm to ``max_grad_norm``, ``optimizer.step()`` (the optimizer maximises).
       The advantages are normalised per minibatch (``calc_clipped_surrogate_objective`` does it on the
       minibatch it is given), never once over the whole batch.
    3. Beside the loss (no gradients), on the log-probabilities the loss used, before the step:
       ``clip_diagnostics`` gives ``approx_kl = mean((r - 1) - log r)`` and
       ``clipfrac = mean(|r - 1| > clip_coef)``.

    Returns a dict: the means over every minibatch step (all epochs) of ``policy_objective`` and
    ``value_loss`` (the two functions' values), ``entropy`` (the policy's mean entropy on the minibatch,
    without ``ent_coef``), ``approx_kl`` and ``clipfrac``; plus the rollout's ``explained_variance`` of
    the stored values against the returns.
    """
    # >>> exercise
    with torch.no_grad():
        next_value = agent.critic(next_obs).squeeze(-1)
        advantages = compute_gae(
            buffer.rewards, buffer.values, next_value, buffer.dones, args.gamma, args.gae_lambda
        )
        returns = advantages + buffer.values

    b_obs = einops.rearrange(buffer.obs, "steps env ... -> (steps env) ...")
    b_actions, b_logprobs, b_advantages, b_returns, b_values = (
        einops.rearrange(x, "steps env -> (steps env)")
        for x in (buffer.actions, buffer.logprobs, advantages, returns, buffer.values)
    )

    stats: dict[str, list[float]] = {
        k: [] for k in ("policy_objective", "value_loss", "entropy", "approx_kl", "clipfrac")
    }
    for _ in range(args.update_epochs):
        for mb in get_minibatch_indices(args.batch_size, args.minibatch_size, generator):
            logits = agent.actor(b_obs[mb])
            dist = Categorical(logits=logits)
            new_logprobs = dist.log_prob(b_actions[mb])
            new_values = agent.critic(b_obs[mb]).squeeze(-1)

            policy_objective = calc_clipped_surrogate_objective(
                new_logprobs, b_logprobs[mb], b_advantages[mb], args.clip_coef
            )
            value_loss = calc_value_function_loss(new_values, b_returns[mb], args.vf_coef)
            entropy_bonus = calc_entropy_bonus(logits, args.ent_coef)
            objective = policy_objective - value_loss + entropy_bonus

            optimizer.zero_grad()
            objective.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()

            with torch.no_grad():  # diagnostics, beside the loss
                for key, value in clip_diagnostics(new_logprobs, b_logprobs[mb], args.clip_coef).items():
                    stats[key].append(value)
                stats["entropy"].append(dist.entropy().mean().item())
            stats["policy_objective"].append(policy_objective.item())
            stats["value_loss"].append(value_loss.item())

    out = {k: float(np.mean(v)) for k, v in stats.items()}
    out["explained_variance"] = explained_variance(b_values, b_returns)
    return out
    # <<< exercise


