"""The tiny world's agent task (chapter 09): arithmetic problems, a calculator, and pretraining text
in which a few solutions call it.

A **problem** is one operation on two numbers, at one of three difficulties (:data:`DIFFICULTIES`):

    easy     a + b or a - b, one-digit operands          ``Q: 7+8``
    medium   a + b or a - b, two-digit operands          ``Q: 47+86``
    hard     a * b, two-digit operands                   ``Q: 47*86``

Its prompt is ``Q: EXPR`` and a newline. A **solution** (the completion) is written in one of two ways:

    Q: 47*86                       Q: 47*86
    47*86 = 4042                   <calc>47*86</calc> = 4042
    Answer: 4042                   Answer: 4042

the left one in the head (the writer writes the expression and its result), the right one with the
calculator: the writer writes the call ``<calc>EXPR</calc>``, the calculator's text ``" = " + result``
follows (the text chapter 09's environment appends, ``rlhf_tutorial.agent.calculator``), then the
answer line. Both end on the line chapter 07's ``extract_answer`` reads; they differ only in the tags
around the expression, so whether a solution calls the tool is decided by its first token.

The **pretraining text** is written by people (:class:`CalcWriter`) who reach for the calculator
rarely (``tool_rate``, the same at every difficulty) and whose mental arithmetic fails more often the
harder the problem (``head_error``: a carry forgotten, a result off by one or by ten, a wrong digit in a
product); an answer read off the calculator is always right. Every solution, worked in the head or
not, copies the problem's expression and then copies the result it wrote (or the calculator wrote) into
the answer line. Both copies must be reliable for a call to pay: with too few passes over the corpus
the model miscopies a 4-digit result (two passes: right one time in three), and with too few calls in
it the expression copied into the call (three positions later than in a solution worked in the head)
goes wrong (one solution in seven with the tool: the base model's own calls on hard problems right one
time in eight). ``build-calc``'s defaults (one solution in five with the tool, five passes) make both
copies reliable. A model trained on that text calls the tool now and then (on about one problem in
ten), copies its result, and in its head gets easy problems mostly
right and hard ones almost always wrong: tool use is a behaviour it has but rarely chooses, which RL can
amplify, and choosing it on easy problems buys nothing, which a cost per call can teach.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

#: The difficulties, easiest first.
DIFFICULTIES = ("easy", "medium", "hard")
#: Per difficulty: (operators drawn from, digits of each operand).
LEVELS = {"easy": ("+-", 1), "medium": ("+-", 2), "hard": ("*", 2)}
#: The pretraining corpus's mixture of difficulties.
CORPUS_DIFFICULTIES = {"easy": 0.3, "medium": 0.3, "hard": 0.4}
#: How a call opens and closes, and the text the calculator writes before its result (as
#: ``rlhf_tutorial.agent``: kept equal by a test).
CALL_OPEN, CALL_CLOSE, RESULT_PREFIX = "<calc>", "</calc>", " = "

_PROMPT = re.compile(r"Q: ([0-9]+)([-+*])([0-9]+)\n")


@dataclass(frozen=True)
class CalcProblem:
    """``a op b`` with op one of ``+ - *``, at a named difficulty."""

    a: int
    op: str
    b: int
    difficulty: str

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def prompt(self) -> str:
        """What the model is given: ``"Q: 47*86\\n"`` (the tokenizer adds BOS in front)."""
        return f"Q: {self.expression}\n"

    @property
    def answer(self) -> int:
        return compute(self.a, self.op, self.b)

    def solution(self, tool: bool) -> str:
        """The correct solution, with the calculator's call and text (``tool``) or from the head."""
        return solution_text(self, self.answer, tool)


