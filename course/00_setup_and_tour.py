# %% [markdown]
# # 00. Setup and a tour of the RLHF machinery
#
# In this course you write every piece of RLHF yourself: PPO on CartPole (01), rewards and reward models
# (02), RLHF with PPO on a language model (03), GRPO (04). This first notebook sets up the tools and
# shows the parts you will wire together.
#
# **How exercises work.** An exercise cell holds a function whose body is
# `raise NotImplementedError(...)`. Replace that line with your code and run the cell, then run the
# `check(...)` cell below it: it compares your function with a reference on several inputs and tells
# you what differs, naming the mistake when it is a known one. The hints wait until you ask, and come
# as a ladder: `hint("name")` gives a nudge (which quantity, which torch function), `hint("name", 2)`
# the approach or formula, `hint("name", 3)` the code; the collapsed **Hint** cell between the two
# cells nests the first two rungs (the code is not written in the notebook: `hint("name", 3)` shows it). Try each rung before the next: the exercises are there to make you
# think, and the text above each says what to compute, never how to write it. `progress()` shows which exercises
# you have passed, in every chapter, and remembers them across kernel restarts.
#
# ## The RLHF map
#
# | piece | what it is | in this course |
# |---|---|---|
# | policy $\pi_\theta$ | the language model we fine-tune | a `HookedTransformer` (GPT-2, or the tiny model) |
# | reference $\pi_{\text{ref}}$ | a frozen copy of the policy before training | the same model, loaded again and never updated |
# | reward model $r(x, y)$ | scores a whole completion $y$ of a prompt $x$ | a sentiment classifier (02: or a model trained on preferences) |
# | value head $V_\phi$ | predicts, at every token, the reward still to come | a small MLP on the final normalised residual stream (03) |
# | KL penalty | keeps $\pi_\theta$ close to $\pi_{\text{ref}}$ so it keeps writing text | $\beta \, \mathrm{KL}(\pi_\theta \,\|\, \pi_{\text{ref}})$ |
#
# RLHF maximises, over prompts $x$ and completions $y \sim \pi_\theta(\cdot \mid x)$,
#
# $$J(\theta) = \mathbb{E}_{x}\Big[\, \mathbb{E}_{y \sim \pi_\theta(\cdot \mid x)}\big[r(x, y)\big] - \beta\, \mathrm{KL}\big(\pi_\theta(\cdot \mid x) \,\|\, \pi_{\text{ref}}(\cdot \mid x)\big) \Big].$$
#
# PPO (01, 03) and GRPO (04) are two ways to climb that objective.
#
# ## Two worlds
#
# - **GPT-2 world** (online, ideally a GPU): the policy is `gpt2`, the reward is the IMDB sentiment
#   classifier `lvwerra/distilbert-imdb`.
# - **Tiny world** (offline, CPU, seconds): a small GPT-2-style model, tokenizer and sentiment
#   classifier trained by this package on synthetic movie reviews. Same code, same label convention
#   (0 = NEGATIVE, 1 = POSITIVE), shipped with the package.
#
# Choose with the environment variable `RLHF_TUTORIAL_WORLD=tiny` or `gpt2` (set it before starting
# Jupyter), or pass `world="tiny"` to the loaders. With neither, GPT-2 is used when it can be loaded
# and the tiny world otherwise; the loader says which it picked.
#
# ## One device
#
# The loaders put the models on a GPU when torch sees one (`cuda`), else on the CPU; set
# `RLHF_TUTORIAL_DEVICE=cpu` (or `cuda:1`) before starting Jupyter to choose. Everything else follows
# the model it is given, and so must your code: a tensor or a layer you create goes on the device of
# the inputs (`torch.zeros(n, device=x.device)`, `nn.Linear(d, 1).to(next(model.parameters()).device)`).
# Code that forgets runs on a CPU and fails on a GPU; the checks run your code on the course's device
# and tell you which tensor is where. On a GPU they run it on the CPU first: a mistake such as an index
# out of range gets a readable message there, before it can reach the GPU (where it would lose the
# kernel's CUDA context until you restart the kernel).

# %% imports
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from rlhf_tutorial import check, hint, progress
from rlhf_tutorial.devices import describe
from rlhf_tutorial.worlds import default_prompt, load_policy, load_sentiment_classifier, resolve_world

