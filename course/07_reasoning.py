# %% [markdown]
# # 07. Reasoning with verifiable rewards: SFT, best-of-N, rejection sampling and GRPO
#
# Chapters 03 and 04 rewarded the policy with a *learned* judge (a sentiment classifier). Since
# DeepSeek-R1, reinforcement learning on language models is used above all where a program can check
# the answer: maths with a known result, code with tests. That is **reinforcement learning with
# verifiable rewards** (RLVR): no reward model, nothing to fool but the checker itself.
#
# The methods of today's reasoning models, which this chapter runs on a CPU and compares:
#
# 1. a **base model** that can sometimes solve the problems (here: a small transformer pretrained on
#    worked arithmetic written by fallible writers, who forget carries and slip by one or ten);
# 2. **supervised fine-tuning** (SFT) on {{sft.args.n_demonstrations}} correct demonstrations;
# 3. **best-of-N** and **rejection-sampling fine-tuning** (expert iteration): sample, keep what the
#    verifier accepts, fine-tune on it;
# 4. **GRPO** (chapter 04's trainer) with the verifier as the reward, with DAPO's fixes: dynamic
#    sampling and clip-higher;
# 5. what RL adds and what it does not: **pass@k** for k = 1 .. 64 (Yue et al. 2025 find that RL
#    raises pass@k at small k, but that at large k the base model's pass@k overtakes the RL-trained
#    model's), and accuracy on **harder problems** no fine-tuning saw.
#
# These are not one chained recipe here. DeepSeek-R1 chains such stages (a cold-start SFT, RL, then an
# SFT of the *base* model afresh on the RL model's samples that rejection sampling kept, with other
# data, then RL again); this chapter starts **every**
# method from the same base model, so that each one's effect is measured on its own: SFT, rejection
# sampling and GRPO each begin from the base model, GRPO as in DeepSeek-R1-Zero (RL with no SFT
# before it). On GPT-2, which has never seen the answer format, GRPO starts from the SFT model; the
# last section shows how to run GRPO after SFT in the tiny world.
#
# The world: a problem chains additions and subtractions of one-digit numbers; the model writes one
# line per step and ends with `Answer: N`.
#
# ```
# Q: 7+8-9        <- the prompt
# 7+8=15
# 15-9=6
# Answer: 6       <- what the verifier reads
# ```
#
# The chapter trains on one-step problems (difficulty 1), where the base model is right on
# {{compare.pass_at_k.base.1:.0%}} of its samples (pass@1) and 16 tries hold a right answer {{compare.pass_at_k.base.16:.0%}} of the time
# (pass@16, averaged over the problems), and measures two- and three-step problems that pretraining showed but no fine-tuning does.

# %% imports
import copy
import math
import re

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlhf_tutorial import check, figures, hint, progress
from rlhf_tutorial.devices import describe
from rlhf_tutorial.reasoning import lenient_extract_answer
from rlhf_tutorial.tiny import arith
from rlhf_tutorial.trainers.grpo import GRPOArgs
from rlhf_tutorial.trainers.grpo import train as train_grpo
from rlhf_tutorial.trainers.reasoning import (
    SFTArgs,
    arithmetic_reward_fn,
    binary_best_of_n_kl,
    evaluate,
    learner_functions,
    sample_completions,
    split_problems,
    train_rejection_sampling,
    train_sft,
)
from rlhf_tutorial.widgets.reasoning import (
    best_of_n_figure,
    grpo_reasoning_curves,
    held_out_figure,
    pass_at_k_figure,
    reasoning_dashboard,
)
from rlhf_tutorial.worlds import is_smoke, is_tiny, load_reasoning_policy, resolve_world

# %%
torch.manual_seed(0)
world = resolve_world(None)
if is_tiny():
    torch.set_num_threads(1)  # the tiny model runs fastest on one thread
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
base = load_reasoning_policy(world)  # tiny: the shipped arithmetic model; gpt2: GPT-2 itself
difficulty = arith.TRAIN_DIFFICULTY
# the 'eval' split: its own draw of problems, the same for every measurement (at one step there are few
# distinct problems, so most of them also occur among the training problems: this measures skill, not transfer)
problems = split_problems("eval", 8 if is_smoke() else 32, difficulty)
n_eval = 4 if is_smoke() else 16  # samples per problem for pass@1
max_new = 24
example = problems[0]
print(f"world: {world}; a problem: {example.prompt!r}, answer {example.answer}")
print("a correct worked solution:\n" + example.solution())
print("\nfour samples of the base model:")
for text in sample_completions(base, [example.prompt], 4, max_new, seed=0)[0]:
    print(repr(text))

