# %% [markdown]
# # 04. GRPO: reinforcement learning without a critic
#
# In chapter 03 PPO needed a **value head**: at every token it guessed the reward still to come, and
# the advantage of a token was the reward minus that guess. Training the critic costs memory (for
# large models it is a second model as big as the policy), compute, and hyperparameters, and a bad
# critic gives bad advantages.
#
# **GRPO** (Group Relative Policy Optimization, DeepSeekMath 2024) drops the critic. For each prompt
# it samples a **group** of $G$ completions and lets them be each other's baseline: a completion is good
# if it scored better than its siblings. Everything else is PPO's machinery: the clipped ratio, an
# old policy, a KL penalty to a frozen reference (moved from the reward into the loss).
#
# | | PPO (chapter 03) | GRPO (here) |
# |---|---|---|
# | samples per prompt | 1 (64 completions of one prompt, each on its own) | a group of $G$ |
# | baseline | value head $V_\phi(s_t)$ at every token | mean reward of the group |
# | advantage | per token (one-step or GAE) | one number per completion, shared by its tokens |
# | KL to the reference | a penalty in the reward (or the objective) | the k3 estimate, inside the loss, per token |
# | extra parameters | the value head (or a whole critic model) | none |
# | reward | any; here the sentiment classifier | outcome rewards: classifier, or a **verifiable rule** |
#
# In this chapter you write the group-relative advantages, the GRPO objective with its three ways of
# averaging over tokens (GRPO, DAPO, Dr. GRPO), the sampler of groups with a completion mask, and the
# training step. Then you train on the same task as chapter 03 (negative reviews), train on a
# rule-based reward that needs no model at all, look at what happens when a whole group gets the
# same reward, and put PPO and GRPO side by side.

# %% imports
import copy
import json
import subprocess
import sys

import torch
import torch.nn as nn
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial import check, figures, hint, progress
from rlhf_tutorial.devices import describe
from rlhf_tutorial.grpo import (
    GroupRollout,
    collect_rollout,
    decode_completions,
    eos_id,
    group_record,
    group_token_logprobs,
    grpo_diagnostics,
    reward_fn_rule,
)
from rlhf_tutorial.rewards import sentiment_reward_fn
from rlhf_tutorial.rlhf import approx_kl, get_logprobs
from rlhf_tutorial.trainers.grpo import GRPOArgs, learner_functions, train
from rlhf_tutorial.widgets.grpo import comparison_figure, group_viewer, grpo_dashboard, truncation_text
from rlhf_tutorial.worlds import default_prompt, is_smoke, is_tiny, load_policy, resolve_world, smoke_sizes

# %%
torch.manual_seed(0)
world = resolve_world(None)
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
if is_tiny():
    torch.set_num_threads(1)  # the tiny model runs fastest on one thread
policy = load_policy(world)
prompt = default_prompt()
direction = "neg"
sentiment_reward = sentiment_reward_fn(world, direction)  # texts -> P(NEGATIVE | text), chapter 02
print(f"world: {world}, prompt: {prompt!r}, EOS token id: {eos_id(policy)}")

# %% [markdown]
# ## 1. Group-relative advantages
#
# For one prompt $x$, sample $G$ completions $y_1, \dots, y_G \sim \pi_{\theta_\text{old}}(\cdot \mid x)$ and
# score each once: rewards $r_1, \dots, r_G$ (an **outcome** reward: one number per completion, not per
# token). The advantage of completion $i$ is its reward relative to its group:
#
# $$A_i = \frac{r_i - \operatorname{mean}(r_1, \dots, r_G)}{\operatorname{std}(r_1, \dots, r_G) + \varepsilon}$$
#
# and every token $t$ of $y_i$ gets the same advantage, $A_{i,t} = A_i$. Why does this work?
#
# - The policy gradient $\mathbb{E}[\nabla_\theta \log \pi_\theta(y \mid x)\,(r(x,y) - b(x))]$ is unbiased for
#   any baseline $b(x)$ that does not depend on $y$, and a good baseline (close to the expected
#   reward of $x$) lowers its variance. PPO learns $b$ with a critic; GRPO estimates it from the
#   group. (Strictly, including $r_i$ in its own mean biases it by a factor $(G-1)/G$; RLOO leaves
#   $r_i$ out. With $G = 8$ the difference is small.)
# - Dividing by the group's std makes the scale of the advantages the same for every prompt. Dr.
#   GRPO (below) argues this is a bias: prompts that are almost always solved (or almost never)
#   have a tiny std, and their few differences get blown up.
# - Each group has mean advantage 0. That is not "half up, half down": with one success among eight
#   0/1 rewards, the success gets $A = (1 - \tfrac18)/s \approx 2.5$ and the seven failures $-\tfrac18/s \approx -0.35$ each
#   ($s \approx 0.35$, the unbiased std): one completion is pushed up hard, seven are pushed down a little.
#
# With a batch of $p$ prompts, `rewards` is a `[p, G]` tensor: one row per group. `scale` chooses the
# denominator: `"group"` (GRPO), `"batch"` (the std of all $p \cdot G$ rewards, a milder variant) or
# `"none"` (Dr. GRPO). Use torch's default `std` (unbiased, it divides by $G - 1$).

# %% exercise rlhf_tutorial.grpo:group_relative_advantages | 10 min | difficulty 2 | importance 5

# %% [markdown]
# **Predict, then check.** The cell below prints the three scales on three groups of 4: two successes
# among four 0/1 rewards, four successes, and four graded rewards. Before running it, write down: the
# `"group"` advantages of the first row (the unbiased std of 1, 0, 0, 1 is $1/\sqrt{3}$), which row is all
# zeros under every scale, and whether `"batch"` makes the third row's advantages larger or smaller
# than `"group"` does (is that row's own spread larger or smaller than the whole batch's?).
#
# A group whose rewards are all equal (every completion got 1, or all got 0) has advantages of
# exactly zero: **it carries no learning signal**, only the KL term acts on it. With a 0/1
# verifiable reward this happens all the time on prompts that are too easy or too hard.

# %%
rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.2, 0.9, 0.4, 0.5]])
for scale in ["group", "batch", "none"]:
    print(f"{scale:>5}:", [[round(a, 2) for a in row] for row in group_relative_advantages(rewards, scale).tolist()])

