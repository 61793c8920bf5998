# %% [markdown]
# # 06. DPO and friends, and every method of the course on one reward-KL frontier
#
# Chapters 03 and 04 tuned the policy with reinforcement learning: sample, score, push up what scored
# well, with a KL penalty that keeps the policy near a reference. This chapter starts from the
# objective those methods share and shows that, given **preference pairs**, the RL loop can be
# replaced by a logistic loss on pairs: **DPO** (Direct Preference Optimization, Rafailov et al. 2023)
# and its relatives IPO, a hinge loss (RSO, after SLiC), conservative DPO and SimPO. Then two ideas from
# critic-free RL become options of chapter 04's GRPO trainer (**RLOO**'s leave-one-out advantages and
# **GSPO**'s sequence-level ratio), and the chapter ends by rebuilding the DPO
# paper's best-known figure: every method of the course, at several KL strengths, on the plane of
# mean reward against KL(policy || reference).
#
# | | PPO (03) | GRPO, with RLOO advantages or GSPO's ratio (04, here) | DPO / IPO (here) |
# |---|---|---|---|
# | data | samples of the policy, scored | groups of samples of the policy, scored | pairs (chosen, rejected), labelled once |
# | reward model at training time | yes | yes | **no** (the labels are in the pairs) |
# | sampling during training | every phase | every phase | none (offline) / once a round (online) |
# | critic | value head | none (group baseline) | none |
# | KL to the reference | in the reward | in the loss (k3) | implicit, through beta |

# %% imports
import copy

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlhf_tutorial import check, figures, hint, progress
from rlhf_tutorial.devices import describe
from rlhf_tutorial.grpo import group_relative_advantages
from rlhf_tutorial.rewards import sentiment_reward_fn
from rlhf_tutorial.trainers.dpo import DPOArgs, pairs_from_samples
from rlhf_tutorial.trainers.dpo import learner_functions as dpo_learner_functions
from rlhf_tutorial.trainers.dpo import train as train_dpo
from rlhf_tutorial.trainers.frontier import METHODS, FrontierArgs, rewards_at_common_kl, run_frontier
from rlhf_tutorial.trainers.grpo import GRPOArgs
from rlhf_tutorial.trainers.grpo import learner_functions as grpo_learner_functions
from rlhf_tutorial.trainers.grpo import train as train_grpo
from rlhf_tutorial.widgets.dpo import FrontierTable, cost_figure, dpo_curves, dpo_dashboard, frontier_figure
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
print(f"world: {world}, prompt: {prompt!r}")

# %% [markdown]
# ## 1. From RLHF to DPO: the math
#
# For a prompt $x$, RLHF looks for the policy that maximises the reward minus a KL penalty to the
# reference $\pi_\text{ref}$ (chapter 03's objective, where $\beta$ is `RLHFArgs.kl_coef`; here it is `DPOArgs.beta`):
#
# $$\max_\pi\; \mathbb{E}_{y \sim \pi(\cdot \mid x)}\big[r(x, y)\big] \;-\; \beta\, \mathrm{KL}\big(\pi(\cdot \mid x)\,\|\,\pi_\text{ref}(\cdot \mid x)\big).$$
#
# **The optimal KL-regularised policy.** Write the objective as
# $-\beta\, \mathrm{KL}\big(\pi \,\|\, \pi_\text{ref}\, e^{r/\beta} / Z(x)\big) + \beta \log Z(x)$ with
# $Z(x) = \sum_y \pi_\text{ref}(y \mid x)\, e^{r(x, y)/\beta}$ (expand the KL to check it). The second term does not
# depend on $\pi$ and a KL is smallest (zero) when its two arguments agree, so the optimum is
#
# $$\pi^*(y \mid x) = \frac{1}{Z(x)}\, \pi_\text{ref}(y \mid x)\, \exp\!\big(r(x, y) / \beta\big):$$
#
# the reference, reweighted by the exponentiated reward. Small $\beta$: chase the reward; large $\beta$:
# stay with the reference. $Z(x)$ sums over every possible completion, so we cannot compute $\pi^*$.
#
# **The implicit reward.** Solve the same equation for $r$:
#
# $$r(x, y) = \beta \log \frac{\pi^*(y \mid x)}{\pi_\text{ref}(y \mid x)} + \beta \log Z(x).$$
#
# Any policy $\pi$ defines the reward $\hat r(x, y) = \beta \log \pi(y \mid x) / \pi_\text{ref}(y \mid x)$ for which
# it is optimal, up to $\beta \log Z(x)$, a term in $x$ alone.
#
# **The Bradley-Terry likelihood of a pair.** Chapter 02's reward model was fitted to pairs with
# $P(y_w \succ y_l \mid x) = \sigma\big(r(x, y_w) - r(x, y_l)\big)$. Only the *difference* of two rewards
# of the same prompt enters, so $\beta \log Z(x)$ cancels, and with the implicit reward the likelihood
# of the preference data is a function of the policy alone:
#
# $$\mathcal{L}_\text{DPO}(\pi) = -\mathbb{E}_{(x, y_w, y_l)}\Big[\log \sigma\big(\beta h\big)\Big], \qquad
# h = \log \frac{\pi(y_w \mid x)}{\pi_\text{ref}(y_w \mid x)} - \log \frac{\pi(y_l \mid x)}{\pi_\text{ref}(y_l \mid x)}.$$
#
# Minimising it fits a reward model whose parameters *are* the policy: no separate reward model, no
# sampling, no value head. What it needs is $\log \pi(y \mid x)$ of whole completions, under the policy
# (with gradients) and the reference (without).

# %% [markdown]
# ## 2. Log-probabilities of whole completions
#
# $\log \pi(y \mid x) = \sum_t \log \pi(y_t \mid x, y_{<t})$ over the completion's tokens only. Prompt and
# completion sit in one row of `tokens` with a `mask` True on the completion (padding and prompt
# False). Logits are shifted by one against the tokens: `logits[:, t - 1]` predicts `tokens[:, t]`, so
# the first token has no prediction and `mask[:, 0]` is ignored. Shapes: `logits` `[b, s, v]`, `tokens`
# and `mask` `[b, s]`, the result `[b]`. The edge cases the check probes: large logits and unlikely
# tokens (where exponentiating first loses the small probabilities: stay in log space), a completion of
# a single token, padding after the completion, and an all-True mask (whose first column must still be
# ignored).
# (Chapter 04's `group_token_logprobs` returned the per-token log-probs of generated tokens; this is
# the sum over a completion, with an explicit mask.) `logits`, `tokens` and `mask` are on the model's device (a GPU
# when there is one), and so is the result: any tensor you build goes there too (`device=logits.device`).

# %% exercise rlhf_tutorial.dpo:sequence_logprobs | 15 min | difficulty 3 | importance 4

