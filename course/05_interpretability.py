# %% [markdown]
# # 05. What RLHF changed inside the model, and where
#
# In chapter 03 you tuned a policy with PPO until its reviews turned **negative**. The samples show
# *that* it changed. This chapter opens both models, the **base** (the reference policy) and the
# **tuned** one, with TransformerLens hooks and asks *where*: at which layer the tuned model decides
# to be negative, which components write the decision, which activations carry it, and how much the
# weights themselves moved.
#
# | section | question | tool (your exercise) |
# |---|---|---|
# | 1. behaviour | what changed in the output? | `sentiment_direction` |
# | 2. lenses | at which layer is the decision readable? where does the value form? | `ln_pre`, `logit_lens_score`, `value_lens` |
# | 3. attribution | which heads and MLPs write the shift? | `head_attribution` |
# | 4. patching | which activations are *enough* to carry it? | `patch_activation`, `restored_fraction` |
# | 5. model diffing | what was the fine-tune about, read from unrelated text? | `activation_difference` |
# | 6. weights | how much, and how sparsely, did the weights move? | `param_change`, `fraction_changed` |
#
# Everything here is a **linear readout** of the residual stream. Both models are processed like
# `HookedTransformer.from_pretrained`: LayerNorm weights are folded into the next layer, so the final
# LayerNorm only centres and scales, and
#
# $$\text{logits} = \mathrm{ln\_pre}(x_{\text{final}})\, W_U + b_U,\qquad \mathrm{ln\_pre}(x) = \frac{x - \bar x}{\sqrt{\overline{(x - \bar x)^2} + \varepsilon}}$$
#
# where $x_{\text{final}}$ is the residual stream after the last block. The residual stream is a sum of
# what every component wrote: $x_{\text{final}} = \text{embed} + \sum_{\text{layers}} (\text{attn}_\ell + \text{mlp}_\ell)$.
#
# **The tuned model.** In the tiny world it ships with the package: `python -m rlhf_tutorial build-tuned
# --world tiny` ran chapter 03's trainer (seed 0, towards negative, ~1 minute) and saved the policy and
# its value head. You need no other notebook. In the GPT-2 world, set `RLHF_TUTORIAL_TUNED_DIR` to a
# folder saved by `python -m rlhf_tutorial train-rlhf --world gpt2 --save DIR`; without it the cell
# below trains one with chapter 03's preset (long: use a GPU) and saves it to `runs/`, and reuses it
# later only while it belongs to the GPT-2 you have (a run records the model it was trained on; a
# stand-in GPT-2 of the tests records its tokenizer and vocabulary size).

# %% imports
import os
from pathlib import Path

import plotly.graph_objects as go
import torch
import torch.nn as nn
from jaxtyping import Float, Int
from plotly.subplots import make_subplots
from torch import Tensor

from rlhf_tutorial import check, figures, hint, progress
from rlhf_tutorial.devices import describe
from rlhf_tutorial.interp import (
    NEUTRAL_TEXTS,
    PATCH_COMPONENTS,
    PROMPTS,
    closure_error,
    final_score,
    first_layer_reaching,
    lens_records,
    mean_attributions,
    patching_sweep,
    prompt_tokens,
    sentiment_words,
    single_token_ids,
    steered_samples,
    vocab_ranks,
    word_rank_baseline,
)
from rlhf_tutorial.rewards import sentiment_reward_fn
from rlhf_tutorial.rlhf import get_samples
from rlhf_tutorial.trainers.interp_report import load_pair, reuse_or_train_tuned
from rlhf_tutorial.widgets.interp import (
    attribution_figure,
    lens_explorer,
    param_change_figure,
    patching_figure,
    steering_explorer,
)
from rlhf_tutorial.worlds import is_smoke, is_tiny, resolve_world

# %%
torch.manual_seed(0)
world = resolve_world(None)
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
if is_tiny():
    torch.set_num_threads(1)  # the tiny model's matrices gain nothing from more threads
checkpoint = os.environ.get("RLHF_TUTORIAL_TUNED_DIR")
if checkpoint is None and not is_tiny():
    # chapter 03's run of this very GPT-2 (for a stand-in: the same tokenizer), else one trained now
    checkpoint = reuse_or_train_tuned(world, Path("runs") / ("tuned_gpt2_neg_smoke" if is_smoke() else "tuned_gpt2_neg"),
                                      smoke=is_smoke())