# %% [markdown]
# ## 2. Sampling a group, and which tokens count
#
# A completion ends when the policy emits the end-of-text token (EOS) or when it reaches
# `max_new_tokens`. To batch a group, the rows that stopped early are padded, so a `[G, g]` tensor of
# generated tokens holds padding we must not learn from. The **completion mask** says which tokens
# count:
#
# $$m_{i,t} = \mathbb{1}\big[\text{no EOS among } y_{i,1}, \dots, y_{i,t-1}\big]$$
#
# The EOS itself counts: emitting it was the policy's decision to stop, and that decision should be
# rewarded or punished like any other token. Everything after the first EOS is padding. (In GPT-2,
# and in the tiny world, BOS and EOS are the same token, `<|endoftext|>`: the mask must look at the
# generated tokens only, never at the prompt.) The completions are on the model's device (a GPU when
# there is one) and the mask goes there too: build any new tensor with `device=completions.device`.
#
# Contract: `completions` is `[b, g]` (the generated tokens only), the mask a **bool** `[b, g]`. The
# edge cases that matter: a row with no EOS (cut off at the length limit: all True), an EOS as the very
# first generated token (only that position True), and several EOS tokens in a row (the padding
# `generate` writes: only the first counts). Think of it as a question about what came *before* each
# position, which a single vectorised pass along the row can answer (no Python loop over positions).

# %% exercise rlhf_tutorial.grpo:completion_mask | 15 min | difficulty 3 | importance 4

# %% [markdown]
# Now the sampler. `model.generate` with `stop_at_eos=True` stops a row at its EOS and pads it with
# EOS; when *every* row has stopped it ends early, so pad the output on the right up to
# `prompt_len + max_new_tokens` to give every group the same shape. As in chapter 03, `generate`
# runs under `torch.inference_mode()`: clone its output. It returns the tokens on the model's device;
# the mask and any padding stay there.

# %% exercise rlhf_tutorial.grpo:sample_group | 15 min | difficulty 2 | importance 4

# %% [markdown]
# One group of 6 from the base policy, 40 new tokens at most, with its mask (`#` a token that counts, `·` a
# masked position: the padding after a row's EOS) and its rewards. A row of `#` only was cut off at the limit.

# %%
torch.manual_seed(1)
prompt_tokens = policy.to_tokens(prompt)[0]
tokens, mask = sample_group(policy, prompt_tokens, 6, 40, eos_id(policy), temperature=1.0)
texts = decode_completions(policy, tokens, mask, prompt)
for row_mask, text, r in zip(mask, texts, sentiment_reward(texts).tolist()):
    print(f"P(neg)={r:.2f} {''.join('#' if m else '·' for m in row_mask.tolist())}  {text!r}")

# %% [markdown]
# ## 3. The GRPO objective
#
# The old policy $\pi_{\theta_\text{old}}$ is simply the policy **at rollout time**: its log-probs of the
# sampled tokens are stored with the rollout. The policy then makes $\mu$ passes over the rollout, each
# cut into `num_minibatches` minibatches: $\mu \times$ `num_minibatches` optimizer steps per phase (8 in the
# tiny preset). The ratio $\rho_{i,t} = \pi_\theta(y_{i,t} \mid x, y_{i,<t}) / \pi_{\theta_\text{old}}(y_{i,t} \mid x, y_{i,<t})$ is
# exactly 1 only for the first minibatch of the first pass; every later step sees a policy that has
# already moved, and the clip keeps it from moving too far, as in PPO. Per token:
#
# $$\ell_{i,t} = \min\!\big(\rho_{i,t} A_i,\ \operatorname{clip}(\rho_{i,t},\, 1 - \varepsilon_\text{low},\, 1 + \varepsilon_\text{high})\, A_i\big) \;-\; \beta\, \hat{D}_{i,t}$$
#
# with the KL to the frozen reference estimated by **k3** (chapter 03's `approx_kl`), from the log-ratio
# $\log r = \log \pi_\text{ref}(y_{i,t} \mid \cdot) - \log \pi_\theta(y_{i,t} \mid \cdot)$ at the sampled token:
#
# $$\hat{D}_{i,t} = e^{\log r} - 1 - \log r \;\ge\; 0, \qquad \mathbb{E}_{y \sim \pi_\theta}\big[\hat{D}\big] = \mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref}).$$
#
# PPO-RLHF put the KL into the reward, where it became part of the advantage. GRPO keeps the reward
# clean and puts the KL into the loss. Chapter 03's section "KL as a reward vs KL as a loss" says what
# that changes: differentiated with the tokens held fixed, $k_3$'s gradient is $(1 - r)\nabla \log \pi_\theta$, whose
# expectation over tokens from $\pi_\theta$ is the gradient of $\mathrm{KL}(\pi_\text{ref} \| \pi_\theta)$, the reverse of the KL whose
# value $k_3$ estimates. The tokens come from $\pi_{\theta_\text{old}}$ and the KL term has no importance ratio, so
# after the first minibatch not even that holds exactly; and as a per-token loss it ignores how each
# token changes the KL of the tokens after it. Near the reference the two directions agree to second
# order, which is where $\beta$ keeps the policy, so in practice the term does its job: a tether.
#
# **How to average over tokens** is where the variants differ. With masks $m_{i,t}$, $|y_i| = \sum_t m_{i,t}$,
# $B$ sequences in the batch and $L$ = `max_completion_len`:
#
# | `loss_type` | objective | every ... weighs the same |
# |---|---|---|
# | `"grpo"` | $\frac{1}{B} \sum_i \frac{1}{\lvert y_i \rvert} \sum_t m_{i,t}\, \ell_{i,t}$ | sequence |
# | `"dapo"` | $\frac{1}{\sum_i \lvert y_i \rvert} \sum_{i,t} m_{i,t}\, \ell_{i,t}$ | token |
# | `"dr_grpo"` | $\frac{1}{B \cdot L} \sum_{i,t} m_{i,t}\, \ell_{i,t}$ | token, with a constant denominator |
#
# The reasons:
#
# - **GRPO**'s $1/|y_i|$ gives each token of a short completion a larger share than each token of a long
#   one. With a positive advantage, short answers are favoured; with a negative one, a *long* bad
#   answer is punished less per token than a short bad one, so wrong answers drift longer.
# - **DAPO** (ByteDance 2025) averages over all tokens of the batch: long completions count in
#   proportion to their length. DAPO also **clips higher** ($\varepsilon_\text{high} = 0.28 > \varepsilon_\text{low} = 0.2$:
#   a token with low probability and positive advantage may grow more, which keeps entropy from
#   collapsing) and uses **dynamic sampling** (section 6).
# - **Dr. GRPO** ("GRPO done right", 2025) removes both normalisations that depend on the sample: no
#   $1/|y_i|$ (a constant $B \cdot L$ instead, so the gradient of each token is independent of the length of
#   its sequence) and no std in the advantages (`scale="none"`).
#
# `clip_eps_high=None` means the symmetric clip $\varepsilon_\text{high} = \varepsilon_\text{low}$. Masked tokens must count for
# nothing: not in the sums, not in the token counts.