# %% [markdown]
# ## 3. The DPO loss and its variants
#
# With $h$ as above (four sequence log-probs per pair), the variants differ in what they do with $h$:
#
# | `loss_type` | per pair | from |
# |---|---|---|
# | `"sigmoid"` | $-(1 - \epsilon)\log\sigma(\beta h) - \epsilon \log\sigma(-\beta h)$ | DPO; $\epsilon$ = `label_smoothing` (conservative DPO: each label is wrong with probability $\epsilon$) |
# | `"ipo"` | $\big(h - \tfrac{1}{2\beta}\big)^2$ | IPO (Azar et al. 2023): regress $h$ onto a finite target |
# | `"hinge"` | $\max(0,\, 1 - \beta h)$ | RSO (Liu et al. 2023): SLiC's hinge (Zhao et al. 2023), which compared the policy's own log-probs, applied to $h$, the log-ratios to the reference |
#
# DPO's loss keeps falling as $h \to \infty$: on pairs that are easy to separate it pushes $h$ without
# limit (the reference is then only a starting point: the KL can grow large). IPO stops at
# $h = 1/(2\beta)$, so $\beta$ sets how far the policy moves; the hinge stops at $\beta h = 1$.
#
# `log(sigmoid(x))` underflows to $\log 0 = -\infty$ for very negative $x$: use `F.logsigmoid`. Any other
# `loss_type` must raise `ValueError` (a typo should not train with another loss). Inputs: four `[b]`
# tensors of sequence log-probs; output: the mean over the pairs, a 0-d tensor.

# %% exercise rlhf_tutorial.dpo:dpo_loss | 15 min | difficulty 2 | importance 5

# %% [markdown]
# The reward the policy implicitly assigns, $\hat r = \beta (\log \pi - \log \pi_\text{ref})$. On a pair,
# $\hat r_w - \hat r_l = \beta h$: its mean is the **reward margin** a DPO run logs, and the fraction of
# pairs where it is positive the **reward accuracy**. Element-wise over a `[b]` batch of completions.
#
# **Predict, then check.** At the first step of a DPO run the policy *is* the reference. What reward
# margin and what reward accuracy does that step log? And what reward accuracy would you call
# "learned nothing" once the policy has moved: 0.5, or something else? Section 5's dashboard shows how
# both move from there.

# %% exercise rlhf_tutorial.dpo:implicit_reward | 10 min | difficulty 2 | importance 4

# %%
# The first step: the policy is the reference, so each completion's log-prob is the same under both
chosen_logps, rejected_logps = torch.tensor([-31.2, -18.7, -25.0]), torch.tensor([-40.3, -12.5, -25.0])
margin = (implicit_reward(chosen_logps, chosen_logps, 0.1)
          - implicit_reward(rejected_logps, rejected_logps, 0.1))
print("each pair's margin:", margin.tolist())
print("the pairs the reward accuracy counts as right (margin > 0):", (margin > 0).tolist())

# %% [markdown]
# Margin 0 and accuracy 0, not 0.5: with the policy equal to the reference every $\hat r$ is exactly 0, so
# every pair's margin is 0 (their mean, the reward margin, too), and the accuracy, the share of pairs
# whose margin is strictly positive, counts none of them (a tie counts as wrong). The trainer's first
# step logs the same (`train-dpo --world tiny --num-pairs 32 --rounds 1 --batch-size 64`, one step over
# 32 pairs: margin 0.0, accuracy 0.0). Once the policy has moved, a policy that tells chosen from
# rejected no better than a coin logs about 0.5: that is "learned nothing", and 0 at the first step is
# not a bad start.

# %% [markdown]
# **SimPO** (Meng et al. 2024) drops the reference model altogether. Its reward is the policy's *mean*
# log-prob per token, $\frac{\beta}{|y|} \log \pi(y \mid x)$ (length-normalised, so a long completion is not
# penalised for having more tokens), and the chosen side must win by a margin $\gamma$:
#
# $$\mathcal{L}_\text{SimPO} = -\log\sigma\Big(\beta \Big(\tfrac{\log \pi(y_w)}{|y_w|} - \tfrac{\log \pi(y_l)}{|y_l|}\Big) - \gamma\Big).$$

# %% exercise rlhf_tutorial.dpo:simpo_loss | 15 min | difficulty 3 | importance 4

# %% [markdown]
# How the three losses react to $h$ (with $\beta = 0.1$). **Predict, then check**: from the table of
# section 3, before running the cell, write down for each loss the sign of $\partial \mathcal{L} / \partial h$
# at $h = -20, 0, 20, 50$, and where it is exactly 0 (the cell prints $h = -5, 5, 10$ too). Then compare:
# DPO's gradient fades but never vanishes as $h$ grows, IPO's is 0 at $h = 1/(2\beta) = 5$ and changes
# sign there, the hinge's is exactly zero at and past $\beta h = 1$ ($h \ge 10$: at the kink itself PyTorch
# takes the slope of $\max(0, x)$ at 0 to be 0; `-0.000` is a zero with a sign).

# %%
hs = torch.tensor([-20.0, -5.0, 0.0, 5.0, 10.0, 20.0, 50.0])
zeros = torch.zeros_like(hs)
for loss_type in ["sigmoid", "ipo", "hinge"]:
    grads = []
    for h in hs:
        h = h.clone().requires_grad_(True)
        dpo_loss(h[None], zeros[:1], zeros[:1], zeros[:1], beta=0.1, loss_type=loss_type).backward()
        grads.append(f"{h.grad.item():+.3f}")
    print(f"{loss_type:>8}: dloss/dh at h = {hs.tolist()}: {grads}")

# %% [markdown]
# **KTO** (Ethayarajh et al. 2024) needs no pairs: each completion carries its own label, desirable or
# undesirable, so a thumbs-up or a thumbs-down is enough. A completion is judged alone, against a
# reference point $z_0$, an estimate of $\mathrm{KL}(\pi \,\|\, \pi_\text{ref})$ that the caller computes from
# the batch, clamps at 0 and treats as a constant. With $r = \log \pi(y \mid x) - \log \pi_\text{ref}(y \mid x)$:
#
# $$\ell(y) = \begin{cases} \lambda_D \,\big(1 - \sigma(\beta (r - z_0))\big) & y \text{ desirable} \\
#   \lambda_U \,\big(1 - \sigma(\beta (z_0 - r))\big) & y \text{ undesirable} \end{cases} \qquad
#   \mathcal{L}_\text{KTO} = \text{mean over the batch's completions of } \ell(y).$$
#
# A desirable completion gains by rising above the reference point, an undesirable one by sinking below
# it; $\lambda_D$ and $\lambda_U$ weigh the two kinds (the paper's loss aversion). The loss is bounded
# ($1 - \sigma$, not DPO's $-\log\sigma$): a completion already far on the right side stops pulling.
# One mean over all completions, so a kind with more completions weighs more (rebalance with the
# $\lambda$s, not by averaging the two kinds separately).
#
# Contract: `desirable` is a bool per completion, `z0` a 0-d tensor that may carry a graph (the loss
# must not differentiate through it), `policy_logps`, `ref_logps` are sequence log-probs as DPO's.