base, tuned = load_pair(world, checkpoint)  # tuned: chapter 03's TransformerWithValueHead
tuned_model = tuned.base_model
torch.set_grad_enabled(False)  # this chapter only reads the models
prompts = PROMPTS[:3] if is_smoke() else PROMPTS
print(f"world: {world}; {base.cfg.n_layers} layers, {base.cfg.n_heads} heads, d_model={base.cfg.d_model}")

# %% [markdown]
# ## 1. Behaviour first
#
# The same prompt, both models. First their samples with the sentiment classifier's P(NEGATIVE), then
# their next-token distributions right after the prompt: the first word a review chooses.

# %%
reward_fn = sentiment_reward_fn(world, "neg")  # P(NEGATIVE | text), as in chapter 03
n_show = 4 if is_smoke() else 6
for name, model in [("base", base), ("tuned", tuned_model)]:
    torch.manual_seed(1)
    _, texts = get_samples(model, PROMPTS[0], n_show, 16)
    print(f"--- {name}: mean P(NEGATIVE) {reward_fn(texts).mean():.3f}")
    for text in texts:
        print("   ", text)

# %%
tokens = base.to_tokens(PROMPTS[0])
fig = make_subplots(rows=1, cols=2, subplot_titles=["base", "tuned"], horizontal_spacing=0.15)
for col, model in enumerate([base, tuned_model], start=1):
    probs = model(tokens)[0, -1].softmax(-1)
    top = probs.topk(12)
    fig.add_trace(go.Bar(x=top.values.tolist()[::-1], y=[model.to_string(int(i)) for i in top.indices][::-1],
                         orientation="h", showlegend=False), row=1, col=col)
fig.update_layout(title=f"next token after {PROMPTS[0]!r}", height=380, template="plotly_white")
fig

# %% [markdown]
# ### A sentiment direction in the unembedding
#
# A logit is a dot product: $\text{logit}_i = h \cdot W_U[:, i] + b_U[i]$ with $h = \mathrm{ln\_pre}(x_{\text{final}})$.
# Take a set of positive review words $P$ and negative ones $N$ (single tokens of the world's
# vocabulary). The **logit difference**
#
# $$\Delta(h) = \operatorname{mean}_{i \in N} \text{logit}_i - \operatorname{mean}_{j \in P} \text{logit}_j
#   = h \cdot \underbrace{\Big(\operatorname{mean}_{i \in N} W_U[:, i] - \operatorname{mean}_{j \in P} W_U[:, j]\Big)}_{\texttt{direction}} + \text{const}$$
#
# is a single direction in the residual stream. Every analysis below reads the residual stream through
# it. We take it from the **base** model's $W_U$ and keep it fixed for both models: one yardstick.
#
# ### Exercise: `sentiment_direction`
#
# Compute the underbraced vector above, shape `[d_model]`, from `W_U` (`[d_model, d_vocab]`) and two
# 1-d tensors of token ids. The contract's edge cases: the two lists have different lengths (55 and 45
# words in the tiny world), so each side is a **mean**, not a sum; a token listed twice counts twice;
# and the direction keeps its length (no normalising), so that $h \cdot \texttt{direction}$ *is* the
# logit difference.
#
# This exercise and the next ones get their tensors on the models' device (a GPU when there is one;
# the ids may stay on the CPU: indexing accepts that) and return their result on it: build any new
# tensor with `device=` of an input.

# %% exercise rlhf_tutorial.interp:sentiment_direction | 15 min | difficulty 2 | importance 5

# %% [markdown]
# **Predict, then check.** Before you run the next cell, write down the sign you expect of the residual
# logit difference $h \cdot \texttt{direction}$ at the last token of each prompt, for the base model and
# for the tuned one. The base model writes reviews of both kinds (its samples above score a mean
# P(NEGATIVE) well below 1/2); the tuned one was pushed towards negative. Then run it: do all prompts
# agree, and is the base model's number about zero, or clearly on one side?

# %%
pos_ids, pos_words = single_token_ids(base, sentiment_words()[0])
neg_ids, neg_words = single_token_ids(base, sentiment_words()[1])
direction = sentiment_direction(base.W_U, pos_ids, neg_ids)
tokens_list = prompt_tokens(base, prompts)
print(f"{len(pos_words)} positive words (e.g. {pos_words[:5]}), {len(neg_words)} negative (e.g. {neg_words[:5]})")
for p, t in zip(prompts, tokens_list):
    scores = [float(final_score(m, t, direction)) for m in (base, tuned_model)]
    print(f"{p!r:>30}: residual logit difference  base {scores[0]:+.3f}   tuned {scores[1]:+.3f}")

