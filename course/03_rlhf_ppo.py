# %% [markdown]
# # 03. RLHF with PPO on a HookedTransformer
#
# This is the heart of the course. In chapter 01 you wrote PPO for CartPole; in chapter 02 you built
# rewards for text. Here you put them together: you fine-tune a language model with PPO so that its
# movie reviews turn **negative** (the base model, like GPT-2, leans positive), while a KL penalty
# keeps it writing reviews rather than gibberish that fools the classifier.
#
# You will write every piece: the value head, sampling, log-probs, the KL penalty and its sampled
# estimators, advantages (two ways), the replay memory, the objective, the optimizer and its
# schedule, an adaptive KL controller, early stopping, and the two phases of the trainer. Then you
# train, watch the reward rise on a live dashboard, look inside single samples token by token, and
# make the policy **hack** the reward on purpose, to see what the KL penalty is for.
#
# ## The language model as an RL environment
#
# | PPO on CartPole (01) | RLHF on a language model (here) |
# |---|---|
# | state $s_t$: cart position, angle, ... | the text so far: prompt $x$ and tokens $y_{<t}$ |
# | action $a_t$: push left or right | the next token $y_t$, one of `d_vocab` |
# | policy $\pi_\theta(a \mid s)$: a small MLP | the transformer's softmax over the vocabulary |
# | episode: until the pole falls | one completion of `gen_len` tokens after a fixed prompt |
# | reward: +1 every step (dense) | the classifier's score of the whole text, at the last token (sparse) |
# | critic $V_\phi(s)$: a separate MLP | a **value head** on the transformer's last residual stream |
#
# The objective is the expected reward minus a penalty for drifting from the **reference** model
# $\pi_{\text{ref}}$ (a frozen copy of the policy before training), averaged over prompts $x$ (this
# chapter uses a single one):
#
# $$J(\theta) = \mathbb{E}_{x}\Big[\mathbb{E}_{y \sim \pi_\theta(\cdot \mid x)}\big[r(x, y)\big] \;-\; \beta\, \mathrm{KL}\big(\pi_\theta(\cdot \mid x) \,\|\, \pi_{\text{ref}}(\cdot \mid x)\big)\Big]$$
#
# Without the KL term the policy is free to find *any* text the classifier scores highly, including
# text no human would call a review. You will see exactly that at the end of this chapter.
#
# The code runs in both worlds (see chapter 00): GPT-2 with the IMDB classifier, or the offline tiny
# world on a CPU. The cell below loads the policy and the classifier of whichever world is active.

# %% imports
import math
import tempfile
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
from IPython.display import display
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial import check, figures, hint, progress
from rlhf_tutorial.devices import describe, device_of
from rlhf_tutorial.grpo import completion_mask as chapter_04_completion_mask  # chapter 04's exercise, solved
from rlhf_tutorial.ppo import (
    calc_clipped_surrogate_objective,
    calc_clipped_value_loss,
    calc_entropy_bonus,
    calc_value_function_loss,
    clip_diagnostics,
    layer_init,
)
from rlhf_tutorial.rewards import (
    missing_eos_penalty,
    ngram_repetition,
    reward_fn_sentiment,
    sentiment_reward_fn,
    whiten,
)
from rlhf_tutorial.rlhf import ReplayMinibatch, compute_gae_advantages
from rlhf_tutorial.trainers.overoptimization import OveroptimizationArgs, run_overoptimization
from rlhf_tutorial.trainers.overoptimization import figure as overoptimization_figure
from rlhf_tutorial.trainers.rlhf import (
    RLHFArgs,
    RLHFTrainer,
    learner_functions,
    load_tuned_policy,
    save_tuned_policy,
)
from rlhf_tutorial.widgets.rlhf import (
    base_vs_tuned,
    rlhf_dashboard,
    runs_figure,
    samples_table,
    token_explorer,
)
from rlhf_tutorial.worlds import (
    default_prompt,
    is_smoke,
    is_tiny,
    load_policy,
    load_sentiment_classifier,
    resolve_world,
    smoke_sizes,
)

# %%
torch.manual_seed(0)
world = resolve_world(None)
if is_tiny():  # the tiny model's matrices are too small to gain from more threads; with one thread the
    torch.set_num_threads(1)  # runs below give the same numbers as `python -m rlhf_tutorial train-rlhf`
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
policy = load_policy(world)
classifier, clf_tokenizer = load_sentiment_classifier(world)
prompt = default_prompt()
print(f"world: {world}, prompt: {prompt!r}")
print(f"policy: {policy.cfg.n_layers} layers, d_model={policy.cfg.d_model}, vocab={policy.cfg.d_vocab}")

# %% [markdown]
# ## The value head, and why it hangs on `ln_final.hook_normalized`
#
# PPO needs a critic $V_\phi(s_t)$: the reward the policy can still expect from state $s_t$. For a
# language model the state is a prefix of text, and the transformer has already computed a rich
# summary of every prefix: the residual stream at each position. The value head is a small MLP that
# reads it:
#
# $$V_\phi(s_t) = w_2^\top \,\mathrm{ReLU}(W_1 h_t + b_1) + b_2,\qquad h_t = \text{residual at position } t \text{ after the final LayerNorm}$$
#
# Why exactly `ln_final.hook_normalized`?
#
# - it is the **last** thing computed before the unembedding, so it has accumulated everything the
#   layers know about the prefix; it is the very vector the policy's logits are read from
#   ($\text{logits}_t = W_U h_t + b_U$), so the critic sees what the actor sees;
# - it is **normalised**: its scale does not depend on the residual stream's norm, which grows with
#   depth and drifts during training, so the head gets stable inputs;
# - attaching the head with a **hook** means one forward pass gives both logits and values, and the
#   base model stays an ordinary `HookedTransformer` (sampling, caching, patching all still work).
#
# The values get gradients through the shared trunk too: the value loss also shapes the transformer.
#
# ### Exercise: `TransformerWithValueHead`
#
# Store `base_model` and build `value_head`, the MLP $V_\phi$ above with a hidden width of
# $4\, d_\text{model}$, both linear layers initialised with chapter 01's `layer_init` (orthogonal weights
# with std $\sqrt 2$ for the hidden layer and 1 for the output, zero biases). In `forward`, one pass of
# the base model must give both the logits and $V_\phi(h_t)$ at every position $t$, computed by a hook
# on `ln_final.hook_normalized`. Return `(logits, values)`: shapes `[b, s, vocab]` and `[b, s]` (one
# number per position, no trailing dimension of size 1). The hook must not return anything (a
# returned tensor would replace the activation), and it must read the residual without detaching it
# (no `.detach()`, no `run_with_cache`, whose activations are detached): the value loss's gradient has
# to reach the transformer, the shared trunk, not only the head. The checker tests both the
# initialisation and that gradient.
#
# Where it lives: the value head sits on the base model's device (`device_of(base_model)`, a GPU when
# the policy is on one). A new layer is created on the CPU, and the hook applies it to a residual on
# the model's device: move it there when you build it, and the same code runs on a CPU and on a GPU.

# %% exercise rlhf_tutorial.rlhf:TransformerWithValueHead | 20 min | difficulty 3 | importance 5

# %%
model = TransformerWithValueHead(policy)
tokens = policy.to_tokens(prompt)
logits, values = model(tokens)
print("logits", tuple(logits.shape), "values", tuple(values.shape))
print("values before training (random head):", [round(v, 3) for v in values[0].tolist()])

# %% [markdown]
# ## Sampling
#
# An episode is a sample: the prompt, then `gen_len` tokens drawn one at a time from
#
# $$\pi_\theta(y_t \mid x, y_{<t}) = \mathrm{softmax}\big(\text{logits}_t / \tau\big)$$
#
# where $\tau$ is the **temperature**: $\tau < 1$ sharpens the distribution (more formulaic text),
# $\tau > 1$ flattens it (more random text). Two details matter for RL:
#
# - the policy PPO optimises must be the distribution the samples came from. So whenever we take
#   log-probs of our samples (now and during learning) we take them of `logits / temperature`. This
#   is "temperature scaling of the logits". With `top_k` set, the sampling distribution is truncated
#   and no longer equals that softmax: we keep `top_k=None` for training;
# - we do not stop at the end-of-text token: every sample has exactly `gen_len` new tokens, so all
#   episodes have the same length and tensors stay rectangular.
#
# ### Exercise: `get_samples`
#
# `get_samples(model, prompt, batch_size, gen_len, temperature, top_k, prepend_bos)` returns
# `(tokens, texts)`. `tokens` is `[batch_size, prompt_len + gen_len]`: the prompt (with a BOS token in
# front exactly when `prepend_bos`) followed by **exactly** `gen_len` tokens drawn from
# $\mathrm{softmax}(\text{logits}_t/\tau)$ (restricted to the `top_k` most likely when it is set), with no stop
# at the end-of-text token. It must be an ordinary tensor: `model.generate` runs under
# `torch.inference_mode()`, and an inference tensor cannot enter a forward pass that needs gradients.
# `texts` are the decoded rows without special tokens (BOS, EOS), what the reward reads. The checker
# looks at what your rows hold (the length, the prompt, the texts, with and without BOS) and at how the
# new tokens are distributed (two temperatures, `top_k`, and a policy that samples the end-of-text token
# at every step), never at which tokens a seed gives: any correct sampler passes.

