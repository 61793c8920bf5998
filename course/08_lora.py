# %% [markdown]
# # 08. LoRA on hooks: how few parameters does reinforcement learning need?
#
# Every chapter so far trained **every** weight of the policy. Whoever takes RLHF to a real model
# trains far fewer: a **LoRA** adapter (Hu et al. 2021) freezes each weight matrix $W$ and learns a
# low-rank change of it,
#
# $$W' = W + \frac{\alpha}{r}\, A^\top B^\top, \qquad A \in \mathbb{R}^{r \times d_\text{in}},\;
# B \in \mathbb{R}^{d_\text{out} \times r},$$
#
# $r (d_\text{in} + d_\text{out})$ numbers instead of $d_\text{in} d_\text{out}$ (TransformerLens multiplies
# on the right, $y = x W$, so $W$ is $d_\text{in} \times d_\text{out}$ and the layer's output gains
# $\Delta y = \frac{\alpha}{r} (x A^\top) B^\top$). The optimizer keeps its two moments for those numbers
# only, and the frozen base can be shared between the policy and the reference.
#
# **Why RL should need very little.** A policy-gradient episode ends with one scalar reward: compared
# with its group's mean, about **one bit** (better or worse than usual; a rule of thumb, not a bound: the
# sentiment reward here is a continuous score). A phase of chapter 04's GRPO samples
# {{lora_grpo_r1.samples_per_phase}} completions: of the order of {{lora_grpo_r1.samples_per_phase}} bits of
# information for an update of the tiny policy's {{lora_rl.runs.0.policy_parameters:,}} numbers. Supervised fine-tuning gets, per token, the whole target: a choice among
# the vocabulary, at most $\log_2 V$ bits (an upper bound: a token the model already predicts well
# carries far less), and many tokens per example. So a rank-1 adapter, a few thousand numbers here, should hold everything GRPO can
# learn in a run, while SFT, which carries many more bits, may need more. "LoRA Without Regret"
# (Thinking Machines, 2025) reports that at scale: in RL even rank 1 matched full fine-tuning, while in
# SFT the small ranks fell behind once the data held more than they could store (a large enough rank
# kept up on small and medium data sets). This chapter measures it in the tiny world, on chapter 04's sentiment task and
# chapter 07's arithmetic.
#
# The plan: (1) the adapter, (2) attached through **hooks**, without touching a base weight,
# (3) **merged** into the weights for export, (4) GRPO and SFT at ranks 1, 4 and 16 against full
# fine-tuning, (5) how many directions chapter 03's full fine-tune actually moved.

# %% imports
import copy
import math
from collections.abc import Callable

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedTransformer

from rlhf_tutorial import check, figures, hint, progress
from rlhf_tutorial.devices import describe
from rlhf_tutorial.lora import (
    HOOK_POINTS,
    TARGETS,
    adapter_key,
    attach_lora,
    detach_lora,
    make_adapters,
    trainable_parameters,
    weight_matrices,
)
from rlhf_tutorial.tiny.tuned import tuned_dir
from rlhf_tutorial.trainers.checkpoint import load_tuned_policy
from rlhf_tutorial.trainers.lora import learner_functions
from rlhf_tutorial.trainers.lora_compare import CompareLoRAArgs, learning_rate, run_grpo, run_sft
from rlhf_tutorial.widgets.lora import cost_figure, rank_curves, spectrum_figure
from rlhf_tutorial.worlds import is_smoke, is_tiny, load_policy, load_reasoning_policy, resolve_world

# %%
torch.manual_seed(0)
world = resolve_world(None)
if is_tiny():
    torch.set_num_threads(1)  # the tiny model runs fastest on one thread
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
base = load_policy(world)
cfg = base.cfg
print(f"world: {world}; {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads of {cfg.d_head}, "
      f"d_mlp {cfg.d_mlp}: {sum(p.numel() for p in base.parameters()):,} parameters")

