# %% [markdown]
# # 01. PPO from scratch
#
# Proximal Policy Optimization (PPO, Schulman et al. 2017) is the algorithm behind RLHF, and it is
# easiest to understand where reinforcement learning is cheap: a small control task on a CPU. In this
# chapter you write every piece of PPO yourself, check each piece, debug the whole with *probe
# environments*, and train it until it balances a pole (CartPole-v1) perfectly. Chapter 03 reuses
# every idea here on a language model: the environment becomes "write a completion", the actions
# become tokens.
#
# The reference code lives in `rlhf_tutorial/ppo.py` (one readable file, in the style of CleanRL). After
# each exercise, the `check(...)` cell compares your function with the reference on several cases and
# tells you what looks wrong; `hint("name")`, `hint("name", 2)` and `hint("name", 3)` climb the hint
# ladder (a nudge, the approach, the code).
#
# **Plan.** 1. policy gradients and the clipped objective · 2. the agent · 3. advantages (GAE) ·
# 4. the three terms of the objective · 5. rollouts · 6. the learning phase · 7. probe environments ·
# 8. CartPole.

# %% imports
import math

import einops
import gymnasium as gym
import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from torch.distributions import Categorical

from rlhf_tutorial import check, figures, hint, ppo, probes, progress
from rlhf_tutorial.devices import describe
from rlhf_tutorial.ppo import Agent, RolloutBuffer, explained_variance, make_vector_env, masked_mean
from rlhf_tutorial.trainers.ppo import PPOArgs, learner_functions, train
from rlhf_tutorial.widgets.ppo import clipped_objective_explorer, ppo_dashboard
from rlhf_tutorial.worlds import is_smoke, is_tiny

# %%
torch.manual_seed(0)
torch.set_num_threads(1)  # the networks here are tiny: more threads only add overhead
print(describe("cpu"), "- this chapter's agents are small: they train on the CPU on every machine")

# %% [markdown]
# ## 1. Policy gradients, importance sampling and the clipped objective
#
# A policy $\pi_\theta(a \mid s)$ gives a distribution over actions $a$ in state $s$. We want to
# maximise the expected discounted return $J(\theta) = \mathbb{E}_{\pi_\theta}\big[\sum_t \gamma^t r_t\big]$.
# The **policy gradient theorem** turns this into something we can estimate from samples:
#
# $$\nabla_\theta J(\theta) = \mathbb{E}_{s, a \sim \pi_\theta}\big[\nabla_\theta \log \pi_\theta(a \mid s)\, A(s, a)\big]$$
#
# where the **advantage** $A(s, a) = Q(s, a) - V(s)$ says how much better action $a$ was than what the
# policy does on average in $s$. Raise the log-probability of actions with $A > 0$, lower it for $A < 0$.
#
# The expectation is over the *current* policy, so in principle every gradient step needs fresh
# data. Collecting data is the expensive part, so PPO reuses one batch for several steps. The data was
# collected by an older policy $\pi_{\theta_\text{old}}$, and **importance sampling** corrects for that:
#
# $$\mathbb{E}_{a \sim \pi_\theta}[f(a)] = \mathbb{E}_{a \sim \pi_{\theta_\text{old}}}\Big[\frac{\pi_\theta(a \mid s)}{\pi_{\theta_\text{old}}(a \mid s)} f(a)\Big],
# \qquad r_t(\theta) = \frac{\pi_\theta(a_t \mid s_t)}{\pi_{\theta_\text{old}}(a_t \mid s_t)} = \exp(\texttt{logprobs} - \texttt{old\_logprobs}).$$
#
# The surrogate objective $\mathbb{E}_t[r_t(\theta)\hat A_t]$ has the policy gradient as its gradient at
# $\theta = \theta_\text{old}$, but it is only trustworthy near $\theta_\text{old}$: far away, the advantages
# estimated under the old policy no longer describe the new one, and maximising the surrogate blindly
# makes huge, destructive updates. PPO keeps the new policy close by **clipping** the ratio:
#
# $$L^{CLIP}(\theta) = \mathbb{E}_t\Big[\min\big(r_t(\theta)\hat A_t,\; \operatorname{clip}(r_t(\theta), 1 - \epsilon, 1 + \epsilon)\,\hat A_t\big)\Big]$$
#
# with $\epsilon$ = `clip_coef` (0.2). Read it for each sign of the advantage:
#
# - $\hat A_t > 0$ (a good action): the objective grows with $r$ until $r = 1 + \epsilon$, then goes flat. Once
#   the action is $(1+\epsilon)$ times likelier than before, there is **no gradient** to push it further in
#   this update. Below $1 - \epsilon$ the min picks the unclipped $r \hat A$, so if an update accidentally made
#   a good action rarer, the full gradient still pulls it back.
# - $\hat A_t < 0$ (a bad action): the objective is flat for $r < 1 - \epsilon$ (already rare enough, stop
#   pushing), while for $r > 1 + \epsilon$ the min keeps the unclipped, more negative $r \hat A$, so a bad action
#   made likelier is corrected with full force.
#
# The min makes $L^{CLIP}$ a **pessimistic** (lower) bound on the unclipped objective: clipping only ever
# removes the incentive to move further in the direction that already helped. Move the sliders (in
# JupyterLab; elsewhere you see a static figure):