def compute(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def tool_text(result: int) -> str:
    """What the calculator appends after a call: ``" = 4042"``."""
    return f"{RESULT_PREFIX}{result}"


def solution_text(problem: CalcProblem, answer: int, tool: bool) -> str:
    """``EXPR = N`` (worked in the head, N = ``answer``) or the call and the calculator's (always right)
    text (``tool``), then ``Answer: N``."""
    if tool:
        return f"{CALL_OPEN}{problem.expression}{CALL_CLOSE}{tool_text(problem.answer)}\nAnswer: {problem.answer}"
    return f"{problem.expression}{tool_text(answer)}\nAnswer: {answer}"


def generate(rng: random.Random, difficulty: str) -> CalcProblem:
    """A random problem of ``difficulty``: two operands of exactly the level's digits (one digit: 1-9)."""
    ops, digits = LEVELS[difficulty]
    lo, hi = 1 if digits == 1 else 10 ** (digits - 1), 10**digits - 1
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    return CalcProblem(a, rng.choice(ops), b, difficulty)


def problems(n: int, seed: int, difficulty: str) -> list[CalcProblem]:
    """``n`` problems of one difficulty from their own seed (the same seed, the same problems)."""
    if difficulty not in LEVELS:
        raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    rng = random.Random(f"calc-problems:{seed}:{difficulty}")
    return [generate(rng, difficulty) for _ in range(n)]


def parse_prompt(text: str) -> CalcProblem | None:
    """The problem whose prompt ``text`` starts with, else None (its difficulty read off its shape)."""
    match = _PROMPT.match(text)
    if match is None:
        return None
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    width = max(len(match.group(1)), len(match.group(3)))
    difficulty = "hard" if op == "*" else "easy" if width == 1 else "medium"
    return CalcProblem(a, op, b, difficulty)


# --- the writers of the pretraining text ---------------------------------------------------------------------
def head_mistake(rng: random.Random, problem: CalcProblem) -> int:
    """A plausible wrong result of ``problem`` worked in the head (never the true one)."""
    true, (a, op, b) = problem.answer, (problem.a, problem.op, problem.b)
    kinds = ["off_by_one", "off_by_ten"]
    if op == "+" and (a % 10 + b % 10) >= 10:
        kinds += ["carry"] * 2  # the carry forgotten
    if op == "-" and a >= b and a % 10 < b % 10:
        kinds += ["carry"] * 2  # the borrow forgotten
    if op == "*":
        kinds += ["digit"] * 3  # one partial product wrong by a multiple of the place it sits in
    kind = rng.choice(kinds)
    if kind == "carry":
        wrong = true - 10 if op == "+" else true + 10
    elif kind == "digit":
        wrong = true + rng.choice([-1, 1]) * rng.randint(1, 9) * rng.choice([1, 10, 10, 100])
    else:
        wrong = true + rng.choice([-1, 1]) * (1 if kind == "off_by_one" else 10)
    return wrong if wrong != true else true + 1


@dataclass
class CalcWriter:
    """How the writers of the pretraining text solve problems (each a probability)."""

    tool_rate: float = 0.2  # a solution calls the calculator (at every difficulty)
    head_error: dict[str, float] = field(default_factory=lambda: {"easy": 0.05, "medium": 0.3, "hard": 0.75})

    def write(self, problem: CalcProblem, rng: random.Random) -> str:
        """A solution of ``problem`` by this writer: the completion text."""
        if rng.random() < self.tool_rate:
            return problem.solution(tool=True)
        wrong = rng.random() < self.head_error[problem.difficulty]
        return solution_text(problem, head_mistake(rng, problem) if wrong else problem.answer, tool=False)


def corpus(n: int, seed: int, writer: CalcWriter, difficulties: dict[str, float] = CORPUS_DIFFICULTIES) -> list[str]:
    """``n`` pretraining texts ``prompt + solution`` (seeded), difficulties drawn from the mixture."""
    rng = random.Random(f"calc-corpus:{seed}")
    levels, weights = zip(*difficulties.items())
    texts = []
    for _ in range(n):
        problem = generate(rng, rng.choices(levels, weights)[0])
        texts.append(problem.prompt + writer.write(problem, rng))
    return texts
