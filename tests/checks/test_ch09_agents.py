"""Checkers of chapter 09: the reference passes, the untouched stub fails, realistic wrong versions (written
out here, independently of the checker's catalogue) fail with a message naming the mistake, and correct code
written differently passes."""

import re

import pytest
import torch

from rlhf_tutorial import agent
from rlhf_tutorial.agent import CALL_CLOSE, CALL_OPEN, AgentRollout
from rlhf_tutorial.checks import ch09_agents as ch09
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.notebooks import load_stub
from tests.checks.helpers import assert_fails_with

EXERCISES = ["parse_tool_call", "safe_calculate", "policy_token_mask", "multi_turn_rollout", "agent_reward"]


@pytest.mark.parametrize("name", EXERCISES)
def test_reference_passes_and_untouched_stub_fails(name):
    assert run_check(name, getattr(agent, name)).passed
    result = run_check(name, load_stub("09_agents", name))
    assert not result.passed and "not implemented" in result.message, result.message


@pytest.mark.parametrize("name", EXERCISES)
def test_a_crash_or_a_missing_return_is_a_verdict(name):
    def crashes(*args, **kwargs):
        raise ValueError("oops")

    def forgets_return(*args, **kwargs):
        pass

    assert_fails_with(name, crashes, "ValueError: oops")
    result = run_check(name, forgets_return)
    assert not result.passed and "None" in result.message, result.message


def test_the_scripted_scenarios_are_what_the_reference_produces():
    """The checker's plans (prompt, policy tokens, the tool texts as encode writes them) are the trajectories
    the reference samples from the scripted policy: each scenario tests what its label says."""
    policy, prompts = ch09._scenario_policy()
    out = agent.multi_turn_rollout(policy, prompts, agent.calculator, ch09.encode, ch09.decode, 3, ch09.BUDGET,
                                   ch09.EOS, 1.0, torch.Generator(device=prompts.device).manual_seed(0))
    found = {}
    for i, (label, plan) in enumerate(ch09.SCENARIOS):
        got = [ch09.VOCAB[x] for x in out.tokens[i, : int(out.lengths[i])].tolist()]
        assert got == plan[: len(got)], label
        found[label] = (len(got), len(plan), int(out.num_calls[i]))
    assert found["one call, then the answer"][2] == 1
    assert found["two calls, the second closed by two tokens"][2] == 2
    assert found["calls up to max_turns = 3, the third unanswered"][:2] == (26, 27)  # ends after the 3rd call
    assert found["a call still open when the budget is spent"][0] == ch09.P + ch09.BUDGET
    length, planned, calls = found["a result one token too long for the budget"]
    assert calls == 0 and length == planned - 6 == ch09.P + ch09.BUDGET - 4  # its 5 tool tokens and EOS never come
    length, planned, calls = found["a result that fills the budget exactly"]
    assert calls == 1 and length == planned - 1 == ch09.P + ch09.BUDGET  # the tool text's last token ends the budget
    assert found["a closing tag alone right after the prompt"][2] == 1
    assert found["a prompt ending in '</', then 'calc>' (no call: the turn alone counts)"][2] == 0
    assert all(n == len(plan) for (n, _, _), (label, plan) in zip(found.values(), ch09.SCENARIOS)
               if "budget" not in label and "max_turns" not in label)


def test_the_test_tokenizer_is_not_canonical():
    """Re-tokenising a sampled text changes its tokens: "1", "2" become "12", "</", "calc>" become "</calc>"."""
    sampled = [ch09._INDEX[p] for p in ["<calc>", "1", "2", "+", "1", "</", "calc>"]]
    assert ch09.decode(sampled) == "<calc>12+1</calc>"
    assert ch09.encode(ch09.decode(sampled)) != sampled


# ----------------------------------------------------------------------------------------------------
# parse_tool_call
# ----------------------------------------------------------------------------------------------------
GRAMMAR = r" *[0-9]+(?: *[-+*/] *[0-9]+)* *"


def parse_scanner(generated):
    """Correct, no regular expression: walk the expression character by character."""
    if not generated.endswith("</calc>"):
        return None
    head = generated[: len(generated) - len("</calc>")]
    if "<calc>" not in head:
        return None
    expression = head.split("<calc>")[-1]
    want_operand, i = True, 0
    while i < len(expression):
        ch = expression[i]
        if ch == " ":
            i += 1
        elif want_operand and ch in "0123456789":
            while i < len(expression) and expression[i] in "0123456789":
                i += 1
            want_operand = False
        elif not want_operand and ch in "+-*/":
            want_operand, i = True, i + 1
        else:
            return None
    return None if want_operand else expression


