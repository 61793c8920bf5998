"""Chapter 01: probe environments, five tiny envs that each test one part of PPO.

A bug in RL code rarely crashes: the agent just learns worse. Probe environments (after Andy Jones,
"Debugging RL, without the agonizing pain") are so simple that the right answer is known exactly,
so a failure points at the part that is wrong. Run them in order and fix the first one that fails:

| probe | observation | actions | reward | what must be learnt | tests |
|---|---|---|---|---|---|
| 1 | always 0 | 1 | +1, episode of 1 step | V(0) = 1 | value loss, critic update |
| 2 | -1 or +1 at random | 1 | = observation, 1 step | V(s) = s | critic sees the right observation |
| 3 | 0, then 1 | 1 | 0, then +1 at the end of 2 steps | V(0) = gamma, V(1) = 1 | discounting, episode ends in GAE |
| 4 | always 0 | 2 | +1 for action 0, -1 for action 1 | pi(0) -> 1 | sign of the policy objective |
| 5 | -1 or +1 at random | 2 | +1 when the action matches (1 for +1, 0 for -1) | pi follows s | advantages lined up with obs and actions |

``run_probes(**overrides)`` trains PPO on each (with your own functions plugged in by name, as in
``rlhf_tutorial.trainers.ppo.train``) and ``format_report`` says which part to look at when a probe fails.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field, replace

import gymnasium as gym
import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from rlhf_tutorial import ppo
from rlhf_tutorial.trainers.ppo import PPOArgs, train

# ---------------------------------------------------------------------------------------------------
# The environments
# ---------------------------------------------------------------------------------------------------


class ProbeEnv(gym.Env):
    """A one-dimensional observation in [-1, 1] and ``n_actions`` discrete actions."""

    n_actions = 1

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.n_actions)
        self._obs = np.zeros(1, dtype=np.float32)
        self._t = 0

    def _set(self, value: float) -> np.ndarray:
        self._obs = np.array([value], dtype=np.float32)
        return self._obs.copy()

    def _random_sign(self) -> float:
        return float(self.np_random.choice([-1.0, 1.0]))


class Probe1(ProbeEnv):
    """Constant observation 0, one action, reward +1, one step. Learns V(0) = 1."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._set(0.0), {}

    def step(self, action):
        return self._obs.copy(), 1.0, True, False, {}


