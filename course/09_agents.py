# %% [markdown]
# # 09. Training an agent with RL: a calculator called over several turns
#
# Since 2025 reinforcement learning on language models is mostly about **agents**: a policy that
# calls tools over several turns (a calculator, code execution, search) and is rewarded for the
# outcome of the whole trajectory. This chapter writes the pieces of such a loop for the tiny
# arithmetic world of chapter 07, each checked on its own:
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
# A trajectory, turn by turn (the environment's text appended after the call, then the policy again):
#
# ```
# Q: 347*29                     <- the prompt
# <calc>347*29</calc>           <- turn 1: the policy closes a call
#  = 10063                      <- the environment's tokens
# Answer: 10063                 <- turn 2: the policy answers
# ```

# %% imports
import re
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from rlhf_tutorial import check, hint, progress
from rlhf_tutorial.agent import (
    CALL_CLOSE,
    CALL_OPEN,
    MAX_ABS_VALUE,
    MAX_OPERAND_DIGITS,
    RESULT_PREFIX,
    AgentRollout,
    calculator,
)

# %% [markdown]
# ## 1. Reading a call
#
# The environment answers only when the policy's text **ends** with a complete call. The expression
# between the last `<calc>` and the final `</calc>` must follow a strict grammar: operands of ASCII
# digits, the operators `+ - * /` between them, plain spaces around them, nothing else (no
# parentheses, no unary minus, no `**`). Anything else is no call: `None`.

# %% exercise rlhf_tutorial.agent:parse_tool_call | 10 min | difficulty 2 | importance 4

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
# ## 3. Which tokens are the policy's
#
# A trajectory holds the prompt, the policy's turns, the environment's texts and padding. A policy
# gradient must train only on what the policy sampled: the positions from `prompt_len` to the end of
# the trajectory, minus every environment span `[start, end)`.

# %% exercise rlhf_tutorial.agent:policy_token_mask | 10 min | difficulty 2 | importance 5

# %% [markdown]
# ## 4. The multi-turn rollout
#
# Sample the policy token by token; when the text of the current turn ends with `</calc>`, ask the tool
# and append its text **as token ids**, so that the tokens trained on are exactly those sampled; go on
# until an EOS, the last turn's call, or the token budget. Keep each sampled token's log-probability.

# %% exercise rlhf_tutorial.agent:multi_turn_rollout | 40 min | difficulty 5 | importance 5

# %% [markdown]
# ## 5. The reward
#
# One for a right final answer, minus `call_cost` for every call the environment answered: with a
# cost, the policy has a reason to call only when the tool helps.

# %% exercise rlhf_tutorial.agent:agent_reward | 5 min | difficulty 1 | importance 4

# %%
progress()