# %% [markdown]
# ## 1. One adapter
#
# An adapter holds $A$ (rank $\times$ $d_\text{in}$) and $B$ ($d_\text{out}$ $\times$ rank) and returns the
# change of its matrix's output,
#
# $$\Delta y = s\,(x A^\top) B^\top, \qquad s = \alpha / r,$$
#
# computed through the rank-$r$ bottleneck: $x A^\top$ first ($r$ numbers per position), never the full
# $d_\text{in} \times d_\text{out}$ matrix. Three choices make it train well:
#
# - **$B = 0$ at the start**, so $\Delta y = 0$: the tuned model starts *equal* to the base (its KL to
#   the reference is 0 at step 0, as in every other chapter);
# - **$A$ small and random** (standard normal draws divided by $\sqrt{d_\text{in}}$, from the generator
#   given, so that a seed fixes it): if $A$ were zero too, every gradient would be zero forever, since
#   $\partial L / \partial B = s\, (\partial L / \partial \Delta y)^\top (x A^\top)$ and
#   $\partial L / \partial A$ goes through $B$;
# - **the scale $\alpha / r$**: Adam's first steps move every entry of $B$ by about the learning rate,
#   whatever the rank, so for the batch they were computed on the update $x A^\top B^\top$ adds up $r$
#   contributions that point the same way and grows about $r$-fold; dividing by $r$ cancels that, so
#   the *first* steps' update has about the same size at every rank and one learning rate can serve
#   them all. That holds only roughly and only early (later steps are not all of one size, and $A$'s
#   directions are random). Rank-stabilized LoRA (rsLoRA, Kalajdzievski 2023) argues that with
#   $\alpha / r$ larger ranks learn more slowly as training goes on, and that $\alpha / \sqrt{r}$ keeps the
#   update's size stable in the rank. This chapter keeps Hu et al.'s $\alpha / r$ and measures the
#   learning rate rather than assuming it.
#
# Both are `nn.Parameter`s on the `device` given; `scale` is a plain float; a rank below 1 raises
# `ValueError` (the given first lines). `forward` takes any leading shape `[*b, d_in]`.
#
# **Predict, then check.** A rank-1 adapter of a $256 \times 64$ matrix: how many numbers does it train,
# and what share of the matrix's $16384$? At the start ($B = 0$), a loss on $\Delta y$ sends a gradient
# back: which of $A$ and $B$ gets a nonzero one? Write your answers down; the cell after the check
# prints them.

# %% exercise rlhf_tutorial.lora:LoRA | 15 min | difficulty 2 | importance 5

# %%
# your prediction, checked: r (d_in + d_out) numbers; at B = 0 only B's gradient is nonzero (A's goes through B)
adapter = LoRA(256, 64, rank=1, alpha=1.0, generator=torch.Generator().manual_seed(0))
print(f"rank 1: {trainable_parameters(adapter)} numbers, {trainable_parameters(adapter) / (256 * 64):.2%} of the matrix's")
x, w = torch.randn(5, 256), torch.randn(5, 64)
(adapter(x) * w).sum().backward()
print(f"at B = 0: |dL/dA| = {float(adapter.A.grad.norm()):.3g}, |dL/dB| = {float(adapter.B.grad.norm()):.3g}")

# %% [markdown]
# ## 2. Attaching through hooks
#
# A TransformerLens model exposes its activations at **hook points**; a forward hook may return a new
# value that replaces the activation. LoRA needs two per matrix: one where the matrix's **input** $x$
# lives (it only remembers $x$), and one where its **output** lives (it returns the output plus
# $\Delta y$). Per layer $L$ (prefix `blocks.L.`), the adapters of `TARGETS` use:
#
# | target | weight | read $x$ at | add $\Delta y$ at | $\Delta y$ shape |
# |---|---|---|---|---|
# | `q`, `k`, `v` | `attn.W_Q`, `W_K`, `W_V` | `ln1.hook_normalized` | `attn.hook_q`, `hook_k`, `hook_v` | `[b, s, head, d_head]` |
# | `o` | `attn.W_O` | `attn.hook_z`, heads flattened | `hook_attn_out` | `[b, s, d_model]` |
# | `mlp_in` | `mlp.W_in` | `ln2.hook_normalized` | `mlp.hook_pre` | `[b, s, d_mlp]` |
# | `mlp_out` | `mlp.W_out` | `mlp.hook_post` | `hook_mlp_out` | `[b, s, d_model]` |
#
# Why those points: `ln1.hook_normalized` is exactly what $W_Q$, $W_K$, $W_V$ multiply, the residual
# stream centred and divided by its scale, because both worlds' policies have their LayerNorm weights
# and biases folded into the next weights (`normalization_type="LNPre"`; with an unfolded LayerNorm
# TransformerLens's `hook_normalized` comes *before* its weight and bias), while `hook_resid_pre` is the
# residual stream before the LayerNorm; `hook_q` holds $x W_Q + b_Q$ before the attention scores use it, so adding there *is*
# changing $W_Q$. $W_O$ reads the heads' outputs $z$, all heads side by side (a vector of
# $\text{head} \cdot d_\text{head}$ numbers, flattened head-major: head 0's $d_\text{head}$ numbers
# first), and `hook_attn_out` is its output before it joins the residual stream. `mlp.hook_pre` is
# $W_\text{in}$'s output *before* the nonlinearity; `mlp.hook_post` the activation *after* it, which
# $W_\text{out}$ multiplies. The delta of q, k, v is computed as `[b, s, head * d_head]` and must be
# split into heads the same way.
#
# `adapters` maps keys `"L{layer}_{target}"` (`adapter_key`) to adapters; a matrix without one is left
# alone, and no adapters give no hooks. Return the list of `(hook_name, hook_fn)` pairs; a hook returns a
# new tensor (no in-place edit: training differentiates through it). The base weights are never touched.
# A trap: hooks made in a loop must each capture *their own* adapter and store (Python closures see the
# loop variable's last value unless it is bound when the function is made).