# %% [markdown]
# ## 1. The verifier
#
# A worked solution is right when its **final answer** equals the true one. The verifier reads the
# final answer strictly: among the lines of the exact form `Answer: N` (optional plain spaces, an optional
# minus sign, ASCII digits, nothing else) it takes the **last**, wherever it stands, and returns `N` as an
# integer, or `None` when there is no such line. Strictness is the point: `Answer: 12 apples`,
# `answer: 12`, `The answer is 12.` are not answers. A verifier that accepts more is one a policy can
# learn to satisfy without being right, as section 5 shows.
#
# The edge cases that decide it: several answer lines (the last wins, even if text follows it), a
# negative answer, no space or several spaces after the colon, trailing spaces, and the near misses
# Python's `int()` would accept (`+12`, `1_000`, a tab or a non-breaking space before the number: the
# contract's spaces are plain spaces only) or a loose pattern would (`Answer: 12 apples`, a leading
# space before `Answer`, a line break other than `"\n"`). Strings only: no model here.

# %% exercise rlhf_tutorial.reasoning:extract_answer | 10 min | difficulty 2 | importance 5

# %% [markdown]
# The reward of a completion is then
#
# $$r(x, y) = \mathbb{1}\big[\,\text{extract\_answer}(y) = a(x)\,\big] \in \{0, 1\}$$
#
# with $a(x)$ the true answer of problem $x$: binary, exact, and free to compute. One float32 reward per
# completion, a `[len(completions)]` tensor on the CPU (its inputs are text).

# %% exercise rlhf_tutorial.reasoning:verifiable_reward | 5 min | difficulty 1 | importance 4

# %% [markdown]
# **Predict, then check.** The cell below samples four solutions of each of four problems from the base
# model and prints each with its reward, what your strict `extract_answer` reads, and what a lenient
# reader ("the first number in the text", section 5) reads. Before running it, guess: of the 16
# samples, how many will the strict verifier reward? Will the lenient reader ever reward a *worked*
# solution (one that starts by restating the operands)?

# %%
samples = sample_completions(base, [p.prompt for p in problems[:4]], 4, max_new, seed=1)
for p, texts in zip(problems[:4], samples):
    rewards = verifiable_reward(texts, [p.answer] * len(texts))
    for text, r in zip(texts, rewards.tolist()):
        print(f"{p.prompt.strip():<12} reward {r:.0f}   strict {extract_answer(text)!s:>5}   "
              f"lenient {lenient_extract_answer(text)!s:>5}   {text!r}")

# %% [markdown]
# What the run shows. The strict verifier rewards a sample only when its arithmetic is right *and* its
# last answer line is well formed: look for samples whose working is right but whose answer line is
# not (in the tiny world `"Answer = 0"`, `"answer = 4"`, `"Answer: 7 ."`, copied from sloppy writers).
# They score 0, so part of what fine-tuning on this reward teaches is the format. The lenient reader never
# rewards a worked solution that copies its problem right: its first number is then the first operand, and
# with operands from 1 to 9 a one-step problem's answer is never its first operand. It rewards only the rare
# sample whose first number happens to be its answer (a bare `The answer is 6.`, for one): over the base
# model's samples its pass@1 is {{compare.base_pass_at_1_lenient:.3f}}, against {{compare.base_pass_at_1:.3f}} for the strict verifier
# (section 5 prints both).

# %% [markdown]
# ## 2. Measuring: pass@k
#
# With a verifier, "how good is the model" becomes: sample $k$ solutions, is at least one right?
# That is **pass@k**. Estimating it by drawing exactly $k$ samples is noisy; Chen et al. (2021) draw
# $n \ge k$ samples, count the $c$ correct ones, and average over every subset of size $k$:
#
# $$\text{pass@}k = 1 - \frac{\binom{n - c}{k}}{\binom{n}{k}},$$
#
# the probability that $k$ samples drawn without replacement from the $n$ include a correct one
# (unbiased for the model's true pass@k). When $n - c < k$ every subset holds a correct sample and the
# estimate is 1. Factorials overflow a float from $171!$, and the binomials themselves from $n = 1030$
# ($\binom{1030}{515} > 1.8 \cdot 10^{308}$, the largest float); their ratio never does:
# $\binom{n-c}{k} / \binom{n}{k} = \prod_{i=0}^{k-1} \frac{n - c - i}{n - i}$, each factor in $[0, 1]$.
#
# Contract: Python ints in, a Python float out; the range check ($1 \le k \le n$, $0 \le c \le n$) is
# given. The cases that separate a right estimator from a plausible one: $c = 0$ (exactly 0), $n - c < k$
# (exactly 1), $n - c = k$ (just below 1), $k = 1$ (it must equal $c / n$), and every size up to
# $n = 1024$ with $k$ up to $n$ (no overflow, no int64 wrap, float64's precision: the check sweeps the
# range).