class Probe2(ProbeEnv):
    """Observation -1 or +1, one action, reward equal to the observation, one step. Learns V(s) = s."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._set(self._random_sign()), {}

    def step(self, action):
        return self._obs.copy(), float(self._obs[0]), True, False, {}


class Probe3(ProbeEnv):
    """Two steps: observation 0 (reward 0), then observation 1 (reward +1, episode ends).

    Learns V(1) = 1 and V(0) = gamma: the only probe where discounting matters.
    """

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._set(0.0), {}

    def step(self, action):
        self._t += 1
        if self._t == 1:
            return self._set(1.0), 0.0, False, False, {}
        return self._obs.copy(), 1.0, True, False, {}


class Probe4(ProbeEnv):
    """Constant observation 0, two actions: reward +1 for action 0 and -1 for action 1, one step."""

    n_actions = 2

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._set(0.0), {}

    def step(self, action):
        return self._obs.copy(), 1.0 if int(action) == 0 else -1.0, True, False, {}


class Probe5(ProbeEnv):
    """Observation -1 or +1, two actions: +1 when the action matches (1 for +1, 0 for -1), else -1."""

    n_actions = 2

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._set(self._random_sign()), {}

    def step(self, action):
        want = 1 if self._obs[0] > 0 else 0
        return self._obs.copy(), 1.0 if int(action) == want else -1.0, True, False, {}


PROBE_ENVS: dict[int, type[ProbeEnv]] = {1: Probe1, 2: Probe2, 3: Probe3, 4: Probe4, 5: Probe5}

# ---------------------------------------------------------------------------------------------------
# Training and judging
# ---------------------------------------------------------------------------------------------------

#: Small and fast: 4 envs x 32 steps per rollout, 16 rollouts (about a second per probe on a CPU;
#: every probe passes with the reference on seeds 0-4).
#: gamma = 0.9 so that probe 3 can tell a discounted value (0.9) from an undiscounted one (1.0).
PROBE_ARGS = PPOArgs(
    env_id="probe",
    total_timesteps=4 * 32 * 16,
    num_envs=4,
    num_steps=32,
    learning_rate=5e-3,
    gamma=0.9,
    ent_coef=0.01,
    num_minibatches=4,
    update_epochs=4,
)

TOLERANCE = 0.1  # on values (probes 1-3)
MIN_PROB = 0.9  # of the right action (probes 4-5)

#: What a failing probe says about your PPO.
DIAGNOSIS: dict[int, str] = {
    1: "The critic did not learn V(0) = 1 for a constant reward of 1. Look at the value loss: "
    "calc_value_function_loss (0.5 * vf_coef * mean((values - returns)**2): the square, the mean) and "
    "its sign in the objective (objective = L_clip - L_value + L_entropy, maximised), and that "
    "ppo_learning_phase steps the optimizer on it.",
    2: "The critic did not learn V(s) = s: the value is not tied to the observation it rates. Check that "
    "rollout_step stores the observation the action was taken in (obs, not the next obs) and that "
    "ppo_learning_phase flattens obs, returns and the rest in the same order.",
    3: "Discounting is wrong: expected V(1) = 1 and V(0) = gamma. Check compute_gae: gamma in "
    "delta_t = r_t + gamma * (1 - dones[t]) * V_{t+1} - V_t, dones[t] (not dones[t+1]) stopping the "
    "bootstrap at an episode end, V_{t+1} = values[t+1] or next_value, and returns = advantages + values.",
    4: "The policy did not learn to prefer the rewarded action. The policy objective probably has the wrong "
    "sign or the ratio is inverted: ratio = exp(logprobs - old_logprobs), objective = mean(min(ratio * A, "
    "clip(ratio) * A)) is maximised (not minimised).",
    5: "The policy did not learn to choose its action from the observation. Advantages, actions and "
    "observations are probably not lined up: check how ppo_learning_phase flattens the buffer (the same "
    "'(steps env)' order for everything) and indexes minibatches, that the new log-probs have shape "
    "[minibatch] (Categorical(logits=logits).log_prob(actions), not log_softmax(logits)[:, actions], which "
    "broadcasts to [minibatch, minibatch]), and that rollout_step stores the pre-step observation.",
}


@dataclass
class ProbeResult:
    probe: int
    passed: bool
    measured: dict[str, float]
    expected: str
    diagnosis: str = ""
    seconds: float = 0.0
    error: str = ""
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        got = ", ".join(f"{k} = {v:.3f}" for k, v in self.measured.items()) or self.error
        mark = "PASS" if self.passed else "FAIL"
        return f"probe {self.probe} {mark}: expected {self.expected}; got {got}"


@torch.no_grad()
def _values(agent: ppo.Agent, xs: list[float]) -> Float[Tensor, "n"]:
    return agent.critic(torch.tensor(xs).reshape(-1, 1)).squeeze(-1)


@torch.no_grad()
def _probs(agent: ppo.Agent, xs: list[float]) -> Float[Tensor, "n actions"]:
    return torch.softmax(agent.actor(torch.tensor(xs).reshape(-1, 1)), dim=-1)


def judge(probe: int, agent: ppo.Agent, gamma: float) -> tuple[bool, dict[str, float], str]:
    """Read the trained agent on the probe's observations: (passed, measurements, expectation)."""
    if probe == 1:
        v = _values(agent, [0.0])
        return bool(abs(v[0] - 1) < TOLERANCE), {"V(0)": float(v[0])}, "V(0) = 1"
    if probe == 2:
        v = _values(agent, [-1.0, 1.0])
        ok = bool((v - torch.tensor([-1.0, 1.0])).abs().max() < TOLERANCE)
        return ok, {"V(-1)": float(v[0]), "V(+1)": float(v[1])}, "V(-1) = -1, V(+1) = +1"
    if probe == 3:
        v = _values(agent, [0.0, 1.0])
        ok = bool((v - torch.tensor([gamma, 1.0])).abs().max() < TOLERANCE / 2)
        return ok, {"V(0)": float(v[0]), "V(1)": float(v[1])}, f"V(0) = gamma = {gamma}, V(1) = 1"
    if probe == 4:
        p = _probs(agent, [0.0])
        return bool(p[0, 0] > MIN_PROB), {"pi(0|0)": float(p[0, 0])}, f"pi(0|0) > {MIN_PROB}"
    if probe == 5:
        p = _probs(agent, [-1.0, 1.0])
        right = torch.stack([p[0, 0], p[1, 1]])
        ok = bool(right.min() > MIN_PROB)
        return ok, {"pi(0|-1)": float(right[0]), "pi(1|+1)": float(right[1])}, f"pi(0|-1), pi(1|+1) > {MIN_PROB}"
    raise ValueError(f"no probe {probe}")


