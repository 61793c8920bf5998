"""Checkers of chapter 07: the reference passes, the untouched stub fails, realistic wrong versions (written
out here, independently of the checker's catalogue) fail with a message naming the mistake, and correct code
written differently passes."""

import inspect
import math
import re
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlhf_tutorial import reasoning
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.checks.core import check_device
from rlhf_tutorial.notebooks import load_stub, stub_source
from tests.checks.helpers import assert_fails_with

EXERCISES = ["extract_answer", "verifiable_reward", "sft_loss", "pass_at_k", "select_correct", "best_of_n_kl"]

#: A tensor built on the CPU beside the checker's cases is a mistake only on another device.
needs_gpu = pytest.mark.skipif(check_device().type == "cpu", reason="needs a GPU or RLHF_TUTORIAL_DEVICE=simgpu")


def stub(name: str):
    """The untouched stub as the chapter notebook has it; before course/07_reasoning.py names the exercise,
    the same stub built the same way (the reference's source with its exercise region replaced by the raise),
    executed after the imports the chapter needs."""
    try:
        return load_stub("07_reasoning", name)
    except (FileNotFoundError, KeyError):
        namespace: dict = {}
        exec("import math\nimport re\nimport torch\nfrom jaxtyping import Bool, Float, Int\nfrom torch import Tensor\n"
             "from rlhf_tutorial.reasoning import extract_answer\n", namespace)
        exec(compile(stub_source(getattr(reasoning, name), name), f"<stub {name}>", "exec", dont_inherit=True),
             namespace)
        return namespace[name]


@pytest.mark.parametrize("name", EXERCISES)
def test_reference_passes_and_untouched_stub_fails(name):
    assert run_check(name, getattr(reasoning, name)).passed
    result = run_check(name, stub(name))
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


# ----------------------------------------------------------------------------------------------------
# extract_answer
# ----------------------------------------------------------------------------------------------------
def answer_first_line(completion):
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: *(-?\d+) *", line)
        if m:
            return int(m.group(1))
    return None


def answer_search_in_line(completion):
    answer = None
    for line in completion.split("\n"):
        m = re.search(r"^Answer:\s*(-?\d+)", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_via_int(completion):
    answer = None
    for line in completion.split("\n"):
        if line.startswith("Answer:"):
            try:
                answer = int(line.split(":", 1)[1])
            except ValueError:
                continue
    return answer


def answer_unsigned(completion):
    matches = re.findall(r"^Answer: *(\d+) *$", completion, flags=re.MULTILINE)
    return int(matches[-1]) if matches else None


def answer_as_text(completion):
    matches = re.findall(r"^Answer: *(-?\d+) *$", completion, flags=re.MULTILINE)
    return matches[-1] if matches else None


def answer_stripped_lines(completion):  # strips each line first: an indented answer line counts
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: *(-?\d+)", line.strip())
        if m:
            answer = int(m.group(1))
    return answer


def answer_any_digit(completion):  # \d: every script's digits, and int() reads them
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: *(-?\d+) *", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_whole_text_tail(completion):  # the answer must end the completion
    m = re.search(r"Answer: *(-?\d+) *$", completion)
    return int(m.group(1)) if m else None


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (answer_first_line, "first answer line"),
        (answer_search_in_line, "text after the number"),
        (answer_via_int, "int() decided"),
        (answer_unsigned, "Negative answers"),
        (answer_as_text, "should return a Python int, got a str"),
        (answer_stripped_lines, "An indented answer line counted"),  # only the indented line exposes it
        (answer_whole_text_tail, "You read only the last line"),
        (answer_any_digit, "Digits of another script counted"),  # only the Arabic-Indic digits expose it
        (reasoning.lenient_extract_answer, "lenient parser"),
    ],
)
def test_extract_answer_mistakes(wrong, fragment):
    assert_fails_with("extract_answer", wrong, fragment)


def test_extract_answer_written_differently():
    def by_hand(completion):
        answer = None
        for line in completion.split("\n"):
            if not line.startswith("Answer:"):
                continue
            rest = line[len("Answer:"):].strip(" ")
            digits = rest[1:] if rest.startswith("-") else rest
            if digits and all(ch in "0123456789" for ch in digits):
                answer = int(rest)
        return answer

    def from_the_end(completion):
        for line in reversed(completion.split("\n")):
            m = re.match(r"Answer:[ ]*(-?[0-9]+)[ ]*$", line)
            if m and "\n" not in m.group(0):
                return int(m.group(1))
        return None

    assert run_check("extract_answer", by_hand).passed
    assert run_check("extract_answer", from_the_end).passed