# %%
torch.manual_seed(0)
world = resolve_world(None)
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
policy = load_policy(world)
print(f"world: {world}")
print(f"layers={policy.cfg.n_layers} d_model={policy.cfg.d_model} heads={policy.cfg.n_heads} vocab={policy.cfg.d_vocab}")

# %% [markdown]
# ## Tokens in, logits out
#
# `to_tokens` turns text into token ids (with a beginning-of-sequence token in front), and a forward
# pass returns **logits** of shape `[batch, seq, vocab]`: the logits at position $t$ score every
# possible token at position $t+1$.

# %%
prompt = default_prompt()
tokens = policy.to_tokens(prompt)
print(prompt, "->", policy.to_str_tokens(prompt))
logits = policy(tokens)
print("tokens", tuple(tokens.shape), "logits", tuple(logits.shape))

# %% [markdown]
# ### Exercise: the next-token distribution
#
# The policy is a distribution over the next token. With $z_t \in \mathbb{R}^{V}$ the logits at position
# $t$ (they score token $t+1$), a sequence of $s$ tokens continues with
#
# $$\pi_\theta(x_{s} \mid x_{<s}) = \operatorname{softmax}(z_{s-1}), \qquad
#   \operatorname{softmax}(z)_v = \frac{e^{z_v}}{\sum_{u} e^{z_u}}.$$
#
# Write `next_token_probs(model, tokens)`: `tokens` is `[batch, seq]`, the result `[batch, vocab]`, every
# row a probability distribution, on the model's device. The check probes a batch of 1 and one-token
# rows (both dimensions must survive), and logits in the hundreds, where $e^{z}$ written by hand
# overflows (why does subtracting $\max_u z_u$ first change nothing in the result?).
#
# **Predict, then check.** Position 0 holds the beginning-of-sequence token. If you read the logits
# there instead of at the last position, would the distribution depend on the prompt? Decide, then
# run the cell after the check, which compares two prompts.

# %% exercise rlhf_tutorial.tour:next_token_probs | 10 min | difficulty 1 | importance 3

# %%
probs = next_token_probs(policy, tokens)[0]
top = probs.topk(8)
for p, i in zip(top.values, top.indices):
    print(f"{p.item():6.3f}  {policy.to_single_str_token(int(i))!r}")

# %%
# your prediction, checked: the distribution after position 0 and after the last position, for two prompts
two = [policy.to_tokens(text) for text in ("The film was dull and", "What a wonderful, moving")]
first_position = [policy(t).softmax(-1)[0, 0] for t in two]  # the distribution after the BOS token
last_position = [next_token_probs(policy, t)[0] for t in two]
print("after position 0, max |prompt 1 - prompt 2| =", (first_position[0] - first_position[1]).abs().max().item())
print("after the last position, max |prompt 1 - prompt 2| =", (last_position[0] - last_position[1]).abs().max().item())

# %% [markdown]
# ## Hooks: reading (and changing) activations
#
# Every intermediate activation of a `HookedTransformer` passes through a named **hook point**. Three
# ways to use them:
#
# - `model.run_with_cache(tokens)` returns the logits and a cache of every activation;
# - `model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])` calls `fn(activation, hook)` as the forward
#   pass reaches `name`; if `fn` returns a tensor, it replaces the activation;
# - `model.hook_dict` lists the names.
#
# The one this course cares most about is `ln_final.hook_normalized`: the residual stream after the
# final LayerNorm, just before the unembedding. Chapter 03 puts the value head there.

# %%
names = list(policy.hook_dict)
print(len(names), "hook points, e.g.", names[:4], "...", names[-3:])
_, cache = policy.run_with_cache(tokens)
print("ln_final.hook_normalized:", tuple(cache["ln_final.hook_normalized"].shape))