# %% exercise rlhf_tutorial.rlhf:get_samples | 15 min | difficulty 2 | importance 4

# %% [markdown]
# The reward of this chapter is the classifier's probability of the NEGATIVE label (chapter 02's
# `reward_fn_sentiment` with `direction="neg"`). The base model's samples score low on average:

# %%
direction = "neg"
reward_fn = sentiment_reward_fn(world, direction)
torch.manual_seed(0)
sample_tokens, sample_texts = get_samples(policy, prompt, batch_size=8, gen_len=16)
base_rewards = reward_fn(sample_texts)
samples_table(sample_texts, base_rewards, title="base model samples, reward = p(NEGATIVE)")

# %% [markdown]
# ### Variable-length completions, and what this chapter leaves out
#
# Sampling exactly `gen_len` tokens is a simplification. A language model ends a text by emitting the
# end-of-text token (EOS; in GPT-2 and the tiny world it is `<|endoftext|>`, the same token as BOS), and
# after an EOS the model starts a *new* document. Our samples run through it, and `skip_special_tokens`
# drops the EOS from the decoded text, so the classifier may score one review plus the start of the
# next. Here that is harmless (16 tokens are about one sentence and EOS is rare, as the cell below
# counts), but with long completions or chat models it is not. The usual treatment (TRL's PPO, chapter
# 04's GRPO) is:
#
# - a **completion mask** $m_t = \mathbb{1}[\text{no EOS among } y_0, \dots, y_{t-1}]$: the EOS itself counts (the
#   policy chose to stop), every token after it is padding;
# - the text scored by the reward is cut at the EOS, and the **score is paid at the EOS position**
#   (the last real token), not at position `gen_len - 1`; GAE's episode ends there (`dones` at the EOS);
# - every per-token sum and mean (the per-token KL rewards, the clipped surrogate, the value loss, the
#   entropy) runs over masked tokens only;
# - a completion that never emits EOS within the budget was **truncated**: its score judges a text that
#   did not end. Chapter 02's `missing_eos_penalty` subtracts a fixed $p$ from the score of such a
#   completion (TRL's `missing_eos_penalty`), so the policy learns to finish its texts rather than
#   ramble until it is cut off.
#
# Chapter 04 samples with `stop_at_eos=True` and has you write that mask (`completion_mask`). Here, the
# same quantities on the samples above, the mask from the package's version of that exercise:

# %%
eos = policy.tokenizer.eos_token_id
generated = sample_tokens[:, policy.to_tokens(prompt).shape[1]:]
completion_mask_demo = chapter_04_completion_mask(generated, eos)  # True up to and including the first EOS
print(f"samples with an EOS among their {generated.shape[1]} tokens: {int((generated == eos).any(-1).sum())} "
      f"of {len(generated)}")
print("real tokens per sample (mask sums):", completion_mask_demo.sum(-1).tolist())
print("missing-EOS penalty (p = 1):       ", missing_eos_penalty(generated, eos, penalty=1.0).tolist())

# %% [markdown]
# ## Log-probs of the generated tokens only
#
# The logits at position $t$ score the token at position $t+1$. With a prompt of `prefix_len` tokens
# (BOS included) followed by `g = gen_len` generated tokens, the log-probs PPO needs are those of the
# generated tokens, read from the positions just before them:
#
# | position | 0 | 1 | ... | `prefix_len - 1` | `prefix_len` | ... | `s - 2` | `s - 1` |
# |---|---|---|---|---|---|---|---|---|
# | token | BOS | This | ... | really | $y_0$ | ... | $y_{g-2}$ | $y_{g-1}$ |
# | its logits predict | This | movie | ... | $y_0$ | $y_1$ | ... | $y_{g-1}$ | (nothing we use) |
#
# $$\log \pi_\theta(y_i \mid x, y_{<i}) = \mathrm{log\_softmax}(\text{logits}[\text{prefix\_len} - 1 + i])[y_i], \qquad i = 0, \dots, g - 1$$
#
# The prompt's tokens are not actions of the policy (we chose them), so they get no log-probs.
#
# ### Exercise: `get_logprobs`
#
# With `prefix_len=None`, return the log-probs of `tokens[:, 1:]` (every token that has a previous
# position); otherwise of `tokens[:, prefix_len:]`, each read from the logits of the position before
# it. Normalise over the vocabulary in log space: the log of a softmax is $-\infty$ wherever a large
# logit makes a probability underflow (the check includes logits times 100).

# %% exercise rlhf_tutorial.rlhf:get_logprobs | 15 min | difficulty 3 | importance 5

# %%
prefix_len = policy.to_tokens(prompt).shape[1]
with torch.no_grad():
    lp = get_logprobs(policy(sample_tokens), sample_tokens, prefix_len)
print(f"prefix_len={prefix_len}, log-probs of the generated tokens: {tuple(lp.shape)}")
print("sequence log-prob of each sample:", [round(x, 1) for x in lp.sum(-1).tolist()])

# %% [markdown]
# ## KL to the reference model
#
# At every generated position the policy and the reference each give a distribution over the next
# token. The penalty is their KL divergence, **policy first**:
#
# $$\mathrm{KL}(\pi_\theta \,\|\, \pi_{\text{ref}}) = \sum_v \pi_\theta(v) \,\big(\log \pi_\theta(v) - \log \pi_{\text{ref}}(v)\big)$$
#
# The order matters. $\mathrm{KL}(\pi_\theta \| \pi_{\text{ref}})$ is large when the policy puts mass
# where the reference puts almost none: exactly the "text no base model would write" we want to
# forbid. The other order would mostly punish the policy for dropping some of the reference's
# options, which is fine here: becoming more negative means giving up positive continuations.
#
# ### Exercise: `calc_kl_penalty`
#
# Given the logits of the policy and of the reference at the generated positions (`[b, g, vocab]`),
# return `kl_coef` times the KL averaged over batch and positions. Use `log_softmax` for both
# (large logits must not overflow).

# %% exercise rlhf_tutorial.rlhf:calc_kl_penalty | 20 min | difficulty 3 | importance 5

# %% [markdown]
# ### What $\beta$ does: the optimum of the KL-regularised objective
#
# Treat a whole completion $y$ as one action. For a fixed prompt the objective is
# $J(\pi) = \sum_y \pi(y)\, r(y) - \beta \sum_y \pi(y) \log \frac{\pi(y)}{\pi_\text{ref}(y)}$, and it has a
# closed-form maximiser. Define
#
# $$\pi^*(y) = \frac{1}{Z}\, \pi_\text{ref}(y)\, e^{r(y)/\beta}, \qquad Z = \sum_y \pi_\text{ref}(y)\, e^{r(y)/\beta}.$$
#
# Then $\log \pi(y) - \log \pi_\text{ref}(y) - r(y)/\beta = \log \pi(y) - \log \pi^*(y) - \log Z$, so
#
# $$J(\pi) = \beta \log Z - \beta\, \mathrm{KL}(\pi \,\|\, \pi^*),$$
#
# which is largest, $\beta \log Z$, exactly at $\pi = \pi^*$. The KL-regularised optimum is the reference
# **reweighted** by $e^{r/\beta}$: $\beta$ is a temperature on the reward. As $\beta \to \infty$, $\pi^* \to \pi_\text{ref}$
# (the policy does not move); as $\beta \to 0$, $\pi^*$ puts all its mass on the highest-reward completions
# *that the reference can produce* (a completion with $\pi_\text{ref}(y) = 0$ keeps $\pi^*(y) = 0$ for every
# $\beta$). PPO does not compute $\pi^*$ (the sum over every possible text is intractable); it climbs
# towards it by sampling. Chapter 06's DPO turns the same formula around:
# $r(y) = \beta \log \frac{\pi^*(y)}{\pi_\text{ref}(y)} + \beta \log Z$.
#
# On six made-up "completions" (the KL of the optimum uses your `calc_kl_penalty`, since $\log \pi^*$ are
# the logits $\log \pi_\text{ref} + r/\beta$):

# %%
ref_probs = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.07, 0.03])
task_reward = torch.tensor([0.1, 0.3, 0.2, 0.6, 0.9, 1.0])
print(f"{'beta':>6} {'E_pi*[r]':>9} {'KL(pi*||ref)':>13}  pi*")
for beta in [3.0, 1.0, 0.3, 0.1, 0.03]:
    opt_logits = ref_probs.log() + task_reward / beta
    opt_probs = opt_logits.softmax(-1)
    kl_opt = calc_kl_penalty(opt_logits[None, None], ref_probs.log()[None, None], 1.0).item()
    print(f"{beta:6.2f} {(opt_probs * task_reward).sum().item():9.3f} {kl_opt:13.3f}  {[round(p, 2) for p in opt_probs.tolist()]}")
# no other distribution does better: J at pi* against J at 2000 random distributions, beta = 0.1
beta = 0.1
opt_probs = (ref_probs.log() + task_reward / beta).softmax(-1)
def J(probs):
    return (probs * task_reward).sum(-1) - beta * (probs * (probs.log() - ref_probs.log())).sum(-1)
