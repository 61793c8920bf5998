"""Checkers for chapter 07: reasoning with verifiable rewards.

Regimes probed (where plausible implementations differ):
- extract_answer: two answer lines (the last wins, and text after it is ignored), a negative answer,
  ``Answer:`` with text after the number on the same line, no space / several spaces after the colon,
  trailing spaces, an indented or lower-case ``answer:`` line, ``+7``, ``1_000`` and ``1.5`` (``int()``
  accepts the first two), digits of another script after a real answer (``\\d`` matches them and
  ``int()`` reads them), whitespace that is not the plain space (a tab, a no-break space, ``\\r`` of
  ``\\r\\n`` endings: ``\\s`` and ``int()`` take them all), line breaks other than ``\\n`` (form feed,
  U+2028: ``splitlines()`` breaks there), ``Answer:`` on one line and the number on the next, ``Answer:``
  with no digit after a real answer, a number in the working before the answer line, no answer at all,
  an empty completion, and the return type (a Python int, never a str, float or bool);
- verifiable_reward: right, wrong and missing answers, a missing answer when the true answer is 0
  (None must not count as 0), negative answers, two answer lines, an empty batch, a batch of 1; dtype
  float32;
- sft_loss: rows of very different completion lengths (one mean over tokens, not a mean of per-row
  means), a prompt-only row (no True: a per-row mean is 0 / 0 there), prompt and padding to mask, an
  all-True mask (``loss_mask[:, 0]`` must be ignored, in the sum and in the count), large logits (x60:
  log(softmax) underflows), a batch of 1, a mask with no True at all (0.0: a count not clamped gives
  0 / 0 = NaN); then the gradient w.r.t. the logits on a seeded case, against
  the reference's (a detached or no_grad output, or a detached input, is named);
- pass_at_k: k = 1, k = n, c = 0, c = n, n - c == k (one all-wrong subset: not yet 1.0), n - c < k, then
  a sweep of the contract's whole range in order of n (n from 2 to 1024, c and k at the edges, in between
  and around n - c = k; k = 1000 factors: no recursion k deep), compared with the exact estimator
  (rational arithmetic) to float64 precision (relative 1e-9: float32 fails; factorials overflow a float
  from 171!, int64 products wrap from n = 21; binomials in floats are exact up to n = 1029, beyond the
  contract);
- select_correct: a cap per prompt (not over the batch), the first correct samples of a prompt (not the
  last), a prompt with none and one with all correct, a cap of 1, one above G and one of 0 (nothing kept:
  0 is no "None"), no correct sample at all (an empty int64 result), one prompt, one kept sample (still
  1-D); inputs never modified (``call``);
- best_of_n_kl: n = 1 (0.0), 2, 3, 16 and 1024 (log(n) alone, the integral's first term, is not the value).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import torch

from rlhf_tutorial import reasoning
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    checker,
    compare_to_reference,
    describe_exception,
    expect_tensor,
    failure,
    fmt,
    seeded,
    to_device,
)

CHAPTER = "07_reasoning"

#: Each exercise's contract (its CURRICULUM.md row and its docstring), clause by clause; the checker
#: tests write a version breaking each one (tests/checks/test_contract_clauses.py holds the two together).
CLAUSES = {
    "extract_answer": {
        "split_on_newline": "the completion is split on '\\n' only: a '\\r', a form feed or a Unicode line "
                            "separator is no line break",
        "exact_prefix": "an answer line starts with 'Answer:' exactly: capital A, no indentation, no other wording",
        "spaces_optional": "after the colon any number of plain spaces, none included ('Answer:2', 'Answer:    -30')",
        "plain_spaces_only": "only the plain space counts: a tab, a non-breaking space, a '\\r' is no space, "
                             "before or after the number",
        "minus_only": "an optional '-' before the digits; no '+', no space between sign and digits",
        "ascii_digits": "one or more ASCII digits 0-9 (no other script's digits, no '_', no decimal point); "
                        "'Answer:' with no digit is no answer line and changes nothing",
        "trailing_spaces": "optional trailing spaces after the number are allowed",
        "nothing_else": "nothing else on the line: 'Answer: 25 apples' is no answer",
        "one_line_each": "each line is judged on its own: 'Answer:' and a number on the next line is no answer",
        "last_line_wins": "among the answer lines the last one wins (a solution may correct itself)",
        "anywhere": "the answer line may stand anywhere: text after it is ignored",
        "none_when_absent": "None when no line has the form (not 0, not the last number of the text)",
        "python_int": "the answer is returned as a Python int (never a str, a float or a bool)",
    },
    "verifiable_reward": {
        "strict_parser": "the answer is read by the strict extract_answer, not a lenient reading",
        "own_answer": "completion i is compared with answers[i], its own problem's answer",
        "missing_is_wrong": "a completion with no answer line gets 0.0, even when the true answer is 0",
        "int_comparison": "the parsed int is compared with the int answer (not as text)",
        "binary": "1.0 for right, 0.0 for wrong (no -1)",
        "float32_tensor": "a float32 torch tensor (not a list, not float64 or bool)",
        "shape": "shape [len(completions)]: an empty batch gives an empty tensor, a batch of 1 a tensor of one",
    },
    "sft_loss": {
        "shifted": "logits[:, t - 1] predicts token t (the logits are shifted by one against the tokens)",
        "mask_aligned": "loss_mask[:, t] selects the prediction of token t, not of token t + 1",
        "masked_only": "only the positions where loss_mask is True count (the prompt and padding are masked)",
        "first_column_ignored": "loss_mask[:, 0] is ignored, in the sum and in the count",
        "one_mean_over_tokens": "one mean over every masked token of the batch, not a mean of per-row means",
        "mean_not_sum": "a mean (divided by the number of masked tokens), not a sum",
        "negative_log_likelihood": "minus the log-likelihood: a loss to minimise",
        "empty_mask_zero": "a batch with no masked token gives 0.0, not 0 / 0",
        "stable": "large logits give finite losses (log-softmax, not log of softmax)",
        "differentiable": "differentiable in logits with the right gradient (no detach, no no_grad, no .item())",
        "scalar": "a 0-d tensor (a scalar), not a Python float or a tensor of shape [1]",
        "inputs_unchanged": "the inputs are not modified in place (the mask and the tokens are the caller's)",
    },
    "pass_at_k": {
        "without_replacement": "the unbiased estimator 1 - C(n - c, k) / C(n, k) (k of the n drawn without "
                               "replacement), not 1 - (1 - c / n) ** k",
        "complement": "the chance that at least one of the k is correct: one minus the all-wrong chance",
        "uses_k": "k is honoured: pass@k is c / n only at k = 1",
        "one_when_n_minus_c_below_k": "1.0 when n - c < k (every k-subset holds a correct sample)",
        "below_one_at_equality": "below 1.0 when n - c == k (one k-subset is all wrong)",
        "no_overflow_to_1024": "exact for n up to 1024, k up to n: no float overflow of factorials or "
                               "binomials, no int64 wrap, no recursion k levels deep",
        "float64_precision": "to float64 precision (relative 1e-9): float32 arithmetic is not enough",
        "python_float": "a Python float is returned (not a tensor, not a Fraction)",
    },
    "select_correct": {
        "correct_only": "only the samples with reward 1.0 are kept",
        "cap_per_prompt": "max_per_prompt caps each prompt's kept samples separately, not the whole batch",
        "cap_honoured": "max_per_prompt is honoured (not ignored)",
        "zero_is_a_cap": "max_per_prompt=0 is a cap of 0 (nothing kept), not 'no cap' like None",
        "none_keeps_all": "max_per_prompt=None keeps every correct sample",
        "first_kept": "of each prompt its FIRST correct samples are kept, not its last",
        "flat_indices": "flat indices i * G + j (the order of rewards.flatten()), not column indices or pairs",
        "increasing": "the indices in increasing order",
        "one_dim": "a 1-D tensor even with one kept sample or none (an empty int64 tensor)",
        "int64": "int64 indices (not int32, not float)",
        "inputs_unchanged": "the rewards are not modified in place",
    },
    "best_of_n_kl": {
        "closed_form": "the integral evaluated exactly: the closed form in n (not log n, not its large-n limit)",
        "natural_log": "in nats: natural logarithms, not bits",
        "sign": "a KL: never negative",
        "zero_at_one": "0.0 at n = 1 (best-of-1 is the reference)",
        "python_float": "a Python float is returned (not a tensor)",
    },
}


def _returns(kind: type, what: str, candidate):
    """``candidate`` wrapped so that an output that is not a ``kind`` (a Python int or float; never a
    bool, a str or a tensor) fails with a message, before any value is compared."""

    def strict(*args, **kwargs):
        out = call(candidate, *args, **kwargs)
        if out is None and kind is int:
            return out  # "no answer" is a value of extract_answer
        ok = isinstance(out, (int, float) if kind is float else int) and not isinstance(out, bool)
        if not ok:
            got = "None (did you forget a `return`?)" if out is None else f"a {type(out).__name__}: {fmt(out)}"
            raise CheckFailure(f"{what} should return a Python {kind.__name__}, got {got}.",
                               hint=f"Convert at the end: {kind.__name__}(...) (a tensor: .item()); the "
                               "code that reads this value (pass@k curves, JSON summaries) expects a plain "
                               "Python number.")
        return out

    return strict


# ----------------------------------------------------------------------------------------------------
# extract_answer
# ----------------------------------------------------------------------------------------------------

_ANSWER_TEXTS = [
    ("a worked solution", "12 + 7 = 19\n19 * 2 = 38\nAnswer: 38"),
    ("two answer lines (the last wins)", "Answer: 12\nwait, 12 + 3 = 15\nAnswer: 15"),
    ("a negative answer", "3 - 10 = -7\nAnswer: -7"),
    ("text after the number on the answer line (not an answer)", "5 * 5 = 25\nAnswer: 25 apples in 5 boxes"),
    ("an answer line, then one with text after the number", "Answer: 8\nAnswer: 9 or so"),
    ("text after the answer line (ignored)", "2 + 2 = 4\nAnswer: 4\nDone. 17 is my favourite number."),
    ("trailing spaces", "3 - 1 = 2\nAnswer: 2   "),
    ("no space after the colon", "1 + 1 = 2\nAnswer:2"),
    ("several spaces after the colon", "Answer:    -30"),
    ("no answer line", "12 + 7 = 19\nthe result is 19"),
    ("an empty completion", ""),
    ("an indented and a lower-case answer line (neither counts)", "so 4 + 1 = 5\n  Answer: 5\nanswer: 6"),
    ("'+7', '1_000' and '1.5' (not plain digits)", "Answer: +7\nAnswer: 1_000\nAnswer: 1.5"),
    ("'Answer:' with no number, after a real answer", "Answer: 3\nAnswer:"),
    ("a leading zero", "Answer: 007"),
    ("digits of another script (int() reads them)", "Answer: 5\nAnswer: \u0664\u0662"),
    # only the plain space ' ' counts as a space: int() and `\s` accept every kind of whitespace
    ("a tab after the colon, after a real answer", "Answer: 3\nAnswer:\t12"),
    ("a non-breaking space after the colon, after a real answer", "Answer: 4\nAnswer:\u00a012"),
    ("a tab after the number, after a real answer", "Answer: 5\nAnswer: 12\t"),
    ("'\\r\\n' line endings: '\\r' is no space (the line is not an answer)", "7 - 1 = 6\r\nAnswer: 6\r\n"),
    ("'Answer:' on one line, a number on the next", "Answer: 1\nAnswer:\n12"),
    ("a form feed and a Unicode line separator inside a line (no line breaks here)",
     "Answer: 2\nAnswer: 8\u2028more\nAnswer: 9\x0cnow"),
    ("'Answer:' with no number, then a lone '-'", "Answer: -4\nAnswer:\nAnswer: -"),
    ("'-0' and a minus sign apart from the digits", "Answer: -0\nAnswer: - 5"),
]


def _extract_first_line(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := _strict_line(line))]
    return found[0] if found else None


def _strict_line(line):
    return re.fullmatch(r"Answer: *(-?[0-9]+) *", line)


def _extract_prefix_only(text):  # the number must start the rest of the line, anything may follow
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.match(r"Answer: *(-?[0-9]+)", line))]
    return found[-1] if found else None


def _extract_unsigned(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer: *([0-9]+) *", line))]
    return found[-1] if found else None


def _extract_via_int(text):  # int() accepts '+7', '1_000', ' 5 ' and tabs
    answer = None
    for line in text.split("\n"):
        if line.startswith("Answer:"):
            try:
                answer = int(line[len("Answer:"):])
            except ValueError:
                pass
    return answer


def _extract_stripped(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := _strict_line(line.strip()))]
    return found[-1] if found else None


def _extract_anywhere_in_line(text):
    found = [int(m.group(1)) for line in text.split("\n")
             if (m := re.search(r"answer: *(-?[0-9]+) *$", line, flags=re.IGNORECASE))]
    return found[-1] if found else None


def _extract_last_number(text):
    found = re.findall(r"-?[0-9]+", text)
    return int(found[-1]) if found else None


def _extract_trailing_spaces_not_stripped(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer: *(-?[0-9]+)", line))]
    return found[-1] if found else None


def _extract_one_space(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer: (-?[0-9]+) *", line))]
    return found[-1] if found else None


def _extract_any_unicode_digit(text):  # \d matches every script's digits, and int() reads them
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer: *(-?\d+) *", line))]
    return found[-1] if found else None


def _extract_at_most_one_space(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer: ?(-?[0-9]+) *", line))]
    return found[-1] if found else None


def _extract_any_whitespace(text):  # \s: tabs, non-breaking spaces, '\r', form feeds...
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer:\s*(-?[0-9]+)\s*", line))]
    return found[-1] if found else None


def _extract_across_lines(text):  # one pattern over the whole text: `\s*` crosses line breaks
    found = re.findall(r"^Answer:\s*(-?[0-9]+) *$", text, flags=re.MULTILINE)
    return int(found[-1]) if found else None


def _extract_splitlines(text):  # splitlines() also breaks at '\r', form feeds, Unicode separators
    found = [int(m.group(1)) for line in text.splitlines() if (m := _strict_line(line))]
    return found[-1] if found else None


def _extract_empty_line_resets(text):  # 'Answer:' with no number erases the answer found before
    answer = None
    for line in text.split("\n"):
        m = re.fullmatch(r"Answer: *(-?[0-9]*) *", line)
        if m:
            answer = int(m.group(1)) if m.group(1) not in ("", "-") else None
    return answer


def _extract_trailing_whitespace(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer: *(-?[0-9]+)\s*", line))]
    return found[-1] if found else None


def _extract_plus_sign(text):
    found = [int(m.group(1)) for line in text.split("\n") if (m := re.fullmatch(r"Answer: *([-+]?[0-9]+) *", line))]
    return found[-1] if found else None


def _extract_zero_when_absent(text):
    found = reasoning.extract_answer(text)
    return 0 if found is None else found


def _extract_last_line_only(text):
    lines = text.rstrip("\n").split("\n")
    m = _strict_line(lines[-1]) if lines else None
    return int(m.group(1)) if m else None


EXTRACT_MISTAKES = [
    Mistake("You took the first answer line: the contract takes the last one (a solution may correct itself).",
            _extract_first_line),
    Mistake("You read only the last line: the answer line may stand anywhere (text after it is ignored); "
            "take the last line that has the form.", _extract_last_line_only),
    Mistake("You returned the last number of the text: only a line of the form 'Answer: N' counts, and "
            "without one the result is None.", _extract_last_number),
    Mistake("A line with text after the number counted ('Answer: 25 apples'): the whole line must be "
            "'Answer:', spaces, the number and optional spaces, nothing else (match the whole line).",
            _extract_prefix_only),
    Mistake("Negative answers are missed: the number may start with '-'.", _extract_unsigned),
    Mistake("Digits of another script counted (in a regular expression `\\d` matches every Unicode digit, and "
            "int() reads '\u0664\u0662' as 42): the contract allows the ASCII digits 0-9 only.",
            _extract_any_unicode_digit),
    Mistake("int() decided what a number is: it also accepts '+7', '1_000', spaces and tabs. The contract "
            "allows only an optional '-' and ASCII digits, with plain spaces around.", _extract_via_int),
    Mistake("An indented answer line counted (the line was stripped first): the line must start with 'Answer:' "
            "itself; spaces are allowed only after the colon and after the number.", _extract_stripped),
    Mistake("Your line need not start with 'Answer:' exactly (a lower-case or indented 'answer:' counted): "
            "the line must start with 'Answer:', capital A, no indentation.", _extract_anywhere_in_line),
    Mistake("You returned 0 where no line has the form: the contract returns None there (0 is an answer like "
            "any other).", _extract_zero_when_absent),
    Mistake("'+7' counted: the contract allows an optional '-' only, right before the digits.", _extract_plus_sign),
    Mistake("Trailing spaces after the number are allowed ('Answer: 2   ' is 2).",
            _extract_trailing_spaces_not_stripped),
    Mistake("The spaces after 'Answer:' are optional and may be several ('Answer:2', 'Answer:    -30').",
            _extract_one_space),
    Mistake("Several spaces after the colon are allowed ('Answer:    -30' is -30), not only one.",
            _extract_at_most_one_space),
    Mistake("A tab, a non-breaking space or a '\\r' counted as a space (in a regular expression `\\s` matches "
            "every kind of whitespace): the contract allows plain spaces ' ' only, before and after the number.",
            _extract_any_whitespace),
    Mistake("A tab (or other whitespace) after the number counted as a trailing space: only plain spaces ' ' may "
            "follow the number.", _extract_trailing_whitespace),
    Mistake("Your pattern crossed a line break ('Answer:' on one line and the number on the next counted): each "
            "line is judged on its own.", _extract_across_lines),
    Mistake("The completion was split at more than '\\n' (str.splitlines() also breaks at '\\r', form feeds and "
            "Unicode line separators): the contract splits on '\\n' only.", _extract_splitlines),
    Mistake("A line 'Answer:' with no number erased the answer before it: it is no answer line, so it changes "
            "nothing (the number needs one digit or more).", _extract_empty_line_resets),
    Mistake("That is the lenient parser (the first number anywhere): the strict one reads the last "
            "'Answer: N' line only.", reasoning.lenient_extract_answer),
]


@checker(
    "extract_answer",
    chapter=CHAPTER,
    hint=(
        "Look at each line on its own and remember the last one that is an answer line: everything "
        "hinges on stating exactly what an answer line is (Python's `re` module can match a pattern "
        "against a WHOLE string).",
        "A line counts when, as a whole, it is 'Answer:', any number of plain spaces, an optional '-', "
        "one or more ASCII digits 0-9, any number of trailing spaces, and nothing else (a pattern matched "
        "against the whole line, capturing the number). Near misses to rule out: '+7' and '1_000', which "
        "`int()` accepts; a tab, a non-breaking space or a '\\r', which `int()` and `\\s` take for spaces; "
        "other scripts' digits, which `\\d` matches. Split on '\\n' only. Keep "
        "the number of the LAST such line as an int; None when no line counts.",
        "```python\nanswer = None\nfor line in completion.split(\"\\n\"):\n    match = re.fullmatch(r\"Answer: "
        "*(-?[0-9]+) *\", line)\n    if match:\n        answer = int(match.group(1))\nreturn answer\n```",
    ),
)
def check_extract_answer(candidate) -> str:
    cases = [Case(f"{label}: {text!r}", (text,)) for label, text in _ANSWER_TEXTS]
    compare_to_reference(_returns(int, "extract_answer", candidate), reasoning.extract_answer, cases,
                         mistakes=EXTRACT_MISTAKES, atol=0, rtol=0, arg_names=["completion"])
    return (f"matches the reference on {len(cases)} completions ("
            + "; ".join(label for label, _ in _ANSWER_TEXTS) + ").")


# ----------------------------------------------------------------------------------------------------
# verifiable_reward
# ----------------------------------------------------------------------------------------------------

_REWARD_TEXTS = ["4 + 5 = 9\nAnswer: 9", "4 + 5 = 8\nAnswer: 8", "no idea", "Answer: -3", "Answer: 1\nAnswer: 2",
                 "Answer: 12 apples", "2 - 2 = 0\nAnswer: 0"]


def _reward_variant(*, parse=reasoning.extract_answer, wrong=0.0, none_as=None, text_compare=False):
    def fn(completions, answers):
        out = []
        for text, answer in zip(completions, answers):
            got = parse(text)
            got = none_as if got is None else got
            if text_compare:
                got = str(got)
            out.append(1.0 if got == answer else wrong)
        return torch.tensor(out, dtype=torch.float32)

    return fn


@checker(
    "verifiable_reward",
    chapter=CHAPTER,
    hint=(
        "Reuse your `extract_answer`: one comparison per completion, collected into a tensor.",
        "r_i = 1.0 when the answer parsed from completion i equals answers[i], else 0.0 (a missing "
        "answer, None, never equals, even a true answer of 0). A float32 tensor of shape "
        "[len(completions)], on the CPU. If extract_answer does not pass its own check yet, fix it first.",
        "```python\nrewards = [1.0 if extract_answer(text) == answer else 0.0 for text, answer in "
        "zip(completions, answers)]\nreturn torch.tensor(rewards, dtype=torch.float32)\n```",
    ),
)
def check_verifiable_reward(candidate) -> str:
    cases = [
        Case("right, wrong, missing, negative, two answer lines, trailing text", (_REWARD_TEXTS, [9, 9, 9, -3, 2, 12, 0])),
        Case("no answer line while the true answer is 0", (["the result is zero", "Answer:", "Answer: 0"], [0, 0, 0])),
        Case("every answer wrong", (["Answer: 1", "Answer: -1"], [2, 1])),
        Case("a batch of 1", (["Answer: 42"], [42])),
        Case("an empty batch", ([], [])),
    ]
    return compare_to_reference(candidate, reasoning.verifiable_reward, cases, arg_names=["completions", "answers"],
                                mistakes=[
        Mistake("A missing answer scored as 0 (None treated as the number 0): a completion without an answer line "
                "gets 0.0, even when the true answer is 0.", _reward_variant(none_as=0)),
        Mistake("Wrong answers get -1: the verifiable reward is 1.0 for right and 0.0 for wrong.",
                _reward_variant(wrong=-1.0)),
        Mistake("You compared a str with an int (always unequal): compare extract_answer's int with the answer.",
                _reward_variant(text_compare=True)),
        Mistake("That is the lenient parser (the first number anywhere): score with extract_answer.",
                _reward_variant(parse=reasoning.lenient_extract_answer)),
    ])


# ----------------------------------------------------------------------------------------------------
# sft_loss
# ----------------------------------------------------------------------------------------------------


def _completion_mask(spans: list[tuple[int, int]], s: int) -> torch.Tensor:
    """Rows of [s]: True from ``start`` for ``n`` tokens (a prompt before, padding after)."""
    pos = torch.arange(s)[None, :]
    start = torch.tensor([a for a, _ in spans])[:, None]
    n = torch.tensor([b for _, b in spans])[:, None]
    return (pos >= start) & (pos < start + n)


_SFT_EMPTY = "a mask with no True at all (the contract: 0.0, not 0 / 0)"


def _sft_cases() -> list[Case]:
    g = seeded(70)
    b, s, v = 4, 10, 13
    logits = 2 * torch.randn(b, s, v, generator=g)
    tokens = torch.randint(0, v, (b, s), generator=g)
    lengths = _completion_mask([(3, 7), (2, 1), (4, 4), (5, 2)], s)  # 7 tokens beside 1: per-row means differ
    prompt_only = _completion_mask([(3, 5), (0, 0), (6, 4)], s)  # row 1 has no True at all
    all_true = torch.ones(3, 6, dtype=torch.bool)
    big = 60 * torch.randn(3, 7, 11, generator=g)
    big_tokens = big.argmin(-1).roll(1, dims=1)  # the least likely tokens: log-probs near -100
    return [
        Case("4 rows: prompt, completion of 7, 1, 4 and 2 tokens, padding", (logits, tokens, lengths)),
        Case("a prompt-only row (no True in row 1)", (logits[:3], tokens[:3], prompt_only)),
        Case("an all-True mask (loss_mask[:, 0] must be ignored)", (logits[:3, :6], tokens[:3, :6], all_true)),
        Case("large logits (x60) and unlikely tokens", (big, big_tokens, _completion_mask([(2, 5), (1, 3), (4, 3)], 7))),
        Case("a batch of 1", (logits[:1], tokens[:1], lengths[:1])),
        Case("one supervised token in the whole batch (the mean is that token's loss)",
             (logits[:2], tokens[:2], _completion_mask([(4, 1), (0, 0)], s))),
        Case(_SFT_EMPTY,
             (logits[:2], tokens[:2], torch.zeros(2, s, dtype=torch.bool))),
    ]


def _sft_variant(*, shift=True, mask_shift=True, reduce="tokens", use_mask=True, stable=True, sign=-1,
                 count_first=False):
    def fn(logits, tokens, loss_mask):
        lp = logits.log_softmax(-1) if stable else logits.softmax(-1).log()
        if shift:
            token_lp = lp[:, :-1].gather(-1, tokens[:, 1:, None]).squeeze(-1)
            m = loss_mask[:, 1:] if mask_shift else loss_mask[:, :-1]
        else:
            token_lp, m = lp.gather(-1, tokens[:, :, None]).squeeze(-1), loss_mask
        m = m.float() if use_mask else torch.ones_like(token_lp)
        total = sign * (token_lp * m)
        if reduce == "rows":
            return (total.sum(-1) / m.sum(-1)).mean()
        if reduce == "sum":
            return total.sum()
        count = loss_mask.float().sum() if count_first else m.sum()
        return total.sum() / count

    return fn


SFT_MISTAKES = [
    Mistake("The logits are not shifted: the logits at position t - 1 predict token t, so each position's "
            "log-probabilities are read at the NEXT token.", _sft_variant(shift=False)),
    Mistake("The mask is shifted the wrong way: loss_mask[:, t] marks token t as one to learn, so it selects "
            "the prediction OF token t (made at position t - 1), not the one made at t.", _sft_variant(mask_shift=False)),
    Mistake("You took a mean of per-row means: the contract is one mean over every masked token of the batch "
            "(a long completion counts more; a row with no True would be 0 / 0).", _sft_variant(reduce="rows")),
    Mistake("The prompt is not masked: only the positions where loss_mask is True count.", _sft_variant(use_mask=False)),
    Mistake("You summed the token losses: divide by the number of masked tokens.", _sft_variant(reduce="sum")),
    Mistake("The sign is flipped: that is the mean log-likelihood; the loss is its negative.", _sft_variant(sign=1)),
    Mistake("The count includes loss_mask[:, 0]: position 0 has no prediction, so count only loss_mask[:, 1:].",
            _sft_variant(count_first=True)),
    Mistake("log(softmax(x)) underflows to log(0) = -inf for large logits: the log-probabilities need one "
            "stable step (x minus its log-sum-exp), not a log of probabilities that rounded to 0.",
            _sft_variant(stable=False)),
]


def compare_gradient(candidate, reference, case: Case, wrt: int, *, arg_names: list[str], atol: float = 1e-6,
                     rtol: float = 1e-4) -> None:
    """Fail unless the candidate's scalar output on ``case`` has the reference's gradient with respect to
    positional argument ``wrt`` (``torch.autograd.grad`` of both, on fresh leaves on the check device).

    A candidate whose output carries no gradient (a ``.detach()``, ``torch.no_grad()``, a detached input, a
    number turned back into a tensor) is told so, by name."""
    case = to_device(case)
    name = arg_names[wrt]

    def with_leaf() -> list:
        args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in case.args]
        args[wrt] = args[wrt].requires_grad_(True)
        return args

    ref_args = with_leaf()
    (want,) = torch.autograd.grad(reference(*ref_args, **case.kwargs).sum(), ref_args[wrt])
    args = with_leaf()
    out = expect_tensor(call(candidate, *args, _arg_names=arg_names, **case.kwargs), what="your output")
    detached_hint = (f"Training differentiates this output with respect to `{name}`: compute it from `{name}` with "
                     "torch operations only, with no .detach(), no torch.no_grad() and no .item() / float() on "
                     "the way.")
    if not out.requires_grad:
        raise CheckFailure(
            f"On {case.label}, the values are right but carry no gradient (requires_grad is False): your output is "
            f"detached from `{name}` (a .detach() on it or on an input, a torch.no_grad() block, or a number "
            "turned back into a tensor).", hint=detached_hint)
    try:
        (got,) = torch.autograd.grad(out.sum(), args[wrt], allow_unused=True)
    except Exception as exc:  # noqa: BLE001 - the learner's graph may fail to backpropagate
        raise CheckFailure(f"On {case.label}, backpropagating through your output raised {describe_exception(exc)}",
                           hint=detached_hint) from None
    if got is None:
        raise CheckFailure(f"On {case.label}, your output has a gradient, but not from `{name}`: it is detached from "
                           f"`{name}` (a .detach() or a number turned back into a tensor on the way).",
                           hint=detached_hint)
    got, want = got.detach().double().cpu(), want.detach().double().cpu()  # the message's arithmetic, on the CPU
    if not torch.allclose(got, want, atol=atol, rtol=rtol):
        diff = (got - want).abs()
        where = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
        raise CheckFailure(
            f"On {case.label}, the values are right but the gradient with respect to `{name}` is not: at "
            f"{name}[{', '.join(map(str, where))}] it is {got[where].item():.4g}, expected {want[where].item():.4g} "
            f"(the largest difference, {diff.max().item():.3g}).",
            hint="Part of the computation is detached (a .detach() on the normaliser, a log-sum-exp or a count "
            "computed from .item()), or is a constant that happens to have the right value here.")


@checker(
    "sft_loss",
    chapter=CHAPTER,
    hint=(
        "Next-token cross-entropy on the completion only: shift by one, pick each next token's log-prob, "
        "keep the masked ones, and take ONE mean over every kept token of the batch.",
        "Position t - 1 predicts token t: log-softmax every position but the last, gather the log-prob "
        "of the next token (the tokens without the first), keep it where the mask without its first "
        "column is True. The loss is minus their sum divided by their count (clamped to 1, so an empty "
        "mask gives 0.0): not a mean of per-row means (a prompt-only row has no tokens). Keep it "
        "differentiable: no .detach(), no .item().",
        "```python\nlogps = logits[:, :-1].log_softmax(dim=-1)\ntoken_logps = logps.gather(-1, tokens[:, "
        "1:, None]).squeeze(-1)\nmask = loss_mask[:, 1:]\nreturn -torch.where(mask, token_logps, "
        "0.0).sum() / mask.sum().clamp(min=1)\n```",
    ),
)
def check_sft_loss(candidate) -> str:
    arg_names = ["logits", "tokens", "loss_mask"]
    try:
        detail = compare_to_reference(candidate, reasoning.sft_loss, _sft_cases(), mistakes=SFT_MISTAKES,
                                      arg_names=arg_names)
    except CheckFailure as failed:
        if failed.message.startswith(f"On {_SFT_EMPTY}") and "NaN" in failed.message:
            # the generic NaN advice (exp / log of large values) would mislead here: it is a count of 0
            raise failure(f"On {_SFT_EMPTY}, your loss is NaN: there are no tokens to average, and 0 / 0 = nan.",
                          "Divide by the number of masked tokens clamped to at least 1: the contract gives 0.0 "
                          "when the mask has no True (a batch of prompts only).") from None
        raise
    compare_gradient(candidate, reasoning.sft_loss, _sft_cases()[0], 0, arg_names=arg_names)
    return detail + " Its gradient with respect to the logits matches too."


# ----------------------------------------------------------------------------------------------------
# pass_at_k
# ----------------------------------------------------------------------------------------------------

_PASS_CASES = [  # (label, n, c, k)
    ("k = 1 (pass@1 = c / n)", 10, 3, 1),
    ("n = 10, c = 3, k = 4", 10, 3, 4),
    ("c = 0 (never right)", 20, 0, 5),
    ("c = n (always right)", 20, 20, 5),
    ("n - c == k (one all-wrong subset)", 10, 5, 5),
    ("n - c < k", 10, 7, 5),
    ("k = n, c = 1", 16, 1, 16),
    ("k = n, c = 0", 16, 0, 16),
    ("n = 1", 1, 1, 1),
    ("n = 1024, c = 3, k = 512", 1024, 3, 512),
    ("n = 1024, c = 1, k = 1", 1024, 1, 1),
    ("n = 1024, c = 100, k = 64", 1024, 100, 64),
    ("n = 1024, c = 2, k = 1023", 1024, 2, 1023),
    ("n = 1024, c = 0, k = 1000 (a thousand factors)", 1024, 0, 1000),
]

#: n of the sweep over the contract's range (n <= 1024): small ones, around 170 (171! overflows a float),
#: and up to 1024 (a product of integers wraps int64, and C(1024, 512) is about 40 times below float's limit)
_SWEEP_N = (2, 3, 5, 8, 21, 64, 100, 170, 171, 172, 255, 256, 500, 777, 1000, 1023, 1024)


def _sweep() -> list[tuple[int, int, int]]:
    """(n, c, k) over the whole range: for each n of :data:`_SWEEP_N`, c from 0 to n and k from 1 to n at the
    edges (0, 1, n - 1, n), in between (n / 3, n / 2), and around n - c (the shortcut's edge), in order of n."""
    rows = []
    for n in _SWEEP_N:
        for c in sorted({0, 1, 2, n // 3, n // 2, n - 2, n - 1, n} & set(range(n + 1))):
            ks = {1, 2, n // 4, n // 2, n - c - 1, n - c, n - c + 1, n - 1, n}
            rows += [(n, c, k) for k in sorted(ks) if 1 <= k <= n]
    return rows


def _exact_pass_at_k(n: int, c: int, k: int) -> float:
    """The estimator in exact rational arithmetic, rounded once to a float: the value every right
    implementation approaches (the reference's product of k floats is within k rounding errors of it)."""
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def _pass_diagnose(case: Case, got, expected) -> str | None:
    """What went wrong where no known mistake explains it: the cases run in order of n, so a candidate that
    fails first beyond n = 20 was right on every smaller one (the chosen cases and the sweep's)."""
    n, c, k = case.args
    finite = isinstance(got, float) and math.isfinite(got)
    if finite and abs(got - expected) < 1e-4 * max(abs(expected), 1e-3):
        return (f"Close, but {abs(got - expected):.2g} away: the contract asks for float64's precision (a relative "
                "error of about 1e-9 at most), which a computation in float32 (a torch tensor's default, numpy's "
                "float32, log-gammas in float32) loses. Compute in Python floats or float64.")
    if n > 20:
        return (f"Right on every case up to n = 20, {'wrong' if finite else fmt(got)} for n = {n}: something overflows or "
                "wraps on the way (a product of many integers wraps in int64 (numpy, torch), factorials overflow a "
                "float from 171!, a product of k large factors overflows a float). Multiply the k ratios "
                "(n - c - i) / (n - i), each in [0, 1], or keep Python's exact integers until one final division.")
    return None


def _pass_no_overflow(candidate):
    """``candidate`` whose OverflowError or RecursionError says why (a factorial or binomial of a large n in
    floats; a recursion k levels deep)."""
    strict = _returns(float, "pass_at_k", candidate)

    def fn(n, c, k):
        try:
            return strict(n, c, k)
        except CheckFailure as failed:
            if "OverflowError" in failed.message:
                raise CheckFailure(
                    f"On n = {n}, c = {c}, k = {k}, {failed.message}",
                    hint=f"A factorial (or a binomial) of n = {n} does not fit in a float: 171! already overflows. "
                    "Write the ratio C(n - c, k) / C(n, k) as a product of k factors (n - c - i) / (n - i), each "
                    "in [0, 1], or divide Python's exact integers only once at the end.") from None
            if "RecursionError" in failed.message:
                raise CheckFailure(
                    f"On n = {n}, c = {c}, k = {k}, {failed.message}",
                    hint="A recursion one level per factor goes k levels deep, and Python stops at about 1000: the "
                    "contract covers k up to n = 1024. A loop over the k factors has no depth.") from None
            raise

    return fn


@checker(
    "pass_at_k",
    chapter=CHAPTER,
    hint=(
        "Count the complement: pass@k is one minus the chance that k samples drawn without replacement "
        "from the n are all wrong. Then find a way to compute that chance that never forms a huge number.",
        "1 - C(n - c, k) / C(n, k), and the ratio is a product of k fractions, prod over i < k of (n - c "
        "- i) / (n - i), each at most 1: nothing overflows even at n = 1024 (factorials in floats do: 171! "
        "is already inf; so do products of integers in int64). When n - c < k every draw holds a correct "
        "sample: return 1.0. 1 - (1 - c/n)^k is the biased, with-replacement version. Python floats "
        "(float64) keep the precision the check asks for; float32 does not.",
        "```python\nif n - c < k:\n    return 1.0\nall_wrong = 1.0\nfor i in range(k):\n    all_wrong *= (n - "
        "c - i) / (n - i)\nreturn 1.0 - all_wrong\n```",
    ),
)
def check_pass_at_k(candidate) -> str:
    cases = [Case(label, (n, c, k)) for label, n, c, k in _PASS_CASES]
    sweep = [Case(f"n = {n}, c = {c}, k = {k}", (n, c, k)) for n, c, k in _sweep()]
    small = [case for case in cases if case.args[0] <= 20]  # the logic first, then in order of n (_pass_diagnose)
    by_size = sorted([case for case in cases if case.args[0] > 20] + sweep, key=lambda case: case.args[0])
    compare_to_reference(_pass_no_overflow(candidate), _exact_pass_at_k, small + by_size, atol=1e-10, rtol=1e-9,
                         diagnose=_pass_diagnose, mistakes=[
        Mistake("That is 1 - (1 - c / n) ** k, the estimate with replacement (biased): pass@k draws k of the n "
                "samples without replacement, 1 - C(n - c, k) / C(n, k).", lambda n, c, k: 1 - (1 - c / n) ** k),
        Mistake("That is the chance that all k samples are wrong: pass@k is one minus it.",
                lambda n, c, k: math.comb(n - c, k) / math.comb(n, k)),
        Mistake("The shortcut is off by one: 1.0 only when n - c < k. When n - c == k one k-subset is all wrong, "
                "and pass@k = 1 - 1 / C(n, k).",
                lambda n, c, k: 1.0 if n - c <= k else 1 - math.comb(n - c, k) / math.comb(n, k)),
        Mistake("The shortcut returns 0.0: when n - c < k every k samples include a correct one, so pass@k = 1.0.",
                lambda n, c, k: 0.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)),
        Mistake("k is ignored: c / n is pass@1 only.", lambda n, c, k: c / n),
    ])
    return (f"matches the exact estimator (to float64 precision) on {len(cases)} chosen cases ("
            + "; ".join(label for label, *_ in _PASS_CASES) + f") and on a sweep of {len(sweep)} (n, c, k) with n from "
            f"{_SWEEP_N[0]} to {_SWEEP_N[-1]}.")


# ----------------------------------------------------------------------------------------------------
# select_correct
# ----------------------------------------------------------------------------------------------------


def _select_cases() -> list[Case]:
    g = seeded(71)
    rewards = (torch.rand(4, 6, generator=g) < 0.5).float()
    rewards[1] = 0.0  # a prompt with no correct sample
    rewards[2] = 1.0  # one right every time
    rewards[0, :4] = torch.tensor([0.0, 1.0, 1.0, 1.0])  # three correct: a cap of 2 keeps the first two
    return [
        Case("4 prompts of 6, no cap", (rewards,)),
        Case("4 prompts of 6, max_per_prompt=2", (rewards,), {"max_per_prompt": 2}),
        Case("max_per_prompt=1", (rewards,), {"max_per_prompt": 1}),
        Case("max_per_prompt above G", (rewards,), {"max_per_prompt": 10}),
        Case("max_per_prompt=0 (a cap of 0 keeps nothing: 0 is a value, not 'no cap')", (rewards,),
             {"max_per_prompt": 0}),
        Case("no correct sample at all", (torch.zeros(3, 4),), {"max_per_prompt": 2}),
        Case("one prompt", (torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]]),), {"max_per_prompt": 2}),
        # one kept sample: still a 1-D tensor of one index (a bare .squeeze() makes it 0-d)
        Case("a single correct sample", (torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),)),
    ]


