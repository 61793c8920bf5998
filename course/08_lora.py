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
# with its group's mean, about **one bit** (better or worse than usual). A phase of chapter 04's GRPO
# samples 64 completions: some 64 bits of information for an update of millions of numbers. Supervised
# fine-tuning gets, per token, the whole target (a choice among the vocabulary: $\log_2 V$ bits, and many
# tokens per example). So a rank-1 adapter, a few thousand numbers here, should hold everything GRPO can
# learn in a run, while SFT, which carries many more bits, may need more. "LoRA Without Regret"
# (Thinking Machines, 2025) reports exactly that at scale: rank 1 matches full fine-tuning in RL and
# falls behind in SFT. This chapter measures it in the tiny world, on chapter 04's sentiment task and
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
    attach,
    detach,
    make_adapters,
    trainable_parameters,
    weight_matrices,
)
from rlhf_tutorial.trainers.lora import learner_functions
from rlhf_tutorial.worlds import is_smoke, is_tiny, load_policy, resolve_world

# %%
torch.manual_seed(0)
world = resolve_world(None)
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
if is_tiny():
    torch.set_num_threads(1)  # the tiny model runs fastest on one thread
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
# - **the scale $\alpha / r$**: the update's size stays about the same when the rank changes, so one
#   learning rate serves every rank (and a larger rank is not a larger step).
#
# Both are `nn.Parameter`s on the `device` given; `scale` is a plain float; a rank below 1 raises
# `ValueError` (the given first lines). `forward` takes any leading shape `[*b, d_in]`.

# %% exercise rlhf_tutorial.lora:LoRA | 15 min | difficulty 2 | importance 5

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
# Why those points: `ln1.hook_normalized` is exactly what $W_Q$, $W_K$, $W_V$ multiply (after the
# LayerNorm's scale, weight and bias), while `hook_resid_pre` is the residual stream before the
# LayerNorm; `hook_q` holds $x W_Q + b_Q$ before the attention scores use it, so adding there *is*
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
# ## 4. How many directions did a full fine-tune move?
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

# %% exercise rlhf_tutorial.lora:update_rank_profile | 10 min | difficulty 2 | importance 4

# %%
progress("08")
