"""Checkers for chapter 09: training an agent with RL (a calculator called over several turns).

Regimes probed (where plausible implementations differ):
- parse_tool_call: a call at the very end, with text before it, with spaces inside (kept as written), two
  calls (the last one pending), a call answered earlier and text after it, a newline or a space after
  the closing tag, a closing tag with no opening one, an empty or all-space call, a nested opening tag,
  a doubled closing tag, upper-case tags; expressions with each of the four operators, unary minus,
  parentheses, ``**`` and ``//``, ``%`` and ``^``, a leading, trailing or doubled operator, two operands
  with no operator, a decimal point, ``1e3``, letters, a tab and a newline (``\\s`` takes them), digits
  of another script (``\\d`` takes them), an operand of many digits (size is not the grammar's), the
  empty text; the return type (a str or None);
- safe_calculate: each operator, precedence (``2+6/3``), left-to-right order (``10-2-3``, ``100/10/5``,
  ``6*4/3`` against ``4/3*6``), exact division (a remainder: ``7/2`` is no 3.5 and no 3), division by
  zero (``5/0``, ``0/0``) and of zero, negative results, leading zeros (``007``: a SyntaxError for
  ``eval``), spaces, operands of 6 and 7 digits and of 5000 digits (``int()`` refuses more than 4300),
  leading zeros counted as digits, the result bound on both sides of 10**12 (999999999999 is fine,
  10**12 is not, negative too), a partial product above the bound whose final value is below it, a
  partial sum above the bound that comes back below it, grammar errors (``2**10``, ``8//2``, ``(1)``,
  ``-3``, letters, a tab, ``1.5``, ``1e3``, another script's digits, the empty string); no ``eval`` or
  ``exec`` anywhere in the call (watched while it runs, and in the code's names); never raises;
- policy_token_mask: several spans per row, rows with their own spans and lengths, a span right after
  the prompt and one ending at the trajectory's end, a trajectory of length 0 (all False), no padding,
  a pad-valued token inside a trajectory (the values never decide), prompt lengths 1 and 5, a batch of
  1; bool dtype, inputs unchanged;
- multi_turn_rollout: a scripted policy (its next-token logits read from a table by prompt and
  position; near one-hot where a scenario needs a fixed token, a spread distribution at "free"
  positions) and a tokenizer that is not canonical (``"12"`` is a token and so are ``"1"`` and ``"2"``;
  ``"</calc>"`` is one token and ``"</"``, ``"calc>"`` two more): in one batch, rows with one call, two
  calls, no call, a malformed call, a call closed by two tokens, calls up to ``max_turns`` (the last
  one left unanswered), a call still open when the budget is spent, a result that does not fit, EOS
  right after a tool text, a call right after a result; then ``max_turns=1``, no EOS token (a
  sampled EOS goes on, token 0 is no EOS, padding is 0), a short budget, a batch of 1; then 64 rows
  sampled at temperatures 1.0 (a policy in bfloat16) and 0.5 (the share of the likely token at the free positions within a
  band around its probability; every log-prob recomputed from the candidate's own tokens), the
  generator honoured (the same seed gives the same rows whatever the global RNG), nothing returned
  with a graph, the tool's inputs recorded;
- agent_reward: right and wrong answers with 0, 1, 3 and 12 calls (a right answer below 0), a cost of 0 (the default), 0.1 and
  0.25, a batch of 1, an empty batch; float32.
"""

from __future__ import annotations

import builtins
import dis
import math
import os
import sys
import types
from collections import Counter

import torch
from torch import nn

from rlhf_tutorial import agent
from rlhf_tutorial.checks.core import (
    _LIBRARY_DIRS,
    Case,
    CheckFailure,
    Mistake,
    call,
    check_device,
    checker,
    compare_to_reference,
    expect_tensor,
    failure,
    fmt,
    get_attr,
)

CHAPTER = "09_agents"

#: Each exercise's contract (its CURRICULUM.md row and its docstring), clause by clause; the checker
#: tests write a version breaking each one (tests/checks/test_contract_clauses.py holds the two together).
CLAUSES = {
    "parse_tool_call": {
        "ends_with_close": "the call must end the text: nothing after '</calc>', not even a space or a newline",
        "last_open": "the call opens at the last '<calc>' before the closing tag; earlier text and calls are ignored",
        "as_written": "the expression is returned exactly as written between the tags, spaces kept",
        "ascii_digits": "operands are ASCII digits 0-9 only: no other script's digits, no decimal point, no exponent",
        "four_operators": "the operators + - * / are all accepted and nothing else (no **, //, %, ^, parentheses)",
        "operators_between": "an operator stands between two operands: no leading, trailing or doubled operator, "
                             "no unary minus, no two operands without an operator",
        "plain_spaces": "plain spaces are allowed around operands and operators; no other whitespace (tab, newline)",
        "not_empty": "an empty or all-space expression is no call",
        "any_length": "an operand of any number of digits follows the grammar (its size is safe_calculate's to judge)",
        "none_otherwise": "None (not '', not an exception) when the text does not end with a well-formed call",
    },
    "safe_calculate": {
        "no_eval": "the expression is parsed, never executed: no eval or exec anywhere in the call",
        "grammar": "an expression outside the grammar (**, //, parentheses, unary minus, letters, a tab, a decimal "
                   "point, an empty text) gives an error text",
        "precedence": "* and / before + and - (2+6/3 is 4)",
        "left_to_right": "left to right within a level (10-2-3 is 5, 100/10/5 is 2, 4/3*6 is an error)",
        "exact_division": "/ is exact division: a remainder gives an error text (not a float, not floor division)",
        "division_by_zero": "a division by zero gives an error text",
        "operand_digits": "an operand of more than 6 digits as written (leading zeros count) gives an error text, "
                          "even one of thousands of digits",
        "partial_values": "every value computed on the way (partial products and quotients, partial sums) must have "
                          "an absolute value below 10**12, even when the result would",
        "result_bound": "the result must have an absolute value below 10**12: 10**12 itself is too large, "
                        "999999999999 is fine",
        "negative_results": "a negative result is a result ('-7'), not an error",
        "spaces": "plain spaces around operands and operators are allowed",
        "never_raises": "every error is returned as a text starting with 'error:', never raised",
        "decimal_text": "the result is the decimal text of the integer: a str, no '+', no '.0'",
    },
    "policy_token_mask": {
        "prompt_false": "the prompt's positions (< prompt_len) are False",
        "first_sampled_true": "position prompt_len, the first the policy samples, is True (no off-by-one)",
        "env_false": "every position of an environment span is False",
        "span_half_open": "a span (start, end) covers start to end - 1: start is False, end is True again",
        "padding_false": "positions from lengths[i] on (padding) are False",
        "last_token_true": "the trajectory's last position, lengths[i] - 1 (an EOS included), is True",
        "own_spans": "each row uses its own spans and length, not another row's",
        "values_ignored": "the token values decide nothing: a pad-valued token inside a trajectory is still the "
                          "policy's",
        "bool": "a bool tensor of the tokens' shape",
        "inputs_unchanged": "the inputs are not modified in place",
    },
    "multi_turn_rollout": {
        "result_appended": "after a turn ending with '</calc>', the tool's text follows as the next positions",
        "token_ids_kept": "only the tool's text is encoded: the sampled tokens stay as sampled, never re-tokenised",
        "turn_text": "the tool gets the decoded text of the turn (since the prompt or the last tool text), once per "
                     "closed call before the last turn",
        "env_spans": "env_spans holds each tool text's positions as (start, end), end exclusive",
        "closed_by_text": "a call is closed when the decoded turn text ends with '</calc>', whichever tokens wrote it",
        "eos_ends": "a sampled EOS ends the trajectory and stays in it (in the mask)",
        "no_eos": "without eos_token_id only the budgets end a trajectory, and the padding is 0",
        "max_turns": "a call closed in turn max_turns is left unanswered and ends the trajectory",
        "open_call_at_budget": "a call still open when the token budget is spent is never run, appended or counted",
        "result_must_fit": "a tool text that does not fit in the budget is not appended: the trajectory ends after "
                           "the call, which is not counted",
        "budget": "max_new_tokens counts sampled and environment tokens together: s = prompt_len + max_new_tokens",
        "padding": "positions from lengths[i] on hold eos_token_id",
        "mask": "mask is True exactly on the sampled positions (policy_token_mask of the result)",
        "logprobs_aligned": "logprobs[i, t] is the log-prob of tokens[i, t] given the tokens before it; 0.0 "
                            "wherever the mask is False",
        "temperature": "tokens are drawn from softmax(logits / temperature), and the log-probs are at that temperature",
        "float32": "the log-probs are float32, computed in float32 even for a policy in bfloat16",
        "sampled": "tokens are drawn at random from that distribution, not taken by argmax",
        "generator": "the draws come from the given generator: the same seed gives the same rows, whatever the "
                     "global random state",
        "no_graph": "nothing returned carries a graph: sampling runs without gradients",
        "counts": "num_calls counts the answered calls and lengths where each trajectory ends (int64)",
        "rows_independent": "each row runs on its own: rows with other lengths and calls in the batch change nothing",
    },
    "agent_reward": {
        "correct_one": "a right answer is worth 1 and a wrong one 0 before costs (no -1)",
        "cost_per_call": "the cost is paid per answered call: call_cost times num_calls",
        "cost_always": "every trajectory pays for its calls, a wrong one too (it goes below 0)",
        "default_no_cost": "call_cost defaults to 0: the answer alone",
        "float32": "a float32 tensor of shape [b]",
    },
}