# %%
clipped_objective_explorer(epsilon=0.2, ratio=1.3)

# %% [markdown]
# ## 2. The agent
#
# The agent is two small MLPs: an **actor** giving logits over actions and a **critic** giving $V(s)$.
# PPO implementations initialise them **orthogonally**: each weight matrix ($W$ of shape `[out, in]`)
# has orthonormal rows or columns, whichever are fewer, scaled by a gain: $W W^\top = \texttt{std}^2 I$
# when the layer does not widen (out $\le$ in), $W^\top W = \texttt{std}^2 I$ when it does. So signals keep
# their scale through the layers at the start of training. Hidden layers use gain $\sqrt 2$; the actor's last layer gets 0.01
# (all logits near 0, so the first policy is close to uniform and explores), the critic's last layer 1.0.
#
# **Exercise.** `layer_init(layer, std, bias_const)` initialises a `nn.Linear` in place (weight orthogonal
# with gain `std`, bias filled with `bias_const`) and returns the same layer. `torch.nn.init` has both.

# %% exercise rlhf_tutorial.ppo:layer_init | 5 min | difficulty 1 | importance 2

# %% [markdown]
# `Agent` (imported from the package) builds its layers with whatever `init_layer` you give it:

# %%
agent = Agent(obs_dim=4, n_actions=2, hidden=64, init_layer=layer_init)
print(agent)
obs = torch.randn(3, 4)
print("logits, shape", tuple(agent.actor(obs).shape), "\n", agent.actor(obs).detach())
print("values, shape", tuple(agent.critic(obs).shape), "(the critic's last layer has one output)\n",
      agent.critic(obs).detach())

# %% [markdown]
# ## 3. Advantages: generalised advantage estimation (GAE)
#
# We never see $A(s, a)$; we estimate it from a rollout of rewards $r_t$ and the critic's values $V_t$.
# The one-step **TD residual**
#
# $$\delta_t = r_t + \gamma (1 - d_t) V_{t+1} - V_t$$
#
# is an advantage estimate with low variance (one random reward) but biased by the critic's errors.
# Here $d_t$ = `dones[t]` is 1 when transition $t$ ended the episode: after it, nothing is bootstrapped.
# Summing more real rewards before bootstrapping ($n$-step estimates) reduces the bias and adds
# variance. **GAE** averages all of them with weights $(1 - \lambda)\lambda^{n-1}$, which works out to a
# discounted sum of TD residuals:
#
# $$\hat A_t = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{t+l} \quad\text{(within the episode)},\qquad
# \hat A_t = \delta_t + \gamma \lambda (1 - d_t) \hat A_{t+1}.$$
#
# $\lambda$ = `gae_lambda` trades bias for variance: $\lambda = 0$ is the TD residual, $\lambda = 1$ is the
# Monte Carlo return minus $V_t$ (unbiased, high variance). PPO uses 0.95. The recursion runs
# **backwards** in time; at the last step, $V_T$ is `next_value`, the critic's value of the observation
# after the rollout. The **returns** $\hat R_t = \hat A_t + V_t$ are the critic's regression targets.
#
# **Exercise.** `compute_gae(rewards, values, next_value, dones, gamma, gae_lambda)`, all `[steps, env]`
# except `next_value: [env]`; `dones` is a bool tensor (convert with `.float()` before arithmetic).
# The check probes a single step, random episode ends, an episode end at every step, and
# $\lambda \in \{0, 1\}$.
#
# **Predict, then check.** One env, four steps, every reward 1, every value 0, `next_value` 0, no episode
# end, $\gamma = 1$. What is $\hat A_0$ with $\lambda = 0$? With $\lambda = 1$? And with $\lambda = 1$ if the
# episode ends at step 1 (`dones[1]` True)? The cell after the check prints the three.