def parse_search_at_end(generated):
    """Correct: one search anchored at the end of the text (the expression holds no '<', so the match opens at
    the last '<calc>')."""
    match = re.search(r"<calc>( *[0-9]+(?: *[-+*/] *[0-9]+)* *)</calc>\Z", generated)
    return match.group(1) if match else None


def parse_rstripped(generated):
    generated = generated.rstrip()
    if not generated.endswith("</calc>") or "<calc>" not in generated:
        return None
    expression = generated[:-7].rsplit("<calc>", 1)[1]
    return expression if re.fullmatch(GRAMMAR, expression) else None


def parse_first_open(generated):
    if not generated.endswith("</calc>") or "<calc>" not in generated:
        return None
    expression = generated[generated.find("<calc>") + 6 : -7]
    return expression if re.fullmatch(GRAMMAR, expression) else None


def parse_stripped(generated):
    if not generated.endswith("</calc>") or "<calc>" not in generated:
        return None
    expression = generated[:-7].rsplit("<calc>", 1)[1].strip()
    return expression if re.fullmatch(GRAMMAR, expression) else None


def parse_unicode_digits(generated):  # \d takes every script's digits
    match = re.search(r"<calc>( *\d+(?: *[-+*/] *\d+)* *)</calc>$", generated)
    return match.group(1) if match and generated.endswith("</calc>") else None


def parse_no_division(generated):
    match = re.search(r"<calc>( *[0-9]+(?: *[-+*] *[0-9]+)* *)</calc>\Z", generated)
    return match.group(1) if match else None


def parse_power_too(generated):
    match = re.search(r"<calc>( *[0-9]+(?: *(?:\*\*|//|[-+*/]) *[0-9]+)* *)</calc>\Z", generated)
    return match.group(1) if match else None


def parse_character_whitelist(generated):  # only the characters are checked, not their order
    if not generated.endswith("</calc>") or "<calc>" not in generated:
        return None
    expression = generated[:-7].rsplit("<calc>", 1)[1]
    ok = expression.strip() != "" and set(expression) <= set("0123456789+-*/ ")
    return expression if ok else None


def parse_any_whitespace(generated):
    match = re.search(r"<calc>(\s*[0-9]+(?:\s*[-+*/]\s*[0-9]+)*\s*)</calc>\Z", generated)
    return match.group(1) if match else None


def parse_star_operands(generated):  # [0-9]* where one digit at least is needed
    match = re.search(r"<calc>( *[0-9]*(?: *[-+*/] *[0-9]+)* *)</calc>\Z", generated)
    return match.group(1) if match else None


def parse_six_digits(generated):
    match = re.search(r"<calc>( *[0-9]{1,6}(?: *[-+*/] *[0-9]{1,6})* *)</calc>\Z", generated)
    return match.group(1) if match else None


def parse_empty_string(generated):
    match = re.search(r"<calc>( *[0-9]+(?: *[-+*/] *[0-9]+)* *)</calc>\Z", generated)
    return match.group(1) if match else ""


def test_parse_tool_call_accepts_correct_versions_written_differently():
    for version in (parse_scanner, parse_search_at_end):
        result = run_check("parse_tool_call", version)
        assert result.passed, f"{version.__name__}: {result.message}"


def test_parse_tool_call_names_the_mistakes():
    assert_fails_with("parse_tool_call", parse_stripped, "exactly as written")
    assert_fails_with("parse_tool_call", parse_rstripped, "very last characters")
    assert_fails_with("parse_tool_call", parse_first_open, "last one before the closing tag")
    assert_fails_with("parse_tool_call", parse_any_whitespace, "plain space")
    assert_fails_with("parse_tool_call", parse_six_digits, "any length")
    for version in (parse_unicode_digits, parse_no_division, parse_power_too, parse_character_whitelist,
                    parse_star_operands, parse_empty_string):
        assert not run_check("parse_tool_call", version).passed, version.__name__


# ----------------------------------------------------------------------------------------------------
# safe_calculate
# ----------------------------------------------------------------------------------------------------