# %% exercise rlhf_tutorial.grpo:calc_grpo_objective | 30 min | difficulty 4 | importance 5

# %% [markdown]
# The three aggregations on one small batch: a short (2 tokens) and a long (8 tokens) completion with
# the same advantage 1, at the start of a step (ratio 1, no clipping, `beta=0`). The gradient of the
# objective with respect to each token's log-prob shows how much each token is pushed.
#
# **Predict, then check.** From the table above, work out the push per token of the short and of the
# long completion under each `loss_type` (a fraction with $B = 2$, $|y_1| = 2$, $|y_2| = 8$, $L = 8$),
# then run the cell. Which variant favours short completions, and by what factor?

# %%
lengths = torch.tensor([2, 8])
demo_mask = torch.arange(8)[None, :] < lengths[:, None]  # [2 8]
for loss_type in ["grpo", "dapo", "dr_grpo"]:
    logprobs = torch.full((2, 8), -1.0, requires_grad=True)
    objective = calc_grpo_objective(logprobs, logprobs.detach(), logprobs.detach(), torch.tensor([1.0, 1.0]),
                                    demo_mask, beta=0.0, loss_type=loss_type)
    objective.backward()
    short, long = logprobs.grad[0, 0].item(), logprobs.grad[1, 0].item()
    print(f"{loss_type:>8}: push per token: short completion {short:.4f}, long completion {long:.4f}")

# %% [markdown]
# ## 4. The training step
#
# One optimizer step on a batch of groups (a `GroupRollout`, or a minibatch of one):
#
# 1. $\log \pi_\theta$ of the generated tokens under the **current** policy, with gradients. The helper
#    `group_token_logprobs` (imported above: read its docstring) computes them from a batch's tokens and
#    prefix lengths: one forward pass per group (its rows share a prompt, so no padding), through
#    chapter 03's `get_logprobs` on the logits divided by the sampling temperature, the distribution the
#    tokens were drawn from;
# 2. the GRPO objective of those log-probs against the ones stored in the batch at rollout time
#    ($\pi_{\theta_\text{old}}$ and $\pi_\text{ref}$), with the batch's advantages and mask. The function's
#    parameters keep the papers' names, the settings the course's knob names:
#
#    | `calc_grpo_objective` parameter | `GRPOArgs` field |
#    |---|---|
#    | `clip_eps` | `clip_coef` |
#    | `beta` | `kl_coef` |
#    | `clip_eps_high` | `clip_coef_high` |
#    | `loss_type` | `loss_type` |
#    | `max_completion_len` | `max_new_tokens` |
#
# 3. one optimizer step: zero the gradients, backpropagate, clip the global gradient norm to
#    `max_grad_norm`, step. The optimizer is built with `maximize=True` (the objective is climbed, as in
#    the whole course): what do you backpropagate, then?
#
# Name the tensors `logprobs`, `objective` and `grad_norm` (what `clip_grad_norm_` returns): the lines
# after the exercise compute the diagnostics (clip fraction, KL to $\pi_\text{old}$ and to the
# reference) from them.

# %% exercise rlhf_tutorial.grpo:grpo_step | 20 min | difficulty 3 | importance 5

# %% [markdown]
# ## 5. Training: towards negative reviews, as in chapter 03
#
# The trainer (`rlhf_tutorial.trainers.grpo.train`) runs your functions: `learner_functions(globals())` hands
# it your `group_relative_advantages`, `calc_grpo_objective`, `completion_mask`, `sample_group` and
# `grpo_step`. One phase:
#
# 1. `collect_rollout`: $p$ groups of $G$ completions from the policy as it is now ($\pi_\text{old}$),
#    texts scored by the sentiment classifier, advantages per group, and (without gradients) the log-
#    probs of $\pi_\text{old}$ and of the frozen reference;
# 2. $\mu$ = `update_epochs` passes of `grpo_step` over the rollout.
#
# No value head anywhere. The reference is a frozen copy of the starting policy. The tiny world runs
# a shortened version of the CLI's run (`python -m rlhf_tutorial train-grpo --world tiny --direction
# neg --seed 0`): 12 phases instead of 40 and 64 evaluation samples instead of 128. Your `sample_group`
# draws the groups (the trainer's faster sampler of its own is used only with the package's
# `sample_group`), so this is the run of `train-grpo --world tiny --direction neg --seed 0 --num-phases
# 12 --eval-samples 64 --no-fast` (`--no-fast` samples with `sample_group` too). On the reference machine
# it ends at reward {{grpo_short_nofast.mean_reward_final:.2f}} (from {{grpo_short_nofast.mean_reward_initial:.2f}}) with a KL of {{grpo_short_nofast.kl_final:.2f}} per token; the cell
# checks that your run agrees. `GRPOArgs` documents every knob.

# %%
args = GRPOArgs.preset(world, direction=direction, seed=0, **smoke_sizes(num_phases=2, eval_samples=32))
if is_tiny() and not is_smoke():
    args.num_phases, args.eval_samples = 12, 64
curves = grpo_dashboard(title=f"GRPO on the {world} world, towards {direction}")
result = train(args, reward_fn=sentiment_reward, callback=curves.update, **learner_functions(globals()))
curves.finish()
figures.agree("grpo_short_nofast", {"mean_reward_initial": result.eval_initial["reward"],
                                    "mean_reward_final": result.eval_final["reward"], "kl_final": result.eval_final["kl"]})
print(f"mean reward: {result.eval_initial['reward']:.3f} -> {result.eval_final['reward']:.3f}, "
      f"KL per token {result.eval_final['kl']:.3f}, {len(result.history)} phases, {result.wall_seconds:.0f} s")

# %%
for name, stats in [("base", result.eval_initial), ("tuned", result.eval_final)]:
    print(f"{name:>6}: reward {stats['reward']:.3f}, 3-gram repetition {stats['repetition']:.3f}, "
          f"completion length {stats['completion_len']:.1f} tokens")
    for text, r in list(zip(stats["texts"], stats["rewards"]))[:3]:
        print(f"        {r:.2f}  {text!r}")