others = torch.distributions.Dirichlet(torch.ones(6)).sample((2000,))
print(f"beta = {beta}: J(pi*) = {J(opt_probs).item():.4f} = beta log Z = "
      f"{beta * torch.logsumexp(ref_probs.log() + task_reward / beta, -1).item():.4f}; "
      f"best of 2000 random distributions: {J(others).max().item():.4f}")

# %% [markdown]
# ### Sampled estimators: k1, k2, k3
#
# The full KL needs both full distributions: `[batch, gen_len, vocab]` tensors, which for GPT-2
# (vocab 50257) at batch 64 and 30 tokens is 386 MB per copy in float32. The tokens we sampled came
# from $\pi_\theta$, so we can instead **estimate** the KL from the log-probs of the sampled tokens
# alone. With $\log r = \log \pi_{\text{ref}}(y) - \log \pi_\theta(y)$ at a sampled token $y \sim \pi_\theta$:
#
# | estimator | formula | bias | variance | sign |
# |---|---|---|---|---|
# | $k_1$ | $-\log r$ | unbiased: $\mathbb{E}_{\pi_\theta}[-\log r] = \mathrm{KL}$ | high | can be negative |
# | $k_2$ | $\tfrac12 (\log r)^2$ | biased (exact to second order for small KL) | low | $\ge 0$ |
# | $k_3$ | $(r - 1) - \log r$ | unbiased: $\mathbb{E}_{\pi_\theta}[r] = 1$ | low | $\ge 0$ since $e^u \ge 1 + u$ |
#
# $k_3$ is $k_1$ plus $r - 1$, a term with zero mean that is negatively correlated with $k_1$: a
# control variate. It is the estimator GRPO (chapter 04) uses.
#
# ### Exercise: `approx_kl`
#
# `approx_kl(logprobs, ref_logprobs, estimator)`: the log-probs of the sampled tokens under the policy
# and the reference (any shape, the same for both); return the per-token estimate for `estimator` in
# `"k1"`, `"k2"`, `"k3"` (same shape as the inputs, no mean), and raise a `ValueError` naming the
# accepted values for anything else. Mind the sign of $\log r$: reference minus policy.
#
# **Predict, then check.** The cell after the check draws 100,000 tokens from $p$ and averages each
# estimator. Before you run it: for two nearby distributions, which estimator has the smallest spread,
# and about what share of k1's values is negative? Which one will be badly biased for two distributions
# far apart?

# %% exercise rlhf_tutorial.rlhf:approx_kl | 10 min | difficulty 2 | importance 3

# %% [markdown]
# Let us check the table's claims on two distributions over a small vocabulary: draw many tokens
# from $p$, compute each estimator per token, and compare its mean with the exact KL. First two
# nearby distributions (the regime of RLHF, where the KL per token stays around 0.1), then two far
# apart.

# %%
torch.manual_seed(0)
vocab = 50
p_logits = torch.randn(vocab)
for label, q_logits in [("nearby", p_logits + 0.4 * torch.randn(vocab)), ("far apart", 1.5 * torch.randn(vocab))]:
    p_logp, q_logp = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    exact = calc_kl_penalty(p_logits[None, None], q_logits[None, None], 1.0).item()
    draws = torch.multinomial(p_logp.exp(), 100_000, replacement=True)
    print(f"{label}: exact KL(p || q) = {exact:.4f}")
    print(f"{'estimator':>11} {'mean':>8} {'std':>8} {'share < 0':>10}")
    for est in ["k1", "k2", "k3"]:
        k = approx_kl(p_logp[draws], q_logp[draws], est)
        print(f"{est:>11} {k.mean().item():8.4f} {k.std().item():8.4f} {(k < 0).float().mean().item():10.3f}")

# %% [markdown]
# k1 and k3 average to the exact KL (unbiased) in both cases. k1 is negative for a large share of the
# tokens (about half of them for nearby distributions). For nearby distributions k3's spread is about
# five times smaller than k1's, and k2 is nearly unbiased; far apart, k2 is badly biased and k3's
# advantage is gone (the ratio $r = p_\text{ref}/p$ gets large at tokens the policy rarely samples).
# k3 is the estimator of choice *near* the reference, which is where the KL penalty keeps the policy.
#
# ## KL as a reward vs KL as a loss
#
# The table above is about **values**: what each estimator averages to. Training needs **gradients**,
# and an estimator can enter training in two ways with different gradients.
#
# **As a reward** (Ziegler et al. 2019, TRL, this chapter's GAE path): $-\beta k$ is added to the per-token
# rewards, the rewards are treated as constants, and the policy gradient multiplies them by
# $\nabla_\theta \log \pi_\theta$. With $k_1 = \log \pi_\theta(y) - \log \pi_\text{ref}(y)$ this is exactly right: the
# score-function gradient $\mathbb{E}[k_1 \nabla \log \pi_\theta]$ equals $\nabla\, \mathrm{KL}(\pi_\theta \| \pi_\text{ref})$, because the
# part it leaves out, $\mathbb{E}[\nabla k_1] = \mathbb{E}[\nabla \log \pi_\theta] = 0$, vanishes. And since the KL sits in the
# return, a token is also charged for the KL of the tokens it leads to. $k_3$ in the reward has the right
# mean but not the right gradient: the part it leaves out, $\mathbb{E}[\nabla k_3]$, is not zero (below).
#
# **As a loss** (differentiated directly, with the sampled tokens held fixed): write $r = \pi_\text{ref}(y)/\pi_\theta(y)$.
#
# | term in the loss | gradient, samples fixed | expected over $y \sim \pi_\theta$ | follows |
# |---|---|---|---|
# | $k_1 = -\log r$ | $\nabla \log \pi_\theta(y)$ | $0$ | nothing: pushes nowhere on average |
# | $k_2 = \tfrac12 (\log r)^2$ | $-\log r\, \nabla \log \pi_\theta(y)$ | $\nabla\, \mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref})$ | the KL of this chapter |
# | $k_3 = r - 1 - \log r$ | $(1 - r)\, \nabla \log \pi_\theta(y)$ | $\nabla\, \mathrm{KL}(\pi_\text{ref} \,\|\, \pi_\theta)$ | the **other** direction |
# | full KL (`calc_kl_penalty`) | exact, at each visited state | $\nabla\, \mathrm{KL}(\pi_\theta \,\|\, \pi_\text{ref})$ per state | the KL of this chapter |
#
# (The $k_3$ line: $\sum_y \pi_\theta(y)(1 - r(y)) \nabla \log \pi_\theta(y) = \sum_y \nabla \pi_\theta(y) - \sum_y \pi_\text{ref}(y)\nabla \log \pi_\theta(y)$; the first
# sum is $\nabla 1 = 0$ and the second is $\nabla\, \mathrm{KL}(\pi_\text{ref} \| \pi_\theta)$.) So:
#
# - in a **reward**, use $k_1$;
# - in a **loss**, use $k_2$ or the full KL for $\mathrm{KL}(\pi_\theta \| \pi_\text{ref})$; $k_3$ there follows $\mathrm{KL}(\pi_\text{ref} \| \pi_\theta)$,
#   which punishes the policy for *dropping* tokens the reference likes rather than for *inventing* text
#   the reference would not write. Near the reference the two KLs agree to second order (both are
#   $\approx \tfrac12 \sum_y \delta_y^2/\pi_\text{ref}(y)$ for $\pi_\theta = \pi_\text{ref} + \delta$), so the difference shows once the
#   policy has moved;
# - as a **number** to log, to steer the adaptive controller or to stop early, use $k_3$ (unbiased, low
#   variance, never negative): that is what the trainer logs as `kl`;
# - every per-token loss treats each position's distribution on its own: it ignores that changing
#   token $t$ changes the states, and so the KL, of every later token. The reward route counts that.
#
# GRPO (chapter 04) puts $k_3$ in the loss: on-policy, its KL gradient follows $\mathrm{KL}(\pi_\text{ref} \| \pi_\theta)$, token by
# token. And its tokens come from $\pi_{\theta_\text{old}}$ with no importance weight on the KL term, so after the
# first minibatch its expectation is not even that. It works because the penalty only has to keep the
# policy *near* the reference, where the directions agree.
#
# Check the table on a small categorical distribution. Exact expectations need no sampling: with the
# probabilities of the "samples" detached, $\nabla \sum_y \mathrm{sg}[\pi_\theta(y)]\, k(y)$ is $\mathbb{E}_{y \sim \pi_\theta}[\nabla k(y)]$, the expected
# gradient with the samples held fixed. The cell compares it with the gradients of both KLs (from your
# `calc_kl_penalty`):

# %%
torch.manual_seed(0)
theta = torch.randn(8, requires_grad=True)  # the policy's logits over 8 tokens
ref_logits_demo = torch.randn(8)


def grad_of(fn):
    (g,) = torch.autograd.grad(fn(theta), theta)
    return g


def expected_grad_fixed_samples(estimator):
    def fn(t):
        logp = t.log_softmax(-1)
        return (logp.exp().detach() * approx_kl(logp, ref_logits_demo.log_softmax(-1), estimator)).sum()
    return grad_of(fn)


