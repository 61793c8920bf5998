# %% [markdown]
# # 02. Rewards and reward models
#
# RLHF optimises a language model against a reward. Before chapter 03 plugs a reward into PPO, this
# chapter looks at rewards on their own: what one is for a language model, how a scripted reward is
# built from a classifier, how rewards are normalised and shaped, and how a reward model is *learned*
# from human preferences with the Bradley-Terry loss. You will also see a reward being fooled, which
# is what chapter 03's policy will learn to do on purpose.
#
# ## What a reward is for a language model
#
# For a language model an episode is one completion. The state is the text so far (prompt $x$ plus the
# tokens $y_{<t}$ written already), an action is the next token $y_t$, and the episode ends after $T$
# tokens (or at the end-of-sequence token). The reward is a function of the whole text,
#
# $$r_t = \begin{cases} r(x, y) & t = T \\ 0 & t < T \end{cases}$$
#
# so it is **sparse**: one number per sample, at the last token. Every function in this chapter
# takes a list of `samples` (strings) and returns a float tensor of shape `[batch]`, one reward per
# sample. (Chapter 03 adds a per-token KL term to the zeros; the score itself stays at the end.)

# %% imports
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from rlhf_tutorial import check, hint, progress
from rlhf_tutorial.devices import describe, device_of
from rlhf_tutorial.rewards import (
    POOLINGS,
    RewardModel,
    length_penalty,
    missing_eos_penalty,
    pair_texts,
    score_texts,
    shaped_reward,
)
from rlhf_tutorial.trainers.rewards import RewardModelArgs, learner_functions, train_reward_model
from rlhf_tutorial.widgets.rewards import (
    LiveRewardModelCurve,
    reward_explorer,
    reward_model_curve,
    reward_table,
)
from rlhf_tutorial.worlds import (
    default_prompt,
    is_smoke,
    is_tiny,
    load_policy,
    load_preference_pairs,
    load_sentiment_classifier,
    resolve_world,
)

# %% [markdown]
# Load the policy (the tiny model or GPT-2, as the world switch says) and sample a few completions of
# the course prompt: these are the kind of texts every reward below has to score.

# %%
torch.manual_seed(0)
world = resolve_world(None)
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
policy = load_policy(world)
print(f"world: {world}")
samples = policy.generate([default_prompt()] * 4, max_new_tokens=24, verbose=False, return_type="str")
for s in samples:
    print(repr(s))

# %% [markdown]
# ## A toy reward, and how a policy would hack it
#
# The simplest reward you can write counts something. `reward_fn_char_count(samples, char=".")` returns
# the number of times `char` occurs in each sample, $r(x) = \#\{i : x_i = \texttt{char}\}$, as a `[batch]`
# float32 tensor (a tensor built from Python integers is int64: the trainers downstream expect floats).

# %% exercise rlhf_tutorial.rewards:reward_fn_char_count | 5 min | difficulty 1 | importance 2

# %% [markdown]
# A policy maximising this reward has an easy way up: write nothing but full stops. The reward keeps
# growing with every `.` and knows nothing about whether the text is still a review:

# %%
toy_texts = samples[:2] + [
    default_prompt() + " good. I liked it.",
    default_prompt() + " . . . . . . . . . . . .",
    "." * 40,
]
for text, r in zip(toy_texts, reward_fn_char_count(toy_texts)):
    print(f"{r.item():5.1f}  {text!r}")