# %% [markdown]
# ## 6. When a whole group gets the same reward
#
# The classifier's reward is a probability: two different texts almost never score exactly alike,
# so every group carries some signal (sometimes too much: a group of near-identical probabilities
# gets advantages of $\pm 1$ after division by its tiny std). A **verifiable** reward is different.
# `reward_fn_rule` gives 1 when a review mentions an aspect *and* has ended within
# `max_sentences` sentences, else 0. No model is asked: anyone can check it, and it cannot be
# fooled the way a classifier can. Rewards like this (a correct final answer, passing unit tests)
# are what GRPO was made for. Here: mention the **acting** and end within **3** sentences.

# %%
print(reward_fn_rule(["This movie was really dull. The acting was wooden.",
                      "This movie was really dull. The acting was wooden. The plot was thin. I left early.",
                      "This movie was really good. The plot was superb.",
                      "This movie was really dull and the acting"], aspect="acting", max_sentences=3))

# %% [markdown]
# But a 0/1 reward makes **all-equal groups** common: on a prompt where none of the $G$ samples
# succeeds (or all do) every advantage is 0 and the group teaches nothing, while still costing
# its sampling and forward passes. The diagnostic is `frac_reward_zero_std`: the fraction of groups
# whose rewards have zero spread. DAPO's **dynamic sampling** drops those groups and samples new
# prompts until the batch is full of groups that carry signal (`dynamic_sampling=True`, at most
# `max_sampling_rounds` rounds per phase, each round sampling as many groups as are still missing).
# When the rounds run out first, the phase trains on the groups it kept, fewer than $p$: the run
# prints both counts (`groups sampled`, `groups kept`).
#
# The run below trains the rule reward on three review openings (`RULE_PROMPTS`, none of which
# mentions the acting), 8 groups of 8 per phase, 40 tokens at most, with dynamic sampling on. The
# base policy rarely earns the reward, so at first most groups are all zeros: `frac_reward_zero_std`
# (measured on the groups sampled, before dropping) starts high, dynamic sampling draws all its rounds
# and still keeps fewer than 8 groups. As the policy learns it falls (and the phases fill up); once
# the policy succeeds on most samples, groups of all ones appear and it rises again.

# %%
rule_args = GRPOArgs.preset(world, reward="rule", aspect="acting", max_sentences=3, seed=0, dynamic_sampling=True,
                           **smoke_sizes(num_phases=2, eval_samples=16))
if is_tiny() and not is_smoke():
    rule_args.num_phases, rule_args.eval_samples = 14, 48
rule_curves = grpo_dashboard(title="GRPO with a verifiable rule reward (mention the acting, <= 3 sentences)")
rule_result = train(rule_args, callback=rule_curves.update, **learner_functions(globals()))
rule_curves.finish()
print(f"prompts: {rule_args.prompts}")
print(f"rule reward: {rule_result.eval_initial['reward']:.3f} -> {rule_result.eval_final['reward']:.3f}")
print("frac_reward_zero_std per phase:", [round(r["frac_reward_zero_std"], 2) for r in rule_result.history])
print("groups sampled per phase:      ", [r["groups_sampled"] for r in rule_result.history])
print("groups kept per phase:         ", [r["groups_kept"] for r in rule_result.history])

# %%
for text, r in list(zip(rule_result.eval_final["texts"], rule_result.eval_final["rewards"]))[:5]:
    print(f"{r:.0f}  {text!r}")

# %% [markdown]
# ### Truncated completions: overlong filtering and the soft overlong penalty
#
# A completion that reaches `max_new_tokens` without an EOS was cut off. `reward_fn_rule` gives it 0
# (it has not ended), so a cut-off review that was about to satisfy the rule gets the same advantage
# as one that never would have: the reward blames the length limit on the text. DAPO names two fixes:
#
# - **overlong filtering**: leave truncated completions out of the loss (mask all their tokens), so the
#   limit teaches nothing either way;
# - **soft overlong punishment**: a length penalty that starts before the hard limit. With the limit
#   $L_\text{max}$ and a buffer $L_\text{cache}$, a completion of $|y|$ tokens gets
#
# $$R_\text{length}(y) = \begin{cases} 0 & |y| \le L_\text{max} - L_\text{cache} \\ \dfrac{(L_\text{max} - L_\text{cache}) - |y|}{L_\text{cache}} & L_\text{max} - L_\text{cache} < |y| \le L_\text{max} \\ -1 & |y| > L_\text{max} \end{cases}$$
#
#   added to its reward: a smooth signal to finish before the limit, instead of a cliff at it. (Where
#   generation stops at $L_\text{max}$, the last case is the truncated one.)
#
# This course does not implement them as options; the cell computes both on the rule run's last rollout
# ($L_\text{max}$ = 40, $L_\text{cache}$ = 10): which completions were truncated, what the rule paid them, and the
# soft penalty.

# %%
last = rule_result.last_rollout
eos = eos_id(policy)
# on the CPU, beside the rewards (a rollout keeps its rewards there, its tokens on the model's device)
completion_lens = last.mask.sum(-1).cpu()  # [B]: tokens up to and including the first EOS
has_eos = torch.cat([(group[:, p:] == eos).any(-1) for group, p in zip(last.tokens, last.prefix_lens)]).cpu()
truncated = ~has_eos
L_max, L_cache = rule_args.max_new_tokens, 10
soft_penalty = (((L_max - L_cache) - completion_lens).float() / L_cache).clamp(-1.0, 0.0)
soft_penalty[truncated] = -1.0
rule_rewards = last.rewards.flatten()
print(truncation_text(truncated.tolist(), rule_rewards.tolist(), L_max))
print(f"completion lengths: mean {completion_lens.float().mean().item():.1f}, max {int(completion_lens.max())}")
print(f"soft overlong penalty: mean {soft_penalty.mean().item():.3f}, "
      f"non-zero for {int((soft_penalty < 0).sum())} completions")