# ----------------------------------------------------------------------------------------------------
# parse_tool_call
# ----------------------------------------------------------------------------------------------------

_CALL_TEXTS = [
    ("a call alone", "<calc>347*29</calc>"),
    ("text before the call", "Q: 347*29\nlet me compute <calc>347*29</calc>"),
    ("spaces inside the call (kept as written)", "<calc> 12 + 7 * 3 </calc>"),
    ("each operator", "<calc>84/2-3+4*5</calc>"),
    ("a single number", "<calc>42</calc>"),
    ("two calls, the second pending", "<calc>2+3</calc> = 5\nthen <calc>5*4</calc>"),
    ("a call answered, then text", "<calc>2+3</calc> = 5\nAnswer: 5"),
    ("a newline after the closing tag", "<calc>2+3</calc>\n"),
    ("a space after the closing tag", "<calc>2+3</calc> "),
    ("a closing tag with no opening one", "2+3</calc>"),
    ("a closing tag with no opening one, after a long expression", "1234567+8</calc>"),
    ("a misspelt closing tag", "<calc>12+3</calx>"),
    ("an unclosed call, then seven characters", "<calc>2+3 abcdefg"),
    ("an empty call", "<calc></calc>"),
    ("an all-space call", "<calc>   </calc>"),
    ("a nested opening tag (the last one opens the call)", "<calc>1+<calc>2*3</calc>"),
    ("a doubled closing tag", "<calc>2+3</calc></calc>"),
    ("upper-case tags", "<CALC>2+3</CALC>"),
    ("unary minus", "<calc>-3+4</calc>"),
    ("parentheses", "<calc>(1+2)*3</calc>"),
    ("'**'", "<calc>2**10</calc>"),
    ("'//'", "<calc>8//2</calc>"),
    ("'%' and '^'", "<calc>7%2</calc>"),
    ("'^'", "<calc>2^3</calc>"),
    ("a trailing operator", "<calc>1+</calc>"),
    ("a leading operator", "<calc>+1</calc>"),
    ("a doubled operator", "<calc>1+*2</calc>"),
    ("two operands with no operator", "<calc>12 34</calc>"),
    ("a decimal point", "<calc>1.5*2</calc>"),
    ("an exponent", "<calc>1e3+1</calc>"),
    ("letters", "<calc>__import__('os')</calc>"),
    ("a tab", "<calc>1+\t2</calc>"),
    ("a newline inside", "<calc>1+\n2</calc>"),
    ("digits of another script", "<calc>\u0664+1</calc>"),
    ("an operand of 20 digits (size is safe_calculate's business)", "<calc>12345678901234567890*2</calc>"),
    ("the empty text", ""),
]


def _parse_fullmatch_any_space(generated):  # \s takes tabs and newlines
    import re

    if not generated.endswith("</calc>"):
        return None
    body = generated[:-7].rsplit("<calc>", 1)
    if len(body) < 2 or not re.fullmatch(r"\s*[0-9]+(\s*[-+*/]\s*[0-9]+)*\s*", body[1]):
        return None
    return body[1]


def _parse_stripped(generated):
    out = agent.parse_tool_call(generated)
    return None if out is None else out.strip()


def _parse_rstrip_text(generated):
    return agent.parse_tool_call(generated.rstrip())


def _parse_first_open(generated):
    if not generated.endswith("</calc>") or "<calc>" not in generated:
        return None
    import re

    expression = generated[generated.index("<calc>") + 6 : -7]
    return expression if re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) else None


def _parse_bounded_digits(generated):
    import re

    out = agent.parse_tool_call(generated)
    return None if out is None or any(len(x) > agent.MAX_OPERAND_DIGITS for x in re.findall("[0-9]+", out)) else out


def _parse_pending_anywhere(generated):  # the last call anywhere, even if text follows it
    import re

    found = re.findall(r"<calc>([^<]*)</calc>", generated)
    return found[-1] if found and agent.parse_tool_call(f"<calc>{found[-1]}</calc>") is not None else None


PARSE_MISTAKES = [
    Mistake("The expression came back stripped: return it exactly as written between the tags, spaces kept.",
            _parse_stripped),
    Mistake("A call followed by a space or a newline counted: the call must be the text's very last characters "
            "(the environment answers only a text that ends with '</calc>').", _parse_rstrip_text),
    Mistake("The call opened at the first '<calc>' of the text: it opens at the last one before the closing tag.",
            _parse_first_open),
    Mistake("A tab or a newline counted as a space (in a regular expression `\\s` matches every whitespace): "
            "only the plain space ' ' is allowed.", _parse_fullmatch_any_space),
    Mistake("An operand of many digits was rejected: the grammar takes operands of any length; their size is "
            "safe_calculate's to judge (it answers with an error text the policy can read).", _parse_bounded_digits),
    Mistake("A call followed by more text counted: only a call that ends the text is pending.",
            _parse_pending_anywhere),
]


def _returns_str_or_none(candidate):
    def strict(generated):
        out = call(candidate, generated)
        if out is not None and not isinstance(out, str):
            raise CheckFailure(f"parse_tool_call should return a str or None, got a {type(out).__name__}: {fmt(out)}.",
                               hint="Return the expression's text itself, or None when there is no well-formed "
                               "call at the end.")
        return out

    return strict