# %% [markdown]
# The tuned model's residual stream points much further along the direction. But its *logits* moved
# even more, because PPO also trained the unembedding. The tuned model's own logit difference splits
# exactly into three parts:
#
# $$\Delta_{\text{tuned}} = \underbrace{h_t \cdot d_{\text{base}}}_{\text{residual stream}} + \underbrace{h_t \cdot (d_{\text{tuned}} - d_{\text{base}})}_{W_U\text{ moved}} + \underbrace{\bar b_U^N - \bar b_U^P}_{\text{bias}}$$
#
# The rest of the chapter studies the first part, what the **residual stream** carries: that is where
# layers, heads and MLPs write. The second is a change of the readout itself (section 6 measures it).

# %%
t = tokens_list[0]
h_t = tuned_model.run_with_cache(t, names_filter="ln_final.hook_normalized")[1]["ln_final.hook_normalized"][0, -1]
d_tuned = sentiment_direction(tuned_model.W_U, pos_ids, neg_ids)
logits = tuned_model(t)[0, -1]
parts = {"residual stream (base direction)": float(h_t @ direction),
         "W_U moved": float(h_t @ (d_tuned - direction)),
         "b_U": float(tuned_model.b_U[neg_ids].mean() - tuned_model.b_U[pos_ids].mean())}
for k, v in parts.items():
    print(f"{k:>34}: {v:+.3f}")
print(f"{'sum':>34}: {sum(parts.values()):+.3f}   (the tuned logits: {float(logits[neg_ids].mean() - logits[pos_ids].mean()):+.3f})")

# %% [markdown]
# ## 2. The logit lens and the value lens
#
# The residual stream before block $\ell$ is what the model "knows" after $\ell$ blocks. The **logit
# lens** pretends the model stopped there: apply the final LayerNorm and the unembedding to it.
# Through our direction that is one number per layer (and position):
#
# $$\text{lens}_\ell = \mathrm{ln\_pre}(x_\ell) \cdot \texttt{direction}$$
#
# `ln_pre` is the final LayerNorm of a folded model: centre over `d_model`, divide by the root of the
# (biased) variance plus $\varepsilon$, no weights. The **value lens** does the same with the value head
# chapter 03 trained on `ln_final.hook_normalized`: $V_\ell = \text{value\_head}(\mathrm{ln\_pre}(x_\ell))$.
# Where the lens jumps, a block wrote the decision; where it is flat, nothing changed.
#
# Two things to know before reading values.
#
# **Which head reads which residual.** Only the tuned model has a value head: chapter 03 trained it
# beside the policy, on the *tuned* model's `ln_final.hook_normalized`; the base model never had one.
# So both columns of the value lens use the **tuned model's head**: the "tuned" column reads the tuned
# model's own residual stream (what the head was trained on, at the last layer), the "base" column reads
# the **base** model's residual stream through that same head, activations it never saw in training.
# A difference between the columns is a difference of the residual streams, seen by one fixed reader.
#
# **What the head predicts, and on which scale.** Not P(NEGATIVE). Chapter 03's trainer (GAE, the
# tiny preset) fitted it to returns made of the rollout's **whitened** score (zero mean over each
# batch, so an average completion is worth 0 whatever its P(NEGATIVE)) plus the per-token KL rewards
# still to come ($-\beta k_1$ each). At the last prompt token its target is therefore "an average score,
# 0" minus the KL the 16 tokens still to be written will cost: a small **negative** number. Recorded
# with `python -m rlhf_tutorial interp-report --world tiny --seed 0`, averaged over the 8 prompts: the
# head gives {{interp.value_final.base:.2f}} on the base model's final residual and
# {{interp.value_final.tuned:.2f}} on the tuned model's, although the tuned model's samples of the
# course prompt score a mean P(NEGATIVE) of {{interp.tuned_reward_prompt0:.2f}} (16 samples) against the
# base model's {{interp.steering_reward.before:.2f}} (the same 16-sample measurement). Both values are negative and close: the head learned a baseline, not the reward.
# Read the value lens for **where along the layers it changes**, not for its level or its sign.
#
# ### Exercise: `ln_pre`
#
# The formula is in the first cell of this chapter. Shapes: any leading dims, the statistics over the
# last one (`d_model`). The edge cases the check probes: vectors whose mean is far from 0, tiny
# magnitudes (where $\varepsilon$ decides the result), a zero vector and a constant one (centred to 0:
# the output must be 0, not NaN).

