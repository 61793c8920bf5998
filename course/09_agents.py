# %% [markdown]
# # 09. Training an agent with RL: a calculator called over several turns
#
# Since 2025 reinforcement learning on language models is mostly about **agents**: a policy that
# calls tools over several turns (a calculator, code execution, search) and is rewarded for the
# outcome of the whole trajectory. The open frameworks that train them (verl and SkyRL's multi-turn
# rollouts, Prime Intellect's `verifiers` environments, TRL's tool-calling GRPO, OpenPipe's ART, rLLM)
# all run the same loop: the policy writes until it calls a tool, the **environment** runs the call and
# writes its result into the context, the policy reads it and goes on; at the end a reward scores the
# trajectory, and a GRPO-style objective trains on it. What is new next to chapters 04 and 07 is that
# the trajectory is written by two authors, and only one of them is being trained.
#
# The environment here is chapter 07's arithmetic with a tool: a problem is one operation on two numbers
# at three difficulties, `easy` (one-digit sums and differences), `medium` (two-digit ones) and `hard`
# (two-digit products, which a small model's mental arithmetic mostly gets wrong). The base model was
# pretrained on solutions written by people who reach for the calculator rarely, at every difficulty,
# and whose own arithmetic fails more often the harder the problem: calling the tool is a behaviour it
# has but rarely chooses, and reinforcement learning has something to amplify.
#
# **The tool's syntax.** The policy calls the calculator by writing `<calc>EXPR</calc>`; when the text
# of its turn ends with that closing tag, the environment appends ` = ` and the result (or a text
# starting with `error:`), and the policy's next turn starts right after it. A trajectory, turn by turn:
#
# ```
# Q: 47*86                      <- the prompt
# <calc>47*86</calc>            <- turn 1: the policy closes a call
#  = 4042                       <- the environment's tokens
# Answer: 4042                  <- turn 2: the policy answers
# ```
#
# The reward reads the last `Answer: N` line with chapter 07's strict verifier. This chapter writes the
# pieces of the loop, each checked on its own, then trains with them:
#
# 1. the **tool call**: the policy writes `<calc>EXPR</calc>`, and the environment must read it strictly;
# 2. the **sandbox**: the expression is evaluated by a small parser, never by `eval`, with bounded sizes
#    and errors returned to the policy as text;
# 3. the **policy-token mask**: in a trajectory that mixes the policy's tokens with the environment's,
#    only the policy's are trained on;
# 4. the **multi-turn rollout**: sample, run the tool on a closed call, append its result as token ids,
#    continue, within a turn and a token budget;
# 5. the **reward**: 1 for a right final answer, minus an optional cost per call.
#
# Then the path: the base model with and without the tool (section 6), GRPO on whole trajectories
# (section 7), a cost per call that teaches *when* to call (section 8), and the classic bug of training
# on the environment's tokens, run (section 9).

# %% imports
import copy
import re
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from rlhf_tutorial import agent, check, figures, hint, progress
from rlhf_tutorial.agent import (
    CALL_CLOSE,
    CALL_OPEN,
    MAX_ABS_VALUE,
    MAX_OPERAND_DIGITS,
    RESULT_PREFIX,
    AgentRollout,
    calculator,
)
from rlhf_tutorial.devices import describe, device_of
from rlhf_tutorial.tiny import calc
from rlhf_tutorial.trainers.agent import (
    AgentArgs,
    agent_functions,
    evaluate,
    learner_functions,
    pretrain,
    rollout_problems,
    score,
    summary,
    tokenizer_fns,
    train_agent,
)
from rlhf_tutorial.widgets.agent import agent_dashboard, by_difficulty_figure, trajectory_viewer
from rlhf_tutorial.worlds import is_smoke, is_tiny, load_agent_policy, resolve_world, smoke_sizes

# %%
torch.manual_seed(0)
world = resolve_world(None)
if is_tiny():
    torch.set_num_threads(1)  # the tiny model runs fastest on one thread