def _select_variant(*, cap="prompt", which="first", flat=True):
    def fn(rewards, max_per_prompt=None):
        p, G = rewards.shape
        correct = rewards == 1.0
        if which == "last":
            correct = correct.flip(-1)
        if max_per_prompt is not None and cap == "prompt":
            correct = correct & (correct.long().cumsum(-1) <= max_per_prompt)
        if which == "last":
            correct = correct.flip(-1)
        idx = correct.flatten().nonzero().squeeze(-1)
        if max_per_prompt is not None and cap == "batch":
            idx = idx[:max_per_prompt]
        return idx if flat else idx % G

    return fn


def _select_pairs(rewards, max_per_prompt=None):
    flat = reasoning.select_correct(rewards, max_per_prompt)
    return torch.stack([flat // rewards.shape[1], flat % rewards.shape[1]], dim=-1)


def _select_diagnose(case: Case, got, expected) -> str | None:
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got.sort().values, expected):
        return "The right samples, in another order: return the indices in increasing order (sort them)."
    return None


@checker(
    "select_correct",
    chapter=CHAPTER,
    hint=(
        "Mark the correct samples, cap the marks per prompt (per row), then turn the marks into "
        "positions in the flattened [p * G] order.",
        "A running count of correct samples along each row ranks them (1 at a row's first correct "
        "sample, 2 at its second...); keep those ranked at most max_per_prompt (all when None). The "
        "result is the flat index i * G + j of every kept mark, increasing: the positions of the nonzero "
        "entries of the flattened mask, int64 on the rewards' device. Slips: a cap over the whole batch, "
        "keeping the last instead of the first, returning j instead of i * G + j.",
        "```python\ncorrect = rewards == 1.0\nif max_per_prompt is not None:\n    rank = "
        "correct.long().cumsum(dim=-1)\n    correct = correct & (rank <= max_per_prompt)\nreturn "
        "correct.flatten().nonzero().squeeze(-1)\n```",
    ),
)
def check_select_correct(candidate) -> str:
    return compare_to_reference(candidate, reasoning.select_correct, _select_cases(), arg_names=["rewards"],
                                diagnose=_select_diagnose, mistakes=[
        Mistake("The cap counts over the whole batch: max_per_prompt limits each prompt's samples separately.",
                _select_variant(cap="batch")),
        Mistake("The cap is ignored: keep at most max_per_prompt correct samples of each prompt.",
                _select_variant(cap="none")),
        Mistake("You kept each prompt's last correct samples: keep its first ones.", _select_variant(which="last")),
        Mistake("Those are column indices j: return flat indices i * G + j (into rewards.flatten()).",
                _select_variant(flat=False)),
        Mistake("Those are (prompt, sample) pairs: return flat indices i * G + j, one per kept sample.",
                _select_pairs),
    ])


# ----------------------------------------------------------------------------------------------------
# best_of_n_kl
# ----------------------------------------------------------------------------------------------------


def _bon_diagnose(case: Case, got, expected) -> str | None:
    if case.args[0] == 1:
        return "best-of-1 is the reference itself: its KL is 0.0, and the closed form must give exactly that at n = 1."
    return None


@checker(
    "best_of_n_kl",
    chapter=CHAPTER,
    hint=(
        "Nothing to sample or fit: evaluate the integral by hand. Split the logarithm, ln(n u^(n-1)) = "
        "ln n + (n - 1) ln u, and integrate each term against the density n u^(n-1) on [0, 1].",
        "The first term gives ln n (the density integrates to 1). For the second, integrate "
        "n u^(n-1) ln u over [0, 1] by parts, with u^n as the antiderivative of n u^(n-1): the bracket "
        "[u^n ln u] from 0 to 1 is 0, and what is left is minus the integral of u^(n-1). Multiply it by "
        "its factor n - 1 and add the two terms: natural logarithms (nats), 0 at n = 1, below ln n for "
        "every n > 1. Return a Python float.",
        "```python\nreturn math.log(n) - (n - 1) / n\n```",
    ),
)
def check_best_of_n_kl(candidate) -> str:
    cases = [Case(f"n = {n}", (n,)) for n in (1, 2, 3, 16, 1024)]
    return compare_to_reference(_returns(float, "best_of_n_kl", candidate), reasoning.best_of_n_kl, cases,
                                atol=1e-8, rtol=1e-6, diagnose=_bon_diagnose, mistakes=[
        Mistake("That is log(n) alone, the first term: the (n - 1) ln u part of the logarithm adds a second one "
                "(it is negative: the KL is below log n).", lambda n: math.log(n)),
        Mistake("The sign is flipped: a KL is never negative (the log n term is the positive one).",
                lambda n: (n - 1) / n - math.log(n)),
        Mistake("That is in bits (log2): the course measures KL in nats, the natural log.",
                lambda n: math.log2(n) - (n - 1) / n),
        Mistake("The second term grows like n: the integral of n u^(n-1) ln u over [0, 1] is small (integrate by "
                "parts), so the second term stays below 1.", lambda n: math.log(n) - (n - 1)),
        Mistake("log(n) - 1 is the large-n limit: at finite n the second term is below 1 (at n = 1 the KL is 0).",
                lambda n: math.log(n) - 1),
    ])