# %% exercise rlhf_tutorial.interp:ln_pre | 10 min | difficulty 2 | importance 3

# %% [markdown]
# ### Exercise: `logit_lens_score`
#
# $\text{lens}_\ell = \mathrm{ln\_pre}(x_\ell) \cdot \texttt{direction}$ for every vector $x_\ell$ of
# `resid_stack`, whose leading dims are any (`[layer, batch, pos, d]`, `[layer, d]`, ...): the output
# keeps them and loses `d`. Pass `eps` on.

# %% exercise rlhf_tutorial.interp:logit_lens_score | 15 min | difficulty 3 | importance 4

# %% [markdown]
# ### Exercise: `value_lens`
#
# $V_\ell = \text{value\_head}(\mathrm{ln\_pre}(x_\ell))$ for every vector of the stack: shape `[layer, *b]`
# (the head's own output ends in a dim of size 1 that the lens does not keep; a batch of 1 stays). A
# lens only *reads*: it must leave the head's parameters and any gradients they hold exactly as they
# were (no `zero_grad()`, no `requires_grad_(False)`; `torch.no_grad()` is fine). The head is on the
# residuals' device (chapter 03 put it where the model is).

# %% exercise rlhf_tutorial.interp:value_lens | 15 min | difficulty 3 | importance 4

# %% [markdown]
# `cache.accumulated_resid()` stacks the residual stream before each block and after the last one:
# `[layer + 1, batch, pos, d_model]`. Below: the lens at the **last prompt token**, averaged over
# the prompts, for both models. Then the explorer: every layer and position of a few texts (the course
# prompt followed by a good and a bad word, and two base samples), base | tuned | difference (in a
# kernel that draws no widgets, the same numbers print as tables).
#
# **Predict, then check.** Before running: at `0_pre` (the embeddings, before any block ran), will the
# two models' logit lens agree? (Which weights did PPO train?) And will the value lens's last row be
# positive for the tuned model, whose samples are almost all negative reviews?

# %%
def lens_at_last_token(model):
    rows = []
    for t in tokens_list:
        stack, labels = model.run_with_cache(t)[1].accumulated_resid(return_labels=True, pos_slice=-1)
        rows.append(torch.stack([logit_lens_score(stack[:, 0], direction), value_lens(stack[:, 0], tuned.value_head)]))
    return torch.stack(rows).mean(0), labels  # [2 (logit, value), layer + 1]


lens_base, labels = lens_at_last_token(base)
lens_tuned, _ = lens_at_last_token(tuned_model)
print(f"{'':>12} {'logit lens base':>16} {'tuned':>8} {'value lens base':>16} {'tuned':>8}")
for i, label in enumerate(labels):
    print(f"{label:>12} {lens_base[0, i]:>16.3f} {lens_tuned[0, i]:>8.3f} {lens_base[1, i]:>16.3f} {lens_tuned[1, i]:>8.3f}")
half = first_layer_reaching(lens_tuned[0].tolist(), 0.5)
print(f"the tuned model's logit lens first reaches half its final value at {labels[half]}")
print(f"the tuned model's value head on the final residual: base model {lens_base[1, -1]:+.3f}, "
      f"tuned model {lens_tuned[1, -1]:+.3f}")
figures.agree("interp", {"value_final.base": float(lens_base[1, -1]), "value_final.tuned": float(lens_tuned[1, -1])});

# %%
torch.manual_seed(2)
lens_texts = [PROMPTS[0] + " bad.", PROMPTS[0] + " good."] + get_samples(base, PROMPTS[0], 2, 12)[1]
records = lens_records(base, tuned, direction, lens_texts, logit_lens=logit_lens_score, value_lens_fn=value_lens)
lens_explorer(records)