# %% exercise rlhf_tutorial.dpo:kto_loss | 15 min | difficulty 3 | importance 3

# %% [markdown]
# **ORPO** (Hong et al. 2024) drops the reference model, like SimPO, and folds preference learning into
# SFT: the usual NLL on the chosen completion plus a term that asks the chosen completion's *odds* to
# beat the rejected one's. With $m = \log \pi(y \mid x) / |y|$, the mean log-prob per token, and the odds of
# $p = e^m$,
#
# $$\log\text{odds}(m) = \log \frac{p}{1 - p} = m - \log(1 - e^m), \qquad
#   \mathcal{L}_\text{ORPO} = \operatorname{mean}(-m_w) - \lambda \operatorname{mean}\,\log\sigma\big(\log\text{odds}(m_w) - \log\text{odds}(m_l)\big).$$
#
# Close to $m = 0$ (a completion the policy is sure of) $1 - e^m$ is a difference of two nearly equal
# numbers: computed as written in float32 it loses every digit. Far below 0, $e^m$ underflows to 0, so
# stay in log space. The checker tries both regimes.

# %% exercise rlhf_tutorial.dpo:orpo_loss | 15 min | difficulty 3 | importance 3

# %% [markdown]
# ## 4. Pairs from the reference model
#
# Chapter 02's pairs were labelled by a rule. Here the pairs come from the task itself, as in the DPO
# paper's IMDb experiment: sample completions from the **reference** policy and let the sentiment
# classifier (the ground-truth reward, towards negative as in chapter 03) say which is better. The
# paper sampled 4 completions per review prefix and kept all 6 pairs of them; we sample $G$ completions
# of the course prompt and keep one pair per group, its best and its worst as (chosen, rejected). The classifier is asked once,
# when the pairs are made; training never calls it.
#
# Contract: `rewards` is `[p, G]` (one row per group); return one `(chosen, rejected)` pair of column
# indices per row, `[p, 2]` int64 on the rewards' device. Ties go to the **first** occurrence, so a
# group whose rewards are all equal gives the pair `(0, 0)`: a completion preferred to itself. What
# should a trainer do with such a pair (look up `min_reward_gap` in `help(DPOArgs)`), and why would
# training on it be harmless but wasteful?

# %% exercise rlhf_tutorial.dpo:best_worst_pairs | 15 min | difficulty 2 | importance 3

# %%
tiny_args = DPOArgs.preset(world, direction=direction, num_pairs=3, group_size=8, min_reward_gap=0.0)
torch.manual_seed(0)
pairs, stats = pairs_from_samples(policy, sentiment_reward, tiny_args, best_worst_pairs)
print(f"mean reward of the {stats['groups'] * 8} samples the pairs were drawn from: {stats['sample_reward']:.3f}")
for *_, chosen, rejected, gap in pairs:
    print(f"gap {gap:.2f}\n  chosen:   {chosen!r}\n  rejected: {rejected!r}")

# %% [markdown]
# ## 5. Training with DPO
#
# `rlhf_tutorial.trainers.dpo.train` runs your `sequence_logprobs`, `dpo_loss`, `implicit_reward` and
# `best_worst_pairs` (`dpo_learner_functions(globals())` hands them over). Offline (the default), the
# pairs are drawn once from the reference (`num_pairs` groups of `group_size`), the reference's
# sequence log-probs are computed once, and the policy makes `rounds` passes over them in minibatches
# of `batch_size` pairs. After every round the policy is measured on fresh samples of its own: the
# held-out classifier reward and the **sequence KL** to the reference (`evaluate_policy`,
# the same measurement the frontier uses for every method, in `rlhf_tutorial.trainers.policy_eval`).
#
# The tiny world runs a shortened version of the CLI's run (`python -m rlhf_tutorial train-dpo --world
# tiny --seed 0`: 384 pairs of the best and worst of 16, 5 rounds): 192 pairs, 3 rounds, the run of
# `train-dpo --world tiny --seed 0 --num-pairs 192 --rounds 3 --eval-samples 64 --eval-samples-per-round 48`
# (the cell checks that yours agrees). `help(DPOArgs)` documents every knob (the CLI's `--help` lists the same as flags).
#
# **Which base reward?** Every run of this notebook measures the policy before and after on the same
# 64 samples (`eval_samples=64`, drawn with the run's seed + 1 on a random stream of their own), so it prints one base reward,
# {{grpo_short.mean_reward_initial:.3f}}. The CLI's runs and the full frontier measure on 128 samples: the same base policy scores
# {{dpo_offline.mean_reward_initial:.3f}} there. Neither is wrong: a mean of 64 rewards has a standard error of about {{frontier_short.base.reward_se:.2f}}, and
# the two sample sets differ (the per-round curves use their own, smaller sets, and section 4 printed the
# mean over the 24 samples its 3 pairs came from). Compare a run with its own base, not with another run's.

# %%
# (smoke runs use random stand-in models whose rewards barely differ: keep every pair there)
dpo_args = DPOArgs.preset(world, direction=direction, seed=0,
                          **smoke_sizes(num_pairs=8, rounds=1, eval_samples=16, min_reward_gap=0.0))
if is_tiny() and not is_smoke():  # the recorded run's sizes (a smoke run keeps the small ones)
    dpo_args.num_pairs, dpo_args.rounds, dpo_args.eval_samples, dpo_args.eval_samples_per_round = 192, 3, 64, 48
dash, callback = dpo_dashboard(title=f"DPO on the {world} world, towards {direction}")
dpo_result = train_dpo(dpo_args, policy=copy.deepcopy(policy), reward_fn=sentiment_reward, callback=callback,
                       **dpo_learner_functions(globals()))
dash.finish()
before, after = dpo_result.eval_initial, dpo_result.eval_final
print(f"reward {before['reward']:.3f} -> {after['reward']:.3f} (± {after['reward_se']:.3f}), sequence KL "
      f"{after['kl']:.2f} ± {after['kl_se']:.2f} nats ({after['kl_per_token']:.3f} per token), "
      f"pair accuracy {dpo_result.history[-1]['accuracy']:.2f}, {dpo_result.wall_seconds:.0f} s")
figures.agree("dpo_short", {"mean_reward_initial": before["reward"], "mean_reward_final": after["reward"],
                            "kl_final": after["kl"], "pair_accuracy_final": dpo_result.history[-1]["accuracy"]})
for text, r in list(zip(after["texts"], after["rewards"]))[:4]:
    print(f"  {r:.2f}  {text!r}")