# %% exercise rlhf_tutorial.reasoning:pass_at_k | 15 min | difficulty 3 | importance 5

# %%
# the same problems and sampling seed as every later "before / after" of the chapter (SFTArgs' seed + 1)
base_eval = evaluate(base, problems, n_eval, max_new, seed=1, extract_answer=extract_answer, pass_at_k=pass_at_k)
print(f"base model: pass@1 {base_eval['pass_at_1']:.3f}, pass@k {({k: round(v, 3) for k, v in base_eval['pass_at_k'].items()})}")
# the text's figures come from `python -m rlhf_tutorial compare-reasoning --world tiny --seed 0`, this notebook's
# run with the reference functions; each cell checks that yours agrees
figures.agree("compare", {"base_pass_at_1": base_eval["pass_at_1"]});

# %% [markdown]
# ## 3. Supervised fine-tuning on demonstrations
#
# SFT maximises the likelihood of correct worked solutions $y^*$ given their problems $x$, **on the
# completion only**: the prompt is given, not something to learn to write.
#
# $$\mathcal{L}_\text{SFT} = -\frac{1}{N} \sum_{b} \sum_{t \ge 1:\, m_{b,t}} \log \pi_\theta(x_{b,t} \mid x_{b,<t}),
# \qquad N = \sum_{b,\, t \ge 1} m_{b,t},$$
#
# where $m$ is the loss mask (True on the completion and its EOS). Position $t-1$'s logits predict
# token $t$. One mean over every masked token of the batch, so a long solution weighs more than a short
# one (a mean of per-row means would not).

# %% exercise rlhf_tutorial.reasoning:sft_loss | 15 min | difficulty 3 | importance 5

# %%
sft_args = SFTArgs.preset(world, seed=0, eval_problems=len(problems), eval_samples=n_eval, max_new_tokens=max_new)
if is_smoke():
    sft_args.n_demonstrations, sft_args.rs_rounds, sft_args.rs_prompts, sft_args.rs_samples = 16, 1, 4, 4
sft = train_sft(sft_args, policy=copy.deepcopy(base), progress=False, **learner_functions(globals()))
print(f"SFT on {sft_args.n_demonstrations} demonstrations, {len(sft.losses)} steps: loss {sft.losses[0]:.3f} -> "
      f"{sft.losses[-1]:.3f}; pass@1 {sft.eval_initial['pass_at_1']:.3f} -> {sft.eval_final['pass_at_1']:.3f}")
figures.agree("compare", {"sft.pass_at_1_final": sft.eval_final["pass_at_1"]});

# %% [markdown]
# ## 4. Best-of-N and rejection sampling
#
# **Best-of-N**: sample $N$ solutions and return one the verifier accepts (any, if none is). Its
# success rate on a problem is exactly pass@N: no training, $N$ times the compute at answer time.
#
# **Rejection-sampling fine-tuning** (expert iteration, STaR, RAFT) moves that compute into training:
# sample $G$ solutions of each problem from the current model, keep the correct ones, fine-tune on them
# with the SFT loss, repeat. No demonstrations needed: the model learns from its own verified work.
# Easy problems would flood the kept set (right every time), so at most `max_per_prompt` of each
# problem's correct samples are kept.
#
# Contract: `rewards` is `[p, G]` (0.0 or 1.0; row $i$ holds the $G$ samples of prompt $i$); return the
# flat indices $i \cdot G + j$ (the order `rewards.flatten()` uses) of the kept samples, increasing, as an
# int64 tensor on the rewards' device: every correct sample when `max_per_prompt` is None, otherwise
# only the **first** `max_per_prompt` correct samples of each row. A row with no correct sample gives
# nothing; a batch with none gives an empty tensor.