# ----------------------------------------------------------------------------------------------------
# verifiable_reward
# ----------------------------------------------------------------------------------------------------
extract_answer = reasoning.extract_answer


def reward_none_is_zero(completions, answers):
    return torch.tensor([float((extract_answer(c) or 0) == a) for c, a in zip(completions, answers)])


def reward_float64(completions, answers):
    return torch.tensor([float(extract_answer(c) == a) for c, a in zip(completions, answers)], dtype=torch.float64)


def reward_bool(completions, answers):
    return torch.tensor([extract_answer(c) == a for c, a in zip(completions, answers)])


def reward_list(completions, answers):
    return [float(extract_answer(c) == a) for c, a in zip(completions, answers)]


def reward_plus_minus(completions, answers):
    return torch.tensor([1.0 if extract_answer(c) == a else -1.0 for c, a in zip(completions, answers)])


def reward_lenient(completions, answers):
    return torch.tensor([float(reasoning.lenient_extract_answer(c) == a) for c, a in zip(completions, answers)])


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (reward_none_is_zero, "None treated as the number 0"),
        (reward_float64, "the dtype is float64"),
        (reward_bool, "the dtype is bool"),
        (reward_list, "should be a torch.Tensor"),
        (reward_plus_minus, "Wrong answers get -1"),
        (reward_lenient, "lenient parser"),
    ],
)
def test_verifiable_reward_mistakes(wrong, fragment):
    assert_fails_with("verifiable_reward", wrong, fragment)


def test_verifiable_reward_written_differently():
    def filled(completions, answers):
        out = torch.zeros(len(completions))
        for i, (text, answer) in enumerate(zip(completions, answers)):
            parsed = extract_answer(text)
            if parsed is not None and parsed == answer:
                out[i] = 1
        return out

    assert run_check("verifiable_reward", filled).passed


# ----------------------------------------------------------------------------------------------------
# sft_loss
# ----------------------------------------------------------------------------------------------------
def token_logps(logits, tokens):
    return logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def sft_per_row_mean(logits, tokens, loss_mask):
    m = loss_mask[:, 1:].float()
    return (-(token_logps(logits, tokens) * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()


def sft_no_mask(logits, tokens, loss_mask):
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v), tokens[:, 1:].reshape(-1))


def sft_unshifted(logits, tokens, loss_mask):
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), tokens.masked_fill(~loss_mask, -100).reshape(-1))


def sft_mask_misaligned(logits, tokens, loss_mask):
    m = loss_mask[:, :-1]
    return -token_logps(logits, tokens)[m].mean()


def sft_counts_position_zero(logits, tokens, loss_mask):
    m = loss_mask[:, 1:]
    return -(token_logps(logits, tokens) * m).sum() / loss_mask.sum()


def masked_mean(picked, loss_mask):  # minus the mean over loss_mask[:, 1:], 0.0 when it has no True
    m = loss_mask[:, 1:]
    return -torch.where(m, picked, 0.0).sum() / m.sum().clamp(min=1)


def sft_count_not_clamped(logits, tokens, loss_mask):  # right on every mask with a True
    return -token_logps(logits, tokens)[loss_mask[:, 1:]].mean()


def sft_cross_entropy_mean(logits, tokens, loss_mask):  # ignore_index's mean: 0 / 0 on an empty mask
    targets = tokens[:, 1:].masked_fill(~loss_mask[:, 1:], -100)
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100)


def sft_log_of_softmax(logits, tokens, loss_mask):
    lp = logits[:, :-1].softmax(-1).log().gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return -lp[loss_mask[:, 1:]].mean()


def sft_detached_output(logits, tokens, loss_mask):
    return reasoning.sft_loss(logits, tokens, loss_mask).detach()


def sft_under_no_grad(logits, tokens, loss_mask):
    with torch.no_grad():
        return masked_mean(token_logps(logits, tokens), loss_mask)


def sft_detached_input(logits, tokens, loss_mask):
    logits = logits.detach()
    return masked_mean(token_logps(logits, tokens), loss_mask)


def sft_item_back_to_tensor(logits, tokens, loss_mask):
    value = masked_mean(token_logps(logits, tokens), loss_mask).item()
    return torch.tensor(value, device=logits.device, requires_grad=True)