# %% [markdown]
# Read the curves together. The **loss** falls and the **pair accuracy** climbs towards 1 on the
# training pairs: the policy separates chosen from rejected. The **implicit reward margin** keeps
# growing: nothing in the sigmoid loss tells it to stop. The **held-out classifier reward** (fresh
# samples, a reward the training never queried) rises with it; in this shortened run (3 passes over
# 192 pairs: {{dpo_short.reward_per_round.0:.2f}}, {{dpo_short.reward_per_round.1:.2f}}, {{dpo_short.reward_per_round.2:.2f}} after each pass on the reference machine) it is still climbing. The CLI's
# longer run (5 passes over 384 pairs) shows what comes next: the held-out reward levels off
# ({{dpo_offline.reward_per_round.0:.2f}}, {{dpo_offline.reward_per_round.1:.2f}}, {{dpo_offline.reward_per_round.2:.2f}}, {{dpo_offline.reward_per_round.3:.2f}}, {{dpo_offline.reward_per_round.4:.2f}} after each pass) while the KL keeps growing ({{dpo_offline.kl_per_round.0:.1f}}, {{dpo_offline.kl_per_round.1:.1f}}, {{dpo_offline.kl_per_round.2:.1f}},
# {{dpo_offline.kl_per_round.3:.1f}}, {{dpo_offline.kl_per_round.4:.1f}} nats): offline DPO on a fixed set of pairs keeps moving away from the reference after the pairs
# have stopped teaching it anything about the classifier, and its text gets rougher: words that the
# rejected completions used and the chosen ones did not are pushed down wherever they appear.
#
# **Chapter 02's pairs instead.** `pairs="preferences"` trains on the tiny world's preference pairs of
# chapter 02 (flipped for `direction="neg"`: they prefer positive reviews, and reviews without
# repetition). Their prompts are not the course prompt and their completions were written by the
# corpus, not sampled from the policy: the policy learns from text it would not itself produce.

# %%
pref_sizes = {**dict(num_pairs=384, rounds=2, eval_samples=64, eval_samples_per_round=32),
              **smoke_sizes(num_pairs=8, rounds=1, eval_samples=16)}
pref_args = DPOArgs.preset(world, direction=direction, seed=0, pairs="preferences", **pref_sizes)
pref_result = train_dpo(pref_args, policy=copy.deepcopy(policy), reward_fn=sentiment_reward, progress=False,
                        **dpo_learner_functions(globals()))
for name, result in [("pairs from the reference's samples", dpo_result), ("chapter 02's preference pairs", pref_result)]:
    print(f"{name:>36}: reward {result.eval_initial['reward']:.3f} -> {result.eval_final['reward']:.3f}, "
          f"KL {result.eval_final['kl']:.2f} nats, pair accuracy {result.history[-1]['accuracy']:.2f}")
figures.agree("dpo_prefs", {"mean_reward_initial": pref_result.eval_initial["reward"],
                            "mean_reward_final": pref_result.eval_final["reward"], "kl_final": pref_result.eval_final["kl"],
                            "pair_accuracy_final": pref_result.history[-1]["accuracy"]})
dpo_curves(pref_result.history, title="DPO on chapter 02's preference pairs")

# %% [markdown]
# On the reference machine (`train-dpo --world tiny --seed 0 --pairs preferences --num-pairs 384 --rounds 2
# --eval-samples 64 --eval-samples-per-round 32`, this cell's run), the pair accuracy on chapter 02's pairs
# reached {{dpo_prefs.pair_accuracy_final:.2f}} after two passes but the classifier's reward on the course prompt barely moved:
# {{dpo_prefs.mean_reward_initial:.2f}} -> {{dpo_prefs.mean_reward_final:.2f}} at {{dpo_prefs.kl_final:.1f}} nats, against {{dpo_short.mean_reward_final:.2f}} at {{dpo_short.kl_final:.1f}} nats with pairs sampled from the reference. The pairs teach what distinguishes
# *those* texts, on *those* prompts, and the policy drifts (look for repeated words in its samples)
# without learning what the classifier wants from the course prompt. This is the
# distribution-shift problem of offline preference data, and the reason for the **online** option:
# `online=True` draws fresh pairs from the *current* policy at the start of every round (the reference
# in the loss stays the frozen start). Measured with the CLI (`train-dpo --world tiny --seed 0
# --online --group-size 8 --num-pairs 256`), online DPO reached a reward of {{dpo_online.mean_reward_final:.2f}} at a sequence KL of
# {{dpo_online.kl_final:.1f}} nats with clean samples, where the offline default (`train-dpo --world tiny --seed 0`: 384 pairs
# of the best and worst of 16) reached {{dpo_offline.mean_reward_final:.2f}} at {{dpo_offline.kl_final:.0f}} nats, with rougher text like the samples above.

# %% [markdown]
# **KTO and ORPO in the trainer.** `DPOArgs(loss_type="kto")` trains with your `kto_loss` on the same
# classifier-labelled samples, read as unpaired labels: every chosen completion is a desirable example,
# every rejected one an undesirable example (KTO never uses which rejected went with which chosen). The
# reference point of a step is the mean log-ratio $\log \pi - \log \pi_\text{ref}$ over all the step's
# completions (the paper averages over mismatched prompt-completion pairs; with one prompt those are the
# batch's own completions), which `kto_loss` detaches and clamps at 0. These completions were sampled
# from the reference, so that mean estimates $-\mathrm{KL}(\pi_\text{ref} \,\|\, \pi) \le 0$ and the clamp
# makes the reference point 0 here: the clamp is not a detail. `DPOArgs(loss_type="orpo")` trains with your
# `orpo_loss` (`orpo_lambda` is its $\lambda$, the lengths are the completions' token counts); the reference
# model is only used to measure the KL. The same shortened run as DPO's above, 192 pairs and 3 rounds
# (`train-dpo --world tiny --seed 0 --num-pairs 192 --rounds 3 --eval-samples 64 --eval-samples-per-round 48
# --loss-type kto`, and `--loss-type orpo`):

# %%
unpaired_runs = {}
for name, run_name in [("KTO", "kto_short"), ("ORPO", "orpo_short")]:
    run_args = DPOArgs.preset(world, direction=direction, seed=0, loss_type=run_name.removesuffix("_short"),
                              **smoke_sizes(num_pairs=8, rounds=1, eval_samples=16, min_reward_gap=0.0))
    if is_tiny() and not is_smoke():
        run_args.num_pairs, run_args.rounds, run_args.eval_samples, run_args.eval_samples_per_round = 192, 3, 64, 48
    r = unpaired_runs[name] = train_dpo(run_args, policy=copy.deepcopy(policy), reward_fn=sentiment_reward,
                                        progress=False, **dpo_learner_functions(globals()))
    print(f"{name}: reward {r.eval_initial['reward']:.3f} -> {r.eval_final['reward']:.3f} "
          f"(± {r.eval_final['reward_se']:.3f}), sequence KL {r.eval_final['kl']:.2f} nats, {r.wall_seconds:.0f} s")
    figures.agree(run_name, {"mean_reward_initial": r.eval_initial["reward"],
                             "mean_reward_final": r.eval_final["reward"], "kl_final": r.eval_final["kl"]})