# %% exercise rlhf_tutorial.reasoning:select_correct | 10 min | difficulty 2 | importance 4

# %%
rs = train_rejection_sampling(sft_args, policy=copy.deepcopy(base), progress=False, **learner_functions(globals()))
for record in rs.rounds:
    print(f"round {record['round']}: samples' pass rate {record['sample_pass_rate']:.3f}, kept {record['kept']}")
print(f"rejection sampling: pass@1 {rs.eval_initial['pass_at_1']:.3f} -> {rs.eval_final['pass_at_1']:.3f}")
figures.agree("compare", {"rejection_sampling.pass_at_1_final": rs.eval_final["pass_at_1"]});

# %% [markdown]
# **How far is best-of-N from the model it samples?** Take a continuous reward (no ties) and measure
# every completion by its reward's quantile $u \in [0, 1]$ under $\pi_\text{ref}$: the quantile of a
# sample from $\pi_\text{ref}$ is then uniform. Best-of-$N$ returns the sample of highest reward, and the
# largest of $N$ uniform quantiles has density $N u^{N-1}$ (its cumulative distribution is $u^N$).
# So best-of-$N$ reweights $\pi_\text{ref}$ by $\pi_{\text{best-of-}N} / \pi_\text{ref} = N u^{N-1}$,
# whatever the model and the reward, and
#
# $$\mathrm{KL}\big(\pi_{\text{best-of-}N} \,\|\, \pi_\text{ref}\big)
# = \mathbb{E}_{\pi_{\text{best-of-}N}}\Big[\log \frac{\pi_{\text{best-of-}N}}{\pi_\text{ref}}\Big]
# = \int_0^1 N u^{N-1} \log\big(N u^{N-1}\big)\, du$$
#
# nats. The exercise: evaluate this integral by hand, in closed form in $N$, and return it. Two checks
# of your algebra: it is 0 at $N = 1$ (best-of-1 is the reference itself), and it stays below $\log N$
# for $N > 1$. Its closed form is the value usually quoted for best-of-$N$'s KL (Stiennon et al. 2020).
# It is exact for a reward with a continuous distribution, as assumed here; for discrete outputs, where
# two samples can be the same completion, Beirami et al. (2024) show that it is only an upper bound on
# the true KL. Section 7 puts it beside the KL measured on our binary reward. A Python float in nats,
# for an int $N \ge 1$.

# %% exercise rlhf_tutorial.reasoning:best_of_n_kl | 10 min | difficulty 2 | importance 3

# %% [markdown]
# **Predict, then check.** Before running the cell: how many nats does best-of-2 cost, and best-of-16?
# How far below $\log N$ is the closed form at $N = 2$, and at $N = 1024$, in nats and as a fraction of
# $\log N$? (Which grows without limit, and which tends to a constant?)

# %%
for n in (1, 2, 16, 1024):
    kl, log_n = best_of_n_kl(n), math.log(n)
    gap = f"{log_n - kl:.3f} nats below it ({(log_n - kl) / log_n:.0%} of it)" if n > 1 else "equal"
    print(f"N = {n:>4}: KL {kl:.3f} nats, log N {log_n:.3f}: {gap}")

# %% [markdown]
# The gap $\log N - \mathrm{KL} = (N - 1)/N$ tends to 1 nat, while both grow like $\log N$: at
# $N = 2$, $\log N$ is more than three times the KL; at $N = 1024$ the gap is a seventh of $\log N$.
# Quoting $\log N$ alone overstates the cost of best-of-N; quoting $\log N - (N - 1)/N$ is right for a
# continuous reward and still an overstatement for discrete outputs (section 7 measures one). Either way
# the KL grows only logarithmically in $N$: many times the samples cost a few nats, which makes
# best-of-N a strong baseline for any fine-tuning method to beat.

# %% [markdown]
# ## 5. A verifier that can be hacked
#
# Suppose the verifier were written the quick way: "the answer is the first number in the text"
# (`lenient_extract_answer`). On a worked solution that reads the first operand, which at one step
# never is the true answer; but in the one-sentence answers some writers gave ("The answer is 15.")
# the first number is the answer. GRPO against the lenient verifier finds that: the policy drops the working
# and the `Answer:` line. The lenient reward climbs while the strict verifier, which wants the
# `Answer: N` line, sees the policy get *worse*.