grad_kl_policy_ref = grad_of(lambda t: calc_kl_penalty(t[None, None], ref_logits_demo[None, None], 1.0))
grad_kl_ref_policy = grad_of(lambda t: calc_kl_penalty(ref_logits_demo[None, None], t[None, None], 1.0))
for est in ["k1", "k2", "k3"]:
    g = expected_grad_fixed_samples(est)
    print(f"{est}: |E[grad]| = {g.norm():.4f}   distance to grad KL(pi||ref): {(g - grad_kl_policy_ref).norm():.2e}"
          f"   to grad KL(ref||pi): {(g - grad_kl_ref_policy).norm():.2e}")
torch.testing.assert_close(expected_grad_fixed_samples("k1"), torch.zeros(8), atol=1e-6, rtol=0)
torch.testing.assert_close(expected_grad_fixed_samples("k2"), grad_kl_policy_ref)
torch.testing.assert_close(expected_grad_fixed_samples("k3"), grad_kl_ref_policy)
print("checked: k1 -> 0, k2 -> grad KL(policy || ref), k3 -> grad KL(ref || policy)")

# %% [markdown]
# ## Advantages, two ways
#
# ### One-step estimates
#
# The advantage of token $y_t$ is how much better choosing it was than the policy's average from the
# same state: $A(s_t, a_t) = Q(s_t, a_t) - V(s_t)$. The one-step estimate of $Q$ is the value of the
# next state, except after the last token, where the episode is over and the reward $r$ is known:
#
# $$\hat A_t = \begin{cases} V(s_{t+1}) - V(s_t) & t < T \\ r - V(s_T) & t = T \end{cases}$$
#
# In tensor terms, `values[:, t]` is $V$ of the state ending at position $t$, which chooses token
# $t+1$, and the $g$ generated tokens sit at positions `prefix_len` to $s - 1$.
#
# ### Exercise: `compute_advantages`
#
# `compute_advantages(values, rewards, prefix_len)`: `values` `[b, s]`, `rewards` `[b]`, the result
# `[b, g]` with $g = s - \text{prefix\_len}$, $\hat A$ above for every generated token. Work out on the
# position table of the log-probs section which position's value is $V(s_t)$ for generated token $i$,
# and which is $V(s_{t+1})$; the last token has no next state. The check includes a single generated
# token ($g = 1$: its advantage is $r - V$) and a batch of 1.

# %% exercise rlhf_tutorial.rlhf:compute_advantages | 20 min | difficulty 3 | importance 5

# %% [markdown]
# ### GAE over per-token rewards
#
# Chapter 01's GAE needs a reward at every step. The standard RLHF recipe (Ziegler et al., 2019; the
# TRL library) makes one: the KL penalty is paid **per token**, with the sampled k1 estimate, and the
# classifier's score arrives at the last token:
#
# $$r_t = -\beta\,\big(\log \pi_\theta(y_t) - \log \pi_{\text{ref}}(y_t)\big) + \mathbb{1}[t = T]\; r(x, y), \qquad \sum_t r_t = r(x, y) - \beta \log \frac{\pi_\theta(y \mid x)}{\pi_{\text{ref}}(y \mid x)}$$
#
# The sum is exactly the RLHF objective of one sample. Then GAE runs over the token positions, one
# episode per sequence, ending at the last token (`compute_gae_advantages` transposes to chapter 01's
# `[steps, env]` layout and calls your `compute_gae`). With GAE the KL is already in the rewards, so
# the objective below drops its own KL term.
#
# ### Exercise: `compute_per_token_rewards`
#
# `compute_per_token_rewards(scores, logprobs, ref_logprobs, kl_coef)`: `scores` `[b]` (one score per
# sample), the log-probs of the generated tokens under the policy and the reference `[b, g]`; return
# the $r_t$ above, `[b, g]`. The score goes to the last position of its own row only, and the inputs
# stay as they were (the rollout reuses them).
#
# **Predict, then check.** With `kl_coef = 0.1` and a policy identical to the reference, what is
# $\sum_t r_t$ for a sample with score 0.8? And if every generated token has log-prob 0.5 higher under
# the policy than under the reference, over 16 tokens? The cell after the check computes both.

# %% exercise rlhf_tutorial.rlhf:compute_per_token_rewards | 15 min | difficulty 3 | importance 4

# %%
same = torch.full((1, 16), -2.0)
print("identical policy:       sum of r_t =",
      round(compute_per_token_rewards(torch.tensor([0.8]), same, same, 0.1).sum().item(), 4))
print("policy 0.5 nats higher: sum of r_t =",
      round(compute_per_token_rewards(torch.tensor([0.8]), same + 0.5, same, 0.1).sum().item(), 4))

# %% [markdown]
# ### Why the score is paid once, at the last token
#
# The seed blog of this course tried GAE with the final score spread over **every** timestep, and saw
# the value loss explode and the text degenerate. With $\gamma = 1$ and $\lambda = 1$ the value target at
# position $t$ is the sum of the rewards still to come, so a reward paid at every one of $T$ tokens turns
# a score of $r$ into a first-token target of $T r$: the critic must predict numbers $T$ times larger,
# its error dominates the objective, and the advantages it produces are mostly noise. GAE's $\lambda < 1$
# weighs the reward $k$ tokens ahead by $\lambda^k$ (while the values are still 0, as below), which
# shrinks that factor to $(1 - \lambda^T) / (1 - \lambda)$, still many times the reward's scale. Paying
# the score once, at the last token, keeps the targets at the reward's scale whatever $\lambda$. Compare
# the value targets (`returns = advantages + values`) the two choices produce, for rewards of $\pm 1$,
# $T = 30$, $\lambda = 1$ and the trainer's default $\lambda = 0.95$:

# %%
torch.manual_seed(0)
T = 30
scores = torch.tensor([1.0, -1.0, 0.5, -0.5])
vals = torch.zeros(4, 1 + T)  # V at every position of a one-token prompt and T generated tokens: 0 here
sparse = compute_per_token_rewards(scores, torch.zeros(4, T), torch.zeros(4, T), kl_coef=0.0)
spread = scores[:, None].expand(4, T).clone()
for lam in (1.0, 0.95):
    for name, rewards in [("score at the last token", sparse), ("score at every token", spread)]:
        returns = compute_gae_advantages(rewards, vals, 1, gamma=1.0, gae_lambda=lam)  # + V(s_t), 0 here
        print(f"lambda {lam}, {name:>24}: value targets up to |{returns.abs().max().item():.1f}|, "
              f"first-token target {[round(x, 1) for x in returns[:, 0].tolist()]}")

# %% [markdown]
# Which estimator? The seed blog used the one-step estimate for GPT-2 (after its GAE runs, with the score
# spread over every token, blew up), and the GPT-2 preset follows it. The tiny world's default is GAE with
# the score at the last token: there the sentiment is mostly settled by the first word after the prompt,
# and the one-step estimate can only pass the score back one value at a time, through 16 tokens. Measured
# on the reference machine with the command line (`train-rlhf --world tiny --seed 0 --num-phases 20
# --batch-size 32 --advantage-estimator one_step` or `gae`, everything else the tiny preset): one-step
# moved the policy (KL {{rlhf_one_step.kl_final:.2f}} per token) but hardly the reward
# ({{rlhf_one_step.mean_reward_initial:.2f}} -> {{rlhf_one_step.mean_reward_final:.2f}}); GAE took it from
# {{rlhf_gae.mean_reward_initial:.2f}} to {{rlhf_gae.mean_reward_final:.2f}} (KL {{rlhf_gae.kl_final:.2f}}).
#
# `rollout_advantages` (not an exercise: read it) makes that choice in one place, from the settings'
# `advantage_estimator`; your `rollout_phase` below calls it, and so does the token explorer at the end
# of the chapter. It calls your `compute_advantages` and `compute_per_token_rewards`.

# %% source rlhf_tutorial.rlhf:rollout_advantages

# %% [markdown]
# ## Replay memory and minibatches
#
# One rollout is one batch of samples. The learning phase visits it `update_epochs`
# times, each time in a fresh random order cut into `num_minibatches` minibatches (as in chapter 01).
# The memory stores per sample: the tokens, the old log-probs $\log\pi_{\theta_\text{old}}$, the
# reference log-probs, the values of the states that chose the generated tokens, and the advantages.
# The **value targets** are the returns $\hat R_t = \hat A_t + V(s_t)$: with one-step advantages,
# the next state's value (or the reward, after the last token).
#
# What it does **not** store: logits. A `[batch, seq, vocab]` tensor for the whole batch is the
# biggest thing in the whole algorithm; the reference logits are recomputed per minibatch when the
# objective's full KL needs them (`bench-memory` in the README measures this for a GPT-2-sized model).
#
# ### Exercise: `ReplayMemory.get_minibatches`
#
# The value targets are the returns $\hat R = \hat A + V$. Each of the `update_epochs` passes visits every
# row exactly once, in a fresh random order drawn from `generator` (so a seed fixes it), cut into
# `num_minibatches` equal minibatches; a `ReplayMinibatch` takes the same rows of every tensor. Its fields, all indexed by the minibatch's
# rows: `tokens` `[mb, s]`, `logprobs` `[mb, g]` (the rollout policy's, pi_old), `ref_logprobs`
# `[mb, g]`, `advantages` `[mb, g]` and `returns` `[mb, g]` (there is no `values` field: the values
# enter through `returns`). The permutation stays on the CPU, where `generator` is: CPU indices select
# rows of tensors on any device, so the minibatches are on the memory's device.