# %% [markdown]
# On the reference machine, from the same base reward ({{kto_short.mean_reward_initial:.2f}}): KTO reached {{kto_short.mean_reward_final:.2f}} at
# {{kto_short.kl_final:.1f}} nats and ORPO {{orpo_short.mean_reward_final:.2f}} at {{orpo_short.kl_final:.1f}} nats, against DPO's {{dpo_short.mean_reward_final:.2f}} at {{dpo_short.kl_final:.1f}} nats on the same
# pairs. ORPO moves least: most of its loss is the SFT term, which imitates the chosen completions
# (sampled from the reference, so already likely under it), and $\lambda = 0.1$ keeps the odds-ratio term
# small. KTO lands about where DPO does (one seed, 64 samples), without ever using which completion was
# paired with which: on these samples the labels carry what DPO learned.

# %% [markdown]
# ## 6. Critic-free RL beside GRPO: RLOO and GSPO
#
# **RLOO** (REINFORCE Leave-One-Out; Kool et al. 2019, Ahmadian et al. 2024). As Ahmadian et al. published
# it, RLOO is plain REINFORCE (no ratio, no clipping) on the whole sequence, with the KL penalty in the
# reward and the leave-one-out baseline below. This course takes only the baseline: its advantages
# replace GRPO's inside chapter 04's trainer (clipped ratios, $k_3$ in the loss), so what runs below is
# **GRPO with RLOO advantages** ("GRPO + RLOO adv." in the printouts and on the frontier). GRPO's baseline for sample
# $i$ is its group's mean, which includes $r_i$ itself; that correlates the baseline with the sample and
# biases the gradient by a factor $(G-1)/G$. RLOO leaves it out:
#
# $$A_i = r_i - \frac{1}{G - 1} \sum_{j \ne i} r_j = \frac{G}{G-1}\big(r_i - \bar r\big),$$
#
# unbiased, and without GRPO's division by the std. `rewards` is `[p, G]` with `G >= 2` (one sample has
# no siblings); the result has the same shape. Compute the leave-one-out mean without a loop over $i$.

# %% exercise rlhf_tutorial.dpo:rloo_advantages | 10 min | difficulty 2 | importance 4

# %% [markdown]
# **Predict, then check.** For a group of four 0/1 rewards with one success, $[1, 0, 0, 0]$, work out
# RLOO's four advantages and GRPO's (`scale="group"`: the unbiased std of that group is 0.5), then run
# the cell. Which one pushes the success harder, and by what factor? Both are the mean-centred reward
# $r - \bar r$ times a constant of the group (so both sum to zero over it): what is each one's constant,
# and which of the two changes for a group with two successes, $[1, 1, 0, 0]$ (unbiased std $1/\sqrt{3}$)? The
# cell prints both groups, each advantage divided by $r - \bar r$, and each group's sum.

# %%
demo_rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
centred = demo_rewards - demo_rewards.mean(dim=-1, keepdim=True)
for name, advantages in [("RLOO", rloo_advantages(demo_rewards)),
                         ("GRPO", group_relative_advantages(demo_rewards, "group"))]:
    for group, row, c in zip(demo_rewards.tolist(), advantages.tolist(), centred.tolist()):
        print(f"{name} {group}: advantages {[round(a, 3) for a in row]}, divided by r - mean "
              f"{[round(a / x, 3) for a, x in zip(row, c)]}, sum {abs(sum(row)):.3f}")

# %% [markdown]
# **GSPO** (Group Sequence Policy Optimization, Qwen 2025). GRPO clips every token's ratio
# $\pi_\theta / \pi_\text{old}$, but the reward belongs to the whole sequence; a few tokens with extreme ratios
# make the token-level objective noisy (the GSPO paper reports it destabilising large mixture-of-experts
# models). GSPO uses one ratio per sequence, length-normalised so that it does not explode with the
# length, and clips that:
#
# $$s_i = \Big(\frac{\pi_\theta(y_i \mid x)}{\pi_\text{old}(y_i \mid x)}\Big)^{1/|y_i|} = \exp\Big(\frac{1}{|y_i|} \sum_t \big(\log \pi_\theta(y_{i,t} \mid \cdot) - \log \pi_\text{old}(y_{i,t} \mid \cdot)\big)\Big),$$
#
# the geometric mean of the token ratios. Inputs `[B, g]` (log-probs and a bool mask, every row with at
# least one True), output `[B]`. Masked positions count for nothing, whatever they hold; $|y_i|$ is the
# row's own number of True.

# %% exercise rlhf_tutorial.dpo:gspo_sequence_ratio | 15 min | difficulty 3 | importance 4

# %% [markdown]
# **Predict, then check.** A completion of 10 tokens in which one token's ratio is 2 (the policy
# doubled its probability) and the other nine are unchanged. GRPO's token-level clip at
# $\varepsilon = 0.2$ sees a ratio of 2 on that token. What is $s_i$? Would GSPO's clip at the same
# $\varepsilon$ touch it? And a 3-token completion with the same one doubled token?

# %%
for n_tokens in (10, 3):
    one_doubled = torch.zeros(1, n_tokens)
    one_doubled[0, 0] = torch.log(torch.tensor(2.0))
    s = gspo_sequence_ratio(one_doubled, torch.zeros(1, n_tokens), torch.ones(1, n_tokens, dtype=torch.bool))
    print(f"{n_tokens} tokens, one of them doubled: s = {float(s[0]):.3f}")

# %% [markdown]
# Both plug into chapter 04's trainer as options: `GRPOArgs(advantage_estimator="rloo")` computes the
# advantages with your `rloo_advantages`, `GRPOArgs(importance_level="sequence")` makes the training
# step optimise `calc_gspo_objective` (your `gspo_sequence_ratio`, clipped once per sequence, with the
# k3 KL averaged over each sequence). From the command line: `train-grpo --advantage-estimator rloo`,
# `train-grpo --importance-level sequence`. Short runs of each (the frontier below runs them longer),
# 12 phases each: `train-grpo --world tiny --direction neg --seed 0 --num-phases 12 --eval-samples 64`, with
# `--advantage-estimator rloo` or `--importance-level sequence` (each cell checks that yours agrees):