# %% exercise rlhf_tutorial.lora:lora_hooks | 25 min | difficulty 4 | importance 5

# %%
adapters = make_adapters(base, rank=2, alpha=4.0, seed=0, lora_cls=LoRA)  # your LoRA, B = 0
tokens = base.to_tokens(["This movie was", "I expected more from"], prepend_bos=True)
plain = base(tokens)
hooked = base.run_with_hooks(tokens, fwd_hooks=lora_hooks(base, adapters))
print(f"B = 0: largest logit change {float((hooked - plain).abs().max()):.2e} (the tuned model starts at the base)")
with torch.no_grad():
    for adapter in adapters.values():
        adapter.B.normal_(std=0.05)
hooked = base.run_with_hooks(tokens, fwd_hooks=lora_hooks(base, adapters))
print(f"B random: largest logit change {float((hooked - plain).abs().max()):.3f}; "
      f"adapters hold {trainable_parameters(adapters):,} parameters, "
      f"{trainable_parameters(adapters) / sum(p.numel() for p in base.parameters()):.2%} of the model's")

# %% [markdown]
# ## 3. Merging for export
#
# Hooks are a training device. To ship the tuned model (or hand it to another library, as `export-hf`
# does), fold each adapter into its matrix: $W' = W + s\, A^\top B^\top$, the $d_\text{in} \times
# d_\text{out}$ update mapped back to TransformerLens's shapes. $W_Q, W_K, W_V$ are stored
# `[head, d_model, d_head]` and $W_O$ `[head, d_head, d_model]`: split the concatenated heads exactly as
# the hooks flattened them. Work on a deep copy with every hook removed (permanent ones too: a copy
# keeps the hooks of a model whose LoRA is attached, and the update would then count twice), without
# gradients; the model and its adapters stay as they were. The merged copy needs no hook and gives the
# same logits, to float rounding.

# %% exercise rlhf_tutorial.lora:merge_lora | 20 min | difficulty 3 | importance 4

# %%
merged = merge_lora(base, adapters)
gap = float((merged(tokens) - base.run_with_hooks(tokens, fwd_hooks=lora_hooks(base, adapters))).abs().max())
print(f"merged vs hooked: largest logit difference {gap:.2e}")
assert gap < 1e-4

