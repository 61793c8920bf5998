"""The tiny arithmetic world's problems, worked solutions and pretraining text (chapter 07).

A **problem** of difficulty d chains d additions or subtractions of ``digits``-digit numbers (default :data:`DIGITS`), read left
to right: ``Q: 23+45-12`` (difficulty 2). Its prompt is that line and a newline; its **worked
solution** (the completion) is one line per operation on the running value, then the final line::

    Q: 7+8-9             <- prompt (with the newline)
    7+8=15
    15-9=6
    Answer: 6            <- the line chapter 07's ``extract_answer`` reads

The **pretraining text** of the base model is written by fallible writers (:class:`Writer`): each
step goes wrong with probability ``step_error`` in one of the ways people get arithmetic wrong (a
forgotten carry or borrow, a result off by one or by ten, an operand copied with its digits swapped),
and the solution carries the wrong value on to its (self-consistent, wrong) answer; some solutions end
on a badly formatted line (``answer: 56``, ``Answer = 56``, ``The answer is 56.``), and some skip the
working and state the result in one sentence (``The answer is 56.``). A model trained on that text
gets about a third of the training difficulty right and nearly all with 16 tries: the room that
SFT, rejection sampling and RL then use.

Difficulties: the corpus holds 1 to ``max(CORPUS_DIFFICULTIES)`` operations; the chapter fine-tunes on
:data:`TRAIN_DIFFICULTY` (one step: the base model gets about a third right at temperature 1 and
nearly all with 16 tries) and measures generalisation on :data:`HELD_OUT_DIFFICULTIES`, chains of
steps that pretraining showed but fine-tuning never does.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

#: Difficulty (number of operations) the chapter fine-tunes and measures pass@k on.
TRAIN_DIFFICULTY = 1
#: Harder difficulties the fine-tuning never sees (both are in the pretraining text).
HELD_OUT_DIFFICULTIES = (2, 3)
#: Digits of every operand (the running value may have more, and go negative).
DIGITS = 1
#: The pretraining corpus's mixture of difficulties.
CORPUS_DIFFICULTIES = {1: 0.3, 2: 0.45, 3: 0.25}

_PROMPT = re.compile(r"Q: ([0-9]+(?:[+-][0-9]+)+)\n")


@dataclass(frozen=True)
class Problem:
    """``operands[0] ops[0] operands[1] ops[1] ...``, evaluated left to right."""

    operands: tuple[int, ...]
    ops: tuple[str, ...]

    @property
    def difficulty(self) -> int:
        return len(self.ops)

    @property
    def expression(self) -> str:
        return str(self.operands[0]) + "".join(f"{op}{x}" for op, x in zip(self.ops, self.operands[1:]))

    @property
    def prompt(self) -> str:
        """What the model is given: ``"Q: 23+45-12\\n"`` (the tokenizer adds BOS in front)."""
        return f"Q: {self.expression}\n"

    @property
    def answer(self) -> int:
        return running_values(self.operands, self.ops)[-1]

    def solution(self) -> str:
        """The correct worked solution: one line per operation, then ``Answer: N`` (no trailing newline)."""
        return worked_solution(self.operands, self.ops, running_values(self.operands, self.ops))


def apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def running_values(operands: tuple[int, ...], ops: tuple[str, ...]) -> list[int]:
    """The running value after each operation (left to right)."""
    values, v = [], operands[0]
    for op, x in zip(ops, operands[1:]):
        v = apply(v, op, x)
        values.append(v)
    return values


def worked_solution(operands, ops, values, final_line: str | None = None) -> str:
    """Step lines ``left op operand=value`` (left = the previous value), then the final line."""
    lines, left = [], operands[0]
    for op, x, v in zip(ops, operands[1:], values):
        lines.append(f"{left}{op}{x}={v}")
        left = v
    lines.append(final_line if final_line is not None else f"Answer: {values[-1]}")
    return "\n".join(lines)


def generate(rng: random.Random, difficulty: int, digits: int = DIGITS) -> Problem:
    """A random problem: ``difficulty + 1`` operands of exactly ``digits`` digits, each operation + or -."""
    lo, hi = 1 if digits == 1 else 10 ** (digits - 1), 10**digits - 1
    operands = tuple(rng.randint(lo, hi) for _ in range(difficulty + 1))
    ops = tuple(rng.choice("+-") for _ in range(difficulty))
    return Problem(operands, ops)


def problems(n: int, seed: int, difficulty: int, digits: int = DIGITS) -> list[Problem]:
    """``n`` problems of one difficulty from their own seed (the same seed, the same problems)."""
    rng = random.Random(f"arith-problems:{seed}:{difficulty}:{digits}")
    return [generate(rng, difficulty, digits) for _ in range(n)]


def parse_prompt(text: str) -> tuple[str, int] | None:
    """(prompt, true answer) of a text that starts with a problem's prompt line, else None: what a
    reward function needs when it is handed ``prompt + completion`` (as chapter 04's trainer does)."""
    match = _PROMPT.match(text)
    if match is None:
        return None
    parts = re.findall(r"([+-]?)([0-9]+)", match.group(1))  # [(sign, digits)]: the first sign is ""
    operands, ops = tuple(int(d) for _, d in parts), tuple(sign for sign, _ in parts[1:])
    return match.group(0), Problem(operands, ops).answer


# --- the fallible writers of the pretraining text ------------------------------------------------------------
def _no_carry_sum(a: int, b: int) -> int:
    """a + b with every carry forgotten (digit-wise sum mod 10); a, b >= 0."""
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def _no_borrow_difference(a: int, b: int) -> int:
    """a - b (a >= b >= 0) with every borrow forgotten: each digit is |a_i - b_i|."""
    out, place = 0, 1
    while a or b:
        out += abs(a % 10 - b % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def wrong_step(rng: random.Random, left: int, op: str, x: int) -> tuple[int, int]:
    """A plausible mistake in ``left op x``: returns (operand as written, result as written), the
    result differing from the true one of the written operand or the operand differing from ``x``."""
    true = apply(left, op, x)
    kinds = ["off_by_one", "off_by_ten"]
    if left >= 0 and op == "+" and _no_carry_sum(left, x) != true:
        kinds += ["carry"] * 3
    if op == "-" and left >= x >= 0 and _no_borrow_difference(left, x) != true:
        kinds += ["carry"] * 3
    if x % 10 != x // 10 % 10 and 10 <= x <= 99:
        kinds.append("copy")
    kind = rng.choice(kinds)
    if kind == "carry":
        return x, _no_carry_sum(left, x) if op == "+" else _no_borrow_difference(left, x)
    if kind == "copy":  # the operand's two digits swapped, the arithmetic right on the wrong operand
        swapped = (x % 10) * 10 + x // 10
        return swapped, apply(left, op, swapped)
    delta = rng.choice([-1, 1]) * (1 if kind == "off_by_one" else 10)
    return x, true + delta


@dataclass
class Writer:
    """How often the writers of the pretraining text get things wrong (each a probability)."""

    step_error: float = 0.25  # a step goes wrong (the error is carried on to the answer)
    bad_format: float = 0.1  # the final line is not ``Answer: N``
    no_working: float = 0.08  # no steps: one sentence ``The answer is N.``

    def write(self, problem: Problem, rng: random.Random) -> str:
        """A (possibly wrong) solution of ``problem`` by this writer: the completion text."""
        if rng.random() < self.no_working:
            return f"The answer is {problem.answer}."
        left, shown, values = problem.operands[0], [problem.operands[0]], []
        for op, x in zip(problem.ops, problem.operands[1:]):
            if rng.random() < self.step_error:
                x, value = wrong_step(rng, left, op, x)
            else:
                value = apply(left, op, x)
            shown.append(x)
            values.append(value)
            left = value
        final = None
        if rng.random() < self.bad_format:
            final = rng.choice(["answer: {}", "Answer = {}", "The answer is {}.", "Answer: {} ."]).format(values[-1])
        return worked_solution(tuple(shown), problem.ops, values, final)


def corpus(n: int, seed: int, writer: Writer, difficulties: dict[int, float] = CORPUS_DIFFICULTIES,
           digits: int = DIGITS) -> list[str]:
    """``n`` pretraining texts ``prompt + solution`` (seeded): problems of the given mixture of
    difficulties, each solved by ``writer``."""
    rng = random.Random(f"arith-corpus:{seed}")
    levels, weights = zip(*sorted(difficulties.items()))
    texts = []
    for _ in range(n):
        problem = generate(rng, rng.choices(levels, weights)[0], digits)
        texts.append(problem.prompt + writer.write(problem, rng))
    return texts


def demonstrations(problem_list: list[Problem]) -> list[tuple[str, str]]:
    """(prompt, correct worked solution) pairs: the SFT data."""
    return [(p.prompt, p.solution()) for p in problem_list]