# %% [markdown]
# That is **reward hacking** in its purest form: the optimiser finds the cheapest way to raise the
# number, not the behaviour we had in mind. Every reward below can be hacked too; they are only
# harder to hack.
#
# ## A sentiment classifier as the reward
#
# The task of chapters 03 and 04 is to steer the policy towards a sentiment. The reward is a
# sentiment classifier's probability of the label we want,
#
# $$r(x) = p_{\text{clf}}(\text{label} \mid x) = \operatorname{softmax}(\text{logits}(x))_{\text{label}},$$
#
# with label POSITIVE for `direction="pos"` and NEGATIVE for `"neg"`. In the GPT-2 world the classifier
# is `lvwerra/distilbert-imdb` (DistilBERT fine-tuned on IMDB reviews); in the tiny world a small
# classifier trained on the synthetic reviews. Both say which output is which label in
# `classifier.config.label2id`: read the index from there, never assume it.
#
# Write `reward_fn_sentiment(samples, classifier, tokenizer, direction="pos")`: a list of $B$ strings in,
# $r(x)$ for each out, a `[B]` float32 tensor on the classifier's device. Score the list in padded
# batches (a few forward passes, not one per sample; every text truncated to what the classifier
# accepts), on the classifier's device and without gradients (a reward is a number, not something to
# differentiate); an empty list gives an empty tensor. The classifier must see which
# positions are padding: without the attention mask, the padding added to the shorter samples changes
# their score (the checker scores batches of reviews of different lengths, with a classifier whose
# `label2id` does not put POSITIVE at index 1).

# %%
classifier, cls_tokenizer = load_sentiment_classifier(world)
print(type(classifier).__name__, classifier.config.id2label, classifier.config.label2id)

# %% exercise rlhf_tutorial.rewards:reward_fn_sentiment | 10 min | difficulty 2 | importance 4

# %% [markdown]
# Does the reward separate positive from negative reviews? A few hand-written ones of each:

# %%
positive_reviews = [
    "This movie was really great. The acting was wonderful and I loved the soundtrack.",
    "A beautiful film with a clever plot. The cast was excellent.",
    "I enjoyed every minute. The story was fun and the ending was satisfying.",
    "This movie was really good. The characters were charming and the dialogue was funny.",
    "Brilliant acting, a moving story and a catchy score. I highly recommend it.",
]
negative_reviews = [
    "This movie was really bad. The acting was awful and the plot was boring.",
    "A terrible film with a dull story. The cast was weak.",
    "I hated the film. The dialogue was silly and the ending was pointless.",
    "This movie was really boring. The characters were flat and the jokes were stale.",
    "Awful acting, a pointless story and a horrible soundtrack. A waste of time.",
]
pos_r = reward_fn_sentiment(positive_reviews, classifier, cls_tokenizer, "pos").cpu()
neg_r = reward_fn_sentiment(negative_reviews, classifier, cls_tokenizer, "pos").cpu()
print(f"p(POSITIVE) on positive reviews: mean {pos_r.mean():.3f}  min {pos_r.min():.3f}")
print(f"p(POSITIVE) on negative reviews: mean {neg_r.mean():.3f}  max {neg_r.max():.3f}")
print(f"every positive review above every negative one: {bool(pos_r.min() > neg_r.max())}")
print("the policy's samples, p(NEGATIVE):",
      [round(v, 3) for v in reward_fn_sentiment(samples, classifier, cls_tokenizer, "neg").tolist()])

# %% [markdown]
# ## Normalising rewards: whitening
#
# A reward's scale is arbitrary (a probability in $[0, 1]$, a reward model's logit in any range), and
# its level drifts as the policy improves. This does not set PPO's step size: the advantages are
# normalised per minibatch and Adam rescales every gradient (chapter 01). What the scale does set is
# the **value targets** (a critic regressing on numbers of size 100 learns badly with a learning rate
# tuned for size 1) and the **balance between the score and $\beta \cdot$ KL** when the KL penalty is
# added to the reward (chapter 03): the same $\beta$ means a strong tether for a reward in $[0, 1]$ and
# almost none for a reward in $[-100, 100]$. So implementations often **whiten** a batch of rewards
# before using them:
#
# $$\operatorname{whiten}(x) = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}, \qquad
# \mu = \frac{1}{N}\sum_i x_i, \quad \sigma^2 = \frac{1}{N}\sum_i (x_i - \mu)^2,$$
#
# with **one** mean and variance over all $N$ elements of the tensor (for a `[batch, seq]` tensor,
# over both dimensions, not per row) and the **biased** variance (divide by $N$: these are the
# statistics of the batch itself, and a single element gives $0$ rather than $0/0$). With
# `shift_mean=False` the mean is added back, $\frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \mu$: the spread
# is normalised but the level survives. That matters for a reward: after shifting the mean, every
# batch averages zero, so some of its samples (half, when the rewards are spread symmetrically) get a
# negative reward however good they are, and a value function trained on the whitened numbers no
# longer sees the reward improving. (TRL's PPO whitens rewards with `shift_mean=False` and
# advantages with the mean shifted.) Chapter 03's trainer centres its scores anyway (`shift_mean=True`),
# on purpose: with a single prompt, subtracting the batch's mean score is a baseline, the same one
# GRPO uses per group in chapter 04; chapter 03 says what it costs.
#
# **Predict, then check.** The cell after the check whitens the classifier's rewards of the ten reviews
# above (five positive, five negative). Before you run it: with `shift_mean=True`, what are the mean
# and the (biased) standard deviation of the result, whatever the rewards were? With
# `shift_mean=False`, what is the mean, and can a whitened reward be negative?

