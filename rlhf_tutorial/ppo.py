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
10. ``train``                            the loop: rollout, learn, anneal the learning rate, log

The objective follows the course convention: it is a value to *maximise* and the optimizer is built
with ``maximize=True``::

    objective = L_clip - L_value + L_entropy

``train`` can run any of the exercise functions in place of the reference ones, so a learner's own
``compute_gae`` (say) can be trained on CartPole or on the probe environments with everything else
left as the reference: pass it by name, ``train(args, compute_gae=my_compute_gae)``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, fields

import einops
import gymnasium as gym
import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from torch.distributions import Categorical
from tqdm.auto import tqdm

from rlhf_tutorial.trainer_args import add_flags, arg, learner_functions_for

# ---------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------


@dataclass
class PPOArgs:
    """Every knob of the PPO trainer. The defaults solve CartPole-v1 on a laptop CPU.

    Derived sizes: one rollout holds ``batch_size = num_envs * num_steps`` transitions, which the
    learning phase cuts into ``num_minibatches`` minibatches of ``minibatch_size`` and visits
    ``update_epochs`` times. Training runs ``num_updates = total_timesteps // batch_size`` rollouts.

    Tuned on CartPole-v1 (seeds 1-6, mean return of the last 20 episodes): the learning rate is 10x
    CleanRL's 2.5e-4 so that training fits a few minutes of a laptop CPU, and ``ent_coef`` is 0: with
    the common 0.01 the bonus keeps the final policy random enough to drop an episode now and then
    (4 of 6 seeds ended at 500 and one below 475, after 200k and after 300k steps); without it all 6
    ended at 500 after 250k steps.
    """

    env_id: str = arg("CartPole-v1", "gymnasium environment id (discrete actions, flat observations)")
    seed: int = arg(1, "seeds torch, numpy, the environments and the minibatch order")
    total_timesteps: int = arg(250_000, "environment steps in total, summed over all envs")
    num_envs: int = arg(4, "environments stepped in parallel (a SyncVectorEnv)")
    num_steps: int = arg(128, "steps per env in one rollout")
    learning_rate: float = arg(2.5e-3, "Adam learning rate at the start")
    anneal_lr: bool = arg(True, "decay the learning rate linearly to 0 over training")
    gamma: float = arg(0.99, "discount factor")
    gae_lambda: float = arg(0.95, "GAE lambda: 0 is one-step TD (low variance), 1 is Monte Carlo (no bias)")
    num_minibatches: int = arg(4, "minibatches per epoch")
    update_epochs: int = arg(4, "passes over each rollout")
    clip_coef: float = arg(0.2, "epsilon of the clipped surrogate")
    ent_coef: float = arg(0.0, "weight of the entropy bonus (0.01 is common; see the class docstring)")
    vf_coef: float = arg(0.5, "weight of the value loss")
    max_grad_norm: float = arg(0.5, "clip the global gradient norm to this")
    hidden: int = arg(64, "width of the two hidden layers of actor and critic")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


# ---------------------------------------------------------------------------------------------------
# The network
# ---------------------------------------------------------------------------------------------------


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """Orthogonal initialisation: ``W`` gets orthonormal rows (or columns) scaled by ``std``.

    ``W W^T = std^2 I`` (when ``out <= in``), every bias is ``bias_const``. The same layer is
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

        A_hat = (A - mean(A)) / (std(A) + eps)            std: torch's default (unbiased)
        r     = exp(logprobs - old_logprobs)              = pi(a|s) / pi_old(a|s)
        L     = mean(min(r * A_hat, clip(r, 1 - clip_coef, 1 + clip_coef) * A_hat))
    """
    # >>> exercise
    advantages = (advantages - advantages.mean()) / (advantages.std() + eps)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages
    return torch.minimum(unclipped, clipped).mean()
    # <<< exercise


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
    3. Beside the loss (no gradients): ``approx_kl = mean((r - 1) - log r)`` and
       ``clipfrac = mean(|r - 1| > clip_coef)``.

    Returns means over all minibatches of ``policy_objective``, ``value_loss``, ``entropy``,
    ``approx_kl``, ``clipfrac``, plus the rollout's ``explained_variance``.
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
                logratio = new_logprobs - b_logprobs[mb]
                ratio = logratio.exp()
                stats["approx_kl"].append(((ratio - 1) - logratio).mean().item())
                stats["clipfrac"].append(((ratio - 1).abs() > args.clip_coef).float().mean().item())
                stats["entropy"].append(dist.entropy().mean().item())
            stats["policy_objective"].append(policy_objective.item())
            stats["value_loss"].append(value_loss.item())

    out = {k: float(np.mean(v)) for k, v in stats.items()}
    out["explained_variance"] = explained_variance(b_values, b_returns)
    return out
    # <<< exercise


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------