@checker(
    "parse_tool_call",
    chapter=CHAPTER,
    hint=(
        "Two questions in turn: does the text end with a closing tag, and is what stands between it and the "
        "last opening tag before it an expression of the grammar? Python's `re` can match a pattern against a "
        "WHOLE string.",
        "Nothing may follow '</calc>'. Take the text between the last '<calc>' and that closing tag, unchanged. "
        "It is a call when, as a whole, it is: optional plain spaces, one or more ASCII digits 0-9, then any "
        "number of (optional spaces, one of + - * /, optional spaces, digits), then optional spaces. Near misses "
        "to rule out: `\\s` (tabs, newlines) and `\\d` (other scripts' digits). Return None otherwise.",
        "```python\nif not generated.endswith(CALL_CLOSE):\n    return None\nbody = generated[: -len(CALL_CLOSE)]\n"
        "start = body.rfind(CALL_OPEN)\nif start < 0:\n    return None\nexpression = body[start + len(CALL_OPEN) :]\n"
        "if re.fullmatch(r\" *[0-9]+(?: *[-+*/] *[0-9]+)* *\", expression) is None:\n    return None\n"
        "return expression\n```",
    ),
)
def check_parse_tool_call(candidate) -> str:
    cases = [Case(f"{label}: {text!r}", (text,)) for label, text in _CALL_TEXTS]
    compare_to_reference(_returns_str_or_none(candidate), agent.parse_tool_call, cases, mistakes=PARSE_MISTAKES,
                         atol=0, rtol=0, arg_names=["generated"])
    return f"matches the reference on {len(cases)} texts (" + "; ".join(label for label, _ in _CALL_TEXTS) + ")."


# ----------------------------------------------------------------------------------------------------
# safe_calculate
# ----------------------------------------------------------------------------------------------------

_CALC_CASES = [  # (label, expression)
    ("an addition", "12+30"),
    ("a product", "347*29"),
    ("a subtraction below zero (a negative result is a result)", "3-10"),
    ("an exact division", "84/2"),
    ("spaces around the operators", " 7 +  8 * 2 "),
    ("precedence", "2+6/3"),
    ("precedence, products on both sides", "2*3+4*5-6/2"),
    ("left to right: subtractions", "10-2-3"),
    ("left to right: divisions", "100/10/5"),
    ("left to right: a product, then a division", "6*4/3"),
    ("left to right: a division with a remainder, then a product", "4/3*6"),
    ("a division with a remainder", "7/2"),
    ("a division by zero", "5/0"),
    ("zero divided by zero", "0/0"),
    ("zero divided", "0/7"),
    ("a division by zero after a product", "3*0/0+1"),
    ("leading zeros", "007+1"),
    ("an operand of 6 digits", "999999*999999"),
    ("an operand of 7 digits", "1234567+1"),
    ("an operand of 7 digits by its leading zeros", "0000012*2"),
    ("an operand of 5000 digits", "1" * 5000 + "+1"),
    ("the largest allowed result, 999999999999", "999999*999999+999999+999999"),
    ("a result of exactly 10**12", "999999*999999+999999+999999+1"),
    ("a negative result of exactly -10**12", "0-999999*999999-999999-999999-1"),
    ("a result above the bound", "999999*999999+999999*999999"),
    ("a partial product above the bound, the result below it", "999999*999999*999999/999999/999999"),
    ("a partial sum above the bound, the result below it", "999999*999999+999999*999999-999999*999999"),
    ("a partial sum of exactly 10**12, the result below it", "999999*999999+999999+999999+1-1"),
    ("a partial product of exactly 10**12, the result below it", "100000*100000*100/100"),
    ("'**'", "2**10"),
    ("'//'", "8//2"),
    ("parentheses", "(1+2)*3"),
    ("unary minus", "-3+4"),
    ("letters", "__import__('os').getcwd()"),
    ("a tab", "1+\t2"),
    ("a decimal point", "1.5*2"),
    ("an exponent", "1e3"),
    ("digits of another script", "\u0664+1"),
    ("the empty text", ""),
    ("a trailing operator", "1+"),
]

_FORBIDDEN = ("eval", "exec", "compile")


def _globals_used(fn, seen: set | None = None) -> set[str]:
    """The global (or builtin) names ``fn``'s code loads, its nested functions and lambdas included, and
    those of the learner's functions it reaches through them (attributes such as ``re.compile`` are not
    globals)."""
    seen = seen if seen is not None else set()
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return set()
    seen.add(code)
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names |= {ins.argval for ins in dis.get_instructions(c) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    forbidden = {id(getattr(builtins, name)): name for name in _FORBIDDEN}
    for name in list(names):
        target = getattr(fn, "__globals__", {}).get(name)
        if id(target) in forbidden:  # the builtin under another name
            names.add(forbidden[id(target)])
        elif isinstance(target, types.FunctionType) and target.__module__ == getattr(fn, "__module__", None):
            names |= _globals_used(target, seen)
    return names


class _Watch:
    """Records calls of ``eval``, ``exec`` and ``compile`` while it is active (the builtins replaced by
    recording wrappers that still work)."""

    def __init__(self):
        self.used: list[str] = []
        self.saved = {name: getattr(builtins, name) for name in _FORBIDDEN}

    def __enter__(self):
        for name, original in self.saved.items():
            def spy(*args, _name=name, _original=original, **kwargs):
                caller = os.path.abspath(sys._getframe(1).f_code.co_filename)
                if not caller.startswith(_LIBRARY_DIRS):  # the learner's code, not a library's own use
                    self.used.append(_name)
                return _original(*args, **kwargs)

            setattr(builtins, name, spy)
        return self

    def __exit__(self, *exc):
        for name, original in self.saved.items():
            setattr(builtins, name, original)
        return False


_NO_EVAL_HINT = ("The expression comes from the policy, and the environment must never run it: `eval` would "
                 "run any Python the policy writes (a `__import__('os')` call, a 9**9**9 that never ends). Read "
                 "it with a small parser of the grammar instead.")


def _is_error(text) -> bool:
    return isinstance(text, str) and text.startswith("error:")


def _calc_same(got, expected) -> bool:
    return _is_error(got) if _is_error(expected) else got == expected


def _calc_float_division(expression):
    import re

    if re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) is None:
        return "error: malformed"
    value = _python_value(expression, exact=False)
    return str(value) if value is not None else "error"


def _python_value(expression, exact=True):
    """The value with Python's own arithmetic on ints (a float for a division when not ``exact``)."""
    import re

    pieces = re.findall(r"[0-9]+|[-+*/]", expression)
    total, sign, term = 0, 1, int(pieces[0])
    for op, x in zip(pieces[1::2], pieces[2::2]):
        value = int(x)
        if op == "*":
            term *= value
        elif op == "/":
            if value == 0:
                return None
            term = term // value if exact else term / value
        else:
            total, sign, term = total + sign * term, (1 if op == "+" else -1), value
    return total + sign * term


def _calc_floor_division(expression):
    import re

    if re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) is None:
        return "error: malformed"
    if any(len(x) > 6 for x in re.findall("[0-9]+", expression)):
        return "error: operand"
    value = _python_value(expression)
    return "error" if value is None or abs(value) >= 10**12 else str(value)


def _calc_final_bound_only(expression):
    out = agent.safe_calculate(expression)
    if _is_error(out) and "too large" in out:
        import re

        if any(len(x) > 6 for x in re.findall("[0-9]+", expression)):
            return out
        value = _python_value(expression)
        return str(value) if value is not None and abs(value) < 10**12 else out
    return out


def _calc_inclusive_bound(expression):
    out = agent.safe_calculate(expression)
    if _is_error(out) and "too large" in out:
        value = _python_value(expression)
        if value is not None and abs(value) == 10**12:
            return str(value)
    return out