# %% exercise rlhf_tutorial.ppo:compute_gae | 20 min | difficulty 3 | importance 5

# %%
ones, zeros = torch.ones(4, 1), torch.zeros(4, 1)
no_end, end_at_1 = torch.zeros(4, 1, dtype=torch.bool), torch.tensor([[False], [True], [False], [False]])
for lam, dones, label in [(0.0, no_end, "lambda 0"), (1.0, no_end, "lambda 1"), (1.0, end_at_1, "lambda 1, end at step 1")]:
    adv = compute_gae(ones, zeros, torch.zeros(1), dones, gamma=1.0, gae_lambda=lam)
    print(f"{label:>24}: A = {adv[:, 0].tolist()}")

# %% [markdown]
# ## 4. The objective: three terms
#
# **Policy.** `calc_clipped_surrogate_objective(logprobs, old_logprobs, advantages, clip_coef)` returns
# $L^{CLIP}$ above. It first **normalises the advantages** over the minibatch,
# $\hat A \leftarrow (\hat A - \operatorname{mean}\hat A)/(\operatorname{std}\hat A + \texttt{eps})$ (torch's default,
# unbiased std): the scale of rewards then no longer sets the step size. The normalised advantages have
# mean 0, which is not the same as "half up, half down": with one large success among many small
# failures, one action is pushed up hard and all the others down a little. It is a value to
# **maximise** (no minus sign).

# %% exercise rlhf_tutorial.ppo:calc_clipped_surrogate_objective | 15 min | difficulty 2 | importance 5

# %% [markdown]
# **Value.** The critic regresses on the returns:
# $L^{VF} = \tfrac12\, \operatorname{mean}\big((V_\theta(s_t) - \hat R_t)^2\big)$. It is a loss, so the objective subtracts
# it, weighted by $c_1$ = `vf_coef`. `calc_value_function_loss(values, returns, vf_coef)` returns the weighted
# term $c_1 L^{VF}$ (so $c_1$ is applied once, inside the function, and the objective subtracts its output).

# %% exercise rlhf_tutorial.ppo:calc_value_function_loss | 5 min | difficulty 1 | importance 3

# %% [markdown]
# **Entropy.** A bonus $c_2\, \operatorname{mean}_t H[\pi_\theta(\cdot \mid s_t)]$, $H(p) = -\sum_a p_a \log p_a$,
# $c_2$ = `ent_coef`, keeps the policy from collapsing onto one action too early. Compute it from
# `log_softmax` (with `softmax` then `log`, a logit of 1e4 gives $0 \cdot \log 0$ = NaN).
#
# **Predict, then check.** With `ent_coef = 1`, what bonus do all-zero logits over 2 actions give? Over
# 4 actions? And logits `[1e4, 0]`? Write your three numbers down; the cell after the check prints them.

# %% exercise rlhf_tutorial.ppo:calc_entropy_bonus | 5 min | difficulty 1 | importance 3

# %%
# your prediction, checked: the entropy of a uniform policy over n actions is log n; a certain one, 0
for logits in (torch.zeros(1, 2), torch.zeros(1, 4), torch.tensor([[1e4, 0.0]])):
    print(logits.tolist(), "->", round(calc_entropy_bonus(logits, 1.0).item(), 4))