# %% exercise rlhf_tutorial.rlhf:ReplayMemory | 15 min | difficulty 2 | importance 3

# %% [markdown]
# ## The RLHF objective
#
# For one minibatch, with $\text{ratio}_t = \pi_\theta(y_t)/\pi_{\theta_\text{old}}(y_t)$ and
# normalised advantages $\hat A_t$ (chapter 01):
#
# $$L(\theta) = \underbrace{\frac1{|B|}\sum_t \min\big(\text{ratio}_t \hat A_t,\ \mathrm{clip}(\text{ratio}_t, 1-\epsilon, 1+\epsilon)\, \hat A_t\big)}_{\text{clipped surrogate}} \;-\; \underbrace{\tfrac{c_1}{2}\,\frac1{|B|}\sum_t \big(V_\theta(s_t) - \hat R_t\big)^2}_{\text{value loss}} \;+\; \underbrace{c_2\, \bar H\big[\pi_\theta\big]}_{\text{entropy}} \;-\; \underbrace{\beta\, \overline{\mathrm{KL}}\big(\pi_\theta \,\|\, \pi_\text{ref}\big)}_{\text{KL penalty}}$$
#
# maximised (the optimizer has `maximize=True`). The three middle pieces are chapter 01's functions,
# imported here. The logits are divided by the temperature first; the entropy and KL are taken at the
# positions from `prefix_len - 1` up to the last one (excluded), whose logits predict the generated
# tokens. The KL is
# `calc_kl_penalty` on reference logits recomputed for this minibatch (under `torch.no_grad()`, and
# divided by the **same** `args.temperature` as the policy's: both distributions are taken at the
# sampling temperature) when `args.kl_estimator == "full"`, else the mean of `approx_kl` on the
# stored reference log-probs (which the rollout already took at that temperature). Multiply the KL by
# the `kl_coef` argument (not `args.kl_coef`), and the entropy by `args.ent_coef`; the names
# `entropy` and `kl` hold the terms *before* their coefficients (the logged stats read them).
#
# Which KL is in here depends on the advantage estimator. With one-step advantages the rewards hold no
# KL, and this term (with the trainer's $\beta$) is the only tether to the reference. With GAE (the tiny
# world's default) the KL is already in the per-token rewards, and the trainer passes `kl_coef = 0`
# here. A term multiplied by 0 still costs a reference forward pass and a `[minibatch, gen, vocab]` KL
# graph to back-propagate through, so when `kl_coef == 0` skip it: no reference forward, and `kl` (for
# the logs only) is the k3 estimate from the stored reference log-probs. (The checker accepts either.)
#
# **Value clipping (optional).** PPO limits how far the policy moves from the rollout's; some
# implementations (CleanRL's `clip_vloss`, TRL's `cliprange_value`) limit the critic the same way. With
# the rollout's values $V_\text{old}$ (here `minibatch.returns - minibatch.advantages`, since the memory
# stored `returns = advantages + values`) and a range $\epsilon_V$ = `args.cliprange_value`:
#
# $$V^\text{clip}_t = V_\text{old}(s_t) + \mathrm{clip}\big(V_\theta(s_t) - V_\text{old}(s_t), -\epsilon_V, \epsilon_V\big), \qquad
# L^{VF} = \tfrac12\, \mathrm{mean}_t \max\big((V_\theta(s_t) - \hat R_t)^2,\ (V^\text{clip}_t - \hat R_t)^2\big)$$
#
# The max is pessimistic, like the clipped surrogate's min: once a value has moved more than $\epsilon_V$
# towards its target the gradient stops, and a value moving *away* from its target is never
# protected. Chapter 01's `calc_clipped_value_loss(values, old_values, returns, vf_coef, clip)` computes it
# (with $c_1$ inside, like `calc_value_function_loss`). It matters most when the value head shares its body
# with the policy, as here: a large value update also reshapes the features the policy reads. Studies
# of PPO's implementation details (Engstrom et al. 2020, Andrychowicz et al. 2021) found it does not
# help and can hurt, and $\epsilon_V$ is in the units of the returns (one more reason to whiten the
# scores); it is off by default
# (`cliprange_value=None`), and `--cliprange-value 0.2` turns it on.
#
# ### Exercise: `compute_rlhf_objective`

# %% exercise rlhf_tutorial.rlhf:compute_rlhf_objective | 25 min | difficulty 4 | importance 5

# %% [markdown]
# ## Optimizer and learning-rate schedule
#
# The transformer is pretrained and the value head is brand new, so they get different learning
# rates: the seed found `learning_rate = 8e-6` (the transformer's) and `head_lr = 8e-5` best for GPT-2 (the tiny world's
# model is ~100 times smaller and takes larger steps). The schedule multiplies both: a linear
# **warmup** from 0 over `warmup_steps` phases (Adam's moment estimates are poor at the start), then a
# linear **decay** to `final_scale`:
#
# $$\text{lr}(t) = \text{lr}_0 \times \begin{cases} t / t_w & t < t_w \\ 1 + (s_f - 1)\,\frac{t - t_w}{t_\text{tot} - t_w} & t_w \le t < t_\text{tot} \\ s_f & t \ge t_\text{tot} \end{cases}$$
#
# AdamW's default `weight_decay=0.01` would shrink every weight towards **zero** a little at each step.
# For a freshly initialised network that is a mild regulariser; for a pretrained transformer it is a
# pull away from everything pretraining learned, in no direction the task asks for. What should hold
# the policy is the KL penalty, which pulls towards the **reference**. So `get_optimizer` sets
# `weight_decay=0` for both groups (chapter 04's GRPO does the same).
#
# ### Exercises: `get_optimizer` and `lr_schedule`

# %% exercise rlhf_tutorial.rlhf:get_optimizer | 10 min | difficulty 2 | importance 3

# %% exercise rlhf_tutorial.rlhf:lr_schedule | 10 min | difficulty 2 | importance 3

# %%
print("multiplier per phase (warmup 3, total 12, final 0.1):",
      [round(lr_schedule(t, 3, 12, 0.1), 2) for t in range(14)])

# %% [markdown]
# ## Adaptive KL control
#
# A fixed $\beta$ is a guess: too small and the policy drifts into reward hacking, too large and it
# never moves. The adaptive controller of Ziegler et al. (2019) treats $\beta$ as the knob of a
# proportional controller that steers the measured KL towards a target:
#
# $$e = \mathrm{clip}\Big(\frac{\mathrm{KL}}{\mathrm{KL}_\text{target}} - 1,\ -0.2,\ 0.2\Big), \qquad \beta \leftarrow \beta\,\Big(1 + e\,\frac{n_\text{steps}}{\text{horizon}}\Big)$$
#
# KL above target raises $\beta$ (a stronger pull back), below target lowers it. The clip keeps one
# noisy measurement from swinging $\beta$ wildly; `horizon` sets how fast it reacts (the trainer
# calls `update` once per phase with `n_steps = batch_size`). One phase changes $\beta$ by at most a factor
# $1 \pm 0.2\, n_\text{steps}/\text{horizon}$: with batch 64 and horizon 10,000 that is 0.13% a phase, and 200
# phases move $\beta$ by at most a factor $e^{\pm 0.26} \approx 1.3$: such a controller barely controls. Choose the
# horizon from the number of phases: with horizon $= k \cdot n_\text{steps}$, a KL persistently off target by
# 20% or more moves $\beta$ by a factor of about $e^{0.2 P/k}$ in $P$ phases.
#
# ### KL per token or per sequence: say which
#
# The KL of a completion is a sum over its tokens: $\mathrm{KL}_\text{seq} = \sum_t \mathrm{KL}_t$, in nats per
# sequence, while the mean over tokens is in nats per token. With `gen_len` tokens the two differ by
# that factor (16 here, 30 in the GPT-2 preset). Ziegler et al. and TRL's adaptive controller target
# the **sequence** KL (TRL's default target is 6 nats); $\pi^*$ above is a statement about sequences too.
# This course's trainer measures, targets and thresholds **per token**: `kl` in the history,
# `kl_target`, `kl_threshold` and the dashboard's KL are means over generated tokens (k3), and
# `kl_seq` in the history is the per-sequence sum (k1). A per-token target of 0.3 with 16 tokens is
# about 4.8 nats per sequence; the same per-token number means twice the drift for a completion twice
# as long. Per token is the easier unit to carry between runs of different lengths; per sequence is the
# unit of the objective. When you copy a target or a threshold from a paper, convert it.
#
# ### Exercise: `AdaptiveKLController`

# %% exercise rlhf_tutorial.rlhf:AdaptiveKLController | 15 min | difficulty 2 | importance 4

# %%
ctl = AdaptiveKLController(init_kl_coef=0.5, target=0.2, horizon=200)
trace = []
for kl in [0.05] * 10 + [0.6] * 10:
    ctl.update(kl, n_steps=16)
    trace.append(round(ctl.value, 3))
print("beta while KL is below target, then above:", trace)