# %%
grpo_sizes = dict(num_phases=2, groups_per_phase=2, group_size=4) if is_smoke() else dict(num_phases=30, groups_per_phase=16)
hack_args = GRPOArgs.preset(world, task="arithmetic", seed=0, verifier="lenient", **grpo_sizes)
hacked = train_grpo(hack_args, policy=copy.deepcopy(base), reward_fn=arithmetic_reward_fn(lenient_extract_answer),
                    evaluate_before_after=False, progress=False)
hacked_eval = evaluate(hacked.policy, problems, n_eval, max_new, seed=1, extract_answer=extract_answer)
print(f"lenient reward during training: {hacked.history[0]['reward']:.3f} (phase 0) -> {hacked.history[-1]['reward']:.3f}")
print(f"strict pass@1: base {base_eval['pass_at_1']:.3f} -> hacked {hacked_eval['pass_at_1']:.3f}; "
      f"lenient pass@1 of the same samples: {base_eval['pass_at_1_lenient']:.3f} -> {hacked_eval['pass_at_1_lenient']:.3f}")
print("samples of the hacked policy:", hacked_eval["samples"])
figures.agree("compare", {"hacked.lenient_reward_last": hacked.history[-1]["reward"],
                          "hacked.pass_at_1": hacked_eval["pass_at_1"],
                          "hacked.pass_at_1_lenient": hacked_eval["pass_at_1_lenient"]});

# %% [markdown]
# In the recorded run (`compare-reasoning`) the lenient reward rose from {{compare.hacked.lenient_reward_first:.3f}}
# to {{compare.hacked.lenient_reward_last:.3f}} in {{compare.args.hack_phases}} phases while strict pass@1 fell from
# {{compare.base_pass_at_1:.3f}} to {{compare.hacked.pass_at_1:.3f}}. Read the hacked samples: `The answer is N.`, and N is
# mostly wrong. By the lenient reader's own count the hacked policy is right on
# {{compare.hacked.pass_at_1_lenient:.3f}} of its samples, far fewer than the {{compare.base_pass_at_1:.3f}} the base model got right *with* its
# working: the new format pays better than the working did under the lenient reader (whose pass@1 for
# the base model was {{compare.base_pass_at_1_lenient:.3f}}), and the policy gave up right answers to get it.
#
# The fix is the strict verifier of section 1. Section 6 trains GRPO with it, with the same seed and
# preset, but it is the chapter's main run, not a replay of this one: in the tiny world it starts
# from the same base model, is longer and samples more groups per phase ({{compare.args.num_phases}} phases of
# {{compare.args.groups_per_phase}} groups, against {{compare.args.hack_phases}} phases of
# {{compare.args.hack_groups}} here), so compare the curves of the two runs by their trend, not their
# last points. The general lesson: the policy optimises the checker you wrote, not the one you meant;
# read samples.
#
# ## 6. GRPO with the verifiable reward
#
# Chapter 04's trainer, unchanged, with `task="arithmetic"`: the prompts are problems of the training
# difficulty, the reward is the verifiable reward (1.0 when your `extract_answer` reads the true answer, which
# the trainer reads from the prompt), and DAPO's settings:
#
# - **dynamic sampling**: with a binary reward many groups are all right or all wrong; their
#   group-relative advantages are all zero and they teach nothing. They are dropped and more are
#   sampled (up to `max_sampling_rounds`);
# - **clip-higher**: the ratio $\pi_\theta / \pi_\text{old}$ is clipped to
#   $[1 - \varepsilon_\text{low},\, 1 + \varepsilon_\text{high}]$ with $\varepsilon_\text{low} =$
#   {{grpo_arith_s0.args.clip_coef:g}} and a larger $\varepsilon_\text{high} =$ {{grpo_arith_s0.args.clip_coef_high:g}}. The
#   upper clip caps how far one update can raise a token with a positive advantage: to
#   $(1 + \varepsilon)$ times its old probability $p$. A likely token is hardly held back
#   ($p (1 + \varepsilon)$ is near or above 1), but a rare one gains at most $\varepsilon p$, almost
#   nothing. With a symmetric clip the rare tokens, the exploratory ones a new correct solution needs,
#   grow slowly while the likely ones take over: the distribution sharpens and the **entropy
#   collapses**. DAPO raises only the upper bound, so that rare tokens can grow more per update (the
#   lower bound is left as it is: widening it would push tokens towards zero faster);
# - token-level averaging (`loss_type="dapo"`) and no KL term.
#
# The policy's entropy per token (estimated on its own samples: the mean of $-\log \pi_\text{old}$ over
# the completion tokens of the groups dynamic sampling kept: the all-right and all-wrong groups are left
# out) and the completion length are tracked per phase.