def calc_recursive_descent(expression):
    """Correct, written differently: a recursive-descent parser over a list of tokens, errors as exceptions of
    its own turned into text at the end."""

    class Bad(Exception):
        pass

    def bounded(x):
        if abs(x) >= 10**12:
            raise Bad("error: out of range")
        return x

    if not re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression):
        return "error: syntax"
    toks = expression.replace(" ", "")
    items, i = [], 0
    while i < len(toks):
        j = i
        while j < len(toks) and toks[j].isdigit():
            j += 1
        if j > i:
            if j - i > 6:
                return "error: number too long"
            items.append(int(toks[i:j]))
            i = j
        else:
            items.append(toks[i])
            i += 1

    def term(pos):
        value = items[pos]
        pos += 1
        while pos < len(items) and items[pos] in ("*", "/"):
            op, rhs = items[pos], items[pos + 1]
            if op == "*":
                value = value * rhs
            else:
                if rhs == 0 or value % rhs != 0:
                    raise Bad("error: bad division")
                value = value // rhs
            bounded(value)
            pos += 2
        return value, pos

    try:
        total, pos = term(0)
        while pos < len(items):
            op = items[pos]
            rhs, pos = term(pos + 1)
            total = bounded(total + rhs if op == "+" else total - rhs)
        return str(total)
    except Bad as bad:
        return str(bad)


def calc_two_stacks(expression):
    """Correct, written differently: shunting-yard with two stacks (a pending + or - waits for its term)."""
    if not re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression):
        return "error: not an expression"
    tokens = re.findall(r"[0-9]+|[-+*/]", expression)
    if any(t.isdigit() and len(t) > 6 for t in tokens):
        return "error: operand too long"
    values, ops = [int(tokens[0])], []
    limit = 10**12
    for op, num in zip(tokens[1::2], tokens[2::2]):
        x = int(num)
        if op in "*/":
            if op == "*":
                values[-1] *= x
            elif x == 0:
                return "error: division by zero"
            elif values[-1] % x:
                return "error: inexact division"
            else:
                values[-1] //= x
            if abs(values[-1]) >= limit:
                return "error: overflow"
        else:
            if ops:  # fold the finished term into the running sum first
                right, left = values.pop(), values.pop()
                values.append(left + right if ops.pop() == "+" else left - right)
                if abs(values[-1]) >= limit:
                    return "error: overflow"
            ops.append(op)
            values.append(x)
    if ops:
        right, left = values.pop(), values.pop()
        values.append(left + right if ops.pop() == "+" else left - right)
    return "error: overflow" if abs(values[-1]) >= limit else str(values[-1])


def _tokens(expression):
    return re.findall(r"[0-9]+|[-+*/]", expression)


def _evaluate(tokens, *, exact=True, bound_parts=True, inclusive=False, zero_divisor_gives_zero=False):
    """Sum of terms, each a left-to-right chain of * and /; the variations below switch one rule."""
    def too_big(x):
        return abs(x) > 10**12 if inclusive else abs(x) >= 10**12

    total, sign, term = 0, 1, int(tokens[0])
    for op, x in zip(tokens[1::2], tokens[2::2]):
        x = int(x)
        if op == "*":
            term *= x
        elif op == "/":
            if x == 0:
                if zero_divisor_gives_zero:
                    term = 0
                    continue
                return "error: division by zero"
            if exact and term % x:
                return "error: remainder"
            term //= x
        else:
            total += sign * term
            if bound_parts and too_big(total):
                return "error: too large"
            sign, term = (1 if op == "+" else -1), x
        if bound_parts and too_big(term):
            return "error: too large"
    total += sign * term
    return "error: too large" if too_big(total) else str(total)


def _valid(expression):
    return re.fullmatch(r" *[0-9]+(?: *[-+*/] *[0-9]+)* *", expression) is not None


def calc_with_eval(expression):
    if not _valid(expression) or any(len(t) > 6 for t in _tokens(expression) if t.isdigit()):
        return "error: invalid"
    try:
        value = eval(expression.replace("/", "//"))  # noqa: S307 - the wrong version under test
    except ZeroDivisionError:
        return "error: division by zero"
    return "error: too large" if abs(value) >= 10**12 else str(value)


def calc_no_grammar_check(expression):  # the pieces are found anywhere, whatever stands between them
    tokens = _tokens(expression)
    if not tokens or any(len(t) > 6 for t in tokens if t.isdigit()):
        return "error: invalid"
    try:
        return _evaluate(tokens)
    except (ValueError, IndexError):
        return "error: invalid"