print("log 2 =", round(math.log(2), 4), " log 4 =", round(math.log(4), 4))

# %% [markdown]
# **The combined objective**, maximised by Adam with `maximize=True`:
#
# $$L(\theta) = L^{CLIP}(\theta) - c_1 L^{VF}(\theta) + c_2 S[\pi_\theta] \quad\text{i.e.}\quad
# \texttt{objective = policy\_objective - value\_loss + entropy\_bonus}$$
#
# where `value_loss` $= c_1 L^{VF}$ and `entropy_bonus` $= c_2 S$ already carry their coefficients.
#
# Here actor and critic are separate networks, so the critic's parameters get gradient only from the
# value loss and, since Adam rescales each parameter's gradient, $c_1$ matters mostly through the
# gradient-norm clip they share. $c_2$ matters directly: it weighs exploration against the policy
# objective in the actor's gradient. (When actor and critic share a body, as the language model and its
# value head do in chapter 03, $c_1$ sets how much the value loss may reshape the shared features.)

# %% [markdown]
# ## 5. Rollouts
#
# A rollout runs `num_envs` copies of the environment side by side (a gymnasium `SyncVectorEnv`) for
# `num_steps` steps and stores everything the learning phase needs in a `RolloutBuffer`, indexed
# `[step, env]`: the observation each action was chosen in, the action, its log-probability and the
# critic's value *at collection time* (these become `old_logprobs` and $V_t$), the reward and whether the
# episode ended. The vector env resets an env in the same step its episode ends
# (`autoreset_mode=SAME_STEP`), so the observation it returns is already the next episode's first one;
# `dones[t]` tells GAE not to bootstrap across.
#
# **Exercise.** `rollout_step(agent, envs, obs, buffer, step)`: sample $a \sim \pi_\theta(\cdot \mid s)$, the
# categorical distribution over the actor's logits, without gradients (acting is not learning); step
# the envs once; store the transition at index `step`, namely the observation the action was chosen in
# (not the next one), $a$, $\log \pi_\theta(a \mid s)$, $V(s)$ as a `[env]` vector, the rewards (float32) and
# whether the episode ended; return the next observation as a float32 tensor. An episode ends when it
# is `terminated` *or* `truncated` (CartPole truncates at 500 steps): a truncated episode must stop
# GAE's bootstrapping too, or the next episode's values leak into this one's advantages.

# %% exercise rlhf_tutorial.ppo:rollout_step | 20 min | difficulty 3 | importance 4

# %% [markdown]
# ## 6. The learning phase
#
# One rollout of `batch_size = num_envs * num_steps` transitions is used for `update_epochs` epochs; each
# epoch shuffles it and cuts it into `num_minibatches` minibatches. Several smaller steps per batch use
# the data better than one big step, and the clipping keeps them from going too far.
#
# **Exercise.** `get_minibatch_indices(batch_size, minibatch_size, generator)`: a list of
# `batch_size // minibatch_size` index tensors, a random permutation cut into pieces (draw it from
# `generator`, so a seed fixes the order).

# %% exercise rlhf_tutorial.ppo:get_minibatch_indices | 10 min | difficulty 2 | importance 3