# %% [markdown]
# ## 7. The variants, in `GRPOArgs`
#
# | variant | what changes | `GRPOArgs` | why |
# |---|---|---|---|
# | GRPO (DeepSeekMath) | | `loss_type="grpo"`, `scale="group"` | the original |
# | Dr. GRPO | no $1/\lvert y_i \rvert$, no std | `loss_type="dr_grpo"`, `scale="none"` | removes the length bias and the difficulty bias of the std |
# | DAPO | token-level mean, clip-higher, dynamic sampling | `loss_type="dapo"`, `clip_coef_high=0.28`, `dynamic_sampling=True` | long completions count fully; exploration; no wasted groups |
# | iterative GRPO | the reference follows the policy | `ref_refresh_every=k` | the KL anchor moves every $k$ phases, so the policy can travel further from the base model over a long run |
#
# DeepSeekMath's iterative variant resets the reference to the current policy at the start of each
# outer iteration (and keeps training the reward model, which a fixed classifier or rule does not
# need). The price is a weaker anchor: the KL term then only limits the distance from where the
# policy was $k$ phases ago.
#
# One practical consequence of Dr. GRPO's `scale="none"`: the advantages are $r_i - \operatorname{mean}(r)$, in
# the units of the reward. With rewards in $[0, 1]$ they are several times smaller than GRPO's
# standardised ones. That does **not** make the same learning rate move the policy more slowly: Adam
# divides each gradient by a running estimate of its own scale, so a global rescale of the gradient
# barely changes the step (chapter 01). What does change is the **balance inside the objective**: the
# advantage term shrinks while $\beta \cdot k_3$ does not, so the same $\beta$ is a stronger tether; and the
# gradient norm shrinks, so `max_grad_norm` clips less often. With `scale="none"`, $\beta$ and the clip norm
# have to be retuned with the reward's scale.
#
# `kl_coef` ($\beta$) is the other knob: DeepSeekMath used 0.04; several later recipes (DAPO, Dr. GRPO) set it to 0
# and drop the reference model altogether. DAPO's reason: in long chain-of-thought reasoning the policy is
# meant to move far from the initial model, so a penalty that holds it near that model is unnecessary,
# even harmful.

# %% [markdown]
# ## 8. PPO and GRPO side by side
#
# The same task (negative sentiment from the course prompt), the same seed, the same number of
# phases, 64 samples per phase each: chapter 03's PPO trainer and GRPO (8 groups of 8), both the
# package's reference code, run through their command lines. Each run is a **fresh process**, so its
# wall time and its peak memory (the peak resident set of the process on a CPU, CUDA's peak allocation
# on a GPU, as both commands report it in `peak_memory_mb`) are its own: measured in this kernel, the memory freed by an earlier run would
# be reused by the next and hide its cost. Both include loading the models and evaluating before and
# after. In the tiny world the runs here are short; the full runs are the same two commands without
# the shortening flags:
#
# ```
# python -m rlhf_tutorial train-rlhf --world tiny --direction neg --seed 0 | tail -n 1 > ppo.json
# python -m rlhf_tutorial train-grpo --world tiny --direction neg --seed 0 --compare ppo.json --report grpo.html
# ```
#
# (Times measured on a shared machine are noisy: compare runs made one after the other.)