print(describe())  # where this chapter's models live: a GPU when there is one (RLHF_TUTORIAL_DEVICE picks)
base = load_agent_policy(world)  # tiny: the shipped calculator-world model; gpt2: GPT-2 itself
# every run of the chapter: the world's preset (seed 0), shrunk at smoke size; in the tiny world at full size
# these are exactly the settings of `python -m rlhf_tutorial train-agent --world tiny --seed 0`
sizes = smoke_sizes(num_phases=2, problems_per_difficulty=1, group_size=4, eval_problems=2, eval_samples=2, max_new_tokens=24)
if not is_tiny():
    # GPT-2 has never seen the calculator's syntax: fine-tune it first on the world's pretraining text
    # (the same writers as the tiny model's), after which tool use is a behaviour it has but rarely chooses
    pretrain(base, AgentArgs.preset(world, seed=0, **smoke_sizes(sft_texts=32)), progress=False)
args = AgentArgs.preset(world, seed=0, sft_texts=0, **sizes)
for d in calc.DIFFICULTIES:
    problem = calc.problems(1, 0, d)[0]
    print(f"{d:>6}: prompt {problem.prompt!r}; in the head: {problem.solution(tool=False)!r}; "
          f"with the tool: {problem.solution(tool=True)!r}")
print("the pretraining text, by the writers the base model learnt from:")
for text in calc.corpus(6, 0, calc.CalcWriter()):
    print("   ", repr(text))

# %% [markdown]
# ## 1. Reading a call
#
# The environment answers only when the policy's text **ends** with a complete call. The expression
# between the last `<calc>` and the final `</calc>` must follow a strict grammar: operands of ASCII
# digits, the operators `+ - * /` between them, plain spaces around them, nothing else (no
# parentheses, no unary minus, no `**`). Anything else is no call: `None`.

# %% exercise rlhf_tutorial.agent:parse_tool_call | 10 min | difficulty 2 | importance 4

# %% [markdown]
# Your parser on texts a policy might write (the environment answers only the first two):

# %%
for text in ["Q: 47*86\n<calc>47*86</calc>", "<calc> 12 + 7 </calc>", "<calc>47*86</calc>\n", "<calc>2**10</calc>",
             "<calc>(1+2)*3</calc>", "<calc>-3+4</calc>", "<calc>47*86", "47*86</calc>"]:
    print(f"{text!r:>32} -> {parse_tool_call(text)!r}")

# %% [markdown]
# ## 2. A sandboxed calculator
#
# The expression comes from the policy: whatever it writes, the environment must neither run it as
# code nor spend unbounded time or memory on it. Evaluate it with the usual precedence, `/` as exact
# division, operands of at most `MAX_OPERAND_DIGITS` digits and every value on the way below
# `MAX_ABS_VALUE` in absolute value; every problem becomes a text starting with `error:`, which the
# policy reads like any result.

# %% exercise rlhf_tutorial.agent:safe_calculate | 20 min | difficulty 3 | importance 4

# %% [markdown]
# Your calculator on what a policy might ask for, the hostile and the unlucky included. With `eval`,
# the last one would have run a shell command; here it is text that breaks the grammar.

# %%
for expression in ["47*86", "7 - 9 * 2", "84/4", "7/2", "5/0", "1234567*2", "999999*999999*999999",
                   "__import__('os').system('ls')"]:
    print(f"{expression!r:>34} -> {safe_calculate(expression)!r}")

# %% [markdown]
# ## 3. Which tokens are the policy's
#
# A trajectory holds the prompt, the policy's turns, the environment's texts and padding. A policy
# gradient must train only on what the policy sampled: the positions from `prompt_len` to the end of
# the trajectory, minus every environment span `[start, end)`.

# %% exercise rlhf_tutorial.agent:policy_token_mask | 10 min | difficulty 2 | importance 5

# %% [markdown]
# **Predict, then check.** Two rows of ten positions, a prompt of 3: row 0 ends at 9 and the environment
# wrote positions 5 and 6; row 1 ends at 6 with no call. Which positions are True?

# %%
print(policy_token_mask(torch.zeros(2, 10, dtype=torch.long), 3, [[(5, 7)], []], torch.tensor([9, 6])).int())

# %% [markdown]
# ## 4. The multi-turn rollout
#
# Sample the policy token by token; when the text of the current turn ends with `</calc>`, ask the tool
# and append its text **as token ids**, so that the tokens trained on are exactly those sampled; go on
# until an EOS, the last turn's call, or the token budget. Keep each sampled token's log-probability.

# %% exercise rlhf_tutorial.agent:multi_turn_rollout | 40 min | difficulty 5 | importance 5