# %% exercise rlhf_tutorial.rewards:whiten | 5 min | difficulty 1 | importance 4

# %%
batch_rewards = reward_fn_sentiment(positive_reviews + negative_reviews, classifier, cls_tokenizer, "pos").cpu()
for shift in (True, False):
    w = whiten(batch_rewards, shift_mean=shift)
    print(f"shift_mean={shift!s:5}  mean {w.mean():+.3f}  std(biased) {w.std(unbiased=False):.3f}  "
          f"min {w.min():+.3f}  max {w.max():+.3f}")
print(f"raw                mean {batch_rewards.mean():+.3f}  std(biased) {batch_rewards.std(unbiased=False):.3f}")

# %% [markdown]
# ## Shaping the reward
#
# Shaping adds small terms that encode what the main reward forgets. Three common ones:
#
# - **repetition**: the fraction of repeated word $n$-grams,
#   $\operatorname{rep}_n(x) = 1 - \frac{\#\text{distinct } n\text{-grams}}{\#n\text{-grams}}$, with the words of
#   `x.split()` ($w - n + 1$ $n$-grams in $w$ words; $0$ for fewer than $n$ words). Subtracting
#   $c \cdot \operatorname{rep}_n$ punishes the loops a hacked policy falls into;
# - **length**: $-c \cdot T$ (or $-c\,|T - T^*|$ around a target length), against a policy padding its
#   answers (or cutting them short);
# - **missing EOS**: $-p$ when the completion never emits the end-of-sequence token (TRL's
#   `missing_eos_penalty`), against a policy that never finishes.
#
# Write `ngram_repetition(samples, n=3)`: **word** n-grams, not characters.

# %% exercise rlhf_tutorial.rewards:ngram_repetition | 15 min | difficulty 2 | importance 3

# %%
print(ngram_repetition(["the movie was good and the movie was good", "great great great great great", "too short"]))
lengths = torch.tensor([5, 20, 40])
print("length penalty (coef 0.01):", length_penalty(lengths, coef=0.01))
print("length penalty around 20:  ", length_penalty(lengths, coef=0.01, target=20))
eos = policy.tokenizer.eos_token_id
completions = torch.tensor([[11, 12, eos, eos], [11, 12, 13, 14]])
print("missing-EOS penalty:       ", missing_eos_penalty(completions, eos, penalty=1.0))

# %% [markdown]
# ## A preview of reward hacking: fooling the classifier
#
# The classifier was trained on real reviews. Text that no reviewer writes, such as one sentiment word
# over and over, lies outside that distribution, and nothing stops the classifier from being *more*
# confident there than on a real review. A policy pushed hard towards the classifier finds such text;
# the repetition penalty is one way to catch it.

# %%
real_texts = positive_reviews
degenerate_texts = [
    "great great great great great great great great great great",
    "This movie was really great great great great great great great great.",
    "good good good good good good good good good good good good",
    "loved it loved it loved it loved it loved it loved it",
    "The acting was wonderful. The acting was wonderful. The acting was wonderful.",
]
hack_texts = real_texts + degenerate_texts
hack_sent = reward_fn_sentiment(hack_texts, classifier, cls_tokenizer, "pos").cpu()
hack_rep = ngram_repetition(hack_texts)
repetition_coef = 1.0
hack_shaped = shaped_reward(hack_sent, hack_texts, repetition_coef=repetition_coef, n=3)  # sent - coef * rep_3
print(f"{'p(POSITIVE)':>11} {'rep_3':>6} {'shaped':>7}  text")
for text, s, r, sh in zip(hack_texts, hack_sent, hack_rep, hack_shaped):
    print(f"{s.item():11.4f} {r.item():6.3f} {sh.item():+7.3f}  {text[:72]}")