# %% [markdown]
# In a real run: `train-rlhf --world tiny --direction neg --seed 0 --adaptive-kl` (the tiny preset with
# the controller on: $\beta$ starts at 0.1, target 0.2 nats per token, horizon 640 samples, so at most 2% a
# phase). From the JSON summary's `kl_coef_per_phase` (the $\beta$ each phase's rollout used) and
# `kl_per_phase` (that rollout's k3 KL per token, which the controller reads), on the reference machine:
#
# | phase | 0 | 3 | 9 | 15 | 21 | 27 | 33 | 39 | 45 | 49 |
# |---|---|---|---|---|---|---|---|---|---|---|
# | $\beta$ | {{rlhf_adaptive.kl_coef_per_phase.0:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.3:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.9:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.15:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.21:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.27:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.33:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.39:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.45:.3f}} | {{rlhf_adaptive.kl_coef_per_phase.49:.3f}} |
# | KL / token | {{rlhf_adaptive.kl_per_phase.0:.2f}} | {{rlhf_adaptive.kl_per_phase.3:.2f}} | {{rlhf_adaptive.kl_per_phase.9:.2f}} | {{rlhf_adaptive.kl_per_phase.15:.2f}} | {{rlhf_adaptive.kl_per_phase.21:.2f}} | {{rlhf_adaptive.kl_per_phase.27:.2f}} | {{rlhf_adaptive.kl_per_phase.33:.2f}} | {{rlhf_adaptive.kl_per_phase.39:.2f}} | {{rlhf_adaptive.kl_per_phase.45:.2f}} | {{rlhf_adaptive.kl_per_phase.49:.2f}} |
#
# Phases 0 and 1 sample from the reference itself (phase 0 learns at rate 0: warmup), so their KL is
# exactly 0. While the KL is below target (the first phases) $\beta$ drops; once it passes 0.2, $\beta$
# climbs, by up to 2% a phase (the clip), and the rollout KL, noisy from phase to phase, drifts back
# towards the target. The run ends at reward {{rlhf_adaptive.mean_reward_final:.2f}} and KL
# {{rlhf_adaptive.kl_final:.2f}} per token (128 fresh samples), $\beta = {{rlhf_adaptive.kl_coef_final:.3f}}$. With the old horizon of 2,000
# samples, $\beta$ could have moved by at most 0.64% a phase, 37% over the whole run; with TRL's 10,000 at
# batch 64, 0.13% a phase and 6% over the run.
#
# ## Early stopping
#
# Reward over-optimisation creeps in late: the reward keeps rising while the text gets worse. A
# simple guard stops training once the rollout's KL (or, optionally, its reward) has been above a
# threshold for `patience` consecutive phases; a single good phase resets the count, so one noisy
# phase does not stop a run.
#
# ### Exercise: `EarlyStopping`

# %% exercise rlhf_tutorial.rlhf:EarlyStopping | 10 min | difficulty 2 | importance 3

# %% [markdown]
# ## Reward whitening
#
# Before computing advantages, the rollout's rewards are **whitened** with chapter 02's `whiten`:
# $(r - \mu) / \sqrt{\sigma^2 + \epsilon}$ over the batch, with `shift_mean=True`. Chapter 02 advised keeping
# the mean (`shift_mean=False`, as TRL does), so this is a deliberate exception. Every sample here
# starts from the same single prompt, so subtracting the batch's mean score is a **baseline**: "better
# or worse than this batch's average", the same baseline GRPO takes per group in chapter 04 with the
# whole batch as one group. The mean shift leaves the policy gradient unchanged in expectation
# (apart from the small $1/N$ effect of a sample being part of its own mean) and lowers its variance.
# The division by the batch's std is not so innocent: it rescales the score but not the per-token KL
# penalty, so it changes their balance, and since the std of the scores changes from phase to phase,
# the effective $\beta$ (against the score in its own units) moves with it: a batch whose scores are
# close together has its differences blown up, which weakens the tether. The other price is the one
# chapter 02 named: the value head learns targets centred anew in every phase, so its
# values say which prefixes beat the batch's average, not how high the reward is, and they do not
# rise as the reward does. With many prompts, one batch mean is a poor baseline for each of them, and
# chapter 02's advice (keep the mean, let the critic learn each prompt's level) is the right one. What
# whitening buys is a fixed scale: the whitened score has spread 1, so $\beta = 0.1$ per token is
# weighed against scores of order 1 whatever the classifier's range.
#
# ## The trainer
#
# `RLHFTrainer` (imported) holds the policy with its value head, the frozen reference, the reward
# function, the optimizer and scheduler, the KL controller and early stopping. Its `train()` loop is:
#
# ```python
# for phase in range(args.num_phases):
#     memory = rollout_phase(trainer)            # sample, score, log-probs, values, advantages
#     if early_stopping.should_stop(kl, reward): break
#     stats = learning_phase(trainer, memory)    # PPO epochs of minibatch ascent, then scheduler.step()
#     kl_controller.update(kl, batch_size)       # when adaptive KL is on
# ```
#
# You write the two phases. Keep the memory rule in mind: the rollout's forward passes run **one
# chunk of `args.minibatch_size` rows at a time** under
# `torch.no_grad()`, and only log-probs and values are kept. The KL coefficient of the per-token
# rewards (GAE) is the trainer's **current** one, `trainer.kl_coef` (the adaptive controller's value
# when `args.adaptive_kl` is on; `args.kl_coef` is only its start). Whiten the shaped rewards only when
# `args.whiten_rewards` is True. Everything the rollout keeps is on the policy's device, as
# `trainer.reward_fn`'s rewards are; `ngram_repetition` reads texts and gives a CPU tensor, so move it
# to the rewards' device before the shaping. In `learning_phase` the objective gets
# `trainer.objective_kl_coef` (0 with GAE, whose rewards already hold the KL) and the minibatch order
# comes from `trainer.generator`.
#
# ### Exercise: `rollout_phase`

# %% exercise rlhf_tutorial.rlhf:rollout_phase | 20 min | difficulty 3 | importance 4

# %% [markdown]
# ### Exercise: `learning_phase`

# %% exercise rlhf_tutorial.rlhf:learning_phase | 25 min | difficulty 4 | importance 5

# %% [markdown]
# ## Train
#
# Everything you wrote now runs together: `learner_functions(globals())` hands the trainer your
# versions of every exercise. The settings are the world's preset (`RLHFArgs.preset`): in the tiny
# world 50 phases of 64 samples of 16 tokens: {{rlhf_neg.wall_seconds:.0f}} s when it was recorded on the reference
# machine, a 2-core CPU shared with other jobs (less on an idle one).
#
# The dashboard updates after every phase: the mean reward of the rollout, the KL to the reference
# (per token, k3 estimate), the policy's entropy, the value loss, the clip fraction, $\beta$ and the
# learning rate, with a table of samples per phase.

# %%
args = RLHFArgs.preset(world, direction=direction, seed=0, **smoke_sizes(num_phases=2, eval_samples=32))
trainer = RLHFTrainer(args, **learner_functions(globals()))
before = trainer.evaluate(args.eval_samples, seed=args.seed + 1)
dashboard = rlhf_dashboard(title=f"RLHF on the {world} world, towards {direction}")
history = trainer.train(callback=dashboard.update)
dashboard.finish()
after = trainer.evaluate(args.eval_samples, seed=args.seed + 1)
print(f"mean reward: {before['reward']:.3f} -> {after['reward']:.3f} "
      f"(KL per token {after['kl']:.3f}, phases {len(history)})")
figures.agree("rlhf_neg", {"mean_reward_initial": before["reward"], "mean_reward_final": after["reward"],
                           "kl_final": after["kl"]});  # the text below quotes this run

# %% [markdown]
# Is it still writing reviews? Three measures beside reading the samples: the 3-gram repetition
# (chapter 02: 0 when no word triple repeats), the same for single words (the share of words that
# repeat one already used in the sample), and the reference model's log-prob per generated token (how
# natural the text still is to the base model).

# %%
for name, stats in [("base", before), ("tuned", after)]:
    print(f"{name:>6}: reward {stats['reward']:.3f}, 3-gram repetition {stats['repetition']:.3f}, word repetition "
          f"{stats['word_repetition']:.3f}, reference log-prob per token {stats['ref_logprob_per_token']:.2f}")
samples_table(after["texts"][:8], torch.tensor(after["rewards"][:8]), title="tuned policy samples")

# %% [markdown]
# With `python -m rlhf_tutorial train-rlhf --world tiny --direction neg --seed 0 --no-fast` (the same run: your
# `get_samples` and value head run as you wrote them, which `--no-fast` asks of the reference ones too; without
# it the command samples with a faster sampler of the harness that draws other tokens, and lands nearby) we
# measured on the reference machine, on 128 samples: reward {{rlhf_neg.mean_reward_initial:.2f}} ->
# {{rlhf_neg.mean_reward_final:.2f}}, KL {{rlhf_neg.kl_final:.2f}} per token, 3-gram repetition
# {{rlhf_neg.repetition_initial:.3f}} -> {{rlhf_neg.repetition_final:.3f}}, word repetition
# {{rlhf_neg.word_repetition_initial:.2f}} -> {{rlhf_neg.word_repetition_final:.2f}}, reference log-prob per
# token {{rlhf_neg.ref_logprob_per_token_initial:.2f}} -> {{rlhf_neg.ref_logprob_per_token_final:.2f}}. (The
# training cell checks that your run agrees, within what another CPU's rounding moves.) The repetition metrics
# barely move and the text is only a little less likely under the base model: these are still review
# sentences, now negative ones. Compare the hacked runs below, whose reference log-prob per token
# falls to {{hack_tiny_beta.ref_logprob_per_token_final:.1f}} and {{hack_tiny_beta_rep.ref_logprob_per_token_final:.1f}}.