# %% [markdown]
# ## 4. GRPO at rank 1: does one bit per episode fit in a few thousand numbers?
#
# Chapter 04's GRPO trainer takes LoRA through two fields, `GRPOArgs(lora_rank=1, lora_alpha=16.0)` (alpha's
# default; on the command line `train-grpo --lora-rank 1`; chapter 03's `RLHFArgs` and chapter 07's `SFTArgs`
# have the same two fields). The trainer freezes the policy, attaches one adapter per layer and matrix through
# your hooks, and hands the optimizer only the adapters' $A$ and $B$. The reference model is copied
# before the adapters are attached, so it stays the base.
#
# **Learning rate.** An adapter's update starts from $B = 0$ and moves through a bottleneck, so the same
# step size moves the function far less than a full fine-tune's, and LoRA is usually given a larger rate. The runs below
# use {{lora_rl.learning_rates.lora:g}} for every rank against full fine-tuning's {{lora_rl.learning_rates.full:g}} (chapter 04's preset), {{lora_rl.lora_lr_ratio:.0f}} times
# larger. That choice was then checked against one other rate: `compare-lora --lr-multipliers 1 3 --num-phases 12` ran
# every rank at its rate and at three times it ({{lora_scan.args.num_phases}} phases, seed 0). Final mean rewards:
#
# | | rate | 3 x rate |
# |---|---|---|
# | full fine-tuning | {{lora_scan.scan.0.1.mean_reward_final:.2f}} (KL {{lora_scan.scan.0.1.kl_final:.2f}}) | {{lora_scan.scan.0.3.mean_reward_final:.2f}} (KL {{lora_scan.scan.0.3.kl_final:.2f}}) |
# | rank 16 | {{lora_scan.scan.16.1.mean_reward_final:.2f}} (KL {{lora_scan.scan.16.1.kl_final:.2f}}) | {{lora_scan.scan.16.3.mean_reward_final:.2f}} (KL {{lora_scan.scan.16.3.kl_final:.1f}}) |
# | rank 4 | {{lora_scan.scan.4.1.mean_reward_final:.2f}} (KL {{lora_scan.scan.4.1.kl_final:.2f}}) | {{lora_scan.scan.4.3.mean_reward_final:.2f}} (KL {{lora_scan.scan.4.3.kl_final:.1f}}) |
# | rank 1 | {{lora_scan.scan.1.1.mean_reward_final:.2f}} (KL {{lora_scan.scan.1.1.kl_final:.2f}}) | {{lora_scan.scan.1.3.mean_reward_final:.2f}} (KL {{lora_scan.scan.1.3.kl_final:.1f}}) |
#
# Every rank did better at the LoRA rate than at three times it, where it broke down, while full
# fine-tuning, over these few phases, did better at three times its preset than at the preset (the preset
# is chosen for 40 stable phases). That is all two rates per run can say, at one seed: no LoRA rate below
# {{lora_rl.learning_rates.lora:g}} and no full fine-tuning rate above three times {{lora_rl.learning_rates.full:g}} was tried, so neither best rate
# is bracketed, and their ratio is not measured by it (the LoRA rate is {{lora_rl.lora_lr_ratio:.0f}} times the full
# preset, a choice). Every rank preferred the same one of its two rates, which is what the $\alpha / r$
# scale is meant to allow.
#
# **Three seeds, and rates that bracket.** `compare-lora --task sentiment --ranks 1 4 16 --seeds 0 1 2
# --lr-multipliers 0.3 1 3` (then `--lr-multipliers 0.1` for the LoRA ranks' lowest column) and `compare-lora --task
# sentiment --ranks 0 --seeds 0 1 2 --lr-multipliers 1 3 10` ran every rank at three or four rates, three seeds each, at the {{lora_rl.args.num_phases}} phases of the runs below
# (final mean reward and KL, each the mean over the three seeds; recorded on another CPU than the five-seed
# runs further down, so its column at the LoRA rate is not their first three seeds):
#
# | | {{lora_scan_seeds_full.scan.0.1.learning_rate:g}} | {{lora_scan_seeds_full.scan.0.3.learning_rate:g}} | {{lora_scan_seeds.scan.1.1.learning_rate:g}} | {{lora_scan_seeds.scan.1.3.learning_rate:g}} |
# |---|---|---|---|---|
# | full fine-tuning | {{lora_scan_seeds_full.scan.0.1.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds_full.scan.0.1.kl_final.mean:.2f}}) | {{lora_scan_seeds_full.scan.0.3.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds_full.scan.0.3.kl_final.mean:.2f}}) | {{lora_scan_seeds_full.scan.0.10.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds_full.scan.0.10.kl_final.mean:.2f}}) | not run |
# | rank 16 | {{lora_scan_seeds_low.runs.16.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds_low.runs.16.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.16.0.3.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.16.0.3.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.16.1.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.16.1.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.16.3.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.16.3.kl_final.mean:.2f}}) |
# | rank 4 | {{lora_scan_seeds_low.runs.4.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds_low.runs.4.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.4.0.3.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.4.0.3.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.4.1.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.4.1.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.4.3.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.4.3.kl_final.mean:.2f}}) |
# | rank 1 | {{lora_scan_seeds_low.runs.1.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds_low.runs.1.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.1.0.3.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.1.0.3.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.1.1.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.1.1.kl_final.mean:.2f}}) | {{lora_scan_seeds.scan.1.3.mean_reward_final.mean:.2f}} (KL {{lora_scan_seeds.scan.1.3.kl_final.mean:.2f}}) |
#
# Full fine-tuning did best, by the mean, at three times its preset, worse below and no better above
# (where it paid a KL of {{lora_scan_seeds_full.scan.0.10.kl_final.mean:.1f}}). At three times the LoRA rate the KL blew up at every seed of
# ranks 4 and 16 (means of {{lora_scan_seeds.scan.4.3.kl_final.mean:.1f}} and {{lora_scan_seeds.scan.16.3.kl_final.mean:.1f}}) and at one seed of rank 1 (from
# {{lora_scan_seeds.scan.1.3.kl_final.min:.2f}} to {{lora_scan_seeds.scan.1.3.kl_final.max:.1f}}), and ranks 1 and 16 lost reward; at a third of it, which is full
# fine-tuning's best rate, each rank did about as well as at the LoRA rate: the seeds' ranges overlap (three seeds separate
# only large differences), and rank 4's mean is even a little higher there. At a tenth of the LoRA rate every rank's
# mean fell below its mean at a third, so each rank's best rate, by the mean, lies between a tenth and three times the
# LoRA rate: the scan brackets it. What this scan settles is the gap: every LoRA cell lies below full fine-tuning's
# worst ({{lora_scan_seeds_full.scan.0.1.mean_reward_final.mean:.2f}}, its best {{lora_scan_seeds_full.scan.0.3.mean_reward_final.mean:.2f}}); the best LoRA cell is rank 16's {{lora_scan_seeds.scan.16.1.mean_reward_final.mean:.2f}}. Whether LoRA needs a larger
# rate than full fine-tuning it does not settle: every rank did about as well at full fine-tuning's best
# rate.
#
# The cell runs **your** LoRA at rank 1 (about a minute in the tiny world); the other ranks come from
# the recorded run of the same settings, `python -m rlhf_tutorial compare-lora --world tiny --task sentiment`.
#
# **One seed is one draw.** {{lora_rl_seeds.args.num_phases}} short phases at this rate leave every run at the mercy of its seed,
# and rank 1 most of all: `compare-lora --world tiny --task sentiment --seeds 0 1 2 3 4` ran the same
# settings at five seeds, and rank 1 ended at a mean reward of {{lora_rl_seeds.runs.1.mean_reward_final.min:.2f}} to {{lora_rl_seeds.runs.1.mean_reward_final.max:.2f}} (mean
# {{lora_rl_seeds.runs.1.mean_reward_final.mean:.2f}}, standard deviation {{lora_rl_seeds.runs.1.mean_reward_final.std:.2f}}) with a KL of {{lora_rl_seeds.runs.1.kl_final.min:.2f}} to {{lora_rl_seeds.runs.1.kl_final.max:.2f}}. Seed 0, the one the
# tables quote, was the best of the five. On a CPU like the reference machine your run repeats seed 0;
# elsewhere (another CPU, a GPU) the arithmetic rounds differently in the last bits, which over a run can
# send sampling down other paths, as another seed would, so expect any number in that range. The cell checks your run against seed 0 on the
# reference machine, and against the five seeds' range (widened by one standard deviation each side)
# elsewhere: a LoRA that learns nothing stays near the starting {{lora_rl.runs.1.mean_reward_initial:.2f}} and fails both.