# %% [markdown]
# Questions to answer from the table and the heatmaps:
#
# - At which layer does the tuned model's lens cross zero, at the last prompt token? Is it
#   already different from the base model at the embedding (`0_pre`), i.e. before any block ran?
# - The value head was trained on the final residual only. Does it read anything sensible at earlier
#   layers? Where does the value estimate form, and does it agree with the logit lens?
# - On a text that ends in " bad." vs " good.", which positions does the difference light up?

# %% [markdown]
# ## 3. Direct logit attribution: who writes the shift
#
# The final LayerNorm is not linear, but once its scale $\sigma$ (`ln_final.hook_scale`, one number per
# position) is fixed it is: centring is linear and so is dividing by $\sigma$. So the readout splits
# over the components that wrote into the residual stream:
#
# $$\mathrm{ln\_pre}(x_{\text{final}}) \cdot d = \sum_{c} \frac{(c - \bar c) \cdot d}{\sigma},\qquad c \in \{\text{embed},\ \text{head}_{\ell,h},\ b_O^{\ell},\ \text{mlp}_\ell\}$$
#
# Head $h$ of layer $\ell$ writes $z_{\ell,h} W_O^{\ell,h}$ at the position read (its share of
# `attn_out`, without the bias $b_O$, which the heads share). Its **direct logit attribution** is its
# term in the sum, averaged over examples, each divided by its own scale. "Direct" because it counts
# only the path straight to the logits, not what later layers do with the head's output.
#
# ### Exercise: `head_attribution`
#
# `head_out[b, l, h]` is head $h$ of layer $l$'s output for example $b$; `ln_scale[b]` the final scale.

# %% exercise rlhf_tutorial.interp:head_attribution | 25 min | difficulty 4 | importance 5

# %% [markdown]
# Now the bookkeeping: the heads (through your `head_attribution`), the attention biases, the MLPs and
# the embedding must add up to the readout itself, for both models. The tolerance is float32
# round-off, far below any number we interpret.

# %%
attr = {name: mean_attributions(m, tokens_list, direction, attribution=head_attribution)
        for name, m in [("base", base), ("tuned", tuned_model)]}
for name, parts in attr.items():
    error = closure_error(parts)
    print(f"{name}: total {float(parts['total']):+.4f}; heads {float(parts['heads'].sum()):+.4f}, attention biases "
          f"{float(parts['attn_bias'].sum()):+.4f}, MLPs {[round(v, 4) for v in parts['mlp'].tolist()]}, embed "
          f"{float(parts['embed']):+.4f}; |sum - total| = {error:.2e}")
    assert error < 1e-3 * max(1.0, abs(float(parts["total"]))), "the attributions do not add up to the total"
attribution_figure(attr["base"], attr["tuned"])

# %% [markdown]
# Which components changed their contribution most between base and tuned: heads or MLPs, early or
# late? A large difference says that component's output moved along the direction; it does not say
# the component *caused* the shift by itself (its input may have changed). Patching asks that.

# %% [markdown]
# ## 4. Activation patching, tuned -> base
#
# Run the **base** model, but replace one activation with the value it has in the **tuned** model on the
# same prompt. If the base model now behaves like the tuned one, that activation carries (enough of)
# the change. With the metric $m$ = the residual logit difference at the last token, averaged over
# the prompts:
#
# $$\text{restored} = \frac{\bar m_{\text{patched}} - \bar m_{\text{base}}}{\bar m_{\text{tuned}} - \bar m_{\text{base}}}$$
#
# 0: the patch changes nothing; 1: it restores all of the tuned behaviour. A patch is a hook function
# `fn(activation, hook)` that returns the (edited) activation; `functools.partial` fixes its other
# arguments.
#
# ### Exercise: `patch_activation`
#
# Replace the given positions (every one when `positions is None`; `[]` means none, `[-1]` the last)
# along dim 1. Edit `activation` in place and return it; never write into `source`. A mask or index
# you build goes on `activation.device`.

# %% exercise rlhf_tutorial.interp:patch_activation | 20 min | difficulty 3 | importance 5

# %% [markdown]
# ### Exercise: `restored_fraction`
#
# The formula above, over inputs of any shape (one metric per prompt, or a `[prompts, samples]` table):
# each mean is over **all** entries, and the result is a 0-d tensor. A ratio of means, not a mean of
# per-example ratios: those blow up when one prompt barely moved.

# %% exercise rlhf_tutorial.interp:restored_fraction | 10 min | difficulty 2 | importance 4