# %% [markdown]
# The environment in the loop is built from your functions: `bind` gives the trainer's pieces with yours
# in place of the references (the calculator the rollout calls runs your `parse_tool_call` and
# `safe_calculate`), the same mechanism every trainer of the course uses. The cell rolls the base model
# out on one hard problem and shows the trajectories turn by turn: the prompt in grey, the policy's tokens
# in purple (darker when the policy found them less likely; hover for the log-probability your rollout
# kept), the environment's in blue. Most trajectories never call: the base model mostly works in its head.

# %%
# your functions in the reference's place; the first rollout is yours, checked draw for draw against the
# course's cached one (section 7 says more)
fns, rollout_note = agent_functions(base, args, **learner_functions(globals()))


def trajectories(policy, problem, n, seed):
    """n trajectories of one problem, rolled out with your functions; (rollout, whether each answer is right)."""
    generator = torch.Generator(device=device_of(policy)).manual_seed(seed)
    [(idx, rollout)] = rollout_problems(policy, [problem], n, args, fns, generator)
    correct, _ = score(policy, [problem], idx, n, rollout)
    return rollout, correct


hard_problem = calc.problems(1, 5, "hard")[0]
rollout, correct = trajectories(base, hard_problem, 4 if is_smoke() else 12, seed=0)
print(f"{hard_problem.prompt!r}: {int((rollout.num_calls > 0).sum())} of {len(correct)} trajectories call the tool, "
      f"{int(correct.sum())} are right; tokens trained on per row: {rollout.mask.sum(1).tolist()}")
trajectory_viewer(rollout, base.tokenizer, correct=correct.tolist())

# %% [markdown]
# ## 5. The reward
#
# One for a right final answer, minus `call_cost` for every call the environment answered: with a
# cost, the policy has a reason to call only when the tool helps.

# %% exercise rlhf_tutorial.agent:agent_reward | 5 min | difficulty 1 | importance 4

# %% [markdown]
# ## 6. The base model, with and without the tool
#
# How good is the base model, and how often does it reach for the calculator? The measurement
# (`evaluate`, the trainer's, run with your functions) samples trajectories of fresh problems of every
# difficulty with the tool available, and reports per difficulty the accuracy, the share of trajectories
# that call, and the accuracy of the two kinds apart: **with the tool** (the trajectories that called)
# and **without it** (those that worked in the head).

# %%
base_eval = evaluate(base, args, fns)
for d, m in base_eval.items():
    with_tool, in_head = (f"{x:.3f}" if x is not None else "none" for x in (m["accuracy_with_call"], m["accuracy_without_call"]))
    print(f"{d:>6}: accuracy {m['accuracy']:.3f}, trajectories with a call {m['call_rate']:.3f}; accuracy with the "
          f"tool {with_tool}, in the head {in_head}")
figures.agree("agent_short", {f"by_difficulty.{d}.{k}_initial": base_eval[d][k] for d in base_eval
                              for k in ("accuracy", "call_rate")})
by_difficulty_figure({"base model": base_eval}, keys=[("accuracy", "accuracy"), ("accuracy_with_call", "accuracy with the tool"),
                                                     ("accuracy_without_call", "accuracy in the head"),
                                                     ("call_rate", "trajectories with a call")],
                     title=f"The base model by difficulty ({world} world)")
print("rollout:", rollout_note["rollout"])