# %%
lora_args = CompareLoRAArgs(world=world, num_phases=2, groups_per_phase=2, eval_samples=8) if is_smoke() else CompareLoRAArgs(world=world)
rank1 = run_grpo(lora_args, 1, learning_rate("sentiment", 1), policy=copy.deepcopy(base), **learner_functions(globals()))
print(f"rank 1: mean reward {rank1['mean_reward_initial']:.3f} -> {rank1['mean_reward_final']:.3f}, KL {rank1['kl_final']:.3f}, "
      f"{rank1['trainable_parameters']:,} trained parameters of {rank1['policy_parameters']:,}, "
      f"optimizer state {rank1['optimizer_state_mb'] * 1024:.1f} KB, reward 0.9 first reached at phase {rank1['phases_to_target']}")
figures.agree("lora_rl", {"runs.1.mean_reward_final": rank1["mean_reward_final"], "runs.1.kl_final": rank1["kl_final"]})
print("samples:", rank1["samples_final"])

# %%
# the other ranks: the recorded run of the same settings (the tiny world's; none at smoke size)
recorded_rl = figures.recorded()["lora_rl"]["summary"]["runs"] if is_tiny() and not is_smoke() else {}
rank_curves({**{r: rec for r, rec in recorded_rl.items() if r != "1"}, "1": rank1})

# %% [markdown]
# The policy's weights did not move; the update lives in the adapters. Merged, it is an ordinary model
# (what `train-rlhf --lora-rank 1 --save DIR` writes and `export-hf --checkpoint DIR --out OUT` exports):

# %%
trained = rank1["_result"]
merged_policy = merge_lora(trained.policy, trained.adapters)
check_tokens = base.to_tokens(["This movie was"], prepend_bos=True)
print(f"base weights unchanged: {all(torch.equal(p, q) for p, q in zip(trained.policy.parameters(), base.parameters()))}; "
      f"merged vs hooked logits: {float((merged_policy(check_tokens) - trained.policy(check_tokens)).abs().max()):.1e}")