# %% [markdown]
# ## Looking inside one sample
#
# The token explorer shows a few fresh samples token by token: the value head's estimate at the
# state that chose each token, the per-token KL to the reference (full distributions), and the
# advantage as the trainer computes it (GAE over per-token rewards in the tiny world, one-step with
# the GPT-2 preset), from the scores whitened over the explorer's samples as a rollout's are (the
# value head was trained on whitened scores, so values and advantages are in those units, not in
# probabilities). Tokens where the value jumps are where the classifier's verdict was decided; tokens
# with large KL are where the tuned policy departs from the base model.

# %%
token_explorer(trainer, n_samples=4, seed=3)

# %% [markdown]
# And the same prompt, base versus tuned, several samples each:

# %%
base_vs_tuned(trainer, prompt=prompt, n=6, seed=4)

# %% [markdown]
# ## Reward hacking, with numbers
#
# What is the KL penalty for? Take it (almost) away: a run with a tiny $\beta$, a larger learning rate
# and no early stopping. The classifier only reads sentiment, so the cheapest way to a high score is
# to say negative words, many of them: the policy collapses into repeated sentiment words, the
# 3-gram repetition shoots up and the reference log-prob per token falls. Then the same run with
# the repetition penalty from chapter 02 in the reward and adaptive KL control.

# %%
hack_common = dict(direction=direction, seed=0, early_stopping=False)
if is_tiny():  # 40 short phases each, with larger steps than the main run, so the hack shows quickly
    hack_common.update(batch_size=32, num_phases=40, learning_rate=1e-3, head_lr=3e-3)
else:
    hack_common.update(num_phases=100)
hack_common.update(smoke_sizes(num_phases=1, batch_size=16, eval_samples=16))
hack_runs = {
    "tiny beta": dict(kl_coef=0.001),
    "tiny beta + repetition penalty": dict(kl_coef=0.001, repetition_coef=1.0),
    "repetition penalty + adaptive KL": dict(kl_coef=args.kl_coef, repetition_coef=1.0, adaptive_kl=True,
                                             **(dict(kl_target=0.25, kl_horizon=128) if is_tiny() else {})),
}
hack_results = {}
bar = tqdm(total=len(hack_runs) * hack_common["num_phases"], desc="reward-hacking runs (phases)")
for name, settings in hack_runs.items():
    bar.set_postfix_str(name)
    run_args = RLHFArgs.preset(world, **hack_common, **settings)
    run = RLHFTrainer(run_args, **learner_functions(globals()))
    run.train(callback=lambda record: bar.update(1), progress=False)
    hack_results[name] = {"history": run.history, "eval": run.evaluate(run_args.eval_samples, seed=run_args.seed + 1)}
    del run
bar.close()

print(f"{'run':>34} {'reward':>7} {'3-gram rep.':>11} {'word rep.':>9} {'ref log-prob/token':>18} {'KL/token':>8}")
for name, result in {"base model": {"eval": before}, "main run above": {"eval": after}, **hack_results}.items():
    e = result["eval"]
    print(f"{name:>34} {e['reward']:7.3f} {e['repetition']:11.3f} {e['word_repetition']:9.3f} "
          f"{e['ref_logprob_per_token']:18.2f} {e['kl']:8.3f}")
for name, run_name in [("tiny beta", "hack_tiny_beta"), ("tiny beta + repetition penalty", "hack_tiny_beta_rep"),
                       ("repetition penalty + adaptive KL", "hack_rep_adaptive")]:
    e = hack_results[name]["eval"]  # the table below quotes these runs
    figures.agree(run_name, {"mean_reward_final": e["reward"], "kl_final": e["kl"]})
runs_figure({name: r["history"] for name, r in hack_results.items()})

# %%
for name, result in hack_results.items():
    display(samples_table(result["eval"]["texts"][:4], result["eval"]["rewards"][:4], title=name))

# %% [markdown]
# Read the numbers with the samples. The same runs from the command line (`train-rlhf --world tiny
# --seed 0 --batch-size 32 --num-phases 40 --learning-rate 1e-3 --head-lr 3e-3 --no-early-stopping --no-fast`
# plus `--kl-coef 0.001`, then `--kl-coef 0.001 --repetition-coef 1.0`, then `--kl-coef 0.1 --repetition-coef 1.0
# --adaptive-kl --kl-target 0.25 --kl-horizon 128`) gave, on 128 samples on the reference machine (this
# notebook, with one thread, prints the same numbers above; the cell checks that they agree):
#
# | run | reward | KL / token | ref. log-prob / token | word repetition | 3-gram repetition |
# |---|---|---|---|---|---|
# | base model | {{rlhf_neg.mean_reward_initial:.2f}} | 0 | {{rlhf_neg.ref_logprob_per_token_initial:.2f}} | {{rlhf_neg.word_repetition_initial:.2f}} | {{rlhf_neg.repetition_initial:.2f}} |
# | main run above | {{rlhf_neg.mean_reward_final:.2f}} | {{rlhf_neg.kl_final:.2f}} | {{rlhf_neg.ref_logprob_per_token_final:.2f}} | {{rlhf_neg.word_repetition_final:.2f}} | {{rlhf_neg.repetition_final:.2f}} |
# | tiny $\beta$ | {{hack_tiny_beta.mean_reward_final:.2f}} | {{hack_tiny_beta.kl_final:.2f}} | {{hack_tiny_beta.ref_logprob_per_token_final:.2f}} | {{hack_tiny_beta.word_repetition_final:.2f}} | {{hack_tiny_beta.repetition_final:.2f}} |
# | tiny $\beta$ + repetition penalty | {{hack_tiny_beta_rep.mean_reward_final:.2f}} | {{hack_tiny_beta_rep.kl_final:.2f}} | {{hack_tiny_beta_rep.ref_logprob_per_token_final:.2f}} | {{hack_tiny_beta_rep.word_repetition_final:.2f}} | {{hack_tiny_beta_rep.repetition_final:.2f}} |
# | repetition penalty + adaptive KL | {{hack_rep_adaptive.mean_reward_final:.2f}} | {{hack_rep_adaptive.kl_final:.2f}} | {{hack_rep_adaptive.ref_logprob_per_token_final:.2f}} | {{hack_rep_adaptive.word_repetition_final:.2f}} | {{hack_rep_adaptive.repetition_final:.2f}} |
#
# - **tiny beta**: the reward saturates ({{hack_tiny_beta.mean_reward_final:.2f}}) and the text stops being
#   a review: broken sentences and the same words again and again (the recorded run's first sample:
#   "{{hack_tiny_beta.samples_final.0}}"). The base model finds it very unlikely (reference log-prob per
#   token from {{rlhf_neg.ref_logprob_per_token_initial:.2f}} to {{hack_tiny_beta.ref_logprob_per_token_final:.1f}}),
#   the KL per token is {{hack_tiny_beta.kl_final:.1f}} against the main run's {{rlhf_neg.kl_final:.2f}}, and
#   the share of words that repeat an earlier one goes from {{rlhf_neg.word_repetition_initial:.2f}} to
#   {{hack_tiny_beta.word_repetition_final:.2f}}.
# - **tiny beta + repetition penalty**: the 3-gram penalty rules out repeated phrases (3-gram repetition
#   {{hack_tiny_beta_rep.repetition_final:.2f}}), and the policy finds the next hole
#   ("{{hack_tiny_beta_rep.samples_final.0}}"). Reward {{hack_tiny_beta_rep.mean_reward_final:.2f}}, yet the
#   text is the least natural of all (reference log-prob {{hack_tiny_beta_rep.ref_logprob_per_token_final:.1f}}
#   per token). A shaping term closes one loophole, not all of them.
# - **repetition penalty + adaptive KL**: a real KL coefficient, which the controller raises whenever the
#   KL passes its target (here $\beta$ ends at {{hack_rep_adaptive.kl_coef_final:.2f}}). The reward climbs
#   more slowly ({{hack_rep_adaptive.mean_reward_final:.2f}} after these 40 aggressive phases), and the
#   samples stay reviews ("{{hack_rep_adaptive.samples_final.0}}"). The main run above, with gentler steps
#   and a fixed $\beta$, gets both: a reward above 0.9 and natural text.
#
# The KL penalty is what keeps "high reward" meaning "a negative review" rather than "whatever string
# the classifier scores highest". The reward model cannot tell the difference; only the tether to the
# reference can.
#
# ## Reward over-optimisation as a curve
#
# Above, the reward we optimised was the thing we measured. In real RLHF the reward is a **learned
# proxy**: a reward model (chapter 02) trained on a limited number of human preferences. Gao, Schulman &
# Hilton (2022) optimised such proxies against a "gold" reward model that played the human, and found
# the same shape every time: as the policy moves away from the reference, the proxy reward keeps
# rising, while the gold reward rises, peaks and then **falls**. With $d = \sqrt{\mathrm{KL}}$ (KL in nats
# per sequence), they fit the gold reward of best-of-$n$ sampling by $d(\alpha - \beta_\text{G} d)$ and that of
# RL (PPO, as here) by $d(\alpha - \beta_\text{G} \log d)$, with fitted constants $\alpha, \beta_\text{G}$ (not the KL
# coefficient): both a hump, which a larger reward model moves further out.
#
# The same experiment in the tiny world, `python -m rlhf_tutorial overoptimization --world tiny --seed 0`:
#
# - the **proxy** is chapter 02's `RewardModel` trained on 1,000 of the world's 4,000 preference pairs
#   (one epoch), so it agrees with the rater on only part of the held-out pairs;
# - PPO (this chapter's trainer, towards **positive** reviews, the direction the preferences favour) climbs
#   the proxy with a small $\beta$ = 0.02 per token, 50 phases of 64 samples;
# - the **gold** reward, never seen by the policy, is the world's sentiment classifier's P(POSITIVE) on
#   the same samples; the x-axis is the k1 KL per sequence of each rollout.
#
# The cell runs a shorter version (fewer phases, smaller batches), enough to see the proxy pull away;
# the full run's numbers follow it.