# %%
def run_cli(command: str, *flags: str) -> dict:
    """Run `python -m rlhf_tutorial <command> ...` in a fresh process and return its JSON summary."""
    cmd = [sys.executable, "-m", "rlhf_tutorial", command, "--world", world, "--direction", direction,
           "--seed", "0", "--no-progress", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


COMPARE_PHASES = 2 if is_smoke() else (10 if is_tiny() else 60)
short = ["--eval-samples", "32", "--threads", "1"] if is_tiny() or is_smoke() else []
runs = {"PPO": ("train-rlhf", "--no-early-stopping"), "GRPO": ("train-grpo",)}
summaries = {}
bar = tqdm(runs.items(), desc="PPO vs GRPO", total=len(runs))  # each run takes about 10-30 s here
for name, (command, *extra) in bar:
    bar.set_postfix_str(f"running {command} ({COMPARE_PHASES} phases)")
    summaries[name] = run_cli(command, "--num-phases", str(COMPARE_PHASES), *extra, *short)
ppo_summary, grpo_summary = summaries["PPO"], summaries["GRPO"]
ppo_summary["samples_per_phase"] = ppo_summary["args"]["batch_size"]
for name, summary in [("PPO", ppo_summary), ("GRPO", grpo_summary)]:
    print(f"{name:>4}: reward {summary['mean_reward_initial']:.3f} -> {summary['mean_reward_final']:.3f}, "
          f"KL {summary['kl_final']:.3f}, {summary['phases']} phases x {summary['samples_per_phase']} samples, "
          f"{summary['wall_seconds']:.1f} s, peak memory {summary['peak_memory_mb']:.0f} MB")
    split = summary["seconds_per_phase"]  # where a phase's seconds went, in the order a phase spends them
    parts = ["sampling", "scoring", "old_logprobs", "ref_logprobs", "optimisation", "other"]
    print(f"      one phase {split['phase']:.2f} s: "
          + ", ".join(f"{part.replace('_', ' ')} {split.get(part, 0.0):.2f}" for part in parts))
comparison_figure({"PPO": ppo_summary, "GRPO": grpo_summary},
                  title=f"PPO vs GRPO, {world} world, {COMPARE_PHASES} phases, seed 0")

# %% [markdown]
# What to read from the figure:
#
# - **Reward per phase.** Both see 64 completions of the course prompt per phase. PPO compares each
#   one with a learned value (a per-token baseline that has to be trained first); GRPO compares it
#   with the mean of its group of 8 (a baseline that is right from the first phase, but noisier, and
#   one number for the whole completion). On a task this easy both climb within a few phases; the
#   shape of GRPO's curve depends on $G$ and $p$ (more samples per group: a better baseline, fewer
#   groups).
# - **Wall time.** Both spend their time in the same places: sampling, and forward and backward
#   passes of the same policy (plus one reference forward); the second line printed for each run
#   splits one phase into them. GRPO's phases are shorter, even at this scale: PPO's learning passes
#   also run and train the value head, and PPO's rollout makes a forward pass of its own for
#   $\pi_{\theta_\text{old}}$'s log-probs, which GRPO's own sampler (the one the command runs) records
#   while it samples. GRPO's completions may stop at EOS, but here almost none does (see **KL**), so
#   that saves nothing.
# - **Memory.** At this scale the peak of a process is mostly Python, PyTorch and the three models
#   (policy, reference, classifier), the same in both: expect bars of similar height. The saving
#   GRPO is known for appears where the critic is a separate model as large as the policy (the usual
#   set-up for large language models): GRPO never holds that model, its gradients or its optimizer
#   state. Here the value head is a small MLP on the policy's last layer.
# - **KL.** The full CLI runs (chapter 03's `train-rlhf ... --no-fast`, {{rlhf_neg.phases}} PPO phases, and the GRPO command
#   above, {{grpo_neg.phases}} phases) ended,
#   on the reference machine, at reward {{rlhf_neg.mean_reward_final:.2f}} with KL {{rlhf_neg.kl_final:.2f}} per token (PPO) and reward
#   {{grpo_neg.mean_reward_final:.2f}} with KL {{grpo_neg.kl_final:.2f}} per token (GRPO): GRPO pays more KL for the same reward. The two
#   KL numbers are measured the same way (k3 per generated token, 128 fresh samples at temperature 1,
#   against the starting policy). GRPO stops at EOS and PPO does not, but that is not the gap: GRPO's
#   final samples are {{grpo_neg.completion_len_final:.2f}} tokens long on average, of the 16 allowed ({{grpo_neg.completion_len_initial:.2f}} before training),
#   so almost none has ended early and both ways of averaging count the same tokens. (A k3 mean over
#   128 samples is noisy: a few tokens the policy has made unlikely carry large values.)
#   The gap comes from training, and the runs differ in more than one way,
#   so read the following as the candidates, not a measured decomposition: (1) **where the penalty
#   acts**: PPO pays $\beta k_1$ in the per-token rewards, so through the return every token is charged
#   for the KL of the whole rest of the sequence; GRPO's $\beta k_3$ is a per-token loss that charges
#   each token only its own KL, and whose gradient follows $\mathrm{KL}(\pi_\text{ref} \| \pi_\theta)$ (chapter 03); (2) **the
#   schedule**: PPO's learning rate decays linearly towards a tenth (reached just after the last
#   phase), GRPO's stays constant. The
#   same $\beta = 0.1$ is not the same tether in the two algorithms. The runs above are much shorter
#   and end before either reward has levelled off, at two different rewards: their KLs (printed above
#   the figure) may come out in either order.
#
# ## 9. The group viewer
#
# The last rollout of the run of section 5, one group at a time: each completion with its reward and
# its advantage (rows sorted by advantage), each token outlined where the ratio
# $\pi_\theta / \pi_{\theta_\text{old}}$, after the phase's updates, has left the clip range on the side of its
# advantage (the clipped branch of the min wins: the surrogate gives that token no gradient, though
# $\beta\, k_3$ still pulls it towards the reference). Hover a token for its ratio.

# %%
groups = group_record(result.policy, result.last_rollout, args)
group_viewer(groups)

# %%
progress("04")

# %% [markdown]
# ## 10. The rest of the field: REINFORCE++, CISPO, and a sampler that disagrees
#
# GRPO fixed two choices: the baseline (the group's mean) and the update (PPO's clipped ratio, per
# token). Chapter 06 changes each once (RLOO's leave-one-out baseline, GSPO's one ratio per sequence).
# Here are three more pieces that large runs use, each a few lines.
#
# **REINFORCE++** (Hu 2025) keeps no group baseline at all. The KL to the reference goes back into the
# reward, as in chapter 03, one penalty per token ($k_1 = \log \pi_{\theta_\text{old}} - \log \pi_\text{ref}$
# of the sampled token); the sequence reward $R$ comes at the end; and a token's return is everything
# from it to the end (no discount, $\gamma = 1$):
#
# $$G_{b,t} = R_b - \beta \sum_{s \ge t} k_1(b, s)$$
#
# The baseline is then the mean of all returns of the *batch*: the returns are whitened over every
# unmasked token at once (chapter 02's `whiten`: the mean and the biased variance, over the tokens where
# the mask is True only), so that a token's advantage says how its return compares with all the batch's tokens, not
# only its siblings'. Each token gets its own advantage: the objective takes a `[B, g]` tensor where
# GRPO's took one number per completion.

# %% exercise rlhf_tutorial.grpo:reinforce_pp_advantages | 20 min | difficulty 3 | importance 3

# %% [markdown]
# **CISPO** (MiniMax 2025) changes the update. PPO's clip keeps a token's ratio in
# $[1 - \varepsilon, 1 + \varepsilon_\text{high}]$ by giving the token *no gradient* once the ratio has left the
# range on the side of its advantage. A rare token that the update makes much more likely (the "aha"
# tokens of a reasoning trace) hits the upper bound at once and stops learning for the rest of the
# phase. CISPO clips the importance *weight* instead and keeps every token's gradient:
#
# $$J = \frac{1}{\sum_{b,t} m_{b,t}} \sum_{b,t} m_{b,t}\, \mathrm{sg}\big(\mathrm{clip}(r_{b,t}, 1 - \varepsilon_\text{low}, 1 + \varepsilon_\text{high})\big)\, A_b \log \pi_\theta(y_{b,t})$$
#
# $\mathrm{sg}$ is stop-gradient: the clipped ratio is a number that scales the REINFORCE gradient
# $A \nabla \log \pi_\theta$ of each token, so a token whose ratio is far out of range is pushed less hard,
# never not at all. The mean is over all the batch's tokens, as DAPO's. The value of $J$ means nothing on
# its own (it contains $\log \pi_\theta$); its gradient is what counts.

# %% exercise rlhf_tutorial.grpo:cispo_objective | 20 min | difficulty 3 | importance 3

# %% [markdown]
# **Predict, then check.** One token with advantage 1 whose ratio has grown to 2 (past
# $1 + \varepsilon_\text{high} = 1.28$), and one with ratio 1.1: what gradient with respect to each token's
# log-prob does GRPO's objective give (with $\beta = 0$), and what does CISPO's?

# %%
demo_lp = torch.tensor([[2.0, 1.1]]).log().requires_grad_(True)  # log-probs whose ratios to pi_old = 1 are 2 and 1.1
demo_old, demo_adv, demo_mask = torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool)
grpo_grad, = torch.autograd.grad(
    calc_grpo_objective(demo_lp, demo_old, demo_old, demo_adv, demo_mask, beta=0.0, loss_type="dapo",
                        clip_eps_high=0.28), demo_lp)
cispo_grad, = torch.autograd.grad(cispo_objective(demo_lp, demo_old, demo_adv, demo_mask), demo_lp)
print(f"GRPO : gradient per token {grpo_grad[0].tolist()}")
print(f"CISPO: gradient per token {cispo_grad[0].tolist()}")

# %% [markdown]
# **When the sampler and the trainer disagree.** Large runs sample with a fast inference engine
# (vLLM, SGLang) in low precision and train with another program in higher precision. The two compute
# slightly different probabilities for the same tokens: the tokens come from the sampler's
# distribution $\mu$, but the update treats them as if they came from the trainer's $\pi_{\theta_\text{old}}$.
# The correction is an importance weight per token, truncated at a cap $C$ so that one token on which
# the two disagree wildly cannot dominate the update (truncated importance sampling, TIS):
#
# $$w_{b,t} = \min\!\Big(\frac{\pi_{\theta_\text{old}}(y_{b,t})}{\mu(y_{b,t})},\; C\Big)$$
#
# computed from the two log-probs, constant (no gradient), 0 where the mask is False; the objective's
# per-token terms are multiplied by it.