# %% [markdown]
# In the recorded run ({{lora_rl.args.num_phases}} phases of {{lora_rl.args.groups_per_phase}} groups of 8, seed 0, the tiny world), the final mean reward
# (64 samples), the KL per token and the first phase whose reward reached 0.9 (None: no phase did) were:
#
# | | trained parameters | optimizer state | final reward | KL | phases to 0.9 |
# |---|---|---|---|---|---|
# | full fine-tuning | {{lora_rl.runs.0.trainable_parameters:,}} | {{lora_rl.runs.0.optimizer_state_mb:.2f}} MiB | {{lora_rl.runs.0.mean_reward_final:.2f}} | {{lora_rl.runs.0.kl_final:.2f}} | {{lora_rl.runs.0.phases_to_target}} |
# | LoRA rank 16 | {{lora_rl.runs.16.trainable_parameters:,}} | {{lora_rl.runs.16.optimizer_state_mb:.3f}} MiB | {{lora_rl.runs.16.mean_reward_final:.2f}} | {{lora_rl.runs.16.kl_final:.2f}} | {{lora_rl.runs.16.phases_to_target}} |
# | LoRA rank 4 | {{lora_rl.runs.4.trainable_parameters:,}} | {{lora_rl.runs.4.optimizer_state_mb:.3f}} MiB | {{lora_rl.runs.4.mean_reward_final:.2f}} | {{lora_rl.runs.4.kl_final:.2f}} | {{lora_rl.runs.4.phases_to_target}} |
# | LoRA rank 1 | {{lora_rl.runs.1.trainable_parameters:,}} | {{lora_rl.runs.1.optimizer_state_mb:.3f}} MiB | {{lora_rl.runs.1.mean_reward_final:.2f}} | {{lora_rl.runs.1.kl_final:.2f}} | {{lora_rl.runs.1.phases_to_target}} |
#
# Seed 0 flatters rank 1: there it matched full fine-tuning. Over the five seeds the picture is steadier
# and plainer (final mean reward, mean over seeds and range):
#
# | | mean reward over seeds 0-4 | range | KL range |
# |---|---|---|---|
# | full fine-tuning | {{lora_rl_seeds.runs.0.mean_reward_final.mean:.2f}} | {{lora_rl_seeds.runs.0.mean_reward_final.min:.2f}} to {{lora_rl_seeds.runs.0.mean_reward_final.max:.2f}} | {{lora_rl_seeds.runs.0.kl_final.min:.2f}} to {{lora_rl_seeds.runs.0.kl_final.max:.2f}} |
# | LoRA rank 16 | {{lora_rl_seeds.runs.16.mean_reward_final.mean:.2f}} | {{lora_rl_seeds.runs.16.mean_reward_final.min:.2f}} to {{lora_rl_seeds.runs.16.mean_reward_final.max:.2f}} | {{lora_rl_seeds.runs.16.kl_final.min:.2f}} to {{lora_rl_seeds.runs.16.kl_final.max:.2f}} |
# | LoRA rank 4 | {{lora_rl_seeds.runs.4.mean_reward_final.mean:.2f}} | {{lora_rl_seeds.runs.4.mean_reward_final.min:.2f}} to {{lora_rl_seeds.runs.4.mean_reward_final.max:.2f}} | {{lora_rl_seeds.runs.4.kl_final.min:.2f}} to {{lora_rl_seeds.runs.4.kl_final.max:.2f}} |
# | LoRA rank 1 | {{lora_rl_seeds.runs.1.mean_reward_final.mean:.2f}} | {{lora_rl_seeds.runs.1.mean_reward_final.min:.2f}} to {{lora_rl_seeds.runs.1.mean_reward_final.max:.2f}} | {{lora_rl_seeds.runs.1.kl_final.min:.2f}} to {{lora_rl_seeds.runs.1.kl_final.max:.2f}} |
#
# Full fine-tuning lands in a narrow band at every seed; the three LoRA ranks, at their one rate
# ({{lora_rl.learning_rates.lora:g}}), trail it in these {{lora_rl.args.num_phases}} phases and are **indistinguishable from each
# other** on average. That is the claim that matters here: rank 1, about half a percent of the model's
# numbers, learns as much as rank 16, as it should if what GRPO learns from the reward in
# {{lora_rl_seeds.args.num_phases}} phases of {{lora_rl_seeds.args.groups_per_phase}} groups fits in one direction per matrix. Rank 1's final rewards spread the widest of the four, so one rank-1
# run tells the least (rank 16's KL spread the widest: five seeds are few). These five seeds ran one LoRA
# rate; the three-seed scan above found no rate between a tenth of it and three times it that closes the
# gap to full fine-tuning.
# What the tables do not show is a rank too small for the task: none was.
#
# The optimizer state is AdamW's two moments per trained number (float32), so it shrinks exactly with the
# trained parameters; on a GPU with a large model that is the memory LoRA saves (the frozen weights and the
# activations stay). `train-grpo --world tiny --lora-rank 1 --learning-rate 3e-3` (40 phases, the preset)
# reached {{lora_grpo_r1.mean_reward_final:.2f}} with a KL of {{lora_grpo_r1.kl_final:.2f}}, first crossing 0.9 at phase {{lora_grpo_r1.phases_to_target}}.
#
# PPO is less forgiving. Chapter 03's trainer with the same field (`train-rlhf --world tiny --lora-rank 1
# --learning-rate 2e-3`, about three times its preset's rate; its value head still trains in full)
# climbed from {{lora_ppo_r1.mean_reward_initial:.2f}} to {{lora_ppo_r1.mean_reward_final:.2f}} in {{lora_ppo_r1.phases}} phases at a KL of {{lora_ppo_r1.kl_final:.2f}}, where the full fine-tune
# reaches {{rlhf_neg.mean_reward_final:.2f}}. This is the only rate recorded for LoRA with PPO: its rate was not scanned,
# and a scan like section 4's is the next experiment to run.