# %%
short = dict(num_phases=12, eval_samples=64) if is_tiny() else dict(num_phases=40)
short.update(smoke_sizes(num_phases=2, eval_samples=16))
rl_runs = {}
for name, run_name, extra in [("GRPO", "grpo_short", {}),
                              ("GRPO + RLOO adv.", "rloo_short", {"advantage_estimator": "rloo"}),
                              ("GSPO", "gspo_short", {"importance_level": "sequence"})]:
    run_args = GRPOArgs.preset(world, direction=direction, seed=0, **short, **extra)
    rl_runs[name] = train_grpo(run_args, policy=copy.deepcopy(policy), reward_fn=sentiment_reward, progress=False,
                               **grpo_learner_functions(globals()))
    r = rl_runs[name]
    print(f"{name}: reward {r.eval_initial['reward']:.3f} -> {r.eval_final['reward']:.3f}, "
          f"KL per token (k3) {r.eval_final['kl']:.3f}, {r.wall_seconds:.0f} s")
    figures.agree(run_name, {"mean_reward_initial": r.eval_initial["reward"],  # the text below quotes these runs
                             "mean_reward_final": r.eval_final["reward"], "kl_final": r.eval_final["kl"]})

# %% [markdown]
# RLOO's advantages are GRPO's without the division by the group's std (and scaled by $G/(G-1)$): with
# rewards in $[0, 1]$ they are several times smaller. That does not make GRPO with RLOO advantages climb more slowly: Adam
# divides each gradient by a running estimate of its own scale, so a global rescale barely changes the
# step (chapter 04, section 7). What it changes is the balance inside the objective: the advantage term
# shrinks against $\beta \cdot k_3$, so the same `kl_coef` holds GRPO with RLOO advantages closer to the reference. On the reference
# machine these runs end with GRPO + RLOO adv. at reward {{rloo_short.mean_reward_final:.2f}} and a KL of {{rloo_short.kl_final:.3f}} nats per token, GRPO at
# {{grpo_short.mean_reward_final:.2f}} and {{grpo_short.kl_final:.3f}}: as high (one seed; a reward over 64 samples has a standard error
# of about {{frontier_short.base.reward_se:.2f}}) at less KL. GSPO with the token-level clip range
# (`clip_coef=0.2`) should clip far less often than GRPO does (a geometric mean of token ratios moves
# much less than its most extreme token); the GSPO paper uses ranges of a few times $10^{-4}$.

# %% [markdown]
# ## 7. Every method on one reward-KL frontier
#
# The DPO paper's IMDb figure places each method, at several KL strengths, on the plane of mean reward
# against KL(policy || reference). We rebuild it with every method of the course: PPO (chapter 03's
# trainer), GRPO, GRPO with RLOO advantages and GSPO (chapter 04's), DPO and IPO (this chapter's), one
# point each of KTO and ORPO (section 5's runs, on the frontier's pairs), and REINFORCE++ and CISPO
# (chapter 04's options of the GRPO trainer, section 10 there).
# Every point is a run from the same starting policy and seed, and every point is measured **the same
# way**: 128 (here fewer) samples of the tuned policy itself, their mean classifier reward, and their **sequence KL** to the
# reference,
#
# $$\mathrm{KL}(\pi \,\|\, \pi_\text{ref}) = \mathbb{E}_{y \sim \pi}\Big[\sum_t \mathrm{KL}\big(\pi(\cdot \mid x, y_{<t}) \,\|\, \pi_\text{ref}(\cdot \mid x, y_{<t})\big)\Big],$$
#
# the exact KL of the next-token distributions summed along each sample's own path (an unbiased
# estimate of the sequence KL with less variance than $\log \pi(y) - \log \pi_\text{ref}(y)$), each with its
# standard error. Per-token KLs (chapter 03's and 04's logs) would favour methods that write shorter
# completions; the sequence KL is what the KL-regularised objective penalises.
#
# **The notebook runs a smaller grid than the CLI**: 2 strengths per method instead of 3 (the middle and the
# strongest tether: PPO's `kl_coef` 0.1 and 0.3, the other RL methods' beta 0.1 and 0.5, DPO's and IPO's
# beta at both ends of the CLI's range; REINFORCE++, whose `kl_coef` weighs the k1 KL inside the per-token
# rewards rather than a k3 term in the loss, at both ends of its own range, 0.03 and 0.3), 6 DPO rounds over 128 pairs instead of 4 over 256 (the same 24
# optimizer steps), 64 evaluation samples per point instead of 128. The RL runs keep the CLI's 20 phases:
# shorter runs stop on the way up, where every method still looks alike. It is the run of `frontier --world
# tiny --ppo-kl-coefs 0.1 0.3 --grpo-kl-coefs 0.1 0.5 --dpo-betas 0.03 0.5 --ipo-betas 0.02 0.5 --rl-phases 20
# --dpo-rounds 6 --dpo-pairs 128 --eval-samples 64 --no-isolate --methods ppo grpo rloo gspo dpo ipo kto orpo
# reinforce_pp cispo --kto-betas 0.1 --orpo-lambdas 0.1 --reinforce-pp-kl-coefs 0.03 0.3`
# ({{frontier_short.wall_seconds:.0f}} s on the reference machine's
# 2 CPU cores, shared with other jobs; the cell checks that yours agrees). The full grid
# is `python -m rlhf_tutorial frontier --world tiny` ({{frontier.wall_seconds:.0f}} s there, recorded while other
# runs held the 2 cores at a load of 10 to 15; HTML report and JSON with every point).

# %%
frontier_args = FrontierArgs(world=world, direction=direction, seed=0, ppo_kl_coefs=(0.1, 0.3),
                             grpo_kl_coefs=(0.1, 0.5), dpo_betas=(0.03, 0.5), ipo_betas=(0.02, 0.5),
                             rl_phases=20, dpo_rounds=6, dpo_pairs=128, eval_samples=64,
                             methods=("ppo", "grpo", "rloo", "gspo", "dpo", "ipo", "kto", "orpo", "reinforce_pp", "cispo"),
                             kto_betas=(0.1,), orpo_lambdas=(0.1,), reinforce_pp_kl_coefs=(0.03, 0.3))
if not is_tiny():
    frontier_args.rl_phases, frontier_args.dpo_rounds = 60, 3
if is_smoke():
    frontier_args.rl_phases, frontier_args.dpo_rounds, frontier_args.dpo_pairs, frontier_args.eval_samples = 1, 1, 4, 8
    frontier_args.dpo_min_reward_gap = 0.0
frontier = run_frontier(frontier_args, progress=False)
figures.agree("frontier_short", {"base.reward": frontier["base"]["reward"],
                                 **{f"points.{i}.{key}": point[key] for i, point in enumerate(frontier["points"])
                                    for key in ("reward", "kl")}})
frontier_figure(frontier, title=f"Reward against sequence KL, {world} world (the notebook's small grid)")

# %%
FrontierTable(frontier)

# %%
cost_figure(frontier)