# %%
grpo_args = GRPOArgs.preset(world, task="arithmetic", seed=0, **grpo_sizes)
if is_tiny() and not is_smoke():
    grpo_args.num_phases, grpo_args.groups_per_phase = 40, 32
grpo_start = copy.deepcopy(base) if is_tiny() else copy.deepcopy(sft.policy)  # GPT-2 needs SFT on the format first
dashboard = reasoning_dashboard("GRPO on arithmetic, strict verifier (live)")
grpo = train_grpo(grpo_args, policy=grpo_start, reward_fn=arithmetic_reward_fn(extract_answer),
                  evaluate_before_after=False, progress=False, callback=dashboard.update)
dashboard.finish()
grpo_eval = evaluate(grpo.policy, problems, n_eval, max_new, seed=1, extract_answer=extract_answer)
print(f"GRPO ({grpo_args.num_phases} phases of {grpo_args.groups_per_phase} groups of {grpo_args.group_size}): "
      f"pass@1 {base_eval['pass_at_1']:.3f} -> {grpo_eval['pass_at_1']:.3f}")
zero = [r["frac_reward_zero_std"] for r in grpo.history]
print(f"groups with all-equal rewards (dropped by dynamic sampling): {sum(zero) / len(zero):.2f} on average")
figures.agree("compare", {"grpo.pass_at_1": grpo_eval["pass_at_1"]})
entropy = [r["entropy"] for r in grpo.history if "entropy" in r]  # none in a phase that kept no group
if entropy:
    print(f"entropy per token (on the policy's own samples): {entropy[0]:.3f} (first phase) -> {entropy[-1]:.3f} (last)")
    figures.agree("compare", {"grpo.entropy_first": entropy[0], "grpo.entropy_last": entropy[-1]})

# %%
grpo_reasoning_curves({"strict verifier": grpo.history, "lenient verifier (hacked)": hacked.history})

# %% [markdown]
# ## 7. What RL adds: pass@k, harder problems, and best-of-N's KL
#
# pass@k for k = 1 .. 64 of the four models on the same problems (64 samples each, drawn afresh with
# another seed: the base model's pass@1 here, {{compare.pass_at_k.base.1:.3f}}, differs from section 2's
# {{compare.base_pass_at_1:.3f}} from 16 samples by sampling noise alone).

# %%
n_big = 8 if is_smoke() else 64
models = {"base": base, "SFT": sft.policy, "rejection sampling": rs.policy, "GRPO": grpo.policy}
big = {name: evaluate(model, problems, n_big, max_new, seed=3, extract_answer=extract_answer, pass_at_k=pass_at_k)
       for name, model in models.items()}
for name, r in big.items():
    print(f"{name:<20} pass@1 {r['pass_at_k'][1]:.3f}   pass@{n_big} {r['pass_at_k'][n_big]:.3f}")
summary_key = {"base": "base", "SFT": "sft", "rejection sampling": "rejection_sampling", "GRPO": "grpo"}
figures.agree("compare", {f"pass_at_k.{summary_key[name]}.{k}": r["pass_at_k"][k] for name, r in big.items()
                          for k in (1, n_big)})
pass_at_k_figure({name: r["pass_at_k"] for name, r in big.items()},
                 title=f"pass@k on {len(problems)} problems of difficulty {difficulty} ({world} world)")

# %% [markdown]
# Accuracy on harder problems (two and three steps), which pretraining showed but no fine-tuning did:

# %%
held_out = {name: {difficulty: r["pass_at_1"]} for name, r in big.items()}
for d in arith.HELD_OUT_DIFFICULTIES:
    harder = split_problems("eval", 8 if is_smoke() else 32, d)
    for name, model in models.items():
        held_out[name][d] = evaluate(model, harder, 2 if is_smoke() else 8, 48, seed=4, extract_answer=extract_answer)["pass_at_1"]
for name, by_d in held_out.items():
    print(f"{name:<20} " + "   ".join(f"difficulty {d}: {v:.3f}" for d, v in by_d.items()))