n_real = len(real_texts)
print(f"\nclassifier reward: real reviews mean {hack_sent[:n_real].mean():.4f} (min {hack_sent[:n_real].min():.4f}), "
      f"degenerate texts mean {hack_sent[n_real:].mean():.4f} (max {hack_sent[n_real:].max():.4f})")
print(f"degenerate texts scoring at least as high as some real review: "
      f"{int((hack_sent[n_real:] >= hack_sent[:n_real].min()).sum())} of {len(degenerate_texts)}")
print(f"shaped reward (coef {repetition_coef}): real reviews min {hack_shaped[:n_real].min():+.3f}, "
      f"degenerate texts max {hack_shaped[n_real:].max():+.3f}: every real review ranks above every degenerate "
      f"text: {bool(hack_shaped[:n_real].min() > hack_shaped[n_real:].max())}")

# %% [markdown]
# Read the numbers. The real reviews all sit near the classifier's ceiling, and so do some of the
# loops: a text that no reviewer would write earns the full reward. (Which loops get through depends
# on the classifier: a classifier that has seen degenerate text during training may reject some of
# them, as the tiny world's partly does for "great" repeated on its own (not for "good" repeated),
# but not every kind of loop.) A policy
# that finds one such loop has no reason to write anything else, and loops are easy to find by
# sampling. The repetition term costs a loop far more than the tiny differences in classifier
# confidence between good texts, so after shaping every real review outranks every loop.
#
# Shaping is not a cure: a policy can still find text that is not repetitive and fools the classifier,
# and a penalty that is too strong makes the policy avoid repeating even the words it needs. Chapter 03
# adds the other guard, the KL penalty that keeps the policy close to the reference model.

# %% [markdown]
# ## Learning a reward from preferences: the Bradley-Terry model
#
# A scripted reward only measures what we know how to write down. RLHF instead asks people to compare
# two answers to the same prompt and **learns** a reward $r_\phi$ that agrees with their choices.
# The Bradley-Terry model says the probability that a rater prefers the chosen answer $y_c$ over the
# rejected $y_r$ is
#
# $$P(y_c \succ y_r \mid x) = \sigma\big(r_\phi(x, y_c) - r_\phi(x, y_r)\big), \qquad \sigma(z) = \frac{1}{1 + e^{-z}},$$
#
# and $r_\phi$ is fitted by maximum likelihood: minimise
#
# $$\mathcal{L}(\phi) = -\frac{1}{B}\sum_{i=1}^{B} \log \sigma\big(r_c^{(i)} - r_r^{(i)}\big).$$
#
# Only differences matter: adding a constant to $r_\phi$ changes nothing, so a reward model's offset is
# arbitrary (another reason to whiten). Once trained, $r_\phi(x, y)$ plays exactly the part the
# classifier played above: one number per completion, at its last token. Compute $\log\sigma$ directly, as a
# log-sigmoid, not as the log of a sigmoid: in float32, `torch.sigmoid(z)` underflows to 0 from about
# $z = -89$, and `torch.log` of it is $-\infty$.
#
# Write `bradley_terry_loss(chosen_rewards, rejected_rewards)`: two `[batch]` tensors in, the scalar
# $\mathcal{L}$ out, differentiable in both.
#
# **Predict, then check.** What is $\mathcal{L}$ for a reward model that scores every answer the same
# (an untrained head)? For one whose margin $r_c - r_r$ is $+5$ on every pair? And $-5$? The cell after
# the check prints all three, then the two ways of computing $\log\sigma$.

# %% exercise rlhf_tutorial.rewards:bradley_terry_loss | 10 min | difficulty 2 | importance 5

# %%
for margin in (0.0, 5.0, -5.0):
    print(f"margin {margin:+.0f}: loss {bradley_terry_loss(torch.full((4,), margin), torch.zeros(4)).item():.4f}")