# %% [markdown]
# ### Exercise: read the final normalised residual stream with a hook
#
# Write `final_normalized_residual(model, tokens)` that returns the activation at
# `ln_final.hook_normalized` (shape `[batch, seq, d_model]`), captured by a hook of your own during a
# forward pass. Why not the cache? `run_with_cache` stores *detached* copies of the activations: they
# carry no graph, so a loss computed from them sends no gradient back into the model. Chapter 03 puts a
# value head on this activation and trains it together with the transformer under it (one trunk for
# actor and critic); from a cached copy the value loss would train the head alone. The activation a
# hook receives is the one in the forward pass, graph included: keep it as it is (no `.detach()`, no
# `torch.no_grad()`). A hook is called with the activation and the hook point; what it returns
# replaces the activation, so a hook that only *reads* returns nothing. `run_with_hooks` removes its
# hooks when the pass ends; a hook you add by hand stays on the model until you remove it. The check
# compares with the neighbouring activations (the residual before the final LayerNorm, the last
# block's other LayerNorm, the logits), probes a batch of 1 and one-token rows (return the activation
# as stored), follows the gradient of your result back into the model's weights, and looks for hooks
# left behind.
#
# **Predict, then check.** The unembedding reads exactly this activation. What should
# `resid @ W_U + b_U` be, and how far from it, in float32? The cell after the check tells.

# %% exercise rlhf_tutorial.tour:final_normalized_residual | 15 min | difficulty 2 | importance 3

# %% [markdown]
# Because this activation is what the unembedding reads, `resid @ W_U + b_U` gives back the logits (up
# to float32 rounding):

# %%
resid = final_normalized_residual(policy, tokens)
rebuilt = resid @ policy.W_U + policy.b_U
print("max |rebuilt - logits| =", (rebuilt - logits).abs().max().item())

# %% [markdown]
# ## Sampling
#
# `model.generate` samples a continuation token by token. Two things to know for later chapters:
#
# - it runs under `torch.inference_mode()`, so its output is an *inference tensor*: `.clone()` it
#   before feeding it to a forward pass that needs gradients;
# - with the KV cache on, a hook active during `generate` only sees the newest position after the
#   first step.
#
# `temperature` divides the logits before the softmax: below 1 sharpens, above 1 flattens.

# %%
torch.manual_seed(0)
batch = policy.to_tokens([prompt] * 4)
samples = policy.generate(batch, max_new_tokens=20, temperature=1.0, verbose=False).clone()
texts = policy.to_string(samples[:, 1:])  # drop the BOS token
for t in texts:
    print(repr(t))

# %% [markdown]
# ## Scoring with the sentiment classifier
#
# The reward in chapters 02 to 04 is the classifier's probability of a label. Its `config.id2label`
# says which index is which: `{0: 'NEGATIVE', 1: 'POSITIVE'}` in both worlds.

# %%
classifier, clf_tokenizer = load_sentiment_classifier(world)
print(classifier.config.id2label)
with torch.no_grad():
    inputs = clf_tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(classifier.device)
    p_positive = classifier(**inputs).logits.softmax(-1)[:, classifier.config.label2id["POSITIVE"]]
for p, t in zip(p_positive, texts):
    print(f"P(POSITIVE)={p.item():.2f}  {t[:70]!r}")

# %% [markdown]
# ## The reference model and the KL penalty, in one cell
#
# The reference is a second copy of the policy that is never trained. Before any training the two are
# identical, so the KL divergence between their next-token distributions is exactly 0 (chapter 03's
# checker tests your KL on identical logits for exactly that).

# %%
from torch.distributions import Categorical, kl_divergence

reference = load_policy(world)
for p in reference.parameters():
    p.requires_grad_(False)
# KL(p || q) = sum_v p_v (log p_v - log q_v), with the log-probabilities taken from the logits: the log of a
# probability that underflowed to 0 is -inf (and 0 * -inf = NaN) on a peaked distribution (chapter 01)
pol = Categorical(logits=policy(tokens)[:, -1])
ref = Categorical(logits=reference(tokens)[:, -1])
kl = kl_divergence(pol, ref)
print("KL(policy || reference) before training:", kl.item())

# %%
progress()  # every chapter; progress("00") for this one

# %% [markdown]
# ## What to try next
#
# - Sample with `temperature=0.5` and `2.0`: how do the texts and their sentiment change?
# - Use `run_with_hooks` with a hook that *returns* a modified activation (for example zero one
#   attention head's output `blocks.0.attn.hook_z[:, :, head]`) and watch the next-token distribution move.
# - Chapter 01 builds PPO from scratch on CartPole before we come back to language models.