figures.agree("compare", {f"held_out_pass_at_1.{summary_key[name]}.{d}": v for name, by_d in held_out.items()
                          for d, v in by_d.items()})
held_out_figure(held_out)

# %% [markdown]
# **Best-of-N on the reward-KL plane.** With our binary reward the formula's "no ties" assumption
# fails: best-of-N picks a correct sample with probability $q = 1 - (1-p)^N$ ($p$: the base model's
# success rate on that problem) and, among correct (or wrong) samples, one as the base model would.
# Its KL is then exactly that of the two outcomes,
# $q \log \frac{q}{p} + (1 - q) \log \frac{1 - q}{1 - p}$, measured below from each problem's $p$
# (64 samples; `binary_best_of_n_kl`), and below the analytic value: ties make best-of-N cheaper than the
# formula says, as Beirami et al. (2024) prove for every discrete output space.

# %%
ns = [1, 2, 4, 8, 16, 32, 64][: 4 if is_smoke() else 7]
p_hat = [c / n_big for c in big["base"]["correct"]]
bon_reward = [sum(1 - (1 - p) ** n for p in p_hat) / len(p_hat) for n in ns]
bon_kl_measured = [sum(binary_best_of_n_kl(p, n) for p in p_hat) / len(p_hat) for n in ns]
bon_kl_analytic = [best_of_n_kl(n) for n in ns]
for n, r, km, ka in zip(ns, bon_reward, bon_kl_measured, bon_kl_analytic):
    print(f"N = {n:>2}: pass rate {r:.3f}, KL measured {km:.3f} nats, analytic {ka:.3f}")
figures.agree("compare", {f"best_of_n.{n}.{key}": v for n, r, km in zip(ns, bon_reward, bon_kl_measured)
                          for key, v in (("reward", r), ("kl_measured", km))})
best_of_n_figure(ns, bon_reward, bon_kl_analytic, bon_kl_measured)