def _calc_value_bound(expression):  # the operand's value bounded, not its digits as written
    import re

    if re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) is None:
        return "error: malformed"
    if any(int(x) > 999999 for x in re.findall("[0-9]+", expression)):
        return "error: operand"
    return agent.safe_calculate(re.sub("[0-9]+", lambda m: str(int(m.group(0))), expression))


def _calc_no_precedence(expression):
    import re

    if re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) is None:
        return "error: malformed"
    pieces = re.findall(r"[0-9]+|[-+*/]", expression)
    value = int(pieces[0])
    for op, x in zip(pieces[1::2], pieces[2::2]):
        b = int(x)
        if op == "/" and (b == 0 or value % b):
            return "error"
        value = {"+": value + b, "-": value - b, "*": value * b, "/": value // b if b else 0}[op]
    return str(value)


def _calc_no_negative(expression):
    out = agent.safe_calculate(expression)
    return "error: negative" if out.startswith("-") else out


CALC_MISTAKES = [
    Mistake("A division with a remainder gave a fraction: '/' here is exact division of integers, and a remainder "
            "is an error text.", _calc_float_division),
    Mistake("A division with a remainder was rounded down: '/' is exact; a remainder is an error text for the "
            "policy, not floor division.", _calc_floor_division),
    Mistake("Only the final value was bounded: every value computed on the way (each partial product or "
            "quotient, each partial sum) must stay below 10**12 in absolute value.", _calc_final_bound_only),
    Mistake("A value of exactly 10**12 passed: the bound is strict, the absolute value must be below 10**12.",
            _calc_inclusive_bound),
    Mistake("The operand's value was bounded, not its length as written: an operand of more than 6 digits "
            "(leading zeros count) is an error, checked before the text becomes a number.", _calc_value_bound),
    Mistake("The operators ran strictly left to right: '*' and '/' come before '+' and '-'.", _calc_no_precedence),
    Mistake("A negative result became an error: '3-10' is '-7', a result like any other.", _calc_no_negative),
]


def _run_calc(candidate, expression, label):
    try:
        out = call(candidate, expression)
    except CheckFailure as failed:
        if "not implemented" in failed.message.lower() or "your code raised" not in failed.message:
            raise
        raise failure(f"On {label} ({expression[:60]!r}), {failed.message}",
                      "safe_calculate raised: it must never raise; every error goes back to the policy as a "
                      "text starting with 'error:'.") from None
    if not isinstance(out, str):
        raise CheckFailure(f"On {label}, safe_calculate returned a {type(out).__name__} ({fmt(out)}): return the "
                           "text the environment appends, a str.",
                           hint="The result goes into the trajectory as text: its decimal digits, or an error text.")
    return out


@checker(
    "safe_calculate",
    chapter=CHAPTER,
    hint=(
        "Never hand the text to Python to run. Check it against the grammar first, cut it into operands and "
        "operators, then evaluate with two levels of precedence, returning an error text the moment anything "
        "is out of bounds or undefined.",
        "A valid text alternates operand, operator, operand... Refuse an operand longer than 6 digits before "
        "converting it. Keep a running sum of terms; a term is a chain of '*' and '/' applied left to right. "
        "A '/' needs a divisor that is not 0 and no remainder. After each step, every partial value (the term, "
        "the sum) must have an absolute value below 10**12. The result is str of the final sum.",
        "```python\nif re.fullmatch(r\" *[0-9]+(?: *[-+*/] *[0-9]+)* *\", expression) is None:\n"
        "    return \"error: malformed expression\"\npieces = re.findall(r\"[0-9]+|[-+*/]\", expression)\n"
        "operands, operators = pieces[0::2], pieces[1::2]\n"
        "if any(len(x) > MAX_OPERAND_DIGITS for x in operands):\n    return \"error: operand too long\"\n"
        "total, sign, term = 0, 1, int(operands[0])\nfor op, x in zip(operators, operands[1:]):\n"
        "    value = int(x)\n    if op == \"*\":\n        term *= value\n    elif op == \"/\":\n"
        "        if value == 0:\n            return \"error: division by zero\"\n        if term % value:\n"
        "            return \"error: the division has a remainder\"\n        term //= value\n    else:\n"
        "        total += sign * term\n        if abs(total) >= MAX_ABS_VALUE:\n            return \"error: too large\"\n"
        "        sign, term = (1 if op == \"+\" else -1), value\n    if abs(term) >= MAX_ABS_VALUE:\n"
        "        return \"error: too large\"\ntotal += sign * term\nif abs(total) >= MAX_ABS_VALUE:\n"
        "    return \"error: too large\"\nreturn str(total)\n```",
    ),
)
def check_safe_calculate(candidate) -> str:
    used = sorted(set(_FORBIDDEN) & _globals_used(candidate))
    if used:
        raise failure(f"Your code calls `{used[0]}`: the expression must be parsed, never executed.", _NO_EVAL_HINT)
    passed: list[tuple[str, str]] = []
    for label, expression in _CALC_CASES:
        expected = agent.safe_calculate(expression)
        with _Watch() as watch:
            got = _run_calc(candidate, expression, label)
        if watch.used:
            raise failure(f"On {label}, your code called `{watch.used[0]}`: the expression must be parsed, never "
                          "executed.", _NO_EVAL_HINT)
        if _calc_same(got, expected):
            passed.append((expression, got))
            continue
        want = "an error text (starting with 'error:')" if _is_error(expected) else repr(expected)
        message = f"On {label} ({expression[:60]!r}): expected {want}, got {got[:80]!r}."
        if _is_error(expected) and got.lower().startswith("error"):
            message += " (An error text starts with 'error:' exactly.)"
        hint = None
        for mistake in CALC_MISTAKES:
            try:
                wrong = mistake.fn(expression)
            except Exception:  # noqa: BLE001 - a variant may not apply
                continue
            if _calc_same(wrong, expected) or not _calc_same(got, wrong):
                continue
            if all(_calc_same(p_got, mistake.fn(p_expr)) for p_expr, p_got in passed):
                hint = mistake.hint
                break
        raise failure(message, hint)
    return (f"right on {len(_CALC_CASES)} expressions (" + "; ".join(label for label, _ in _CALC_CASES)
            + "), errors returned as text, and no eval.")


# ----------------------------------------------------------------------------------------------------
# policy_token_mask
# ----------------------------------------------------------------------------------------------------


def _mask_cases() -> list[Case]:
    g = torch.Generator().manual_seed(91)
    tokens = torch.randint(1, 20, (3, 16), generator=g)
    tokens[0, 9] = 0  # a pad-valued token inside row 0's trajectory
    tokens[1, 13:] = 0  # row 1's padding
    spans = [[(6, 8), (11, 13)], [(4, 7)], []]
    lengths = torch.tensor([16, 13, 9])
    one = torch.randint(1, 20, (1, 10), generator=g)
    return [
        Case("3 rows: two spans, one right after the prompt, none; lengths 16, 13 and 9",
             (tokens, 4, spans, lengths)),
        Case("a span ending where the trajectory ends, prompt_len 1",
             (tokens, 1, [[(2, 3), (14, 16)], [(10, 13)], [(8, 9)]], lengths)),
        Case("an empty trajectory (length = prompt_len) and a full one, prompt_len 5",
             (tokens[:2], 5, [[], [(5, 7)]], torch.tensor([5, 16]))),
        Case("a batch of 1, two adjacent spans", (one, 2, [[(3, 5), (5, 6)]], torch.tensor([9]))),
    ]


def _mask_variant(*, prompt_shift=0, start_shift=0, end_shift=0, length_shift=0, first_row_spans=False,
                  by_value=False):
    def fn(tokens, prompt_len, env_spans, lengths):
        b, s = tokens.shape
        t = torch.arange(s)
        mask = (t >= prompt_len + prompt_shift) & (t < lengths[:, None] + length_shift)
        for i in range(b):
            for start, end in env_spans[0 if first_row_spans else i]:
                mask[i, max(start + start_shift, 0) : end + end_shift] = False
        if by_value:
            mask &= tokens != 0
        return mask

    return fn


MASK_MISTAKES = [
    Mistake("The prompt's last position is in your mask: positions below prompt_len are the prompt.",
            _mask_variant(prompt_shift=-1)),
    Mistake("Position prompt_len is missing: it is the first token the policy sampled.", _mask_variant(prompt_shift=1)),
    Mistake("A span's end came out excluded too: (start, end) is half-open, so position end is the policy's again.",
            _mask_variant(end_shift=1)),
    Mistake("A span's last position stayed True: (start, end) covers start to end - 1.", _mask_variant(end_shift=-1)),
    Mistake("A span's first position stayed True: the environment wrote position start too.",
            _mask_variant(start_shift=1)),
    Mistake("A span began one early: position start - 1 is the policy's (the '</calc>' it closed the call with).",
            _mask_variant(start_shift=-1)),
    Mistake("The trajectory's last position is missing: lengths[i] is exclusive, position lengths[i] - 1 is "
            "the policy's.", _mask_variant(length_shift=-1)),
    Mistake("Position lengths[i] is in your mask: it is padding, lengths[i] is exclusive.",
            _mask_variant(length_shift=1)),
    Mistake("Every row used the first row's spans: env_spans[i] belongs to row i.", _mask_variant(first_row_spans=True)),
    Mistake("A token's value decided (tokens equal to the pad value were dropped): padding is where lengths says, "
            "and a pad-valued token inside the trajectory is the policy's.", _mask_variant(by_value=True)),
]


@checker(
    "policy_token_mask",
    chapter=CHAPTER,
    hint=(
        "Three conditions at once for each position: after the prompt, before the row's length, and in none "
        "of the row's environment spans.",
        "Compare the positions 0..s-1 with prompt_len and with lengths (one column per position, one row per "
        "trajectory, on the tokens' device): that gives the trajectory. Then switch off, row by row, each "
        "span's positions start to end - 1. The token values are not looked at.",
        "```python\nb, s = tokens.shape\npositions = torch.arange(s, device=tokens.device)\nmask = (positions >= "
        "prompt_len) & (positions < lengths.to(tokens.device)[:, None])\nfor i, spans in enumerate(env_spans):\n"
        "    for start, end in spans:\n        mask[i, start:end] = False\nreturn mask\n```",
    ),
)
def check_policy_token_mask(candidate) -> str:
    return compare_to_reference(candidate, agent.policy_token_mask, _mask_cases(), mistakes=MASK_MISTAKES, atol=0,
                                rtol=0, arg_names=["tokens", "prompt_len", "env_spans", "lengths"])


# ----------------------------------------------------------------------------------------------------
# multi_turn_rollout: a scripted policy and a tokenizer that is not canonical
# ----------------------------------------------------------------------------------------------------

#: The test vocabulary: multi-character pieces ("12", "</calc>" and its halves, "Answer:") beside single
#: characters, so that re-tokenising a text changes its tokens; "?" stands for any other character.
VOCAB = (["~", "<eos>", "<calc>", "</calc>", "</", "calc>", "12", "Answer:"] + list("0123456789+-*/ =\nQ:")
         + list("abcdefghilmnorstuvwxyz.()'_#?"))
EOS = 1  # not 0: padding without an EOS token is 0, another token
_INDEX = {piece: i for i, piece in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Greedy longest match over :data:`VOCAB`; an unknown character is "?"."""
    ids, i = [], 0
    while i < len(text):
        best = max((p for p in VOCAB if p != "<eos>" and text.startswith(p, i)), key=len, default=None)
        if best is None:
            ids.append(_INDEX["?"])
            i += 1
        else:
            ids.append(_INDEX[best])
            i += len(best)
    return ids


def decode(ids) -> str:
    return "".join("" if int(i) == EOS else VOCAB[int(i)] for i in ids)


def env(text: str) -> list[str]:
    """The pieces of a tool text as ``encode`` writes them (for writing plans)."""
    return [VOCAB[i] for i in encode(text)]


#: A logit gap that makes the planned token certain: the others' total probability is below 1e-15.
_SURE = 40.0
#: A free position of a plan, and its logits: three digits, the first likeliest.
FREE_MARK = "<free>"
FREE = {"3": 1.0, "4": 0.0, "5": -0.5}


class ScriptedPolicy(nn.Module):
    """A language model that follows plans: row r (recognised by its prompt) predicts at position t the
    planned token t + 1 (logit 0, every other token -40), or at a free position (FREE_MARK) the
    :data:`FREE` digits. Causal and position-based: what the rollout writes never changes its logits. A
    parameter scales the logits, so that a forward pass outside ``no_grad`` builds a graph."""

    def __init__(self, plans: list[list[str]], prompt_len: int, length: int):
        super().__init__()
        self.prompt_len = prompt_len
        self.prompts = [tuple(_INDEX[p] for p in plan[:prompt_len]) for plan in plans]
        table = torch.full((len(plans), length, len(VOCAB)), -_SURE)
        for k, plan in enumerate(plans):
            for t in range(length):
                nxt = plan[t + 1] if t + 1 < len(plan) else "<eos>"
                if nxt == FREE_MARK:
                    for piece, logit in FREE.items():
                        table[k, t, _INDEX[piece]] = logit
                else:
                    table[k, t, _INDEX[nxt]] = 0.0
        self.scale = nn.Parameter(torch.ones(()))
        self.register_buffer("logits", table)

    def forward(self, tokens):
        b, t = tokens.shape
        rows = []
        for prompt in tokens[:, : self.prompt_len].tolist():
            if tuple(prompt) not in self.prompts:
                raise CheckFailure(f"the policy was given a row that does not start with a prompt of the batch: "
                                   f"{decode(prompt)!r}.", hint="Every row the policy reads starts with its prompt.")
            rows.append(self.prompts.index(tuple(prompt)))
        if t > self.logits.shape[1]:
            raise CheckFailure(f"the policy was given {t} positions, more than prompt_len + max_new_tokens.")
        return self.logits[rows, :t] * self.scale


def plan_tokens(plan: list[str]) -> list[int]:
    return [_INDEX[p] for p in plan]


P = 3  # every prompt: "Q", a digit, "\n"
_CALC = ["<calc>"]
#: (label, plan) of the batch of scenarios; the plan's pieces after the prompt are what the policy writes and
#: what the environment appends, as the reference produces them (tests/checks/test_ch09_agents.py checks it).
SCENARIOS = [
    ("one call, then the answer", ["Q", "0", "\n", "<calc>", "1", "2", "*", "3", "</calc>", *env(" = 36"), "\n",
                                   "Answer:", " ", "3", "6", "<eos>"]),
    ("two calls, the second closed by two tokens", ["Q", "1", "\n", "<calc>", "2", "+", "3", "</calc>", *env(" = 5"),
                                                    "\n", "<calc>", "5", "*", "4", "</", "calc>", *env(" = 20"), "\n",
                                                    "Answer:", "2", "0", "<eos>"]),
    ("no call (a '~', token 0, on the way)", ["Q", "2", "\n", "~", "Answer:", " ", "7", "<eos>"]),
    ("a malformed call", ["Q", "3", "\n", "<calc>", "2", "*", "*", "3", "</calc>", *env(" = error: malformed call"),
                          "\n", "8", "<eos>"]),
    ("calls up to max_turns = 3, the third unanswered", ["Q", "4", "\n", "<calc>", "1", "+", "1", "</calc>",
                                                         *env(" = 2"), "<calc>", "2", "+", "2", "</calc>",
                                                         *env(" = 4"), "<calc>", "4", "+", "4", "</calc>", "\n"]),
    ("a call still open when the budget is spent", ["Q", "5", "\n", "<calc>"] + ["9"] * 60),
    ("a result one token too long for the budget", ["Q", "6", "\n"] + ["a"] * 27 + ["<calc>", "7", "*", "7", "</calc>",
                                                                                  *env(" = 49"), "<eos>"]),
    ("a result that fills the budget exactly", ["Q", "b", "\n"] + ["a"] * 26 + ["<calc>", "7", "*", "7", "</calc>",
                                                                              *env(" = 49"), "<eos>"]),
    ("a closing tag alone right after the prompt", ["Q", "d", "\n", "</calc>", *env(" = error: malformed call"),
                                                    "\n", "2", "<eos>"]),
    ("a prompt ending in '</', then 'calc>' (no call: the turn alone counts)", ["Q", "c", "</", "calc>", "\n",
                                                                                "Answer:", "1", "<eos>"]),
    ("EOS right after a tool text", ["Q", "7", "\n", "<calc>", "1", "2", "-", "1", "2", "</calc>", *env(" = 0"),
                                     "<eos>"]),
    ("a call right after a result", ["Q", "8", "\n", "<calc>", "3", "/", "3", "</calc>", *env(" = 1"), "<calc>", "1",
                                     "*", "9", "</calc>", *env(" = 9"), "\n", "Answer:", "9", "<eos>"]),
]
BUDGET = 36  # max_new_tokens of the scenarios


class RecordingTool:
    """The chapter's calculator, recording the texts it is given."""

    def __init__(self):
        self.texts: list[str] = []

    def __call__(self, text: str) -> str:
        self.texts.append(text)
        return agent.calculator(text)


def _scenario_policy(scenarios=SCENARIOS, length=P + BUDGET) -> tuple[ScriptedPolicy, torch.Tensor]:
    plans = [plan for _, plan in scenarios]
    policy = ScriptedPolicy(plans, P, length).to(check_device())
    prompts = torch.tensor([plan_tokens(plan[:P]) for plan in plans], device=check_device())
    return policy, prompts


def _fields(out, what: str) -> dict:
    if out is None:
        raise CheckFailure(f"{what} returned None: did you forget a `return`?")
    return {name: get_attr(out, name) for name in ("tokens", "mask", "logprobs", "env_spans", "lengths",
                                                    "num_calls")}


def _spans(spans) -> list[list[tuple[int, int]]]:
    try:
        return [[(int(a), int(b)) for a, b in row] for row in spans]
    except (TypeError, ValueError):
        raise CheckFailure(f"env_spans should be a list (one per row) of (start, end) pairs, got {fmt(spans)}.",
                           hint="Record, for each row, the (start, end) positions of every tool text you "
                           "append.") from None


def _row_text(tokens, i) -> str:
    return "|".join(VOCAB[int(x)] for x in tokens[i])


def _compare_rollouts(got: dict, want: dict, labels: list[str], where: str, got_tools=None, want_tools=None):
    """Every field of the candidate's rollout against the reference's, the first difference named."""
    b, s = want["tokens"].shape
    tokens = expect_tensor(got["tokens"], shape=(b, s), dtype=torch.long, what=f"{where}: tokens")
    for i in range(b):
        if torch.equal(tokens[i].cpu(), want["tokens"][i].cpu()):
            continue
        g, w = tokens[i].tolist(), want["tokens"][i].tolist()
        t = next(j for j in range(s) if g[j] != w[j])
        message = (f"{where}, row {i} ({labels[i]}): position {t} holds {VOCAB[g[t]]!r}, expected {VOCAB[w[t]]!r}.\n"
                   f"  expected: {_row_text(want['tokens'], i)}\n  got:      {_row_text(tokens, i)}")
        hint = _token_diagnosis(g, w, t, want, i, labels[i])
        raise failure(message, hint)
    spans = _spans(got["env_spans"])
    if spans != want["env_spans"]:
        i = next(j for j in range(b) if j >= len(spans) or spans[j] != want["env_spans"][j])
        raise failure(f"{where}, row {i} ({labels[i]}): env_spans {spans[i] if i < len(spans) else None}, expected "
                      f"{want['env_spans'][i]}.",
                      "A span is (start, end) with start the first position of the tool text and end the position "
                      "after its last: end - start is the number of the tool text's tokens.")
    for name in ("lengths", "num_calls"):
        value = expect_tensor(got[name], shape=(b,), dtype=torch.long, what=f"{where}: {name}")
        if not torch.equal(value.cpu(), want[name].cpu()):
            i = next(j for j in range(b) if int(value[j]) != int(want[name][j]))
            hint = ("lengths[i] is where row i's trajectory ends, exclusive: the position after its last token "
                    "(an EOS the policy sampled included)." if name == "lengths" else
                    "num_calls counts the calls the environment answered (the tool texts appended): a call left "
                    "unanswered (the last turn, a full budget, a call still open) does not count.")
            raise failure(f"{where}, row {i} ({labels[i]}): {name} is {int(value[i])}, expected {int(want[name][i])}.",
                          hint)
    mask = expect_tensor(got["mask"], shape=(b, s), dtype=torch.bool, what=f"{where}: mask")
    if not torch.equal(mask.cpu(), want["mask"].cpu()):
        i, t = (mask.cpu() != want["mask"].cpu()).nonzero()[0].tolist()
        raise failure(f"{where}, row {i} ({labels[i]}): mask[{i}, {t}] is {bool(mask[i, t])}, expected "
                      f"{bool(want['mask'][i, t])}.",
                      "The mask is True exactly where the policy sampled: build it with your policy_token_mask from "
                      "the prompt length, the spans and the lengths.")
    logprobs = expect_tensor(got["logprobs"], shape=(b, s), dtype=torch.float32, what=f"{where}: logprobs")
    if logprobs.requires_grad:
        raise failure(f"{where}: the log-probs carry a graph (requires_grad=True).",
                      "Sampling needs no gradients: run the policy under torch.no_grad() (the trainer recomputes "
                      "log-probs with gradients when it trains).")
    if got_tools is not None and sorted(got_tools) != sorted(want_tools):
        extra = sorted((Counter(got_tools) - Counter(want_tools)).elements())
        missing = sorted((Counter(want_tools) - Counter(got_tools)).elements())
        raise failure(f"{where}: the tool was called with other texts than expected (unexpected: {extra[:3]}; "
                      f"missing: {missing[:3]}).",
                      "The tool gets the decoded text of the current turn only (since the prompt or the end of the "
                      "last tool text), once for each call closed before the last turn; never an open call.")


def _token_diagnosis(got, want, t, want_out, i, label) -> str | None:
    piece, wanted = VOCAB[got[t]], VOCAB[want[t]]
    if len(piece) > len(wanted) and "".join(VOCAB[w] for w in want[t : t + len(piece)]).startswith(piece):
        return ("The text is right but its tokens are not those sampled: the trajectory was re-tokenised "
                f"({piece!r} where the policy sampled {wanted!r} and what follows). Keep the sampled tokens as "
                "they are and append the tool's text as the ids of encode(tool text) alone.")
    for start, end in want_out["env_spans"][i]:
        if start - 1 <= t <= end:
            return ("A difference at a turn boundary: the tool text starts at the position right after the token "
                    "that closed the call, and the policy samples again right after the tool text's last token.")
    if t >= int(want_out["lengths"][i]):
        return ("The trajectory should have ended before this position: it ends after a sampled EOS, a call closed "
                "in the last turn (max_turns), a tool text that would not fit, or the budget; then comes padding "
                "(eos_token_id, 0 without one).")
    if t < P:
        return "The prompt must stay as it is, at the start of each row."
    return None


def _run(fn, policy, prompts, **kwargs):
    tool = RecordingTool()
    out = fn(policy, prompts, tool, encode, decode, **kwargs)
    return out, tool.texts


def _reference(policy, prompts, **kwargs):
    out, texts = _run(agent.multi_turn_rollout, policy, prompts, **kwargs)
    want = {name: getattr(out, name) for name in ("tokens", "mask", "logprobs", "env_spans", "lengths", "num_calls")}
    return want, texts


def _candidate(candidate, policy, prompts, **kwargs):
    tool = RecordingTool()
    out = call(candidate, policy, prompts, tool, encode, decode, _arg_names=["policy", "prompts"], **kwargs)
    return _fields(out, "multi_turn_rollout"), tool.texts


def _recomputed_logprobs(policy, tokens, mask, temperature) -> torch.Tensor:
    """log_softmax(logits[:, t - 1] / T)[tokens[:, t]] at every masked position, 0.0 elsewhere."""
    with torch.no_grad():
        logp = (policy(tokens[:, :-1]).float() / temperature).log_softmax(-1)
        picked = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    out = torch.zeros(tokens.shape, device=tokens.device)
    out[:, 1:] = picked
    return torch.where(mask, out, 0.0)


def _check_logprobs(got: dict, want_logprobs, where: str, labels):
    logprobs = got["logprobs"].detach()
    if torch.allclose(logprobs.cpu(), want_logprobs.cpu(), atol=1e-4, rtol=1e-4):
        return
    i, t = (~torch.isclose(logprobs.cpu(), want_logprobs.cpu(), atol=1e-4, rtol=1e-4)).nonzero()[0].tolist()
    mask = got["mask"]
    shifted = torch.zeros_like(want_logprobs)
    shifted[:, :-1] = want_logprobs[:, 1:]
    later = torch.zeros_like(want_logprobs)
    later[:, 1:] = want_logprobs[:, :-1]
    if torch.allclose(logprobs.cpu(), shifted.cpu(), atol=1e-4) or torch.allclose(logprobs.cpu(), later.cpu(), atol=1e-4):
        hint = ("The log-probs are one position off: logprobs[i, t] belongs to the token at position t (the one "
                "sampled from the logits at t - 1), like the mask.")
    elif not bool(mask[i, t]) and float(logprobs[i, t]) != 0.0:
        hint = "A position the policy did not sample has a log-prob: it must be 0.0 wherever the mask is False."
    else:
        hint = ("The log-prob of a sampled token is log_softmax(logits / temperature) at that token, with the "
                "temperature the token was sampled at, computed in float32 (a policy in bfloat16 gives logits "
                "to convert first).")
    raise failure(f"{where}, row {i} ({labels[i]}): logprobs[{i}, {t}] is {float(logprobs[i, t]):.5g}, expected "
                  f"{float(want_logprobs[i, t]):.5g}.", hint)


#: 64 rows of one prompt, a call, then four free digits after "Answer:": the sampling case.
_FREE_PLAN = ["Q", "9", "\n", "<calc>", "1", "2", "*", "2", "</calc>", *env(" = 24"), "\n", "Answer:", *[FREE_MARK] * 4,
              "<eos>"]
_FREE_ROWS = 64


def _free_share_band(temperature: float) -> tuple[float, float, float]:
    logits = torch.tensor(list(FREE.values()), dtype=torch.float64) / temperature
    p = float(logits.softmax(0)[0])
    n = _FREE_ROWS * 4
    half = 4.5 * math.sqrt(p * (1 - p) / n)
    return p, p - half, p + half


def _check_sampling(candidate, temperature: float, dtype: torch.dtype = torch.float32) -> None:
    where = f"64 rows at temperature {temperature} (four free digits each after a call), a policy in {dtype}"
    length = P + 24
    policy = ScriptedPolicy([_FREE_PLAN], P, length).to(check_device(), dtype)
    prompts = torch.tensor([plan_tokens(_FREE_PLAN[:P])] * _FREE_ROWS, device=check_device())
    kwargs = {"max_turns": 3, "max_new_tokens": length - P, "eos_token_id": EOS, "temperature": temperature}
    torch.manual_seed(1)
    got, _ = _candidate(candidate, policy, prompts, generator=torch.Generator(check_device()).manual_seed(5), **kwargs)
    tokens = expect_tensor(got["tokens"], shape=(_FREE_ROWS, length), dtype=torch.long, what=f"{where}: tokens")
    free = [t for t, piece in enumerate(_FREE_PLAN) if piece == FREE_MARK]
    fixed = [t for t in range(len(_FREE_PLAN)) if t not in free]
    want = torch.tensor(plan_tokens([p if p != FREE_MARK else "3" for p in _FREE_PLAN]), device=tokens.device)
    if not torch.equal(tokens[:, fixed].cpu(), want[fixed].expand(_FREE_ROWS, -1).cpu()):
        raise failure(f"{where}: the rows differ from the plan outside the free positions.",
                      "Every row here follows the same path: a call, its result, then four sampled digits.")
    digits = tokens[:, free].flatten().tolist()
    allowed = {_INDEX[d] for d in FREE}
    if not set(digits) <= allowed:
        raise failure(f"{where}: a token of probability ~0 was drawn at a free position.",
                      "Sample from softmax(logits / temperature) of the row's last position.")
    p, low, high = _free_share_band(temperature)
    share = digits.count(_INDEX["3"]) / len(digits)
    if not low <= share <= high:
        if share == 1.0:
            hint = "Every free draw was the likeliest token: the tokens must be sampled, not taken by argmax."
        else:
            hint = (f"The likeliest digit has probability {p:.3f} at temperature {temperature}: sample from "
                    "softmax(logits / temperature), the temperature applied before the softmax.")
        raise failure(f"{where}: the likeliest digit came out {share:.3f} of the time, expected about {p:.3f} "
                      f"(between {low:.3f} and {high:.3f}).", hint)
    expect_tensor(got["logprobs"], shape=(_FREE_ROWS, length), dtype=torch.float32, what=f"{where}: logprobs")
    start = _FREE_PLAN.index("</calc>") + 1
    mask = agent.policy_token_mask(tokens, P, [[(start, start + len(env(" = 24")))]] * _FREE_ROWS,
                                   torch.full((_FREE_ROWS,), len(_FREE_PLAN), device=tokens.device))
    got = {**got, "mask": mask}
    _check_logprobs(got, _recomputed_logprobs(policy, tokens, mask, temperature), where, ["the free rows"] * _FREE_ROWS)
    # the same generator seed, another global random state: the same rows
    torch.manual_seed(2)
    again, _ = _candidate(candidate, policy, prompts, generator=torch.Generator(check_device()).manual_seed(5), **kwargs)
    if not torch.equal(torch.as_tensor(again["tokens"]).cpu(), tokens.cpu()):
        raise failure(f"{where}: two runs with generators of the same seed gave other rows (the global random state "
                      "differed between them).",
                      "Draw every random number from the `generator` argument (the sampling functions take "
                      "generator=...), never from the global random state.")


@checker(
    "multi_turn_rollout",
    chapter=CHAPTER,
    hint=(
        "Advance every row one position at a time. At each position a row either samples (its own turn) or "
        "copies the next token of a tool text waiting to be written; after each sampled token, ask whether the "
        "row is done or its turn just closed a call.",
        "Keep per row: the start of its current turn, its turn number, the tool tokens still to write, whether "
        "it is done, its spans. Sample from softmax(policy logits at the last position / temperature) with the "
        "generator, and store the token's log-prob at the token's own position. A turn closes a call when "
        "decode(the turn's tokens) ends with CALL_CLOSE: in the last turn, or when encode(tool(turn text)) "
        "would run past the budget, the row ends there; else queue those ids and record their span. An EOS "
        "ends the row. Run it all under torch.no_grad(); build the mask with policy_token_mask.",
        "```python\nb, prompt_len = prompts.shape\ns = prompt_len + max_new_tokens\ndevice = prompts.device\n"
        "pad = eos_token_id if eos_token_id is not None else 0\ntokens = torch.full((b, s), pad, dtype=torch.long, "
        "device=device)\ntokens[:, :prompt_len] = prompts\nlogprobs = torch.zeros(b, s, device=device)\nlengths = "
        "[s] * b\nenv_spans = [[] for _ in range(b)]\nqueued = [[] for _ in range(b)]\nturn_start, turn = "
        "[prompt_len] * b, [1] * b\ndone = [False] * b\nwith torch.no_grad():\n    for t in range(prompt_len, s):\n"
        "        if any(not done[i] and not queued[i] for i in range(b)):\n            logits = policy(tokens[:, :t])"
        "[:, -1].float() / temperature\n            logp = logits.log_softmax(dim=-1)\n            drawn = "
        "torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)\n        for i in range(b):\n"
        "            if done[i]:\n                continue\n            if queued[i]:\n                tokens[i, t] = "
        "queued[i].pop(0)\n                turn_start[i] = t + 1\n                continue\n            token = "
        "int(drawn[i])\n            tokens[i, t] = token\n            logprobs[i, t] = logp[i, token]\n"
        "            turn_text = decode(tokens[i, turn_start[i] : t + 1].tolist())\n            if token == "
        "eos_token_id:\n                done[i], lengths[i] = True, t + 1\n            elif "
        "turn_text.endswith(CALL_CLOSE):\n                ids = list(encode(tool(turn_text))) if turn[i] < max_turns "
        "else []\n                if turn[i] >= max_turns or t + 1 + len(ids) > s:\n                    done[i], "
        "lengths[i] = True, t + 1\n                else:\n                    queued[i] = ids\n"
        "                    env_spans[i].append((t + 1, t + 1 + len(ids)))\n                    turn[i] += 1\n"
        "        if all(done):\n            break\nlengths_t = torch.tensor(lengths, dtype=torch.long, device=device)\n"
        "mask = policy_token_mask(tokens, prompt_len, env_spans, lengths_t)\nnum_calls = torch.tensor([len(x) for x "
        "in env_spans], dtype=torch.long, device=device)\nreturn AgentRollout(tokens, mask, logprobs, env_spans, "
        "lengths_t, num_calls, prompt_len)\n```",
    ),
)
def check_multi_turn_rollout(candidate) -> str:
    policy, prompts = _scenario_policy()
    labels = [label for label, _ in SCENARIOS]
    runs = [
        ("the scenarios (max_turns=3, EOS 1)", prompts, labels,
         {"max_turns": 3, "max_new_tokens": BUDGET, "eos_token_id": EOS}),
        ("the scenarios with max_turns=1 (every first call unanswered)", prompts, labels,
         {"max_turns": 1, "max_new_tokens": BUDGET, "eos_token_id": EOS, "temperature": 0.7}),
        ("the scenarios without an EOS token (a sampled EOS goes on, padding is 0)", prompts, labels,
         {"max_turns": 3, "max_new_tokens": BUDGET, "eos_token_id": None}),
        ("two scenarios, a budget of 12", prompts[[1, 7]], [labels[1], labels[7]],
         {"max_turns": 3, "max_new_tokens": 12, "eos_token_id": EOS}),
        ("one scenario alone (a batch of 1)", prompts[[4]], [labels[4]],
         {"max_turns": 3, "max_new_tokens": BUDGET, "eos_token_id": EOS}),
    ]
    for where, rows, row_labels, kwargs in runs:
        want, want_tools = _reference(policy, rows, generator=torch.Generator(check_device()).manual_seed(0), **kwargs)
        got, got_tools = _candidate(candidate, policy, rows, generator=torch.Generator(check_device()).manual_seed(0),
                                    **kwargs)
        _compare_rollouts(got, want, row_labels, where, got_tools, want_tools)
        _check_logprobs(got, want["logprobs"], where, row_labels)
    _check_sampling(candidate, 1.0, torch.bfloat16)
    _check_sampling(candidate, 0.5)
    return (f"matches the reference on {len(SCENARIOS)} scripted scenarios (" + "; ".join(labels) + ") under five "
            "settings, and samples 64 rows at temperatures 1.0 and 0.5 with the right distribution, log-probs "
            "and generator.")


# ----------------------------------------------------------------------------------------------------
# agent_reward
# ----------------------------------------------------------------------------------------------------


def _reward_cases() -> list[Case]:
    correct = torch.tensor([True, True, False, False, True, False, True])
    calls = torch.tensor([0, 1, 0, 3, 3, 1, 12])  # the last: right, but its calls cost more than 1
    return [
        Case("right and wrong answers, 0 to 12 calls, no cost (the default)", (correct, calls)),
        Case("a cost of 0.1 per call", (correct, calls), {"call_cost": 0.1}),
        Case("a cost of 0.25 per call", (correct, calls), {"call_cost": 0.25}),
        Case("a batch of 1", (torch.tensor([True]), torch.tensor([2])), {"call_cost": 0.5}),
        Case("an empty batch", (torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long)),
             {"call_cost": 0.1}),
    ]


@checker(
    "agent_reward",
    chapter=CHAPTER,
    hint=(
        "The chapter 07 reward, and a price for every call the environment answered.",
        "r_i = 1 when trajectory i's answer is right, else 0, minus call_cost times its number of calls; "
        "a wrong answer pays for its calls too. float32, shape [b].",
        "```python\nreturn correct.float() - call_cost * num_calls.to(correct.device).float()\n```",
    ),
)
def check_agent_reward(candidate) -> str:
    return compare_to_reference(candidate, agent.agent_reward, _reward_cases(), arg_names=["correct", "num_calls"],
                                mistakes=[
        Mistake("Only right answers paid for their calls: every trajectory pays call_cost per call.",
                lambda correct, num_calls, call_cost=0.0: correct.float() * (1 - call_cost * num_calls)),
        Mistake("The cost was paid once per trajectory that called: it is paid per call.",
                lambda correct, num_calls, call_cost=0.0: correct.float() - call_cost * (num_calls > 0).float()),
        Mistake("A wrong answer scored -1: it scores 0 before costs.",
                lambda correct, num_calls, call_cost=0.0: 2 * correct.float() - 1 - call_cost * num_calls),
        Mistake("The reward was floored at 0: a wrong answer that called goes below 0.",
                lambda correct, num_calls, call_cost=0.0: (correct.float() - call_cost * num_calls).clamp(min=0)),
    ])