# %% [markdown]
# In the recorded run (`python -m rlhf_tutorial train-agent --world tiny --seed 0`, whose first measurement
# is this one) the base model called the tool in {{agent_short.by_difficulty.easy.call_rate_initial:.0%}} of its
# trajectories on easy problems, {{agent_short.by_difficulty.medium.call_rate_initial:.0%}} on medium ones and
# {{agent_short.by_difficulty.hard.call_rate_initial:.0%}} on hard ones. In its head it was right on {{agent_short.by_difficulty.easy.accuracy_without_call_initial:.0%}} of the
# easy problems, {{agent_short.by_difficulty.medium.accuracy_without_call_initial:.0%}} of the medium and
# {{agent_short.by_difficulty.hard.accuracy_without_call_initial:.0%}} of the hard ones; when it called, the
# accuracy was {{agent_short.by_difficulty.easy.accuracy_with_call_initial:.0%}},
# {{agent_short.by_difficulty.medium.accuracy_with_call_initial:.0%}} and
# {{agent_short.by_difficulty.hard.accuracy_with_call_initial:.0%}} (few trajectories call, so these three rest on few
# samples). The model rarely uses the tool, and the harder the problem the less its head is worth: there
# is something for reinforcement learning to find.
#
# ## 7. GRPO on trajectories
#
# Chapter 04's objective with the environment in the loop (`train_agent`, `AgentArgs` documents every
# knob). One phase:
#
# 1. draw fresh problems of every difficulty and roll each out `group_size` times with your
#    `multi_turn_rollout`, the calculator (your parser and sandbox) answering the calls;
# 2. score each trajectory with your `agent_reward` and turn the rewards into group-relative advantages
#    (chapter 04's `group_relative_advantages`): one advantage per trajectory, shared by all its tokens;
# 3. climb the clipped objective (`calc_grpo_objective`) over the tokens your rollout's mask marks as the
#    policy's.
#
# Your `multi_turn_rollout` samples the first batch (the base model's measurement on easy problems). Beside
# it, from the same generator state, the trainer runs the course's key/value-cached version of the same
# function; when the two agree draw for draw (tokens, masks, spans, calls, log-probs: they do when yours
# passed its check), the cached one samples from then on: the same trajectories, several times faster.
# When they differ, yours runs throughout, and the run says which ran.
#
# The dashboard follows the sampled trajectories per phase: the mean reward, the accuracy, the calls and
# turns per trajectory, and the length. In the tiny world this is the recorded run itself
# ({{agent_short.phases}} phases); each measurement checks that yours agrees.

# %%
dashboard = agent_dashboard(f"GRPO on trajectories, {world} world (live)")
run = train_agent(args, policy=copy.deepcopy(base), progress=False, callback=dashboard.update, **learner_functions(globals()))
dashboard.finish()


def report(result, name):
    """Per difficulty, before -> after; checks the figures against the recorded run `name`."""
    for d in result.eval_final:
        a, b = result.eval_initial[d], result.eval_final[d]
        print(f"{d:>6}: accuracy {a['accuracy']:.3f} -> {b['accuracy']:.3f}, trajectories with a call "
              f"{a['call_rate']:.3f} -> {b['call_rate']:.3f}, calls per problem {b['calls_per_problem']:.3f}")
    s = summary(result_args[name], result, result.wall_seconds, result.cpu_seconds)
    figures.agree(name, {**{k: s[k] for k in ("accuracy_initial", "accuracy_final", "tool_calls_per_problem_final")},
                         **{f"by_difficulty.{d}.{k}_final": s["by_difficulty"][d][f"{k}_final"] for d in s["by_difficulty"]
                            for k in ("accuracy", "call_rate")}})
    print(f"{len(result.history)} phases, {result.wall_seconds:.0f} s; rollout: {result.rollout}")
    print("samples of hard problems after training:", result.eval_final["hard"]["samples"])


result_args = {"agent_short": args}
report(run, "agent_short")

# %% [markdown]
# On the reference machine the run raised the accuracy on hard problems from
# {{agent_short.accuracy_initial:.2f}} to {{agent_short.accuracy_final:.2f}}, and the calls per hard problem from
# {{agent_short.tool_calls_per_problem_initial:.2f}} to {{agent_short.tool_calls_per_problem_final:.2f}}; on medium
# problems the accuracy went from {{agent_short.by_difficulty.medium.accuracy_initial:.2f}} to
# {{agent_short.by_difficulty.medium.accuracy_final:.2f}}, on easy ones from
# {{agent_short.by_difficulty.easy.accuracy_initial:.2f}} to {{agent_short.by_difficulty.easy.accuracy_final:.2f}}.
# One seed is one draw: the same command at seeds 0, 1 and 2 gained
# {{agent_short_seeds.over_seeds.accuracy_gain.mean:+.2f}} on hard problems on average (from
# {{agent_short_seeds.over_seeds.accuracy_gain.min:+.2f}} to {{agent_short_seeds.over_seeds.accuracy_gain.max:+.2f}}), and
# ended at {{agent_short_seeds.over_seeds.tool_calls_per_problem_final.min:.2f}} to
# {{agent_short_seeds.over_seeds.tool_calls_per_problem_final.max:.2f}} calls per hard problem.
# Nothing told the policy to use the calculator: the trajectories that called were right more often,
# got a larger reward than the rest of their group and so a positive advantage, and the first token of a
# call (the choice between working in the head and calling) was pushed up. The trajectories of the
# trained policy, turn by turn:

# %%
rollout, correct = trajectories(run.policy, hard_problem, 4 if is_smoke() else 12, seed=1)
rewards = agent_reward(correct.to(rollout.tokens.device), rollout.num_calls, args.call_cost)  # your reward
print(f"after training, {hard_problem.prompt!r}: {int((rollout.num_calls > 0).sum())} of {len(correct)} trajectories "
      f"call the tool, {int(correct.sum())} are right")
trajectory_viewer(rollout, run.policy.tokenizer, rewards=rewards.tolist(), correct=correct.tolist())

# %% [markdown]
# ## 8. A cost per call: learning *when* to call
#
# With `call_cost` = 0 a call costs nothing: wherever it raises the chance of a right answer at all, GRPO
# pushes it up, on easy problems as on hard ones. A real tool has a price (time, money, a context filling
# up). With a cost $c$ per answered call, a call pays only where it raises the probability of a right
# answer by more than $c$: on a problem the head gets right anyway, a right answer with a call earns
# $1 - c$ against $1$ without, and the calls of such a group get a negative advantage; on a hard problem,
# where the head is mostly wrong, a right answer with a call still beats a wrong one without.
#
# **Predict, then check.** The run below repeats section 7's with a cost of {{agent_cost.call_cost:g}} per call.
# Which call rate should fall, which should stay high, and what happens to the accuracy on easy problems?


# %%
cost_args = AgentArgs.preset(world, seed=0, sft_texts=0, call_cost=0.3, **sizes)
result_args["agent_cost"] = cost_args
cost_dashboard = agent_dashboard(f"GRPO with a cost of {cost_args.call_cost:g} per call (live)")
cost_run = train_agent(cost_args, policy=copy.deepcopy(base), progress=False, callback=cost_dashboard.update,
                       **learner_functions(globals()))
cost_dashboard.finish()
report(cost_run, "agent_cost")

# %%
by_difficulty_figure({"base model": base_eval, "GRPO": run.eval_final, f"GRPO, cost {cost_args.call_cost:g} per call": cost_run.eval_final},
                     keys=[("call_rate", "trajectories with a call"), ("accuracy", "accuracy")],
                     title="Call rate and accuracy by difficulty, before and after")

# %% [markdown]
# The recorded runs: without a cost, the share of trajectories that call went from
# {{agent_short.by_difficulty.easy.call_rate_initial:.2f}} to {{agent_short.by_difficulty.easy.call_rate_final:.2f}} on easy
# problems and from {{agent_short.by_difficulty.hard.call_rate_initial:.2f}} to
# {{agent_short.by_difficulty.hard.call_rate_final:.2f}} on hard ones; with the cost, to
# {{agent_cost.by_difficulty.easy.call_rate_final:.2f}} on easy problems and
# {{agent_cost.by_difficulty.hard.call_rate_final:.2f}} on hard ones, at an accuracy of
# {{agent_cost.by_difficulty.easy.accuracy_final:.2f}} (easy) and {{agent_cost.accuracy_final:.2f}} (hard). The
# policy calls less where the head suffices and keeps calling where it does not: *when* to use a tool is
# learnt from the reward alone, with nothing in the data that says which problems need it.
#
# ## 9. The classic bug, run: training on the environment's tokens
#
# Leave the mask out and the objective counts every position after the prompt, the environment's result
# too (`policy_mask=False`, the CLI's `--no-policy-mask`). Those tokens were never sampled: the
# policy-gradient term of a token the policy did not choose pushes up its probability whenever the
# trajectory's advantage is positive, as if the policy had written it. After a call the environment writes
# ` = ` and the right result, so a trajectory that called and was right teaches the policy to write
# results itself. The known symptom in agent training is a policy that writes results on its own instead
# of calling the tool (and writes them wrong). The measurement counts the results the policy wrote in its
# own text (`a op b = N`, outside the environment's spans), and how many of them are wrong.