# %% exercise rlhf_tutorial.grpo:truncated_is_weights | 10 min | difficulty 2 | importance 3

# %% [markdown]
# How large is the disagreement? Below, a bfloat16 copy of the policy samples a group (bfloat16 keeps 8 bits
# of mantissa where float32 keeps 24, the precision inference engines often sample in), and the float32
# policy, the trainer, scores the same tokens. Your `truncated_is_weights` turns the two into weights.

# %%
sampler = copy.deepcopy(policy).to(torch.bfloat16)  # the "inference engine": the same weights, rounded
sampler.cfg.dtype = torch.bfloat16
mismatch_prompt = policy.to_tokens(prompt)[0]
with torch.no_grad():
    mismatch_tokens, mismatch_mask = sample_group(sampler, mismatch_prompt, 16, 16, eos_id(policy), 1.0)
    sampler_lp = group_token_logprobs(sampler, [mismatch_tokens], [len(mismatch_prompt)]).float()
    trainer_lp = group_token_logprobs(policy, [mismatch_tokens], [len(mismatch_prompt)])
log_ratio = (trainer_lp - sampler_lp)[mismatch_mask]
tis = truncated_is_weights(trainer_lp, sampler_lp, mismatch_mask, cap=2.0)
print(f"{int(mismatch_mask.sum())} tokens: mean |log pi - log mu| = {log_ratio.abs().mean():.4f}, "
      f"largest {log_ratio.abs().max():.4f}; mean |pi - mu| = "
      f"{(trainer_lp.exp() - sampler_lp.exp())[mismatch_mask].abs().mean():.4f}")
print(f"weights: mean {tis[mismatch_mask].mean():.4f}, from {tis[mismatch_mask].min():.4f} to "
      f"{tis[mismatch_mask].max():.4f}; {(log_ratio.exp() > 2.0).sum().item()} above the cap")

# %% [markdown]
# **Does the correction matter here?** The trainer can sample in bfloat16 while it trains in float32
# (`sampler_dtype="bfloat16"`; its phases then record the mismatch) and multiply every token's advantage
# by its truncated weight (`tis_cap`):
#
# ```bash
# python -m rlhf_tutorial train-grpo --world tiny --num-phases 12 --sampler-dtype bfloat16               # no correction
# python -m rlhf_tutorial train-grpo --world tiny --num-phases 12 --sampler-dtype bfloat16 --tis-cap 2.0
# ```
#
# On the reference machine, over the run without correction, the per-token $|\log \pi_{\theta_\text{old}} - \log \mu|$
# averaged {{mismatch_bf16.mismatch_abs_logratio:.3f}} (the probabilities themselves differed by
# {{mismatch_bf16.mismatch_abs_prob:.4f}} on average) and reached {{mismatch_bf16.mismatch_max_abs_logratio_all:.2f}}
# at most; with the correction the mean weight was {{mismatch_bf16_tis.tis_weight_mean:.4f}}, and a fraction
# {{mismatch_bf16_tis.mismatch_frac_above_cap:.1f}} of the tokens reached the cap. The two runs end at a
# mean reward of {{mismatch_bf16.mean_reward_final:.2f}} without and {{mismatch_bf16_tis.mean_reward_final:.2f}}
# with the correction (KL {{mismatch_bf16.kl_final:.2f}} and {{mismatch_bf16_tis.kl_final:.2f}}): a difference
# smaller than the standard error of a reward measured on 64 samples ({{frontier_short.base.reward_se:.2f}}),
# and about the size of the one between two float32 GRPO runs whose samplers differ only in their code
# (section 5's {{grpo_short_nofast.mean_reward_final:.2f}} and chapter 06's {{grpo_short.mean_reward_final:.2f}}).
# **At this size the correction is not measurable**: the tiny model's log-probabilities move by a few
# hundredths per token in bfloat16, and no weight comes near the cap. The mismatch grows with depth, vocabulary and
# sequence length (rounding errors add up over layers and over the tokens of a long completion), and
# with a mixture-of-experts model whose router picks different experts in the two programs; that is where
# large runs found their training collapsing without the correction.
#
# **REINFORCE++ and CISPO in the trainer.** `advantage_estimator="reinforce_pp"` computes the advantages
# with `reinforce_pp_advantages` (the KL in the reward, weighted by `kl_coef`, so the objective has no KL
# term) and trains PPO's clipped surrogate on them, token by token; `policy_loss="cispo"` replaces the
# objective by `cispo_objective` with `clip_coef` and `clip_coef_high` as its bounds (and `kl_coef` times k3).
# Like GSPO's option, each needs the reference `grpo_step`, and they exclude each other. Pass your own
# versions as keywords (`train(args, **learner_functions(globals()))`), or from the command line:
#
# ```bash
# python -m rlhf_tutorial train-grpo --world tiny --num-phases 12 --advantage-estimator reinforce_pp
# python -m rlhf_tutorial train-grpo --world tiny --num-phases 12 --policy-loss cispo
# ```
#
# On the reference machine, in the 12 phases of chapter 06's runs, REINFORCE++ lifted the mean reward from
# {{reinforce_pp_short.mean_reward_initial:.2f}} to {{reinforce_pp_short.mean_reward_final:.2f}} (KL
# {{reinforce_pp_short.kl_final:.2f}} per token) and CISPO to {{cispo_short.mean_reward_final:.2f}} (KL
# {{cispo_short.kl_final:.2f}}), beside GRPO's {{grpo_short.mean_reward_final:.2f}} (KL {{grpo_short.kl_final:.2f}}):
# one seed each, on a task this easy, so these rank nothing; they show that each update learns.