#: The functions ``train`` lets you replace by keyword (your own version from the notebook).
PLUGGABLE = (
    "layer_init",
    "compute_gae",
    "calc_clipped_surrogate_objective",
    "calc_value_function_loss",
    "calc_entropy_bonus",
    "get_minibatch_indices",
    "rollout_step",
    "ppo_learning_phase",
)


learner_functions = learner_functions_for(PLUGGABLE)


def _with_names(fn: Callable, names: dict[str, Callable]) -> Callable:
    """A copy of ``fn`` whose global names in ``names`` point at the given objects.

    This is how the reference ``ppo_learning_phase`` calls *your* ``compute_gae`` when you replace only
    that: it looks the name up in its globals, and we hand it globals where the name is yours.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    new = types.FunctionType(
        fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__, fn.__closure__
    )
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__doc__ = fn.__doc__
    return new


@dataclass
class TrainResult:
    """What ``train`` returns: the trained agent and everything it logged."""

    agent: Agent
    episode_returns: list[float]  # every finished episode, in order of completion
    episode_end_steps: list[int]  # env steps (all envs together) when each one finished
    history: list[dict[str, float]]  # one dict per update: the learning-phase stats and more
    env_steps: int
    wall_seconds: float

    def mean_return_last(self, n: int = 20) -> float:
        tail = self.episode_returns[-n:]
        return float(np.mean(tail)) if tail else float("nan")


def train(
    args: PPOArgs,
    *,
    make_env: Callable[[], gym.Env] | None = None,
    callback: Callable[..., None] | None = None,
    progress: bool = True,
    **overrides: Callable,
) -> TrainResult:
    """Train PPO with ``args``; any function named in ``PLUGGABLE`` can be replaced by keyword.

    ``make_env`` builds one env (default ``gym.make(args.env_id)``). ``callback(env_steps, **metrics)``
    is called after every finished episode (``episodic_return=...``) and after every update (the
    learning-phase stats, ``learning_rate`` and ``mean_return_last20``): hand it a dashboard's ``update``.
    """
    unknown = set(overrides) - set(PLUGGABLE)
    if unknown:
        raise TypeError(f"train() cannot replace {sorted(unknown)}; replaceable: {PLUGGABLE}")
    fns = {name: globals()[name] for name in PLUGGABLE} | overrides
    rollout = _with_names(fns["rollout_step"], fns)
    learn = _with_names(fns["ppo_learning_phase"], fns)

    # Seeding: torch (init and action sampling), numpy, the envs, and the minibatch order.
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    make_env = make_env or (lambda: gym.make(args.env_id))
    envs = make_vector_env(make_env, args.num_envs)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "discrete actions only"
    obs_shape = envs.single_observation_space.shape
    obs_dim = int(np.prod(obs_shape))

    agent = Agent(obs_dim, int(envs.single_action_space.n), args.hidden, init_layer=fns["layer_init"])
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, maximize=True)
    buffer = RolloutBuffer.zeros(args.num_steps, args.num_envs, obs_shape)

    obs_np, _ = envs.reset(seed=args.seed)
    obs = torch.as_tensor(obs_np, dtype=torch.float32)
    running = np.zeros(args.num_envs)
    result = TrainResult(agent, [], [], [], 0, 0.0)
    start = time.perf_counter()
    bar = tqdm(range(args.num_updates), desc=f"PPO {args.env_id}", disable=not progress, file=sys.stderr)
    for update in bar:
        if args.anneal_lr:  # linear decay from learning_rate to 0 over all updates
            lr = args.learning_rate * (1.0 - update / args.num_updates)
            for group in optimizer.param_groups:
                group["lr"] = lr

        for step in range(args.num_steps):
            obs = rollout(agent, envs, obs, buffer, step)
            result.env_steps += args.num_envs
            running += buffer.rewards[step].numpy()
            for i in np.flatnonzero(buffer.dones[step].numpy()):
                result.episode_returns.append(float(running[i]))
                result.episode_end_steps.append(result.env_steps)
                if callback is not None:
                    callback(result.env_steps, episodic_return=float(running[i]))
                running[i] = 0.0

        stats = dict(learn(agent, optimizer, buffer, obs, args, generator))
        stats["learning_rate"] = optimizer.param_groups[0]["lr"]
        stats["env_steps"] = result.env_steps
        stats["mean_return_last20"] = result.mean_return_last(20)
        result.history.append(stats)
        if callback is not None:
            callback(result.env_steps, **{k: v for k, v in stats.items() if k != "env_steps"})
        bar.set_postfix(ret20=f"{stats['mean_return_last20']:.1f}", kl=f"{stats.get('approx_kl', float('nan')):.4f}")
    envs.close()
    result.wall_seconds = time.perf_counter() - start
    return result


# ---------------------------------------------------------------------------------------------------
# Command line: python -m rlhf_tutorial train-ppo --env CartPole-v1 --seed 1
# ---------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial train-ppo", description="Train the reference PPO (chapter 01)."
    )
    add_flags(parser, PPOArgs, from_preset=False, aliases={"env_id": ["--env"]})
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (a tiny MLP wants 1)")
    parser.add_argument("--report", default=None, help="write the training curves to this HTML file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def main(argv: list[str]) -> dict:
    """Train, then summarise: the mean return of the last 20 episodes, steps, time and diagnostics."""
    ns = _parser().parse_args(argv)
    args = PPOArgs(**{f.name: getattr(ns, f.name) for f in fields(PPOArgs)})
    torch.set_num_threads(ns.threads)

    dashboard = None
    if ns.report:
        from rlhf_tutorial.widgets.ppo import ppo_dashboard

        dashboard = ppo_dashboard(title=f"PPO on {args.env_id}, seed {args.seed}", static=True)
    result = train(args, callback=dashboard.update if dashboard else None, progress=not ns.no_progress)

    threshold = gym.spec(args.env_id).reward_threshold
    returns = np.array(result.episode_returns)
    window = 20
    solved_at = None
    if threshold is not None and len(returns) >= window:
        means = np.convolve(returns, np.ones(window) / window, mode="valid")  # means[i]: episodes i..i+19
        hits = np.flatnonzero(means >= threshold)
        if hits.size:
            solved_at = result.episode_end_steps[hits[0] + window - 1]
    last = result.history[-1] if result.history else {}
    summary = {
        "env_id": args.env_id,
        "seed": args.seed,
        "mean_return_last20": _finite(result.mean_return_last(window)),
        "reward_threshold": threshold,
        "solved": bool(threshold is not None and result.mean_return_last(window) >= threshold),
        "first_step_last20_above_threshold": solved_at,
        "episodes": len(returns),
        "env_steps": result.env_steps,
        "updates": len(result.history),
        "wall_seconds": round(result.wall_seconds, 2),
        "steps_per_second": round(result.env_steps / max(result.wall_seconds, 1e-9), 1),
        "final_approx_kl": _finite(last.get("approx_kl", float("nan"))),
        "final_clipfrac": _finite(last.get("clipfrac", float("nan"))),
        "final_explained_variance": _finite(last.get("explained_variance", float("nan"))),
        "torch_threads": ns.threads,
    }
    if dashboard is not None:
        dashboard.save(ns.report)
        summary["report"] = ns.report
    return summary
