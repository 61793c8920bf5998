"""Chapter 09: training an agent with RL: a calculator called over several turns.

The policy solves a problem in several **turns**. In a turn it writes text; when the text of the turn
ends with a call, ``<calc>EXPR</calc>``, the **environment** evaluates the expression and appends its
result, the **tool text** ``" = " + safe_calculate(EXPR)`` (no newline: the policy writes what comes
next), and the policy starts its next turn right after it::

    Q: 347*29\\n                     <- prompt
    <calc>347*29</calc>            <- turn 1, sampled by the policy (ends with a call)
     = 10063                       <- the environment's tokens (never sampled, never trained on)
    \\nAnswer: 10063<eos>           <- turn 2, sampled by the policy

**The grammar of EXPR** (``parse_tool_call`` and ``safe_calculate`` share it): one or more operands
separated by operators, nothing else. An operand is one or more ASCII digits ``0``-``9`` (a
non-negative integer literal; leading zeros allowed, no sign, no decimal point); an operator is one of
``+``, ``-``, ``*`` and ``/``; plain spaces (U+0020, no other whitespace) may stand before and after
any operand or operator. No parentheses, no unary minus, no ``**`` or ``//``.

**Its value** (``safe_calculate``): the usual precedence (``*`` and ``/`` before ``+`` and ``-``),
left to right within each level; ``/`` is exact division of integers: a division by zero or one
with a remainder is undefined. Bounds, checked before any big number is built: an operand of more
than :data:`MAX_OPERAND_DIGITS` digits as written (leading zeros count) is too large, and so is any
value computed on the way (each partial product or quotient, each partial sum, the result) whose
absolute value is not below :data:`MAX_ABS_VALUE`. The result is the decimal text of the integer
(``"-7"``, ``"0"``); an expression that breaks the grammar, is too large or is undefined gives a text
starting with ``"error:"``, which the policy reads like any result: nothing is ever raised.

The pieces a learner writes, in the order the chapter builds them:

1. ``parse_tool_call``     the expression of the call the generated text ends with, or None
2. ``safe_calculate``      the expression's value as text, by a parser of the grammar (no ``eval``)
3. ``policy_token_mask``   True exactly on the tokens the policy sampled
4. ``multi_turn_rollout``  sample, run the tool on a closed call, append its text as token ids, go on
5. ``agent_reward``        1 for a right answer, minus a cost per call

``calculator`` is the environment's step (the tool ``multi_turn_rollout`` calls): the tool text for the
text of a turn that ends with ``</calc>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

#: How a call opens and closes.
CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
#: The text the environment writes before the result.
RESULT_PREFIX = " = "
#: An operand may have at most this many digits (as written).
MAX_OPERAND_DIGITS = 6
#: Every value computed on the way must have an absolute value below this.
MAX_ABS_VALUE = 10**12

# ----------------------------------------------------------------------------------------------------
# The tool
# ----------------------------------------------------------------------------------------------------


def parse_tool_call(generated: str) -> str | None:
    """The expression of the call that ``generated`` ends with, checked against the grammar.

    The text must end with ``</calc>`` as its very last characters (nothing after it, not even a
    space or a newline); the call opens at the last ``<calc>`` before that closing tag. Returns the text
    between the two tags exactly as written (spaces kept) when it follows the grammar of the module
    docstring (operands of ASCII digits of any length, the operators ``+ - * /``, plain spaces around
    them, nothing else), else ``None``: no closing tag at the end, no opening tag before it, an empty
    or malformed expression. Text before the call is ignored.
    """
    # >>> exercise
    if not generated.endswith(CALL_CLOSE):
        return None
    body = generated[: -len(CALL_CLOSE)]
    start = body.rfind(CALL_OPEN)
    if start < 0:
        return None
    expression = body[start + len(CALL_OPEN) :]
    if re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) is None:
        return None
    return expression
    # <<< exercise


def safe_calculate(expression: str) -> str:
    """The value of ``expression`` as the text the environment appends, or an error text; never raises.

    Follows the module docstring: the grammar (ASCII-digit operands, ``+ - * /``, plain spaces), the
    usual precedence with left-to-right evaluation, ``/`` exact (a remainder or a zero divisor is an
    error), operands of at most ``MAX_OPERAND_DIGITS`` digits as written, and every value computed on
    the way (partial products and quotients, partial sums, the result) of absolute value below
    ``MAX_ABS_VALUE``. Returns the integer in decimal (``"-7"``) or a text starting with ``"error:"``
    that says what went wrong. The text is parsed, never executed (no ``eval`` or ``exec``): the
    expression comes from the policy, and an environment is a sandbox.
    """
    # >>> exercise
    if re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) is None:
        return "error: malformed expression"
    pieces = re.findall(r"[0-9]+|[-+*/]", expression)  # operand, operator, operand, ...
    operands, operators = pieces[0::2], pieces[1::2]
    if any(len(x) > MAX_OPERAND_DIGITS for x in operands):
        return f"error: an operand has more than {MAX_OPERAND_DIGITS} digits"
    total, sign, term = 0, 1, int(operands[0])
    for op, x in zip(operators, operands[1:]):
        value = int(x)
        if op == "*":
            term *= value
        elif op == "/":
            if value == 0:
                return "error: division by zero"
            if term % value:
                return "error: the division has a remainder"
            term //= value
        else:  # + or -: the term so far is complete
            total += sign * term
            if abs(total) >= MAX_ABS_VALUE:
                return "error: too large"
            sign, term = (1 if op == "+" else -1), value
        if abs(term) >= MAX_ABS_VALUE:
            return "error: too large"
    total += sign * term
    if abs(total) >= MAX_ABS_VALUE:
        return "error: too large"
    return str(total)
    # <<< exercise


def calculator(turn_text: str) -> str:
    """The environment's step: the tool text for a turn that ends with ``</calc>``, that is
    ``RESULT_PREFIX`` followed by ``safe_calculate`` of the call's expression, or by an error text when
    ``parse_tool_call`` finds no well-formed call (``" = error: malformed call"``)."""
    expression = parse_tool_call(turn_text)
    result = "error: malformed call" if expression is None else safe_calculate(expression)
    return RESULT_PREFIX + result


# ----------------------------------------------------------------------------------------------------
# Trajectories
# ----------------------------------------------------------------------------------------------------


def policy_token_mask(
    tokens: Int[Tensor, "b s"],
    prompt_len: int,
    env_spans: Sequence[Sequence[tuple[int, int]]],
    lengths: Int[Tensor, "b"],
) -> Bool[Tensor, "b s"]:
    """Which positions of each trajectory the policy sampled (the only ones a policy gradient trains):

        mask[i, t] = True  iff  prompt_len <= t < lengths[i]  and  t is in no span of env_spans[i]

    Row i of ``tokens`` is the prompt (positions ``< prompt_len``), then the trajectory up to
    ``lengths[i]`` (exclusive; an EOS the policy sampled is inside it), then padding. ``env_spans[i]``
    lists the environment's tool texts of row i as half-open position ranges ``(start, end)``: positions
    start, ..., end - 1 were written by the environment. Only the shape and device of ``tokens`` are
    used. A bool tensor on ``tokens.device``.
    """
    # >>> exercise
    b, s = tokens.shape
    positions = torch.arange(s, device=tokens.device)  # [s]
    mask = (positions >= prompt_len) & (positions < lengths.to(tokens.device)[:, None])  # [b s]
    for i, spans in enumerate(env_spans):
        for start, end in spans:
            mask[i, start:end] = False
    return mask
    # <<< exercise


@dataclass
class AgentRollout:
    """What ``multi_turn_rollout`` returns (b rows, s = prompt_len + max_new_tokens positions).

    - ``tokens`` [b s] int64: prompt, trajectory, then padding (``eos_token_id``, 0 when None);
    - ``mask`` [b s] bool: ``policy_token_mask(tokens, prompt_len, env_spans, lengths)``;
    - ``logprobs`` [b s] float32: at a position the policy sampled, the log-probability of its token at
      the sampling temperature, ``log_softmax(logits[i, t - 1] / temperature)[tokens[i, t]]``; 0.0
      elsewhere (no graph);
    - ``env_spans``: per row, the half-open ranges ``(start, end)`` of the tool texts appended;
    - ``lengths`` [b] int64: where each trajectory ends (exclusive);
    - ``num_calls`` [b] int64: the calls the environment answered (``len(env_spans[i])``);
    - ``prompt_len``: the prompt's length.
    """

    tokens: Int[Tensor, "b s"]
    mask: Bool[Tensor, "b s"]
    logprobs: Float[Tensor, "b s"]
    env_spans: list[list[tuple[int, int]]]
    lengths: Int[Tensor, "b"]
    num_calls: Int[Tensor, "b"]
    prompt_len: int


def multi_turn_rollout(
    policy: nn.Module,
    prompts: Int[Tensor, "b prompt_len"],
    tool: Callable[[str], str],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    max_turns: int,
    max_new_tokens: int,
    eos_token_id: int | None = None,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> AgentRollout:
    """Multi-turn trajectories of ``policy`` (a language model: ``policy(tokens)`` gives logits
    [b, s, v]) from the ``prompts``, with the environment in the loop.

    Each row, on its own: the policy samples one token at a time from ``softmax(logits / temperature)``
    (drawn from ``generator``) after the prompt. A **turn** is the text sampled since the prompt or
    since the last tool text. The trajectory ends after a token when:

    - the token is ``eos_token_id`` (the EOS is the policy's and stays in the trajectory);
    - the decoded text of the turn (``decode`` of the turn's tokens) ends with ``CALL_CLOSE``, and the
      turn is turn number ``max_turns`` (the call is left unanswered), or the tool text would not fit
      in the token budget;
    - the budget is spent: ``max_new_tokens`` positions after the prompt, sampled and environment tokens
      together (a call still open then is never run).

    Otherwise, after a turn whose text ends with ``CALL_CLOSE``, ``tool(turn_text)`` gives the tool
    text; ``encode(tool_text)`` (only that text: the sampled tokens are never re-tokenised) is appended
    as the next positions, an environment span, and the next turn starts after it. Returns an
    :class:`AgentRollout` (its docstring: padding, mask, log-probs, spans, lengths, calls), with
    ``mask`` from ``policy_token_mask``. Sampling needs no gradients: nothing returned has a graph.
    """
    # >>> exercise
    b, prompt_len = prompts.shape
    s = prompt_len + max_new_tokens
    device = prompts.device
    pad = eos_token_id if eos_token_id is not None else 0
    tokens = torch.full((b, s), pad, dtype=torch.long, device=device)
    tokens[:, :prompt_len] = prompts
    logprobs = torch.zeros(b, s, device=device)
    lengths = [s] * b
    env_spans: list[list[tuple[int, int]]] = [[] for _ in range(b)]
    queued: list[list[int]] = [[] for _ in range(b)]  # tool tokens still to write, per row
    turn_start, turn = [prompt_len] * b, [1] * b
    done = [False] * b
    with torch.no_grad():
        for t in range(prompt_len, s):
            sampling = [i for i in range(b) if not done[i] and not queued[i]]
            if sampling:
                logits = policy(tokens[:, :t])[:, -1].float() / temperature  # [b v]: predicts position t
                logp = logits.log_softmax(dim=-1)
                drawn = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)  # [b]
            for i in range(b):
                if done[i]:
                    continue
                if queued[i]:  # the environment writes this position
                    tokens[i, t] = queued[i].pop(0)
                    turn_start[i] = t + 1
                    continue
                token = int(drawn[i])
                tokens[i, t] = token
                logprobs[i, t] = logp[i, token]
                if token == eos_token_id:
                    done[i], lengths[i] = True, t + 1
                elif decode(tokens[i, turn_start[i] : t + 1].tolist()).endswith(CALL_CLOSE):
                    ids = list(encode(tool(decode(tokens[i, turn_start[i] : t + 1].tolist())))) if turn[i] < max_turns else []
                    if turn[i] >= max_turns or t + 1 + len(ids) > s:
                        done[i], lengths[i] = True, t + 1
                    else:
                        queued[i] = ids
                        env_spans[i].append((t + 1, t + 1 + len(ids)))
                        turn[i] += 1
            if all(done):
                break
    lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
    mask = policy_token_mask(tokens, prompt_len, env_spans, lengths_t)
    num_calls = torch.tensor([len(spans) for spans in env_spans], dtype=torch.long, device=device)
    return AgentRollout(tokens, mask, logprobs, env_spans, lengths_t, num_calls, prompt_len)
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# The reward
# ----------------------------------------------------------------------------------------------------


def agent_reward(
    correct: Bool[Tensor, "b"], num_calls: Int[Tensor, "b"], call_cost: float = 0.0
) -> Float[Tensor, "b"]:
    """The reward of each trajectory: 1 for a right final answer, minus a cost per answered call,

        r_i = 1[correct_i] - call_cost * num_calls_i

    (a wrong answer that called the tool is below 0). ``call_cost = 0`` rewards the answer alone.
    float32, on ``correct.device``.
    """
    # >>> exercise
    return correct.float() - call_cost * num_calls.to(correct.device).float()
    # <<< exercise