# %% [markdown]
# The sweep below patches, one at a time, every component of every layer at all positions
# (`resid_pre`, `attn_out`, `mlp_out`, `resid_post`), every head's `z`, and the residual stream at a
# single position (counted from the end, so `-1` is the last prompt token). It calls your two
# functions. The sanity check: the residual stream after the last block determines the readout
# completely, so patching it must restore (about) all of the shift.
#
# **Predict, then check.** Write down three numbers before running: the fraction restored by patching
# `resid_pre` of layer 0 at every position (the base model's blocks, reading the tuned model's
# embeddings), by `mlp_out` of the last layer alone, and by the residual stream at the *first* position
# only (BOS) in the last layer. The figure shows all three; where were you furthest off, and why?

# %%
sweep = patching_sweep(base, tuned_model, tokens_list, direction, patch=patch_activation, restored=restored_fraction)
final_patch = float(sweep["by_component"][-1, list(PATCH_COMPONENTS).index("resid_post")])
print(f"patching the final resid_post restores {final_patch:.3f} of the shift")
assert final_patch >= 0.95, "patching the last residual stream should restore (about) all of the shift"
n_pos = min(t.shape[1] for t in tokens_list)
patching_figure(sweep, list(PATCH_COMPONENTS), [str(p - n_pos) for p in range(n_pos)])

# %% [markdown]
# Read the figure:
#
# - **per component**: which single attention or MLP output restores most? Does `resid_pre` of a
#   layer restore as much as everything before it together (it must: it *is* their sum)?
# - **per position**: is the decision carried at the last token only, or also earlier (the word
#   "really")? A position that restores nothing at an early layer can still matter later, once
#   attention has moved information to the last token.
# - Compare with the attributions of section 3: a component with a large direct attribution change
#   should restore a large fraction when patched, unless later layers undo it.

# %% [markdown]
# ## 5. The activation-difference lens: what was the fine-tune about?
#
# Suppose you did not know what the tuning was for. Run both models on **unrelated** text (plot
# summaries that say nothing about quality) and average the difference of their residual streams over
# the first few positions:
#
# $$\delta = \operatorname{mean}_{b,\ t < n}\ \big(x^{\text{tuned}}_{b,t} - x^{\text{base}}_{b,t}\big)$$
#
# A narrow fine-tune leaves a trace that is present on *any* input (recent model-diffing work finds it
# in the first positions). Read through the unembedding, $\delta W_U$, its top tokens tell what the
# fine-tune pushes towards. And as a **steering vector**, added to the base model's residual stream,
# it should move the base model's samples towards the tuned behaviour.
#
# ### Exercise: `activation_difference`
#
# $\delta$ above, shape `[d_model]`, from two `[batch, pos, d_model]` residual streams of the same
# tokens. The edge case: texts shorter than `n_positions` (then the mean is over the positions that
# exist). Nothing else about the inputs is special: the two models see identical tokens.

# %% exercise rlhf_tutorial.interp:activation_difference | 15 min | difficulty 2 | importance 4

# %%
lens_layer = base.cfg.n_layers // 2  # read (and steer) at the residual stream before this block
hook = f"blocks.{lens_layer}.hook_resid_pre"
texts = NEUTRAL_TEXTS[:4] if is_smoke() else NEUTRAL_TEXTS
resid = {name: m.run_with_cache(m.to_tokens(texts), names_filter=hook)[1][hook]
         for name, m in [("base", base), ("tuned", tuned_model)]}
delta = activation_difference(resid["base"], resid["tuned"], n_positions=5)
scores = delta @ base.W_U
top = [(base.to_string(int(i)), float(scores[i])) for i in scores.topk(10).indices]
bottom = [(base.to_string(int(i)), float(scores[i])) for i in (-scores).topk(10).indices]
ranks = vocab_ranks(delta, base.W_U)  # 0 = the top of the vocabulary, 1 = the bottom
print(f"||delta|| = {delta.norm():.3f} at {hook}; cosine with the sentiment direction "
      f"{torch.cosine_similarity(delta, direction, dim=0):+.3f}")
print("top tokens:   ", [t for t, _ in top])
print("bottom tokens:", [t for t, _ in bottom])
print(f"mean rank (0 = top, 1 = bottom): negative words {ranks[neg_ids].mean():.3f}, "
      f"positive words {ranks[pos_ids].mean():.3f}")