print(f"log 2 = {math.log(2):.4f}")
z = torch.tensor([-200.0, -20.0, 0.0, 20.0])
print("log(sigmoid(z)):", torch.log(torch.sigmoid(z)))
print("logsigmoid(z):  ", F.logsigmoid(z))

# %% [markdown]
# ## A reward model on a HookedTransformer
#
# The reward model is a language model with its unembedding replaced by a scalar head: run the
# backbone, take the final normalised residual stream $h_{b,t} \in \mathbb{R}^{d_\text{model}}$ (the
# activation at `ln_final.hook_normalized`), and turn the `[batch, seq, d_model]` features into one
# number per sequence. It starts from the pretrained policy, so it already "reads" the language.
# Batches are padded, so every pooling must use the attention mask $m_{b,t}$ (1 for a real token):
#
# | pooling | $r_b$ | trade-offs |
# |---|---|---|
# | `"last"` | $w^\top h_{b, t_b}$, $t_b$ the last real token | the last token has attended to the whole text (causal attention), the usual choice (InstructGPT, TRL); the score rests on one position |
# | `"mean_scores"` | $\frac{1}{\sum_t m_{b,t}}\sum_t m_{b,t}\, \operatorname{head}(h_{b,t})$ | a score per token (a per-token reward for free); early tokens have seen little of the text; mixes with length when lengths vary a lot |
# | `"mean_hidden"` | $\operatorname{head}\big(\frac{1}{\sum_t m_{b,t}}\sum_t m_{b,t}\, h_{b,t}\big)$ | pools the features first; same as `mean_scores` with a linear head |
#
# First the two pooling functions. `pool_last_token(x, attention_mask)` takes `x` of shape
# `[batch, seq]` or `[batch, seq, d]` and returns, per row, the entry at the **last position where the
# mask is 1**. Padding may be on the right (`[1, 1, 1, 0, 0]`) or on the left (`[0, 0, 1, 1, 1]`), so
# `mask.sum(1) - 1` is not enough. `pool_mean` averages over the real positions only. Both return a
# tensor on `x`'s device: build any helper tensor (a range of positions, say) on `x`'s device.

# %% exercise rlhf_tutorial.rewards:pool_last_token | 10 min | difficulty 2 | importance 3

# %% exercise rlhf_tutorial.rewards:pool_mean | 10 min | difficulty 2 | importance 3

# %% [markdown]
# Now the reward model. `__init__` is written for you: it creates the head on the base model's device
# (`.to(device_of(base_model))`: a new layer starts on the CPU, and a GPU model cannot read a CPU
# layer). Write `forward(tokens, attention_mask=None)`: run the backbone with the mask, catch
# `ln_final.hook_normalized` with a hook (not `run_with_cache`: it stores detached tensors, so no
# gradient would reach the backbone), and pool as `self.pooling` says, returning a `[batch]` tensor.
# `tokens` and `attention_mask` arrive on the model's device; a default mask you build goes there too
# (on the tokens' device), and so does the result.

# %% exercise rlhf_tutorial.rewards:RewardModel | 15 min | difficulty 2 | importance 4

# %% [markdown]
# A good reward model does not care how much padding a batch has. Score a few texts one by one and
# then together in one padded batch:

# %%
torch.manual_seed(0)
rm_demo = RewardModel(load_policy(world), pooling="last")
demo_texts = [positive_reviews[0], "Awful.", negative_reviews[2]]
one_by_one = torch.cat([score_texts(rm_demo, [t]) for t in demo_texts])
together = score_texts(rm_demo, demo_texts)
print("one by one:", one_by_one)
print("batched:   ", together)
print("max difference:", (one_by_one - together).abs().max().item())

# %% [markdown]
# ### The training step
#
# `reward_model_train_step(model, optimizer, chosen_tokens, chosen_mask, rejected_tokens, rejected_mask)`
# scores both sides of a batch of pairs, computes $\mathcal{L}$ with your `bradley_terry_loss`, clears
# the old gradients, backpropagates and steps. The token batches are already on the model's device.
# It returns, from before the step, the loss, the **pairwise accuracy** (the fraction of pairs with
# $r_c > r_r$) and the mean **margin** $r_c - r_r$, as Python floats: the diagnostics to watch beside
# the loss.