# %% [markdown]
# ## 5. SFT at the same ranks: many bits per example
#
# Supervised fine-tuning on chapter 07's worked arithmetic gives the model, at every token of every
# demonstration, the token to write: far more information per example than a reward's one bit. If
# capacity is what LoRA lacks, SFT is where a small rank should show it. One pass over
# {{lora_sft.args.n_demonstrations}} demonstrations (the world has fewer than two hundred distinct one-step problems,
# two operands from 1 to 9 and + or -: they repeat),
# then pass@1 on {{lora_sft.args.eval_problems}} problems of the evaluation split ({{lora_sft.args.pass_samples}} samples each; a separate draw,
# but with so few distinct problems most of them are also among the demonstrations). The cell runs full fine-tuning and your
# rank 1; the other ranks come from `compare-lora --world tiny --task arithmetic`.

# %%
sft_args = CompareLoRAArgs(world=world, task="arithmetic", n_demonstrations=32, eval_problems=4) if is_smoke() else CompareLoRAArgs(world=world, task="arithmetic")
arith_base = load_reasoning_policy(world)
sft_runs = {str(rank): run_sft(sft_args, rank, learning_rate("arithmetic", rank), base=arith_base, **learner_functions(globals()))
            for rank in (0, 1)}
figures.agree("lora_sft", {f"runs.{rank}.pass_at_1_final": record["pass_at_1_final"] for rank, record in sft_runs.items()})
for rank, record in sft_runs.items():
    print(f"rank {rank}: pass@1 {record['pass_at_1_final']:.3f}, loss {record['loss_first']:.3f} -> {record['loss_last_5']:.3f} "
          f"({record['trainable_parameters']:,} trained parameters)")

# %%
recorded_sft = figures.recorded()["lora_sft"]["summary"]["runs"] if is_tiny() and not is_smoke() else sft_runs
seed_spread = figures.recorded()["lora_rl_seeds"]["summary"]["runs"] if is_tiny() and not is_smoke() else None
cost_figure({**recorded_rl, "1": rank1} if recorded_rl else {"1": rank1}, sft=recorded_sft, seeds=seed_spread)

# %% [markdown]
# The recorded SFT run (seed 0, {{lora_sft.runs.0.steps}} steps): pass@1 {{lora_sft.runs.0.pass_at_1_final:.3f}} after full fine-tuning,
# {{lora_sft.runs.16.pass_at_1_final:.3f}} at rank 16, {{lora_sft.runs.4.pass_at_1_final:.3f}} at rank 4 and {{lora_sft.runs.1.pass_at_1_final:.3f}} at rank 1; the training loss
# of the last steps tells the same story more steadily: {{lora_sft.runs.0.loss_last_5:.4f}}, {{lora_sft.runs.16.loss_last_5:.4f}}, {{lora_sft.runs.4.loss_last_5:.4f}} and
# {{lora_sft.runs.1.loss_last_5:.4f}} nats per token. Here rank 1 **falls behind**, while in RL it did as well as rank 16: SFT's targets carry
# more than one direction per matrix can hold, GRPO's rewards do not (one reading of one run). Read both with their sizes in
# mind: {{lora_sft.args.eval_problems}} problems x {{lora_sft.args.pass_samples}} samples and 64 samples of reward are noisy (standard errors of a few
# hundredths), and one seed is one draw.

# %% [markdown]
# ## 6. How many directions did a full fine-tune move?
#
# A weight change $\Delta = W_\text{tuned} - W_\text{base}$ has singular values
# $s_1 \ge s_2 \ge \dots$, and its squared size splits over them: $\|\Delta\|_F^2 = \sum_i s_i^2$. The
# number of directions that carry a fraction $f$ of the change is the smallest $k$ with
#
# $$\sum_{i \le k} s_i^2 \ \ge\ f \sum_i s_i^2 .$$
#
# If $k$ is small for every matrix, a rank-$k$ adapter could have made the same change. Return the
# singular values (largest first, `float32`, computed in `float64`: a float32 SVD loses the small ones
# next to large ones) and $k$ as an int; "reaches" means $\ge$ (allow a relative $10^{-6}$ for rounding,
# so that $f = 1$ counts the nonzero values); a zero change or $f = 0$ gives $k = 0$.
#
# **Predict, then check.** A change with singular values $4, 2, 1, 0.5$: what is $k$ for $f = 0.5$, and
# for $f = 0.9$? And for $f = 0.9$ if one (wrongly) summed the $s_i$ instead of their squares? The cell
# after the check prints the first two.

# %% exercise rlhf_tutorial.lora:update_rank_profile | 10 min | difficulty 2 | importance 4

# %%
# your prediction, checked: the squares 16, 4, 1, 0.25 sum to 21.25; the largest carries 75%, the top two 94%
# (summing the s_i, 4 + 2 = 6 is only 80% of 7.5: that mistake would say 3 for 90%)
four = torch.diag(torch.tensor([4.0, 2.0, 1.0, 0.5]))
print(f"k(50%) = {update_rank_profile(four, 0.5)[1]}, k(90%) = {update_rank_profile(four, 0.9)[1]}")