# %% [markdown]
# Read the numbers before the tokens. The lens need not put sentiment words at the very top: the
# difference also carries whatever else the fine-tune moved (in a small model, much of it is not about
# sentiment at all), and a few tokens with large unembedding vectors dominate any raw readout.
#
# Is "negative words rank above positive ones" evidence, then? A number needs a yardstick. Take the
# **gap** $=$ (mean rank of the positive words) $-$ (mean rank of the negative words), positive when the
# negative words sit higher, and ask what it would be for a direction that knows nothing about the
# fine-tune: 1000 random unit directions of the residual stream (seeded), the same statistic for each.
# And ask whether the unrelated texts agree with each other: $\delta$ from each text alone.

# %%
baseline = word_rank_baseline(delta, base.W_U, pos_ids, neg_ids, n_random=200 if is_smoke() else 1000)
per_text = []
for i in range(len(texts)):
    r = vocab_ranks(activation_difference(resid["base"][i:i + 1], resid["tuned"][i:i + 1], n_positions=5), base.W_U)
    per_text.append(float(r[pos_ids].mean() - r[neg_ids].mean()))
print(f"gap of delta: {baseline['gap']:+.3f}")
print(f"gap of a random direction: mean {baseline['random_gap_mean']:+.3f}, std {baseline['random_gap_std']:.3f}; "
      f"{baseline['random_at_least_gap']:.0%} of them have a gap at least as large")
print(f"a random direction puts the negative words at mean rank {baseline['random_negative_rank_mean']:.2f} "
      f"(delta: {baseline['negative_words_mean_rank']:.2f})")
print("gap from each text alone:", [round(g, 3) for g in per_text])
figures.agree("interp", {"activation_difference_sentiment.gap": baseline["gap"],
                         "activation_difference_sentiment.random_gap_std": baseline["random_gap_std"]});

# %% [markdown]
# What it shows, in the tiny world (recorded with `interp-report --world tiny --seed 0`): the negative
# words rank at {{interp.activation_difference_sentiment.negative_words_mean_rank:.2f}} and the positive
# ones at {{interp.activation_difference_sentiment.positive_words_mean_rank:.2f}}, a gap of
# {{interp.activation_difference_sentiment.gap:.3f}}; random directions give gaps of
# {{interp.activation_difference_sentiment.random_gap_mean:+.3f}} on average with a spread (std) of
# {{interp.activation_difference_sentiment.random_gap_std:.3f}}, and
# {{interp.activation_difference_sentiment.random_at_least_gap:.0%}} of them separate the lists at least
# as well. **So, here, the evidence is weak**: a gap that many random directions match or beat is no
# finding. Two things do stand out. Both word lists sit near the top (a random direction puts them
# near the middle, {{interp.activation_difference_sentiment.random_negative_rank_mean:.2f}} on average):
# $\delta$ points at "review adjectives" in general, of either kind, more than at *negative* ones.
# And the texts do not agree on a size: the gap from each text alone ranges from
# {{interp.activation_difference_sentiment.gap_per_text_min:+.3f}} to
# {{interp.activation_difference_sentiment.gap_per_text_max:+.3f}}.
# The steering below is the other test: does adding $\delta$ make the base model's reviews more negative?
# Recorded: a mean P(NEGATIVE) of {{interp.steering_reward.before:.2f}} without it and
# {{interp.steering_reward.after:.2f}} with $4\delta$, over 16 samples each: with 16 values in $[0, 1]$ a mean's
# standard error can reach $\tfrac{1}{2} / \sqrt{16} = \tfrac18$, so a change this small is within noise. The method comes
# from model-diffing work on large models, where narrow fine-tunes have been reported to leave a clear
# trace; a two-layer model tuned for a minute is a hard case for it. Try it on your own GPT-2 run.

# %% [markdown]
# Now steer: add $c \cdot \delta$ to the base model's residual stream at that layer, at every position,
# while sampling, and score the samples with the classifier (P(NEGATIVE)). In JupyterLab the slider
# re-samples with another coefficient (negative ones steer the other way).

# %%
n_steer = 4 if is_smoke() else 16
steer_coef = 4.0


def sample_steered(coef):
    return steered_samples(base, delta, lens_layer, coef, reward_fn, n_steer, 16, seed=3)


steering_explorer(top, bottom, sample_steered, steer_coef)