def run_probe(probe: int, seed: int = 0, args: PPOArgs | None = None, **overrides) -> ProbeResult:
    """Train PPO (with ``overrides`` plugged in, see ``trainers.ppo.train``) on one probe and judge it."""
    args = replace(args or PROBE_ARGS, seed=seed, env_id=f"probe{probe}")
    start = time.perf_counter()
    try:
        result = train(args, make_env=PROBE_ENVS[probe], progress=False, **overrides)
    except Exception as exc:  # noqa: BLE001 - a crash is a failed probe with its reason
        return ProbeResult(probe, False, {}, "", DIAGNOSIS[probe], time.perf_counter() - start,
                           error=f"training raised {type(exc).__name__}: {exc}")
    ok, measured, expected = judge(probe, result.agent, args.gamma)
    if not all(np.isfinite(list(measured.values()))):
        ok = False
    return ProbeResult(probe, ok, measured, expected, "" if ok else DIAGNOSIS[probe],
                       time.perf_counter() - start)


def run_probes(
    probes: tuple[int, ...] = (1, 2, 3, 4, 5), seed: int = 0, verbose: bool = False, **overrides
) -> list[ProbeResult]:
    """Run several probes; ``overrides`` are your functions by name (see ``trainers.ppo.PLUGGABLE``)."""
    results = []
    for p in probes:
        results.append(run_probe(p, seed=seed, **overrides))
        if verbose:
            print(results[-1].line(), flush=True)
    return results


def format_report(results: list[ProbeResult]) -> str:
    """One line per probe, then what to fix for the first failure (fix that one first)."""
    lines = [r.line() for r in results]
    failed = [r for r in results if not r.passed]
    if failed:
        lines += ["", f"Fix probe {failed[0].probe} first. {failed[0].diagnosis}"]
    else:
        lines += ["", "All probes pass."]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial probes [--seed S] [--probe N ...]``: the reference PPO on every probe."""
    parser = argparse.ArgumentParser(prog="python -m rlhf_tutorial probes",
                                     description="Run the reference PPO on the probe environments.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe", type=int, action="append", choices=sorted(PROBE_ENVS),
                        help="probe to run (repeat for several; default all)")
    parser.add_argument("--threads", type=int, default=1)
    ns = parser.parse_args(argv)
    torch.set_num_threads(ns.threads)
    results = run_probes(tuple(ns.probe or PROBE_ENVS), seed=ns.seed)
    print(format_report(results))
    return {
        "all_passed": all(r.passed for r in results),
        "seed": ns.seed,
        "probes": {str(r.probe): {"passed": r.passed, **r.measured, "seconds": round(r.seconds, 2)}
                   for r in results},
    }