# %% [markdown]
# The learning phase puts everything together, with the implementation details that make PPO work in
# practice (Huang et al., "The 37 implementation details of PPO"):
#
# - **advantage normalisation** per minibatch (inside `calc_clipped_surrogate_objective`);
# - **gradient clipping**: `nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)` between
#   `backward()` and `optimizer.step()`, so that one unlucky minibatch cannot make a giant step;
# - **learning-rate annealing**: `train` decays the rate linearly to 0 over training, so late updates
#   are small and the policy settles;
# - **minibatches over epochs**, as above; the returns and advantages are computed once per rollout,
#   before the epochs;
# - **diagnostics beside the loss**, under `torch.no_grad()`: the approximate KL divergence between the
#   old and new policy, $\widehat{KL} = \operatorname{mean}\big((r - 1) - \log r\big)$ (never negative, unbiased),
#   and the **clip fraction**, the share of samples with $|r - 1| > \epsilon$. Typical healthy values are
#   $\widehat{KL} \lesssim 0.02$ and a clip fraction of a few percent to 0.2; much larger means the steps are
#   too big. The rollout's **explained variance** $1 - \operatorname{Var}(\hat R - V)/\operatorname{Var}(\hat R)$ says how well
#   the critic predicts the returns (1 perfect, 0 useless).
#
# **Exercise.** `ppo_learning_phase(agent, optimizer, buffer, next_obs, args, generator)`: compute
# `next_value`, the advantages (your `compute_gae`) and the returns without gradients; flatten the
# buffer to `[(steps env), ...]` (the same order for every field!); then for every epoch and minibatch,
# recompute logits and values, build the objective from your three functions, step, and record the
# minibatch's `policy_objective`, `value_loss`, `entropy` (the policy's, without `ent_coef`), `approx_kl`
# and `clipfrac` (measured before its step). Return a dict of their means over every step, with the
# rollout's `explained_variance` (the stored values against the returns). The check replays your
# minibatches on the reference and compares the update and every one of these numbers.
#
# The two diagnostics have one definition in the course, used by chapters 01, 03 and 04 alike (read
# it, then call it from your learning phase):

# %% source rlhf_tutorial.ppo:clip_diagnostics

# %% exercise rlhf_tutorial.ppo:ppo_learning_phase | 25 min | difficulty 3 | importance 5

# %% [markdown]
# ## 7. Probe environments
#
# A bug in RL code rarely crashes: the agent just learns a bit worse, and CartPole takes long enough
# that you cannot tell why. **Probe environments** (Andy Jones, "Debugging RL, without the agonizing
# pain") are so small that the right answer is known exactly, and each one tests one part:
#
# | probe | observation | actions | reward | must learn | a failure points at |
# |---|---|---|---|---|---|
# | 1 | always 0 | 1 | +1, 1 step | $V(0) = 1$ | the value loss, the critic's update |
# | 2 | $\pm 1$ at random | 1 | = observation, 1 step | $V(s) = s$ | the critic seeing the wrong observation |
# | 3 | 0, then 1 | 1 | 0, then +1; 2 steps | $V(0) = \gamma$, $V(1) = 1$ | discounting and episode ends in GAE |
# | 4 | always 0 | 2 | +1 for action 0, -1 for 1 | $\pi(0) \to 1$ | the sign of the policy objective |
# | 5 | $\pm 1$ at random | 2 | +1 if the action matches | $\pi$ follows $s$ | advantages not lined up with obs and actions |
#
# `probes.run_probes(**learner_functions(globals()))` trains PPO with **your** functions (everything you
# defined above, by name) on each probe for a few thousand steps. Fix the first probe that fails first.

# %%
results = probes.run_probes(**learner_functions(globals()))
print(probes.format_report(results))
assert all(r.passed for r in results), "a probe failed: fix that part before training on CartPole"

# %% [markdown]
# What a failure looks like: the same PPO with a policy objective of the wrong sign (a "loss" that the
# optimizer maximises) learns to pick the *punished* action in probe 4.

# %%
def surrogate_with_wrong_sign(*args, **kwargs):
    return -calc_clipped_surrogate_objective(*args, **kwargs)


bad = probes.run_probe(4, calc_clipped_surrogate_objective=surrogate_with_wrong_sign)
print(bad.line())
print(bad.diagnosis)

# %% [markdown]
# ## 8. CartPole
#
# Now the real thing: keep a pole upright on a cart by pushing left or right; +1 per step, up to 500
# steps. CartPole-v1 counts as solved at a mean return of 475. The dashboard shows the episodic returns
# (dots, with the mean of the last 20), the value loss, the policy's entropy, the approximate KL, the
# clip fraction and the explained variance; in JupyterLab it updates while training runs.
#
# In the tiny world (the one CI runs) this run is shortened to 40,000 steps to fit a test budget; with
# seed 1, on the reference machine, it goes from a mean return of {{cartpole_40k.mean_return_first20:.0f}}
# over the first 20 episodes to {{cartpole_40k.mean_return_last20:.0f}} over the last 20 (a shorter run is
# less reliable than the full one). In the GPT-2 world it is the full run of the
# `PPOArgs` defaults (about 250,000 steps, one to two minutes on a CPU).