# %% [markdown]
# What to read in these figures. In the tiny world with seed 0 (this notebook's run, as
# `python -m rlhf_tutorial compare-reasoning --world tiny --seed 0` recorded it on the reference machine;
# 32 problems, 64 samples each), pass@1 / pass@64 were: base {{compare.pass_at_k.base.1:.3f}} /
# {{compare.pass_at_k.base.64:.3f}}, SFT {{compare.pass_at_k.sft.1:.3f}} / {{compare.pass_at_k.sft.64:.3f}}, rejection sampling
# {{compare.pass_at_k.rejection_sampling.1:.3f}} / {{compare.pass_at_k.rejection_sampling.64:.3f}}, GRPO ({{compare.grpo.phases}} phases)
# {{compare.pass_at_k.grpo.1:.3f}} / {{compare.pass_at_k.grpo.64:.3f}}; at two and three steps, pass@1
# {{compare.held_out_pass_at_1.base.2:.3f}} / {{compare.held_out_pass_at_1.base.3:.3f}} (base),
# {{compare.held_out_pass_at_1.sft.2:.3f}} / {{compare.held_out_pass_at_1.sft.3:.3f}} (SFT),
# {{compare.held_out_pass_at_1.rejection_sampling.2:.3f}} / {{compare.held_out_pass_at_1.rejection_sampling.3:.3f}} (rejection sampling),
# {{compare.held_out_pass_at_1.grpo.2:.3f}} / {{compare.held_out_pass_at_1.grpo.3:.3f}} (GRPO). The CLI's longer runs are in
# the README.
#
# - **pass@1** rises with every method, GRPO's the most. The CLI's longer run ({{grpo_arith_s0.args.num_phases}} phases of
#   {{grpo_arith_s0.args.groups_per_phase}} groups) at three seeds raised it by {{grpo_arith.over_seeds.pass_at_1_gain.mean:+.2f}} on average
#   (from {{grpo_arith.over_seeds.pass_at_1_gain.min:+.2f}} to {{grpo_arith.over_seeds.pass_at_1_gain.max:+.2f}}, standard deviation
#   {{grpo_arith.over_seeds.pass_at_1_gain.std:.2f}}; {{grpo_arith.over_seeds.pass_at_1_initial.mean:.2f}} ->
#   {{grpo_arith.over_seeds.pass_at_1_final.mean:.2f}}). One run is one draw, and so is one CPU: with torch's AVX2 kernels,
#   whose rounding differs in the last bits (a seed's two curves coincide for a while, then part), the same three seeds
#   gained {{grpo_arith_avx2.over_seeds.pass_at_1_gain.mean:+.2f}} on average ({{grpo_arith_avx2.over_seeds.pass_at_1_gain.min:+.2f}}
#   to {{grpo_arith_avx2.over_seeds.pass_at_1_gain.max:+.2f}}), with its unvectorised ones
#   {{grpo_arith_default.over_seeds.pass_at_1_gain.mean:+.2f}} ({{grpo_arith_default.over_seeds.pass_at_1_gain.min:+.2f}} to
#   {{grpo_arith_default.over_seeds.pass_at_1_gain.max:+.2f}}).
# - **pass@k at large k** cannot rise at k = 64 (the base model already found a right answer within
#   64 tries on every problem: {{compare.pass_at_k.base.64:.3f}}), and falls for GRPO ({{compare.pass_at_k.grpo.64:.3f}}). At
#   k = 16, where there is room, SFT ({{compare.pass_at_k.sft.16:.3f}}) is above the base model
#   ({{compare.pass_at_k.base.16:.3f}}), rejection sampling about level ({{compare.pass_at_k.rejection_sampling.16:.3f}}), GRPO below
#   ({{compare.pass_at_k.grpo.16:.3f}}; the CLI's run, seed 0: pass@16 {{grpo_arith_s0.pass_at_k_initial.16:.3f}} ->
#   {{grpo_arith_s0.pass_at_k.16:.3f}}). RL sharpens the distribution onto answers it could already produce (the entropy falls from
#   {{compare.grpo.entropy_first:.2f}} nats per token in the first phase to {{compare.grpo.entropy_last:.2f}} in the last) and loses a
#   few it could, which is what Yue et al. (2025) report for large models: the RL-trained model wins at
#   small k, and at large k the base model's pass@k overtakes it. SFT and rejection sampling,
#   trained on whole solutions with a likelihood loss, keep more of the spread.
# - **Harder problems**: a one-step skill made more reliable helps chains of steps only a little
#   (two steps: {{compare.held_out_pass_at_1.base.2:.3f}} for the base model, {{compare.held_out_pass_at_1.grpo.2:.3f}} to
#   {{compare.held_out_pass_at_1.rejection_sampling.2:.3f}} after the three methods); none of them trains on them.
# - **Best-of-N** reaches a pass rate of {{compare.best_of_n.16.reward:.2f}} at N = 16 without training, at
#   {{compare.best_of_n.16.kl_measured:.1f}} nats by the two-outcome KL ({{compare.best_of_n.16.kl_analytic:.1f}} by the continuous formula); the price is paid at
#   answer time, N samples per question.

# %%
progress("07")

# %% [markdown]
# ## What to try next
#
# - `train-grpo --world tiny --task arithmetic --clip-coef-high 0.2 --num-phases 100` (no clip-higher): measured with
#   seed 0, pass@1 reached {{grpo_arith_noclip.pass_at_1_final:.3f}} without clip-higher and {{grpo_arith_100.pass_at_1_final:.3f}} with it,
#   and the entropy over the last 10 phases was {{grpo_arith_noclip.entropy_last_10:.3f}} against {{grpo_arith_100.entropy_last_10:.3f}} nats
#   per token: one seed of this small world shows no benefit of clip-higher. Try other seeds, and longer
#   runs, where DAPO saw the entropy collapse it prevents.
#   `--no-dynamic-sampling`: how much of each phase goes to all-equal groups, which teach nothing?
# - `train-grpo --task arithmetic --init sft`: RL after SFT (DeepSeek-R1 starts its RL from a cold-start
#   SFT), against RL from the base ("R1-Zero").
# - `pass-at-k --method rejection-sampling --samples 64`: section 7 showed expert iteration's pass@64 at one
#   step; the command also measures it at two and three steps, where the base model's is
#   {{pass_at_k.pass_at_k_by_difficulty.2.64:.2f}} and {{pass_at_k.pass_at_k_by_difficulty.3.64:.2f}}. Does it rise there, or fall?
# - A harder training difficulty: `SFTArgs(difficulty=2)`; the base model's pass@1 there is
#   {{pass_at_k.pass_at_k_by_difficulty.2.1:.2f}} (`pass-at-k`, {{pass_at_k.problems}} problems of {{pass_at_k.samples}} samples).