def sft_detached_normaliser(logits, tokens, loss_mask):
    lp = logits[:, :-1] - logits[:, :-1].logsumexp(-1, keepdim=True).detach()
    picked = lp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return masked_mean(picked, loss_mask)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (sft_per_row_mean, "mean of per-row means"),
        (sft_no_mask, "prompt is not masked"),
        (sft_unshifted, "not shifted"),
        (sft_mask_misaligned, "mask is shifted the wrong way"),
        (sft_counts_position_zero, "count includes loss_mask[:, 0]"),  # only the all-True mask exposes it
        (sft_log_of_softmax, "NaN or inf"),
        (sft_count_not_clamped, "0 / 0 = nan"),
        (sft_cross_entropy_mean, "0 / 0 = nan"),  # only the mask with no True exposes it  # only the large logits expose it
        (sft_detached_output, "detached"),
        (sft_under_no_grad, "torch.no_grad()"),
        (sft_detached_input, "carry no gradient"),
        (sft_item_back_to_tensor, "not from `logits`"),
        (sft_detached_normaliser, "the gradient with respect to `logits` is not"),
    ],
)
def test_sft_loss_mistakes(wrong, fragment):
    assert_fails_with("sft_loss", wrong, fragment)


def test_sft_loss_written_differently():
    def with_ignore_index(logits, tokens, loss_mask):
        targets = tokens[:, 1:].masked_fill(~loss_mask[:, 1:], -100)
        total = F.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=-100, reduction="sum")
        return total / max(int(loss_mask[:, 1:].sum()), 1)

    def with_loops(logits, tokens, loss_mask):
        total, count = logits.new_zeros(()), 0
        for b in range(logits.shape[0]):
            for t in range(1, logits.shape[1]):
                if loss_mask[b, t]:
                    total = total + torch.logsumexp(logits[b, t - 1], 0) - logits[b, t - 1, tokens[b, t]]
                    count += 1
        return total / max(count, 1)

    assert run_check("sft_loss", with_ignore_index).passed
    assert run_check("sft_loss", with_loops).passed


# ----------------------------------------------------------------------------------------------------
# pass_at_k
# ----------------------------------------------------------------------------------------------------
def pass_gamma(n, c, k):
    def comb(a, b):
        return math.gamma(a + 1) / (math.gamma(b + 1) * math.gamma(a - b + 1))

    return 1.0 if n - c < k else 1 - comb(n - c, k) / comb(n, k)


def pass_int64(n, c, k):
    num = np.prod(np.arange(n - c - k + 1, n - c + 1, dtype=np.int64))
    den = np.prod(np.arange(n - k + 1, n + 1, dtype=np.int64))
    with np.errstate(all="ignore"):
        return float(1 - num / den)


def pass_with_replacement(n, c, k):
    return 1 - (1 - c / n) ** k


def pass_shortcut_off_by_one(n, c, k):
    if n - c <= k:
        return 1.0
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def pass_tensor(n, c, k):
    return 1 - torch.tensor(math.comb(n - c, k) / math.comb(n, k), dtype=torch.float64)


def pass_lgamma_float32(n, c, k):
    def lcomb(a, b):
        a, b = torch.tensor(float(a)), torch.tensor(float(b))
        return torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)

    if n - c < k:
        return 1.0
    return float(1 - torch.exp(lcomb(n - c, k) - lcomb(n, k)))


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (pass_gamma, "171!"),
        (pass_int64, "Right for small n, wrong for n = 1024"),
        (pass_with_replacement, "with replacement"),
        (pass_shortcut_off_by_one, "off by one"),
        (pass_tensor, "should return a Python float, got a Tensor"),
        (pass_lgamma_float32, "precision is lost"),  # float32 log-gammas lose the digits there
    ],
)
def test_pass_at_k_mistakes(wrong, fragment):
    assert_fails_with("pass_at_k", wrong, fragment)


def test_pass_at_k_written_differently():
    def exact_fraction(n, c, k):
        return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))

    def exact_integers(n, c, k):  # Python divides two big ints exactly, to the nearest float
        return 1 - math.comb(n - c, k) / math.comb(n, k)

    def log_gamma_float64(n, c, k):
        if n - c < k:
            return 1.0
        log_ratio = (math.lgamma(n - c + 1) - math.lgamma(n - c - k + 1)) - (math.lgamma(n + 1) - math.lgamma(n - k + 1))
        return 1 - math.exp(log_ratio)

    for right in (exact_fraction, exact_integers, log_gamma_float64):
        result = run_check("pass_at_k", right)
        assert result.passed, (right.__name__, result.message)


