"""Running chapter 01's PPO: its arguments, the training loop and the ``train-ppo`` command.

The pieces a learner writes (GAE, the objective, the rollout step, the learning phase) live in
``rlhf_tutorial.ppo``; this module runs them. ``train(args, **learner_functions(globals()))`` runs a
notebook's versions in place of the reference ones (see ``rlhf_tutorial.trainers.plug``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from rlhf_tutorial import ppo
from rlhf_tutorial.ppo import Agent, RolloutBuffer, make_vector_env
from rlhf_tutorial.trainers.args import add_flags, arg, documented
from rlhf_tutorial.trainers.plug import bind, learner_functions_for

# ---------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------


@documented
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
    fns = bind(ppo, PLUGGABLE, overrides)
    rollout, learn = fns["rollout_step"], fns["ppo_learning_phase"]

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
        "mean_return_first20": _finite(float(np.mean(returns[:window]))) if len(returns) else None,
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