# %%
nomask_args = AgentArgs.preset(world, seed=0, sft_texts=0, policy_mask=False, **sizes)
result_args["agent_nomask"] = nomask_args
nomask_dashboard = agent_dashboard("GRPO without the policy-token mask (the bug, live)")
nomask_run = train_agent(nomask_args, policy=copy.deepcopy(base), progress=False, callback=nomask_dashboard.update,
                         **learner_functions(globals()))
nomask_dashboard.finish()
report(nomask_run, "agent_nomask")
for name, result in (("masked", run), ("no mask", nomask_run)):
    for d in result.eval_final:
        a, b = result.eval_initial[d], result.eval_final[d]
        print(f"{name:>8} {d:>6}: results written without the tool per problem {a['self_results_per_problem']:.2f} -> "
              f"{b['self_results_per_problem']:.2f}, wrong among them " + " -> ".join(
                  f"{x:.2f}" if x is not None else "none" for x in (a["self_results_wrong"], b["self_results_wrong"])))

# %%
by_difficulty_figure({"base model": base_eval, "GRPO": run.eval_final, "GRPO, no mask": nomask_run.eval_final},
                     keys=[("self_results_per_problem", "results written without the tool, per problem"),
                           ("call_rate", "trajectories with a call"), ("accuracy", "accuracy")],
                     title="Masked and unmasked training, by difficulty")

# %% [markdown]
# What to read in it. In this world the environment's text after a call is ` = ` and the right result, and
# the answer line that follows repeats that result. Training on those tokens raises, after ` = `, the
# probability of the digits the calculator wrote: the same tokens a policy writes when it works a result
# out itself (the symptom), and the ones it copies into its answer. The run measures which of the two
# shows.
#
# The recorded run (`train-agent --world tiny --seed 0 --no-policy-mask`, the same seed and settings as
# section 7's): on hard problems the base model wrote
# {{agent_nomask.by_difficulty.hard.self_results_per_problem_initial:.2f}} results of its own per problem
# ({{agent_nomask.by_difficulty.hard.self_results_wrong_initial:.0%}} of them wrong). After training without the
# mask it wrote {{agent_nomask.by_difficulty.hard.self_results_per_problem_final:.2f}} per hard problem (with the
# mask: {{agent_short.by_difficulty.hard.self_results_per_problem_final:.2f}}), called the tool
# {{agent_nomask.tool_calls_per_problem_final:.2f}} times per hard problem (with the mask:
# {{agent_short.tool_calls_per_problem_final:.2f}}), and was right on {{agent_nomask.accuracy_final:.2f}} of them
# (with the mask: {{agent_short.accuracy_final:.2f}}; medium problems: {{agent_nomask.by_difficulty.medium.accuracy_final:.2f}}
# against {{agent_short.by_difficulty.medium.accuracy_final:.2f}}).
#
# So here the bug did not show its known symptom: the unmasked run learnt to call the tool as the masked
# one did, wrote hardly any result of its own, and ended a little below it in accuracy. One seed of each
# is one draw, so read the samples of both runs above before making more of the gap. Why so little harm:
# the tokens it was wrongly trained on are the ones a right trajectory copies anyway (` = ` and the
# result, which the answer line repeats), so pushing them up mostly pushed up what the policy would write
# next. With a tool whose text the policy never repeats (a search result, a test report, an error), the
# same line trains the policy to imitate the environment and nothing else. The mask is the statement of
# which actions were the policy's; a run that happens to survive without it does not make it optional.

# %%
progress("09")

# %% [markdown]
# ## What to try next
#
# - **More tools.** A second tool (a lookup table, a unit converter, a tool that can fail) is a new
#   environment step and a new syntax for `parse_tool_call`; the rollout and the mask do not change.
#   Which tool does the policy learn to prefer where both would do?
# - **Longer horizons.** Problems that need several calls (`a * b + c * d` in two steps, with `max_turns`
#   raised): the reward then comes after several tool results, and a wrong intermediate call is paid for
#   only at the end.
# - **Turn-level credit.** Here every token of a trajectory shares its one advantage. With several turns,
#   give each turn its own (a verifier of each call's result, or a value per turn as in chapter 03's PPO)
#   and compare how fast the call rate on hard problems rises.
# - **The cost, swept.** `train-agent --world tiny --call-cost 0.6`: at what cost does the policy stop
#   calling on hard problems too, and is that where the cost outweighs the accuracy the tool buys?