# %%
if is_smoke():  # CI's smoke runs (RLHF_TUTORIAL_SMOKE=1): just long enough to see it learn
    args = PPOArgs(seed=1, total_timesteps=12_000)
elif is_tiny():
    args = PPOArgs(seed=1, total_timesteps=40_000)
else:
    args = PPOArgs(seed=1)
dashboard = ppo_dashboard(title=f"PPO on CartPole-v1 ({args.total_timesteps:,} steps)")
result = train(args, callback=dashboard.update, **learner_functions(globals()))
dashboard.finish()

# %%
first20, last20 = np.mean(result.episode_returns[:20]), result.mean_return_last(20)
print(f"{len(result.episode_returns)} episodes, {result.env_steps:,} env steps in {result.wall_seconds:.0f} s")
print(f"mean return: first 20 episodes {first20:.1f}, last 20 episodes {last20:.1f}")
if args.total_timesteps == 40_000:  # the text above quotes this run
    figures.agree("cartpole_40k", {"mean_return_first20": first20, "mean_return_last20": last20})
assert last20 > 3 * first20, "the agent should clearly learn within this run"

# %% [markdown]
# The full run uses the defaults of `PPOArgs` (250,000 steps, 488 updates):
#
# ```
# python -m rlhf_tutorial train-ppo --env CartPole-v1 --seed 1 --report reports/ppo_cartpole.html
# ```
#
# It prints a JSON summary on its last line; `--report` saves this dashboard as an HTML file. Recorded
# on the reference machine (2 CPU cores, one torch thread): a mean return of
# **{{cartpole.mean_return_last20:.1f}}** over the last 20 episodes (the maximum is 500; solved is 475),
# {{cartpole.episodes}} episodes, {{cartpole.wall_seconds:.0f}} s of training (more on a busy machine),
# the same returns on every run with seed 1 on one machine. The mean of the last 20 returns first passes
# 475 after {{cartpole.first_step_last20_above_threshold:,}} steps; in the figure it wobbles before it
# settles, as the annealed learning
# rate takes approx KL and the clip fraction towards 0 (at the last update: {{cartpole.final_approx_kl:.4f}}
# and {{cartpole.final_clipfrac:.3f}}). Explained variance falls to about 0 whenever every
# episode lasts the full 500 steps: the returns then differ only by how far each state is from the time
# limit, which the observation does not show (see "truncation" below).
#
# ## What to try next
#
# - **Ablate the details.** `PPOArgs(anneal_lr=False)`, `max_grad_norm=1e9` (no clipping),
#   `update_epochs=1`, `num_minibatches=1`, `clip_coef=10` (no clipping of the ratio): which ones matter
#   on CartPole, and what do approx KL and the clip fraction show when they are off?
# - **Bias and variance.** Train with `gae_lambda=0` and `gae_lambda=1`, and several seeds each.
# - **Break it on purpose.** Put one bug into a copy of your functions (swap `dones[t]` for
#   `dones[t+1]`, forget `torch.no_grad()`, flatten obs in `(env steps)` order) and see which probe catches it.
# - **Entropy bonus.** The defaults use `ent_coef=0`; train with the common `ent_coef=0.01` on a few seeds
#   and watch the entropy panel and the last episodes' returns (see the `PPOArgs` docstring).
# - **Other environments.** Any gymnasium env with discrete actions and flat observations runs unchanged,
#   e.g. `train(PPOArgs(env_id="Acrobot-v1", total_timesteps=300_000))`; tune from there.
# - **Truncation.** CartPole's 500-step limit is not a failure, yet `dones` treats it like one. Bootstrap
#   truncated episodes instead (add $\gamma V(s_\text{final})$ to the last reward; the vector env puts the
#   final observation in `info["final_obs"]`) and compare.
# - Chapter 03 runs this same loop with a language model as the policy.

# %%
progress("01_ppo")