# ----------------------------------------------------------------------------------------------------
# select_correct
# ----------------------------------------------------------------------------------------------------
def select_batch_cap(rewards, max_per_prompt=None):
    idx = (rewards.flatten() == 1).nonzero().squeeze(-1)
    return idx if max_per_prompt is None else idx[:max_per_prompt]


def select_last(rewards, max_per_prompt=None):
    G = rewards.shape[1]
    kept = []
    for i, row in enumerate(rewards.tolist()):
        js = [j for j, r in enumerate(row) if r == 1.0]
        if max_per_prompt is not None:
            js = js[len(js) - max_per_prompt:] if len(js) > max_per_prompt else js
        kept += [i * G + j for j in js]
    return torch.tensor(kept, dtype=torch.long, device=rewards.device)


def select_columns(rewards, max_per_prompt=None):
    keep = rewards == 1
    if max_per_prompt is not None:
        keep &= keep.cumsum(-1) <= max_per_prompt
    return keep.nonzero()[:, 1]


def select_prompts_reversed(rewards, max_per_prompt=None):  # the right samples, last prompt first
    keep = rewards == 1
    if max_per_prompt is not None:
        keep &= keep.cumsum(-1) <= max_per_prompt
    G = rewards.shape[1]
    rows = [(i * G + keep[i].nonzero().squeeze(-1)) for i in reversed(range(rewards.shape[0]))]
    return torch.cat(rows)


def select_int32(rewards, max_per_prompt=None):
    return reasoning.select_correct(rewards, max_per_prompt).int()


def select_on_cpu(rewards, max_per_prompt=None):
    idx = reasoning.select_correct(rewards, max_per_prompt).tolist()
    return torch.tensor(idx, dtype=torch.long)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (select_batch_cap, "whole batch"),
        (select_last, "last correct samples"),
        (select_columns, "column indices"),
        (select_prompts_reversed, "increasing order"),
        (select_int32, "the dtype is int32"),
        pytest.param(select_on_cpu, "is on cpu", marks=needs_gpu),
    ],
)
def test_select_correct_mistakes(wrong, fragment):
    assert_fails_with("select_correct", wrong, fragment)


def test_select_correct_written_differently():
    def with_loops(rewards, max_per_prompt=None):
        G = rewards.shape[1]
        kept = []
        for i in range(rewards.shape[0]):
            taken = 0
            for j in range(G):
                if rewards[i, j] > 0.5 and (max_per_prompt is None or taken < max_per_prompt):
                    kept.append(i * G + j)
                    taken += 1
        return torch.tensor(kept, dtype=torch.int64, device=rewards.device)

    assert run_check("select_correct", with_loops).passed


# ----------------------------------------------------------------------------------------------------
# best_of_n_kl
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (lambda n: math.log(n), "bound often quoted"),
        (lambda n: math.log(n) - (n - 1) // n, "bound often quoted"),  # integer division: the term vanishes
        (lambda n: math.log2(n) - (n - 1) / n, "in bits"),
        (lambda n: torch.log(torch.tensor(float(n))) - (n - 1) / n, "should return a Python float"),
        (lambda n: math.log(n) - 1 + 1 / (n + 1), "best-of-1 is the reference itself"),
    ],
)
def test_best_of_n_kl_mistakes(wrong, fragment):
    assert_fails_with("best_of_n_kl", wrong, fragment)


def test_best_of_n_kl_written_differently():
    assert run_check("best_of_n_kl", lambda n: float(np.log(n) - 1 + 1 / n)).passed
    assert run_check("best_of_n_kl", lambda n: -math.log(1 / n) - sum(1 / n for _ in range(n - 1))).passed


# ----------------------------------------------------------------------------------------------------
# hints
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EXERCISES)
def test_hint_names_the_mistakes_without_the_code(name, capsys):
    """The first two rungs of the ladder (a nudge, the approach) give no line of the solution; the third
    is the code itself."""
    from rlhf_tutorial.checks import hint
    from rlhf_tutorial.notebooks import BEGIN, END

    source = inspect.getsource(getattr(reasoning, name))
    region = source[source.index(BEGIN) + len(BEGIN):source.index(END)]
    code = [line.split("#")[0].strip() for line in region.splitlines()]
    code = [c for c in code if len(c) > 12]
    for rung in (1, 2):
        hint(name, rung)
        shown = capsys.readouterr().out
        assert shown.startswith(f"[HINT {rung}/3] {name}: ") and len(shown) > 80, shown
        for line in code:
            assert line not in shown, f"rung {rung} of the hint of {name} gives away the line {line!r}"
    hint(name, 3)
    shown = capsys.readouterr().out
    assert all(line in shown for line in code), shown