# %% [markdown]
# Hover a point for its settings and samples; click a method in the legend to hide it (double-click:
# only it), or use the buttons. Memory here is measured inside one kernel, where a run reuses memory
# an earlier run freed: the CLI runs each method in its own process for that reason.
#
# The same figure from the CLI's full grid (`frontier --world tiny`: 3 strengths per method, 20 phases
# per RL run, 4 DPO rounds over 256 pairs, 128 evaluation samples per point; the JSON is in the
# README), and what to read in it, on the reference machine. Base policy: reward {{frontier.base.reward:.3f}}.
#
# | method | strength: reward at sequence KL (nats) |
# |---|---|
# | PPO | kl_coef 0.3: {{frontier.points.2.reward:.3f}} at {{frontier.points.2.kl:.1f}}; 0.1: {{frontier.points.1.reward:.3f}} at {{frontier.points.1.kl:.1f}}; 0.03: {{frontier.points.0.reward:.3f}} at {{frontier.points.0.kl:.1f}} |
# | GRPO | kl_coef 0.5: {{frontier.points.5.reward:.3f}} at {{frontier.points.5.kl:.1f}}; 0.1: {{frontier.points.4.reward:.3f}} at {{frontier.points.4.kl:.1f}}; 0.01: {{frontier.points.3.reward:.3f}} at {{frontier.points.3.kl:.1f}} |
# | GRPO + RLOO adv. | kl_coef 0.5: {{frontier.points.8.reward:.3f}} at {{frontier.points.8.kl:.1f}}; 0.1: {{frontier.points.7.reward:.3f}} at {{frontier.points.7.kl:.1f}}; 0.01: {{frontier.points.6.reward:.3f}} at {{frontier.points.6.kl:.1f}} |
# | GSPO | kl_coef 0.5: {{frontier.points.11.reward:.3f}} at {{frontier.points.11.kl:.1f}}; 0.1: {{frontier.points.10.reward:.3f}} at {{frontier.points.10.kl:.1f}}; 0.01: {{frontier.points.9.reward:.3f}} at {{frontier.points.9.kl:.1f}} |
# | DPO | beta 0.5: {{frontier.points.14.reward:.3f}} at {{frontier.points.14.kl:.1f}}; 0.1: {{frontier.points.13.reward:.3f}} at {{frontier.points.13.kl:.1f}}; 0.03: {{frontier.points.12.reward:.3f}} at {{frontier.points.12.kl:.1f}} |
# | IPO | beta 0.5: {{frontier.points.17.reward:.3f}} at {{frontier.points.17.kl:.2f}}; 0.1: {{frontier.points.16.reward:.3f}} at {{frontier.points.16.kl:.1f}}; 0.02: {{frontier.points.15.reward:.3f}} at {{frontier.points.15.kl:.1f}} |
#
# (Each point's standard errors are in the JSON and in the notebook's table above: about {{frontier.points.1.reward_se:.2f}} on a
# reward near 0.9, {{frontier.points.2.reward_se:.2f}} near 0.7, and up to about a tenth of the KL.)
#
# - **PPO and GRPO (either advantage)** lie close to one curve: near 5 nats PPO (`kl_coef` 0.1) reaches {{frontier.points.1.reward:.2f}} at
#   {{frontier.points.1.kl:.1f}} nats, GRPO (`kl_coef` 0.1) {{frontier.points.4.reward:.2f}} at {{frontier.points.4.kl:.1f}}, with RLOO advantages (`kl_coef` 0.01) {{frontier.points.6.reward:.2f}} at {{frontier.points.6.kl:.1f}}; the KL strength moves a point
#   along it. GSPO starts on it (`kl_coef` 0.5: {{frontier.points.11.reward:.2f}} at {{frontier.points.11.kl:.1f}}, GRPO {{frontier.points.5.reward:.2f}} at {{frontier.points.5.kl:.1f}}) but at `kl_coef` 0.1 spends more than
#   twice GRPO's KL for the same reward ({{frontier.points.10.reward:.2f}} at {{frontier.points.10.kl:.1f}} nats). At the same `kl_coef`, RLOO advantages spend less KL than GRPO for a little less
#   reward ({{frontier.points.7.reward:.2f}} at {{frontier.points.7.kl:.1f}} against {{frontier.points.4.reward:.2f}} at {{frontier.points.4.kl:.1f}} nats at 0.1, and {{frontier.points.6.reward:.2f}} at {{frontier.points.6.kl:.1f}} against {{frontier.points.3.reward:.2f}} at
#   {{frontier.points.3.kl:.1f}} at 0.01): a point further down the same curve (section 6 says why).
# - **Offline DPO and IPO**, trained on pairs drawn once from the reference, sit below that curve: about
#   {{frontier.points.13.reward:.2f}} at {{frontier.points.13.kl:.0f}} to {{frontier.points.12.kl:.0f}} nats, where PPO reaches {{frontier.points.0.reward:.2f}} at {{frontier.points.0.kl:.0f}}, and {{frontier.points.14.reward:.2f}} at {{frontier.points.14.kl:.1f}} nats, where the
#   RL methods reach {{frontier.points.1.reward:.2f}} (PPO) and {{frontier.points.4.reward:.2f}} (GRPO) at {{frontier.points.4.kl:.1f}}. More passes over the pairs add KL faster than reward (`train-dpo`'s 5
#   passes over 384 pairs: {{dpo_offline.mean_reward_final:.2f}} at {{dpo_offline.kl_final:.0f}} nats). IPO's beta controls the KL directly (its target
#   $h = 1/(2\beta)$: {{frontier.points.17.kl:.2f}}, {{frontier.points.16.kl:.1f}} and {{frontier.points.15.kl:.1f}} nats); DPO's beta only through where its loss saturates
#   ({{frontier.points.14.kl:.1f}} to {{frontier.points.12.kl:.1f}} nats).
# - **The weakest tether runs away.** With `kl_coef` = 0.01, GRPO reached {{frontier.points.3.reward:.2f}} at {{frontier.points.3.kl:.0f}} nats and GSPO
#   {{frontier.points.9.reward:.3f}} at {{frontier.points.9.kl:.0f}} nats ({{frontier.points.9.kl_per_token:.1f}} per token), far beyond every other point, and their samples start to
#   repeat themselves (3-gram repetition {{frontier.points.3.repetition:.3f}} and {{frontier.points.9.repetition:.3f}}, against {{frontier.base.repetition:.4f}} for the base policy).
#   GSPO goes furthest. A likely reason: with the token-level clip range (0.2) a length-normalised
#   sequence ratio almost never leaves it, so GSPO's updates here are in effect unclipped, and a KL
#   weight of 0.01 does not hold the policy back.
# - The DPO paper found DPO's frontier *above* PPO's on IMDb with GPT-2-large. Here, with a 2-layer
#   model, a classifier that is easy to please and RL methods that sample 64 fresh completions of
#   their current policy every phase, PPO and GRPO (either advantage) are more KL-efficient, as later studies
#   comparing online and offline preference optimisation also report; section 5's online DPO moves
#   DPO towards them.
# - **Cost**, on the reference machine (shared with other jobs: compare the methods with each other),
#   training seconds for the 3 points of each method: PPO {{frontier.methods.ppo.train_seconds:.0f}}, GRPO {{frontier.methods.grpo.train_seconds:.0f}}, GRPO + RLOO adv. {{frontier.methods.rloo.train_seconds:.0f}},
#   GSPO {{frontier.methods.gspo.train_seconds:.0f}}, DPO {{frontier.methods.dpo.train_seconds:.0f}}, IPO {{frontier.methods.ipo.train_seconds:.0f}}, plus the pairs DPO and IPO share (4096 samples from the
#   reference and one classifier pass, {{frontier.methods.dpo.pairs_seconds_shared:.0f}} s). Peak memory above the start of a run: DPO {{frontier.methods.dpo.peak_memory_mb:.0f}} MB
#   and IPO {{frontier.methods.ipo.peak_memory_mb:.0f}} MB (a forward and backward pass over 64 full rows), the RL methods {{frontier.methods.grpo.peak_memory_mb:.0f}} to
#   {{frontier.methods.ppo.peak_memory_mb:.0f}} MB.
#
# The cell below reads *this* run's points the same way, at equal KL: each method's curve starts at the
# base policy (every run starts there) and joins its points in order of KL, and `rewards_at_common_kl`
# reads every curve at one KL that every method reached (comparing each method's highest point instead
# would favour the methods that stopped early: reward per nat falls as a curve flattens). It reads the swept
# methods only (the default grid's, REINFORCE++ and CISPO): KTO and ORPO have one point each here, and ORPO's
# lies at a smaller KL than any other method's largest, which would pull the common KL down to it.