# %% [markdown]
# ## What to try next
#
# - Dr. GRPO and DAPO on the sentiment task: `loss_type="dr_grpo", scale="none"` and `loss_type="dapo",
#   clip_coef_high=0.28`. Compare the completion lengths (`completion_len` in the history).
# - `kl_coef=0.0`: nothing pulls the policy back to the reference (the trainer still keeps the
#   reference and runs it, to log `kl`). How far does the policy drift and do the reviews stay reviews
#   (`repetition`)?
# - `group_size=2` versus `16` with the same number of samples per phase: the quality of the baseline
#   against the number of prompts.
# - The iterative variant, `ref_refresh_every=5`, over a longer run: does the KL to the *original*
#   model grow faster?
# - A rule of your own: a review that mentions two aspects, or that ends with a verdict sentence.
#   Check its base rate first: a reward the base policy never earns gives only all-equal groups.
# - From the command line, all of the above are flags:
#   `python -m rlhf_tutorial train-grpo --world tiny --loss-type dr_grpo --scale none --seed 0`.

# %% [markdown]
# ## 11. Scaling up: from this course to TRL
#
# Past one machine, use a library built for it rather than these trainers: Hugging Face's
# [TRL](https://huggingface.co/docs/trl) with `accelerate`. Everything you built maps onto it.
#
# **The model.** `export-hf` turns a policy into a transformers folder with the same logits (tested to
# 1e-4). TransformerLens folded the LayerNorms and centred the unembedding; that is the same function,
# so it maps onto GPT-2 exactly, except for the unembedding's bias $b_U$ (GPT-2's head has none), which
# the export keeps in a biased head (`GPT2WithUnembedBias`, a `GPT2LMHeadModel` subclass). A chapter-03
# checkpoint's value head is saved beside it.
#
# ```bash
# python -m rlhf_tutorial export-hf --world tiny --out policy_hf            # the base policy
# python -m rlhf_tutorial train-rlhf --world tiny --save tuned              # chapter 03, then
# python -m rlhf_tutorial export-hf --checkpoint tuned --out tuned_hf       # the tuned one + value head
# ```
#
# **The reward and the settings.** A TRL reward function takes the prompts and the completions (text)
# and returns one float each; our `GRPOArgs` become a `GRPOConfig`
# (`rlhf_tutorial.trainers.bench_trl.trl_config` is the mapping used to race the two):
#
# | `GRPOArgs` | `GRPOConfig` |
# |---|---|
# | `group_size` (G) | `num_generations` |
# | `groups_per_phase * group_size` (64 a phase) | `per_device_train_batch_size * steps_per_generation` (x GPUs) |
# | `num_minibatches` | `steps_per_generation` |
# | `update_epochs` (mu) | `num_iterations` |
# | `max_new_tokens`, `temperature`, `top_k` | `max_completion_length`, `temperature`, `top_k` |
# | `learning_rate` (constant), `max_grad_norm` | `learning_rate` + `lr_scheduler_type="constant"`, `max_grad_norm` |
# | `clip_coef`, `clip_coef_high`, `kl_coef` | `epsilon`, `epsilon_high`, `beta` |
# | `loss_type`, `scale` | `loss_type`, `scale_rewards` |
#
# ```python
# # train_trl.py: the sentiment GRPO run of this chapter, on TRL
# import rlhf_tutorial.trainers.export                      # registers the biased-head GPT-2 with transformers
# from datasets import Dataset
# from trl import GRPOConfig, GRPOTrainer
# from rlhf_tutorial.trainers.grpo import GRPOArgs, make_reward_fn
#
# ours = GRPOArgs.preset("tiny")
# score = make_reward_fn(ours)                     # texts -> rewards, as in section 5
#
# def reward(prompts, completions, **kwargs):
#     return score([p + c for p, c in zip(prompts, completions)]).tolist()
#
# config = GRPOConfig(
#     output_dir="grpo_trl", num_generations=8, per_device_train_batch_size=16, steps_per_generation=4,
#     num_iterations=2, max_completion_length=16, learning_rate=3e-4, lr_scheduler_type="constant",
#     beta=0.1, epsilon=0.2, loss_type="grpo", scale_rewards="group", max_steps=320,
#     bf16=False, gradient_checkpointing=False,
# )
# prompts = Dataset.from_dict({"prompt": ["This movie was really"] * 320})
# GRPOTrainer(model="policy_hf", reward_funcs=reward, args=config, train_dataset=prompts).train()
# ```
#
# **Several GPUs.** The same script runs on every GPU of a machine (or several machines) with
# `accelerate launch --num_processes 4 train_trl.py`. Each process samples and trains on its own
# share: `per_device_train_batch_size` is per GPU, so divide it by the number of GPUs to keep 64
# completions a phase (TRL checks that the global batch is a multiple of `num_generations`);
# `accelerate config` sets up DeepSpeed or FSDP when the model no longer fits one GPU.
#
# **Several processes, on this machine.** `scale-trl` runs this chapter's run through that path: it
# exports the policy, starts TRL with `accelerate launch` and N processes (on a CPU they talk over
# gloo; on a machine with N GPUs the same command starts one process per GPU), with the settings of
# the table shared between the processes as above, and loads the trained weights back into a
# `HookedTransformer` to measure them as this chapter does:
#
# ```bash
# python -m rlhf_tutorial scale-trl --world tiny --num-processes 2 --algo grpo   # --algo dpo: chapter 06's DPO
# ```
#
# On the reference machine's CPU: {{scale_grpo.samples_per_phase}} completions a phase,
# {{scale_grpo.samples_per_phase_per_process.0}} sampled by each process; mean reward
# {{scale_grpo.reward_before:.2f}} -> {{scale_grpo.reward_after:.2f}} in {{scale_grpo.phases}} phases
# ({{scale_grpo.train_seconds_per_phase:.2f}} s a phase; peak memory
# {{scale_grpo.peak_memory_mb_per_process.0:.0f}} and {{scale_grpo.peak_memory_mb_per_process.1:.0f}} MB
# per process while training). The two processes sampled different completions (each seeds its sampler
# with its rank), yet they end with the same weights to the last bit: before every optimizer step,
# data-parallel training averages the gradients over the processes (an all-reduce), so each process
# takes the same step. `make test` checks this with two processes on every run
# (`tests/test_scale_trl.py`), and that the result loads back into a `HookedTransformer`.
#
# **How fast are ours?** `python -m rlhf_tutorial bench-trl --algo grpo` races our trainer against
# TRL's on the exported tiny policy with the settings above, alternating runs over seeds 0-3, and
# prints each side's time per phase (split into sampling, scoring, old and reference log-probs and
# optimisation), time to a mean reward of 0.9, final reward and peak memory. `--algo ppo` races
# chapter 03's trainer against TRL 1.12's `PPOTrainer` (by then moved to `trl.experimental`; a later
# release removed it) and `--algo dpo` chapter 06's against TRL's `DPOTrainer`. The README lists the
# figures measured here and every setting TRL expresses differently.