# %%
if is_tiny():
    # chapter 03's full fine-tune as chapter 05 reads it: the shipped tuned policy against the base
    tuned_policy = load_tuned_policy(tuned_dir()).base_model
    spectrum_base, spectrum_what = base, "chapter 03's PPO fine-tune (the shipped tuned policy)"
else:
    # the GPT-2 world ships no tuned policy: section 5's full SFT run stands in for it
    tuned_policy = sft_runs["0"]["_result"].policy
    spectrum_base, spectrum_what = arith_base, "section 5's full SFT run"
before, after = weight_matrices(spectrum_base), weight_matrices(tuned_policy)
spectra, ks = {}, {}
for key in before:
    values, k90 = update_rank_profile(after[key] - before[key], 0.9)
    spectra[key], ks[key] = values, (update_rank_profile(after[key] - before[key], 0.5)[1], k90)
gaussian, _ = update_rank_profile(torch.randn(*before["L0_q"].shape, generator=torch.Generator().manual_seed(0)))
for key in list(spectra)[:6]:
    print(f"{key:>10} {tuple(before[key].shape)}: k(50%) = {ks[key][0]:>3}, k(90%) = {ks[key][1]:>3}")
if is_tiny():
    figures.agree("lora_spectrum", {"median_k_90": sorted(k[1] for k in ks.values())[len(ks) // 2],
                                    "median_k_50": sorted(k[0] for k in ks.values())[len(ks) // 2]})
spectrum_figure(spectra, ks, random=gaussian, title=f"How many directions {spectrum_what} moved")

# %% [markdown]
# Chapter 05 found that chapter 03's fine-tune changed {{lora_spectrum.fraction_changed:.0%}} of the entries: a
# dense update. Its spectrum says how many *directions* that dense change spans: half of each matrix's
# squared change lies in a median of {{lora_spectrum.median_k_50}} directions, 90% in {{lora_spectrum.median_k_90}} (at most {{lora_spectrum.max_k_90}}),
# out of {{lora_spectrum.min_dim_median}} for the typical matrix; a Gaussian matrix of the same shape needs
# {{lora_spectrum.random_median_k_90}} for 90%. So the full fine-tune is neither rank 1 nor noise: its largest direction
# holds a median {{lora_spectrum.median_top1_share:.0%}} of the change, and the rest is spread over tens of directions.
# Section 4 is the other half of the argument, and it is only half won: a rank-1 adapter, which can move
# each matrix in one direction only, reached over five seeds a mean reward of {{lora_rl_seeds.runs.1.mean_reward_final.mean:.2f}},
# against full fine-tuning's {{lora_rl_seeds.runs.0.mean_reward_final.mean:.2f}}, but as much as ranks 4 and 16 ({{lora_rl_seeds.runs.4.mean_reward_final.mean:.2f}} and {{lora_rl_seeds.runs.16.mean_reward_final.mean:.2f}}). So the
# rank is not what held LoRA back in those runs: one direction per matrix did as well as sixteen, far
# fewer than the full fine-tune's spectrum spreads over. Nor was it the learning rate, within the
# range section 4's three-seed scan tried; what did hold it back (the number of phases, the targets, or
# alpha, which under Adam acts much like the learning rate, as Hu et al. note, so the scan covers part of
# it) is untested here.

# %%
progress("08")

# %% [markdown]
# ## What to try next
#
# - `train-grpo --world tiny --lora-rank 1 --learning-rate 3e-4`: the full fine-tune's rate. How far does
#   rank 1 get in 40 phases?
# - LoRA on attention only: the trainers make adapters for every target (`trainers.lora.apply_lora`), so
#   pass GRPO `lora_functions={"lora_hooks": f}`, where `f`, given the model and the adapters, calls your `lora_hooks` on only
#   the adapters whose key ends in `_q`, `_k`, `_v` or `_o` (the MLP adapters then get no gradient and stay
#   at $B = 0$). Which
#   matrices does the sentiment task need?
# - `train-rlhf --world tiny --lora-rank 4 --learning-rate 2e-3 --save DIR`, then `export-hf --checkpoint DIR --out OUT`:
#   PPO with LoRA, merged and exported (the value head is trained in full: it starts from scratch), at
#   the rate section 4's rank-1 PPO run used.
# - `compare-lora --world tiny --task sentiment --seeds 0 1 2 3 4 --num-phases 40`: do the LoRA ranks catch
#   up with full fine-tuning given twice the phases, and does rank 1's spread narrow?
# - SFT with more data (`compare-lora --task arithmetic --n-demonstrations 8192`, four times the
#   recorded run's {{lora_sft.args.n_demonstrations}}): does rank 1 fall further behind when there are more bits to learn?