# %% exercise rlhf_tutorial.rewards:reward_model_train_step | 15 min | difficulty 2 | importance 4

# %% [markdown]
# ## Training the reward model on preference pairs
#
# Each pair is a prompt (the start of a review) and two continuations; the text scored is
# `prompt + continuation`. The simulated rater of the tiny world prefers a fluent continuation over a
# degenerate (repetitive) one whatever their sentiment, and between two fluent ones the more positive.
# `train_reward_model` runs the loop (shuffled batches, AdamW, a held-out evaluation every few steps)
# around **your** `RewardModel` and **your** `reward_model_train_step`.

# %%
train_pairs = load_preference_pairs(world, split="train")
test_pairs = load_preference_pairs(world, split="test")
print(f"{len(train_pairs)} training pairs, {len(test_pairs)} held-out pairs. One of them:")
print({k: train_pairs[0][k] for k in ("prompt", "chosen", "rejected")})

# %%
args = RewardModelArgs.preset(  # the world's learning rates (GPT-2: fine-tuning rates), these sizes
    world,
    seed=0,
    pooling="last",
    epochs=1,
    batch_size=16,
    max_train_pairs=64 if is_smoke() else (2400 if is_tiny() else 400),  # the CLI: all pairs, 2 epochs
    max_test_pairs=32 if is_smoke() else (300 if is_tiny() else 100),
    eval_every=25,
)
torch.manual_seed(args.seed)
reward_model = RewardModel(load_policy(world), pooling=args.pooling)
reward_model, history = train_reward_model(
    args, model=reward_model, train_pairs=train_pairs, test_pairs=test_pairs,
    on_eval=LiveRewardModelCurve(),  # redraws live in JupyterLab; draws nothing under nbval
    **learner_functions(globals()),  # your reward_model_train_step (and bradley_terry_loss)
)
print(f"held-out pairwise accuracy: {history['heldout_accuracy'][0]:.3f} before training, "
      f"{history['heldout_accuracy'][-1]:.3f} after {history['step'][-1]} steps")

# %%
reward_model_curve(history)

# %% [markdown]
# How does it do on each kind of pair? A reward model can reach a good overall accuracy by learning only
# the easier cue; the split shows whether it learned both.

# %%
kinds = sorted({p.get("kind", "all") for p in test_pairs[: args.max_test_pairs]})
for kind in kinds:
    subset = [p for p in test_pairs[: args.max_test_pairs] if p.get("kind", "all") == kind]
    chosen = score_texts(reward_model, [pair_texts(p)[0] for p in subset])
    rejected = score_texts(reward_model, [pair_texts(p)[1] for p in subset])
    print(f"{kind:>10}: {len(subset):4d} pairs, accuracy {(chosen > rejected).float().mean():.3f}")

# %% [markdown]
# ## The reward explorer
#
# Pick a text or type your own, and compare the classifier's reward, the repetition penalty and the
# trained reward model's score side by side. (The reward model's numbers have an arbitrary offset:
# only differences between texts mean something.) The static table below shows the same numbers for
# the texts of this chapter.

# %%
explorer_texts = hack_texts + negative_reviews[:2]
reward_explorer(explorer_texts, classifier, cls_tokenizer, reward_model, direction="pos")

# %%
reward_table(explorer_texts, classifier, cls_tokenizer, reward_model, direction="pos")

# %% [markdown]
# ## What to try next
#
# - Train with `pooling="mean_scores"` (and `head_hidden=32` to make it differ from `"mean_hidden"`): does
#   the per-kind accuracy change? Which pooling is fooled more by long repetitive texts?
# - Score the degenerate texts above with the trained reward model. The preference data contained
#   repetition, so the reward model should have learned to dislike it; find a degenerate text it still
#   likes (a different kind of loop, say).
# - Train on a quarter of the pairs: how does held-out accuracy scale with data?
# - Whiten the reward model's scores over a batch with and without `shift_mean`, and think about what a
#   value head in chapter 03 would have to predict in each case.
# - From the command line: `python -m rlhf_tutorial train-reward-model --world tiny --seed 0` trains on
#   all pairs and prints a JSON summary.

# %%
progress("02")