# %%
over_args = OveroptimizationArgs(world=world, seed=0)
if is_tiny():  # about a third of the CLI's run: 24 phases of 32
    over_args = replace(over_args, num_phases=24, batch_size=32)
over_args = replace(over_args, **smoke_sizes(rm_train_pairs=32, rm_test_pairs=32, num_phases=2, batch_size=8))
over = run_overoptimization(over_args, progress=False)
print(f"proxy held-out accuracy {over['proxy_heldout_accuracy']:.3f}; gold {over['gold_initial']:.3f} -> "
      f"peak {over['gold_peak_smoothed']:.3f} (phase {over['gold_peak_phase']}) -> {over['gold_final_smoothed']:.3f}; "
      f"proxy {over['proxy_initial']:.2f} -> {over['proxy_final_smoothed']:.2f}; {over['wall_seconds']:.0f} s")
overoptimization_figure(over)

# %% [markdown]
# The full CLI run, `overoptimization --world tiny --seed 0`, and the same with `--seed 1`, recorded on
# the reference machine ({{overopt.wall_seconds:.0f}} s for seed 0 on a busy 2-core CPU). The proxy trained
# in {{overopt.rm_seconds:.0f}} s and agrees with the rater on {{overopt.proxy_heldout_accuracy:.0%}} of 400
# held-out pairs ({{overopt.proxy_heldout_accuracy_initial:.0%}} before training). Five-phase moving
# averages, KL in nats per sequence (k1):
#
# | phase | seed 0: KL / seq | proxy | gold P(POSITIVE) | seed 1: KL / seq | proxy | gold P(POSITIVE) |
# |---|---|---|---|---|---|---|
# | 0 | {{overopt.kl_seq_smoothed_per_phase.0:.1f}} | {{overopt.proxy_smoothed_per_phase.0:.2f}} | {{overopt.gold_smoothed_per_phase.0:.2f}} | {{overopt_s1.kl_seq_smoothed_per_phase.0:.1f}} | {{overopt_s1.proxy_smoothed_per_phase.0:.2f}} | {{overopt_s1.gold_smoothed_per_phase.0:.2f}} |
# | 10 | {{overopt.kl_seq_smoothed_per_phase.10:.1f}} | {{overopt.proxy_smoothed_per_phase.10:.2f}} | {{overopt.gold_smoothed_per_phase.10:.2f}} | {{overopt_s1.kl_seq_smoothed_per_phase.10:.1f}} | {{overopt_s1.proxy_smoothed_per_phase.10:.2f}} | {{overopt_s1.gold_smoothed_per_phase.10:.2f}} |
# | 20 | {{overopt.kl_seq_smoothed_per_phase.20:.1f}} | {{overopt.proxy_smoothed_per_phase.20:.2f}} | {{overopt.gold_smoothed_per_phase.20:.2f}} | {{overopt_s1.kl_seq_smoothed_per_phase.20:.1f}} | {{overopt_s1.proxy_smoothed_per_phase.20:.2f}} | {{overopt_s1.gold_smoothed_per_phase.20:.2f}} |
# | 30 | {{overopt.kl_seq_smoothed_per_phase.30:.1f}} | {{overopt.proxy_smoothed_per_phase.30:.2f}} | {{overopt.gold_smoothed_per_phase.30:.2f}} | {{overopt_s1.kl_seq_smoothed_per_phase.30:.1f}} | {{overopt_s1.proxy_smoothed_per_phase.30:.2f}} | {{overopt_s1.gold_smoothed_per_phase.30:.2f}} |
# | 40 | {{overopt.kl_seq_smoothed_per_phase.40:.1f}} | {{overopt.proxy_smoothed_per_phase.40:.2f}} | {{overopt.gold_smoothed_per_phase.40:.2f}} | {{overopt_s1.kl_seq_smoothed_per_phase.40:.1f}} | {{overopt_s1.proxy_smoothed_per_phase.40:.2f}} | {{overopt_s1.gold_smoothed_per_phase.40:.2f}} |
# | 49 | {{overopt.kl_seq_smoothed_per_phase.49:.1f}} | {{overopt.proxy_smoothed_per_phase.49:.2f}} | {{overopt.gold_smoothed_per_phase.49:.2f}} | {{overopt_s1.kl_seq_smoothed_per_phase.49:.1f}} | {{overopt_s1.proxy_smoothed_per_phase.49:.2f}} | {{overopt_s1.gold_smoothed_per_phase.49:.2f}} |
#
# The proxy rises in both runs, well past where it started. What the gold reward does depends on the seed.
# With seed 0 the policy settles on one review that the proxy and the classifier both like, and gold
# ends at {{overopt.gold_final_smoothed:.2f}}: no hump, but every sample is now nearly the same text
# ("{{overopt.samples_final.0}}"). With seed 1 gold never gains: from {{overopt_s1.gold_initial:.2f}} it drifts
# down ({{overopt_s1.gold_smoothed_per_phase.10:.2f}} at phase 10, {{overopt_s1.gold_smoothed_per_phase.23:.2f}} at phase 23)
# while the proxy climbs from {{overopt_s1.proxy_initial:.2f}} to {{overopt_s1.proxy_smoothed_per_phase.23:.2f}}, and ends at
# {{overopt_s1.gold_final_smoothed:.2f}}, below where it started, on samples like "{{overopt_s1.samples_final.0}}". The reward model
# learned features that go with preferred reviews in its 1,000 pairs; it never saw text like this, so
# nothing told it that such text is not a good review. Early stopping on the proxy would not catch it (the
# proxy never turns); a held-out gold check would. One small run is one draw of a noisy process: Gao et
# al.'s curves are fits over many runs and reward-model sizes, and whether a single run shows the hump,
# where, and how deep, belongs to its proxy, seed and $\beta$ (and, on another CPU, to its rounding). The
# general lesson is the gap: the proxy always gains, the gold reward only as far as the two agree.
#
# ## Saving the tuned policy
#
# `save_tuned_policy` writes the policy and its value head with **safetensors** (a plain tensor format:
# loading it runs no code, unlike a pickle) and the run's arguments as JSON; `load_tuned_policy`
# rebuilds the world's model and loads the weights. Chapter 05 looks inside a tuned policy.

# %%
folder = save_tuned_policy(trainer.model, tempfile.mkdtemp(), args)
reloaded = load_tuned_policy(folder)
check_tokens = trainer.model.base_model.to_tokens(prompt)
with torch.no_grad():
    same = torch.allclose(reloaded(check_tokens)[1], trainer.model(check_tokens)[1], atol=1e-6)
print(f"saved to {folder}; reloaded values equal: {same}")

# %% [markdown]
# ## What to try next
#
# - Train towards `"pos"`: the base model already leans positive, so it is easier (and hacks sooner).
# - `advantage_estimator="one_step"`: the KL moves out of the per-token rewards into the objective
#   (`kl_estimator` only matters then). Compare the reward and value-loss curves with the GAE default.
# - With `advantage_estimator="one_step"`, `kl_estimator="k3"` or `"k2"` instead of `"full"`: compare
#   speed, memory and the KL curve, and recall which divergence each gradient follows.
# - Raise the temperature to 1.3 or lower it to 0.7 and read the samples.
# - From the command line: `python -m rlhf_tutorial train-rlhf --world tiny --direction neg --seed 0
#   --report reports/demo.html` trains with the reference code and writes an HTML report.
# - In the GPT-2 world (a GPU helps), `RLHFArgs.preset("gpt2")` holds the seed blog's settings:
#   learning rates 8e-6 / 8e-5, max grad norm 0.5, clip 0.3, $\beta$ = 0.8 with adaptive control,
#   entropy 0.01, 200 phases of 64 samples of 30 tokens. They are a starting point, not a measured
#   result: this repository has not run the GPT-2 world (only the tiny world's numbers above are measured).

# %%
progress("03")