# %%
swept = (*METHODS, "reinforce_pp", "cispo")  # KTO and ORPO have one point each
common_kl, rewards = rewards_at_common_kl(frontier, methods=swept)
print(f"base policy: reward {frontier['base']['reward']:.3f}; every method reached a sequence KL of {common_kl:.2f} nats, "
      "where (read on each method's curve):")
for method, reward in sorted(rewards.items(), key=lambda kv: -kv[1]):
    print(f"{method:>5}: reward {reward:.3f} ({frontier['methods'][method]['train_seconds']:.0f} s of training for its points)")

# %% [markdown]
# On the reference machine this cell puts every RL method above DPO and IPO at equal KL (GRPO + RLOO adv.
# first, then REINFORCE++ and GRPO, then CISPO, GSPO and PPO), as the full grid does for PPO and GRPO (either
# advantage). With 64 samples a point's reward has a standard error of about {{frontier_short.base.reward_se:.2f}},
# so neighbours in the ranking may swap places on another machine.
#
# REINFORCE++ and CISPO (chapter 04, section 10), two points each, 20 phases like the other RL runs.
# REINFORCE++ lies on the RL curve or above it: at `kl_coef` 0.3 (the weight of the k1 KL in its per-token
# rewards) {{frontier_short.points.15.reward:.2f}} at {{frontier_short.points.15.kl:.1f}} nats, beside GRPO's `kl_coef` 0.5 point ({{frontier_short.points.3.reward:.2f}} at {{frontier_short.points.3.kl:.1f}}), and at
# 0.03 {{frontier_short.points.14.reward:.2f}} at {{frontier_short.points.14.kl:.1f}} nats, where PPO's `kl_coef` 0.1 reaches {{frontier_short.points.0.reward:.2f}} at {{frontier_short.points.0.kl:.1f}} (one seed, and a gap
# within two standard errors of the difference). CISPO at `kl_coef` 0.5 lands with GRPO and GSPO at 0.5 ({{frontier_short.points.17.reward:.2f}} at
# {{frontier_short.points.17.kl:.1f}} nats, GSPO {{frontier_short.points.7.reward:.2f}} at {{frontier_short.points.7.kl:.1f}}), but at 0.1 it runs furthest of every point: {{frontier_short.points.16.reward:.2f}} at
# {{frontier_short.points.16.kl:.1f}} nats ({{frontier_short.points.16.kl_per_token:.2f}} per token), beyond GSPO's {{frontier_short.points.6.kl:.1f}} and GRPO's {{frontier_short.points.2.kl:.1f}} at the same `kl_coef`. A likely
# reason: CISPO clips the weight, not the gradient, so a token whose ratio has left the range still
# learns (the point of CISPO), and nothing but the KL term holds the policy back.
#
# KTO and ORPO, one point each on the figure (section 5's losses, on the same 128 pairs and 6 rounds as
# DPO's): KTO (beta 0.1) at {{frontier_short.points.12.reward:.2f}} and {{frontier_short.points.12.kl:.1f}} nats, beside DPO's beta 0.5 point ({{frontier_short.points.9.reward:.2f}} at
# {{frontier_short.points.9.kl:.1f}}) and IPO's beta 0.02 ({{frontier_short.points.10.reward:.2f}} at {{frontier_short.points.10.kl:.1f}}): the offline preference methods share one
# region, below the RL curve. ORPO ($\lambda = 0.1$) moves least, {{frontier_short.points.13.reward:.2f}} at {{frontier_short.points.13.kl:.1f}} nats, about where GRPO + RLOO adv.
# at `kl_coef` 0.5 lands ({{frontier_short.points.5.reward:.2f}} at {{frontier_short.points.5.kl:.2f}}): its SFT term imitates completions the reference wrote, which
# keeps the policy near the reference though no term of its loss measures that distance.

# %%
progress("06")

# %% [markdown]
# ## What to try next
#
# - `train-dpo --online`: pairs from the current policy every round. Where does online DPO land on the
#   frontier? (`frontier` runs offline DPO; add a point by hand with `trainers.policy_eval.evaluate_policy`.)
# - `loss_type="hinge"` and `label_smoothing=0.1` in `DPOArgs`: does a loss that saturates, or one
#   that doubts its labels, keep the KL down?
# - SimPO in the trainer: `simpo_loss` needs no reference log-probs. Pass a `dpo_loss` replacement to
#   `train_dpo` that ignores the reference arguments and calls `simpo_loss` with the completion
#   lengths, and compare its samples' lengths with DPO's.
# - GSPO with its paper's clip range: `GRPOArgs(importance_level="sequence", clip_coef=3e-4,
#   clip_coef_high=4e-4)`, and watch how many sequences are clipped.
# - More points: `frontier --dpo-betas 0.01 0.03 0.1 0.3 1.0 --rl-phases 40`, or one method at a time
#   (`--methods ipo`).
# - The GPT-2 world: the same commands with `--world gpt2` on a GPU.