def calc_left_to_right(expression):
    if not _valid(expression):
        return "error: invalid"
    tokens = _tokens(expression)
    if any(len(t) > 6 for t in tokens if t.isdigit()):
        return "error: operand too long"
    value = int(tokens[0])
    for op, x in zip(tokens[1::2], tokens[2::2]):
        x = int(x)
        if op == "/" and (x == 0 or value % x):
            return "error: division"
        value = {"+": value + x, "-": value - x, "*": value * x, "/": value // x if x else 0}[op]
        if abs(value) >= 10**12:
            return "error: too large"
    return str(value)


def calc_right_recursive(expression):  # expr := term (op expr)?: a - b - c becomes a - (b - c)
    if not _valid(expression):
        return "error: invalid"
    tokens = _tokens(expression)
    if any(len(t) > 6 for t in tokens if t.isdigit()):
        return "error: operand too long"

    def expr(ts):
        for k in range(1, len(ts), 2):
            if ts[k] in "+-":
                left, right = _evaluate(ts[:k]), expr(ts[k + 1 :])
                if left.startswith("error") or right.startswith("error"):
                    return left if left.startswith("error") else right
                value = int(left) + int(right) if ts[k] == "+" else int(left) - int(right)
                return "error: too large" if abs(value) >= 10**12 else str(value)
        return _evaluate(ts)

    return expr(tokens)


def _grammar_then(**rules):
    def fn(expression):
        if not _valid(expression):
            return "error: invalid"
        tokens = _tokens(expression)
        if any(len(t) > 6 for t in tokens if t.isdigit()):
            return "error: operand too long"
        return _evaluate(tokens, **rules)

    return fn


calc_floor_division = _grammar_then(exact=False)
calc_final_bound_only = _grammar_then(bound_parts=False)
calc_inclusive_bound = _grammar_then(inclusive=True)
calc_zero_divisor_gives_zero = _grammar_then(zero_divisor_gives_zero=True)


def calc_value_bound(expression):  # bounds the operand's value, not its digits as written
    if not _valid(expression):
        return "error: invalid"
    tokens = _tokens(expression)
    if any(t.isdigit() and int(t) > 999999 for t in tokens):
        return "error: operand too large"
    return _evaluate(tokens)


def calc_int_first(expression):  # int() of every operand before the size check: int refuses 5000 digits
    if not _valid(expression):
        return "error: invalid"
    tokens = _tokens(expression)
    numbers = [int(t) for t in tokens if t.isdigit()]
    if any(len(str(n)) > 6 for n in numbers) or any(len(t) > 6 for t in tokens if t.isdigit()):
        return "error: operand too large"
    return _evaluate(tokens)


def calc_negative_is_error(expression):
    out = agent.safe_calculate(expression)
    return "error: negative result" if out.startswith("-") else out


def calc_no_spaces(expression):
    if re.fullmatch(r"[0-9]+(?:[-+*/][0-9]+)*", expression) is None:
        return "error: invalid"
    return agent.safe_calculate(expression)


def calc_raises(expression):
    if not _valid(expression):
        raise ValueError(f"not an expression: {expression!r}")
    return agent.safe_calculate(expression)


def calc_returns_int(expression):
    out = agent.safe_calculate(expression)
    return out if out.startswith("error") else int(out)


def calc_true_division(expression):  # "/" of Python: 84/2 is 42.0
    if not _valid(expression):
        return "error: invalid"
    tokens = _tokens(expression)
    if any(len(t) > 6 for t in tokens if t.isdigit()):
        return "error: operand too long"
    total, sign, term = 0, 1, int(tokens[0])
    for op, x in zip(tokens[1::2], tokens[2::2]):
        x = int(x)
        if op == "*":
            term *= x
        elif op == "/":
            if x == 0 or term % x:
                return "error: division"
            term = term / x
        else:
            total, sign, term = total + sign * term, (1 if op == "+" else -1), x
        if abs(term) >= 10**12 or abs(total) >= 10**12:
            return "error: too large"
    total += sign * term
    return "error: too large" if abs(total) >= 10**12 else str(total)


def test_safe_calculate_accepts_correct_versions_written_differently():
    for version in (calc_recursive_descent, calc_two_stacks):
        result = run_check("safe_calculate", version)
        assert result.passed, f"{version.__name__}: {result.message}"


def test_safe_calculate_names_the_mistakes():
    assert_fails_with("safe_calculate", calc_with_eval, "calls `eval`")
    assert_fails_with("safe_calculate", calc_floor_division, "rounded down")
    assert_fails_with("safe_calculate", calc_final_bound_only, "on the way")
    assert_fails_with("safe_calculate", calc_inclusive_bound, "strict")
    assert_fails_with("safe_calculate", calc_value_bound, "as written")
    assert_fails_with("safe_calculate", calc_left_to_right, "come before")
    assert_fails_with("safe_calculate", calc_negative_is_error, "'-7'")
    assert_fails_with("safe_calculate", calc_raises, "never raise")
    assert_fails_with("safe_calculate", calc_int_first, "never raise")
    assert_fails_with("safe_calculate", calc_returns_int, "a str")


def test_safe_calculate_sees_eval_called_through_a_helper_and_at_run_time():
    def helper(text):
        return eval(text)  # noqa: S307 - the wrong version under test

    def through_helper(expression):
        return calc_two_stacks(expression) if not expression.startswith("1") else str(helper("1"))

    builtins_eval = __builtins__["eval"] if isinstance(__builtins__, dict) else __builtins__.eval
    namespace = {"evaluate": builtins_eval, "calc": calc_two_stacks}
    exec("def hidden(expression):\n    return calc(expression) if expression != '12+30' else str(evaluate('12+30'))",
         namespace)
    assert_fails_with("safe_calculate", through_helper, "`eval`")
    assert_fails_with("safe_calculate", namespace["hidden"], "`eval`")


# ----------------------------------------------------------------------------------------------------
# policy_token_mask
# ----------------------------------------------------------------------------------------------------


def mask_loops(tokens, prompt_len, env_spans, lengths):
    """Correct, written differently: position by position."""
    b, s = tokens.shape
    mask = torch.zeros(b, s, dtype=torch.bool, device=tokens.device)
    for i in range(b):
        env = {t for start, end in env_spans[i] for t in range(start, end)}
        for t in range(prompt_len, int(lengths[i])):
            mask[i, t] = t not in env
    return mask


def mask_vectorised(tokens, prompt_len, env_spans, lengths):
    """Correct, written differently: every span as a comparison with the positions, no in-place writes."""
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    rows = []
    for i, spans in enumerate(env_spans):
        keep = (positions >= prompt_len) & (positions < lengths[i].to(tokens.device))
        for start, end in spans:
            keep = keep & ~((positions >= start) & (positions < end))
        rows.append(keep)
    return torch.stack(rows)


def _mask(tokens, prompt_len, env_spans, lengths, *, first=None, span=lambda a, b: (a, b), end=None,
          spans_of=lambda spans, i: spans[i], values=False):
    b, s = tokens.shape
    mask = torch.zeros(b, s, dtype=torch.bool)
    for i in range(b):
        stop = int(lengths[i]) if end is None else end(int(lengths[i]))
        mask[i, (prompt_len if first is None else first(prompt_len)) : stop] = True
        for a, z in spans_of(env_spans, i):
            a, z = span(a, z)
            mask[i, max(a, 0) : z] = False
        if values:
            mask[i] &= tokens[i] != 0
    return mask


def mask_prompt_included(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, first=lambda p: 0)


def mask_prompt_last_included(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, first=lambda p: p - 1)


def mask_first_sampled_dropped(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, first=lambda p: p + 1)


def mask_env_left_in(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, spans_of=lambda spans, i: [])


def mask_span_inclusive_end(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, span=lambda a, z: (a, z + 1))


def mask_span_start_kept(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, span=lambda a, z: (a + 1, z))


def mask_padding_in(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, end=lambda n: tokens.shape[1])


def mask_last_dropped(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, end=lambda n: n - 1)


def mask_first_row_spans(tokens, prompt_len, env_spans, lengths):
    return _mask(tokens, prompt_len, env_spans, lengths, spans_of=lambda spans, i: spans[0])


def mask_by_value(tokens, prompt_len, env_spans, lengths):  # the pad value decides where padding is
    return _mask(tokens, prompt_len, env_spans, lengths, values=True)


def mask_long(tokens, prompt_len, env_spans, lengths):
    return agent.policy_token_mask(tokens, prompt_len, env_spans, lengths).long()


def mask_in_place(tokens, prompt_len, env_spans, lengths):
    for i, spans in enumerate(env_spans):
        for start, end in spans:
            tokens[i, start:end] = -1  # marks the environment's tokens in the caller's tensor
    return agent.policy_token_mask(tokens, prompt_len, env_spans, lengths)


def test_policy_token_mask_accepts_correct_versions_written_differently():
    for version in (mask_loops, mask_vectorised):
        result = run_check("policy_token_mask", version)
        assert result.passed, f"{version.__name__}: {result.message}"


def test_policy_token_mask_names_the_mistakes():
    assert_fails_with("policy_token_mask", mask_prompt_last_included, "prompt's last position")
    assert_fails_with("policy_token_mask", mask_first_sampled_dropped, "first token the policy sampled")
    assert_fails_with("policy_token_mask", mask_span_inclusive_end, "half-open")
    assert_fails_with("policy_token_mask", mask_span_start_kept, "position start too")
    assert_fails_with("policy_token_mask", mask_last_dropped, "lengths[i] is exclusive")
    assert_fails_with("policy_token_mask", mask_first_row_spans, "belongs to row i")
    assert_fails_with("policy_token_mask", mask_by_value, "pad-valued token")
    assert_fails_with("policy_token_mask", mask_in_place, "in place")
    assert_fails_with("policy_token_mask", mask_long, "dtype")
    for version in (mask_prompt_included, mask_env_left_in, mask_padding_in):
        assert not run_check("policy_token_mask", version).passed, version.__name__


# ----------------------------------------------------------------------------------------------------
# multi_turn_rollout: one learner's version, row by row (correct), and the same with one slip each
# ----------------------------------------------------------------------------------------------------


def _rollout_row_by_row(policy, prompts, tool, encode, decode, max_turns, max_new_tokens, eos_token_id=None,
                        temperature=1.0, generator=None, *, bug=None):
    """Each row sampled on its own, a whole tool text appended at once; ``bug`` names one slip."""
    b, prompt_len = prompts.shape
    width = prompt_len + max_new_tokens
    pad = 0 if bug == "pad_zero" else (eos_token_id if eos_token_id is not None else 0)
    stop_token = eos_token_id if eos_token_id is not None else (0 if bug == "none_is_zero" else None)
    rows, row_logps, all_spans, ends, calls = [], [], [], [], []
    turn = 1
    for i in range(b):
        seq, logps, spans, n_calls = prompts[i].tolist(), [0.0] * prompt_len, [], 0
        if bug != "shared_turns":
            turn = 1
        start, end = prompt_len, None
        while len(seq) < width:
            context = torch.tensor([seq], device=prompts.device)
            if bug == "with_grad":
                logits = policy(context)[0, -1].float()
            else:
                with torch.no_grad():
                    logits = policy(context)[0, -1]
                    logits = logits if bug == "no_float" else logits.float()
            draw_t = 1.0 if bug == "sample_t1" else temperature
            probs = torch.softmax(logits / draw_t, dim=-1)
            if bug == "greedy":
                token = int(probs.argmax())
            elif bug == "global_rng":
                token = int(torch.multinomial(probs, 1))
            else:
                token = int(torch.multinomial(probs, 1, generator=generator))
            logp = torch.log_softmax(logits / (1.0 if bug == "logprob_t1" else temperature), dim=-1)[token]
            seq.append(token)
            logps.append(logp if bug == "with_grad" else float(logp))
            if stop_token is not None and token == stop_token:
                end = len(seq) - 1 if bug == "eos_dropped" else len(seq)
                break
            first = {"turn_off_by_one": start - 1 if start > prompt_len else start, "whole_text": prompt_len}
            turn_text = decode(seq[first.get(bug, start):])
            closed = decode([token]) == CALL_CLOSE if bug == "token_close" else turn_text.endswith(CALL_CLOSE)
            if not closed:
                continue
            if (turn > max_turns) if bug == "answers_last_turn" else (turn >= max_turns):
                n_calls += bug == "counts_unanswered"
                end = len(seq)
                break
            ids = list(encode(tool(turn_text)))
            if len(seq) + len(ids) > width:
                if bug != "truncates_result":
                    n_calls += bug == "counts_unanswered"
                    end = len(seq)
                    break
                ids = ids[: width - len(seq)]
            if bug == "retokenise":
                text = decode(seq[prompt_len:]) + tool(turn_text)
                seq = seq[:prompt_len] + list(encode(text))
                logps = (logps + [0.0] * len(seq))[: len(seq)]
            else:
                at = len(seq) + (1 if bug == "span_off_by_one" else 0)
                spans.append((at, at + len(ids)))
                if bug != "not_appended":
                    seq += ids
                    logps += [0.0] * len(ids)
            n_calls += 1
            turn += 1
            start = len(seq)
        if end is None:
            end = len(seq)
            if bug == "counts_open_call" and CALL_OPEN in decode(seq[start:]):
                tool(decode(seq[start:]))
                n_calls += 1
        rows.append(seq)
        row_logps.append(logps)
        all_spans.append(spans)
        ends.append(end)
        calls.append(n_calls)
    width_out = max(len(r) for r in rows) if bug == "budget_sampled_only" else width
    tokens = torch.full((b, width_out), pad, dtype=torch.long, device=prompts.device)
    logprobs = torch.zeros(b, width_out, device=prompts.device)
    mask = torch.zeros(b, width_out, dtype=torch.bool, device=prompts.device)
    for i, (seq, logps, spans, end) in enumerate(zip(rows, row_logps, all_spans, ends)):
        tokens[i, : len(seq)] = torch.tensor(seq[:width_out])
        mask[i, (0 if bug == "prompt_in_mask" else prompt_len) : (width_out if bug == "padding_in_mask" else end)] = True
        if bug != "env_in_mask":
            for a, z in spans:
                mask[i, a:z] = False
        for t in range(prompt_len, end):
            if mask[i, t] or bug == "env_in_mask":
                where = t - 1 if bug == "logprob_shift" else t
                logprobs[i, where] = logps[t]
    return AgentRollout(tokens, mask, logprobs, all_spans, torch.tensor(ends, device=prompts.device),
                        torch.tensor(calls, device=prompts.device), prompt_len)


def rollout_with(bug):
    def multi_turn_rollout(policy, prompts, tool, encode, decode, max_turns, max_new_tokens, eos_token_id=None,
                           temperature=1.0, generator=None):
        return _rollout_row_by_row(policy, prompts, tool, encode, decode, max_turns, max_new_tokens, eos_token_id,
                                   temperature, generator, bug=bug)

    multi_turn_rollout.__name__ = f"rollout_{bug}"
    return multi_turn_rollout


rollout_row_by_row = rollout_with(None)


def rollout_budget_sampled_only(policy, prompts, tool, encode, decode, max_turns, max_new_tokens, eos_token_id=None,
                                temperature=1.0, generator=None):
    """max_new_tokens spent on sampled tokens only: the tool's tokens come on top."""
    return _rollout_row_by_row(policy, prompts, tool, encode, decode, max_turns,
                               max_new_tokens + 8 * max_turns, eos_token_id, temperature, generator)


def test_multi_turn_rollout_accepts_a_version_written_row_by_row():
    result = run_check("multi_turn_rollout", rollout_row_by_row)
    assert result.passed, result.message


def test_multi_turn_rollout_names_the_mistakes():
    assert_fails_with("multi_turn_rollout", rollout_with("retokenise"), "re-tokenised")
    assert_fails_with("multi_turn_rollout", rollout_with("env_in_mask"), "mask")
    assert_fails_with("multi_turn_rollout", rollout_with("span_off_by_one"), "env_spans")
    assert_fails_with("multi_turn_rollout", rollout_with("logprob_shift"), "one position off")
    assert_fails_with("multi_turn_rollout", rollout_with("global_rng"), "generator")
    assert_fails_with("multi_turn_rollout", rollout_with("greedy"), "argmax")
    assert_fails_with("multi_turn_rollout", rollout_with("with_grad"), "graph")
    assert_fails_with("multi_turn_rollout", rollout_with("whole_text"), "text of the current turn")
    assert_fails_with("multi_turn_rollout", rollout_with("counts_open_call"), "num_calls")


# ----------------------------------------------------------------------------------------------------
# agent_reward
# ----------------------------------------------------------------------------------------------------


def reward_where(correct, num_calls, call_cost=0.0):
    """Correct, written differently."""
    base = torch.where(correct, torch.ones(correct.shape, device=correct.device), torch.zeros(correct.shape, device=correct.device))
    return base - num_calls * torch.tensor(call_cost, dtype=torch.float32)


def reward_cost_if_correct(correct, num_calls, call_cost=0.0):
    return torch.where(correct, 1.0 - call_cost * num_calls.float(), torch.zeros(correct.shape))


def reward_cost_per_trajectory(correct, num_calls, call_cost=0.0):
    return correct.float() - call_cost * (num_calls > 0).float()


def reward_plus_minus(correct, num_calls, call_cost=0.0):
    return correct.float() * 2 - 1 - call_cost * num_calls.float()


def reward_floored(correct, num_calls, call_cost=0.0):
    return (correct.float() - call_cost * num_calls.float()).clamp(min=0.0)


def reward_fixed_cost(correct, num_calls, call_cost=0.1):
    return correct.float() - 0.1 * num_calls.float()


def reward_float64(correct, num_calls, call_cost=0.0):
    return correct.double() - call_cost * num_calls.double()


def test_agent_reward_accepts_a_version_written_differently_and_names_the_mistakes():
    assert run_check("agent_reward", reward_where).passed
    assert_fails_with("agent_reward", reward_cost_if_correct, "every trajectory pays")
    assert_fails_with("agent_reward", reward_cost_per_trajectory, "per call")
    assert_fails_with("agent_reward", reward_plus_minus, "-1")
    assert_fails_with("agent_reward", reward_floored, "below 0")
    assert_fails_with("agent_reward", reward_float64, "float64")


VIOLATIONS = {
    "parse_tool_call": {
        "ends_with_close": [parse_rstripped],
        "last_open": [parse_first_open],
        "as_written": [parse_stripped],
        "ascii_digits": [parse_unicode_digits],
        "four_operators": [parse_no_division, parse_power_too],
        "operators_between": [parse_character_whitelist],
        "plain_spaces": [parse_any_whitespace],
        "not_empty": [parse_star_operands],
        "any_length": [parse_six_digits],
        "none_otherwise": [parse_empty_string],
    },
    "safe_calculate": {
        "no_eval": [calc_with_eval],
        "grammar": [calc_no_grammar_check],
        "precedence": [calc_left_to_right],
        "left_to_right": [calc_right_recursive],
        "exact_division": [calc_floor_division, calc_true_division],
        "division_by_zero": [calc_zero_divisor_gives_zero],
        "operand_digits": [calc_value_bound, calc_int_first],
        "partial_values": [calc_final_bound_only],
        "result_bound": [calc_inclusive_bound],
        "negative_results": [calc_negative_is_error],
        "spaces": [calc_no_spaces],
        "never_raises": [calc_raises],
        "decimal_text": [calc_returns_int, calc_true_division],
    },
    "policy_token_mask": {
        "prompt_false": [mask_prompt_included, mask_prompt_last_included],
        "first_sampled_true": [mask_first_sampled_dropped],
        "env_false": [mask_env_left_in],
        "span_half_open": [mask_span_inclusive_end, mask_span_start_kept],
        "padding_false": [mask_padding_in],
        "last_token_true": [mask_last_dropped],
        "own_spans": [mask_first_row_spans],
        "values_ignored": [mask_by_value],
        "bool": [mask_long],
        "inputs_unchanged": [mask_in_place],
    },
    "multi_turn_rollout": {
        "result_appended": [rollout_with("not_appended")],
        "token_ids_kept": [rollout_with("retokenise")],
        "turn_text": [rollout_with("whole_text"), rollout_with("turn_off_by_one")],
        "env_spans": [rollout_with("span_off_by_one")],
        "closed_by_text": [rollout_with("token_close")],
        "eos_ends": [rollout_with("eos_dropped")],
        "no_eos": [rollout_with("none_is_zero")],
        "max_turns": [rollout_with("answers_last_turn")],
        "open_call_at_budget": [rollout_with("counts_open_call")],
        "result_must_fit": [rollout_with("truncates_result")],
        "budget": [rollout_budget_sampled_only],
        "padding": [rollout_with("pad_zero")],
        "mask": [rollout_with("env_in_mask"), rollout_with("prompt_in_mask"), rollout_with("padding_in_mask")],
        "logprobs_aligned": [rollout_with("logprob_shift")],
        "temperature": [rollout_with("sample_t1"), rollout_with("logprob_t1")],
        "float32": [rollout_with("no_float")],
        "sampled": [rollout_with("greedy")],
        "generator": [rollout_with("global_rng")],
        "no_graph": [rollout_with("with_grad")],
        "counts": [rollout_with("counts_unanswered")],
        "rows_independent": [rollout_with("shared_turns")],
    },
    "agent_reward": {
        "correct_one": [reward_plus_minus],
        "cost_per_call": [reward_cost_per_trajectory],
        "cost_always": [reward_cost_if_correct, reward_floored],
        "default_no_cost": [reward_fixed_cost],
        "float32": [reward_float64],
    },
}