# %% [markdown]
# ## 6. How much, and how sparsely, did the weights move?
#
# Per parameter tensor, the relative change
#
# $$\frac{\lVert \theta_{\text{tuned}} - \theta_{\text{base}} \rVert}{\max(\lVert \theta_{\text{base}} \rVert,\ 10^{-8})}$$
#
# (norms over all entries), and over all entries together, the fraction that changed at all,
# $\#\{|\theta_{\text{tuned}} - \theta_{\text{base}}| > \text{atol}\} / \#\{\text{entries}\}$. Recent work
# reports that RL fine-tuning updates only a small subset of the weights, and that part of this
# sparsity comes from **precision**: in bfloat16 (7 stored mantissa bits, 8 bits of precision) a small update often rounds back
# to the same number. Measure both on your model: round both to bfloat16, then count.
#
# ### Exercise: `param_change`

# %% exercise rlhf_tutorial.interp:param_change | 10 min | difficulty 2 | importance 3

# %% [markdown]
# ### Exercise: `fraction_changed`

# %% exercise rlhf_tutorial.interp:fraction_changed | 10 min | difficulty 2 | importance 3

# %%
base_params = dict(base.named_parameters())
tuned_params = dict(tuned_model.named_parameters())
changes = param_change(base_params, tuned_params)
# b_V is zero in the base model (its values were folded into b_O when the model was processed) and PPO
# trained it from zero: its relative change is ||b_V|| / 1e-8, meaningless. Set such tensors apart.
zero_in_base = [k for k, v in base_params.items() if float(v.norm()) == 0.0]
print("zero in the base model:", zero_in_base, {k: f"{float(tuned_params[k].norm()):.4f}" for k in zero_in_base})
changes = {k: v for k, v in changes.items() if k not in zero_in_base}
fraction = {
    "fp32": fraction_changed(base_params, tuned_params),
    "bf16": fraction_changed({k: v.bfloat16() for k, v in base_params.items()},
                             {k: v.bfloat16() for k, v in tuned_params.items()}),
}
for name, value in sorted(changes.items(), key=lambda kv: -kv[1])[:6]:
    print(f"{name:>24}: {value:.4f}")
print(f"entries changed: fp32 {fraction['fp32']:.1%}, after rounding both to bf16 {fraction['bf16']:.1%}")
param_change_figure(changes, fraction)

# %% [markdown]
# Which matrices moved most, relative to their size: the MLPs (section 3), attention, the unembedding?
# Section 1 found that the change of $W_U$ adds much of the tuned model's logit difference, yet $W_U$
# need not rank high here. The two measure different things: the sentiment direction is a difference
# of two nearly equal means of columns (the positive and the negative words' columns have much in
# common), a short vector, so a change of $W_U$ that is modest against the whole matrix can still
# change that difference by as much as its own length. A large effect on one readout does not need a large
# relative change of the weights. In float32 most entries move: Adam moves every weight
# whose gradient was ever non-zero. The ones that stay exactly put are embedding rows of tokens that never
# appeared in a rollout and positions past the longest sequence: they get no gradient, and with no weight
# decay (chapter 03's `get_optimizer`) nothing else moves them. How many of the moves survive rounding to
# bfloat16?

# %%
progress("05")

# %% [markdown]
# ## What to try next
#
# - **A reward-hacked policy.** Train one in chapter 03 (no KL penalty, `--kl-coef 0`) and save it:
#   `python -m rlhf_tutorial train-rlhf --world tiny --kl-coef 0 --save hacked`. Then run the same
#   analysis with `python -m rlhf_tutorial interp-report --world tiny --checkpoint hacked`: does the
#   lens decide earlier, do more weights move, do the activation-difference tokens change?
# - **Towards positive.** `train-rlhf --direction pos --save pos`: is the tuned direction simply the
#   opposite, with the same components involved?
# - **Other positions and prompts.** The lenses and the patching read the last prompt token; read a
#   position inside a sample instead (a token after a negation: "not" followed by an adjective).
# - **Path patching.** Patching `mlp_out` of layer 0 changes what layer 1 reads; freeze layer 1's input
#   to its base value to separate the direct path from the indirect one.
# - **The whole report** for any checkpoint: `python -m rlhf_tutorial interp-report --world tiny
#   [--checkpoint DIR]` writes an HTML page with every figure of this chapter and a JSON summary.
