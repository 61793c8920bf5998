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


def answer_at_most_one_space(completion):
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: ?(-?[0-9]+) *", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_any_whitespace(completion):  # \s*: a tab, a non-breaking space, '\r' count as spaces
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer:\s*(-?[0-9]+)\s*", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_trailing_whitespace(completion):  # plain spaces after the colon, but any whitespace at the end
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: *(-?[0-9]+)\s*", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_across_lines(completion):  # one pattern over the whole text: \s* crosses the line break
    found = re.findall(r"^Answer: *\s?(-?[0-9]+) *$", completion, flags=re.MULTILINE)
    return int(found[-1]) if found else None


def answer_splitlines(completion):  # splitlines() also breaks at '\r', '\x0c', '\u2028'...
    answer = None
    for line in completion.splitlines():
        m = re.fullmatch(r"Answer: *(-?[0-9]+) *", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_requires_space(completion):
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: +(-?[0-9]+) *", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_no_trailing_spaces(completion):
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: *(-?[0-9]+)", line)
        if m:
            answer = int(m.group(1))
    return answer


def answer_sign_with_space(completion):  # '+7' and '- 5' read as numbers
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: *([-+]?) *([0-9]+) *", line)
        if m:
            answer = int(m.group(1) + m.group(2))
    return answer


def answer_empty_resets(completion):  # 'Answer:' alone erases the answer found before
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"Answer: *(-?[0-9]*) *", line)
        if m:
            answer = int(m.group(1)) if m.group(1).lstrip("-") else None
    return answer


def answer_lower_case_too(completion):
    answer = None
    for line in completion.split("\n"):
        m = re.fullmatch(r"answer: *(-?[0-9]+) *", line, flags=re.IGNORECASE)
        if m:
            answer = int(m.group(1))
    return answer


def answer_zero_when_absent(completion):
    found = re.findall(r"^Answer: *(-?[0-9]+) *$", completion, flags=re.MULTILINE)
    return int(found[-1]) if found else 0


def answer_last_number(completion):
    found = re.findall(r"-?[0-9]+", completion)
    return int(found[-1]) if found else None


def answer_as_float(completion):
    found = re.findall(r"^Answer: *(-?[0-9]+) *$", completion, flags=re.MULTILINE)
    return float(found[-1]) if found else None


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
        (answer_any_whitespace, "A tab, a non-breaking space"),
        (answer_splitlines, "split at more than"),
        (answer_empty_resets, "erased the answer before it"),
    ],
)
def test_extract_answer_mistakes(wrong, fragment):
    assert_fails_with("extract_answer", wrong, fragment)


@pytest.mark.parametrize("wrong", [answer_any_whitespace, answer_trailing_whitespace, answer_across_lines,
                                   answer_splitlines])
def test_extract_answer_only_plain_spaces_and_newlines(wrong):
    """Any whitespace where the contract says plain spaces, or a line break other than '\\n', is rejected."""
    result = run_check("extract_answer", wrong)
    assert not result.passed, result.message


def test_extract_answer_at_most_one_space_is_not_told_negatives_are_missed():
    """It reads '-7' right, so "Negative answers are missed" would be a wrong diagnosis: it is told about the
    spaces instead."""
    result = run_check("extract_answer", answer_at_most_one_space)
    text = f"{result.message}\n{result.hint}"
    assert not result.passed
    assert "Negative answers" not in text, text
    assert "Several spaces after the colon are allowed" in result.message, text


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

    def whole_text_pattern(completion):  # one pattern over the text, [ ] for spaces, [0-9] for digits
        found = re.findall(r"^Answer:[ ]*(-?[0-9]+)[ ]*$", completion, flags=re.MULTILINE)
        return int(found[-1]) if found else None

    def partition(completion):
        answer = None
        for line in completion.split("\n"):
            head, colon, rest = line.partition(":")
            if head != "Answer" or not colon:
                continue
            number = rest.strip(" ")
            digits = number.removeprefix("-")
            if digits.isascii() and digits.isdigit():
                answer = int(number)
        return answer

    for right in (by_hand, from_the_end, whole_text_pattern, partition):
        result = run_check("extract_answer", right)
        assert result.passed, (right.__name__, result.message)


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


def reward_any_answer(completions, answers):  # right if it matches any problem's answer
    return torch.tensor([float(extract_answer(c) in answers) for c in completions])


def reward_text_compare(completions, answers):
    return torch.tensor([float(str(extract_answer(c)) == answers[i]) for i, c in enumerate(completions)])


def reward_stacked(completions, answers):  # torch.stack of an empty list raises
    return torch.stack([torch.tensor(float(extract_answer(c) == a)) for c, a in zip(completions, answers)])


def reward_squeezed(completions, answers):  # a batch of 1 loses its dimension
    return torch.tensor([[float(extract_answer(c) == a)] for c, a in zip(completions, answers)]).squeeze()


def reward_prefix_parse(completions, answers):  # its own loose reading: 'Answer: 12 apples' counts
    out = []
    for c, a in zip(completions, answers):
        found = re.findall(r"Answer: *(-?[0-9]+)", c)
        out.append(float(bool(found) and int(found[-1]) == a))
    return torch.tensor(out)


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


def sft_count_floored_at_two(logits, tokens, loss_mask):  # "a mean needs two tokens": halves a lone token's loss
    nll = -token_logps(logits, tokens) * loss_mask[:, 1:]
    return nll.sum() / loss_mask[:, 1:].sum().clamp(min=2)


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


def sft_summed(logits, tokens, loss_mask):
    return -torch.where(loss_mask[:, 1:], token_logps(logits, tokens), 0.0).sum()


def sft_log_likelihood(logits, tokens, loss_mask):  # the sign forgotten
    return -masked_mean(token_logps(logits, tokens), loss_mask)


def sft_as_float(logits, tokens, loss_mask):
    return masked_mean(token_logps(logits, tokens), loss_mask).item()


def sft_shape_one(logits, tokens, loss_mask):
    return masked_mean(token_logps(logits, tokens), loss_mask).reshape(1)


def sft_clears_first_column(logits, tokens, loss_mask):  # "loss_mask[:, 0] is ignored", written into the input
    loss_mask[:, 0] = False
    picked = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
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


def pass_all_wrong(n, c, k):  # the complement forgotten
    prob = 1.0
    for i in range(k):
        prob *= (n - c - i) / (n - i)
    return prob


def pass_ignores_k(n, c, k):
    return c / n


def pass_zero_shortcut(n, c, k):  # 0.0 where it should be 1.0
    if n - c < k:
        return 0.0
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def pass_float32_product(n, c, k):  # torch's default dtype: exact to 7 digits only
    if n - c < k:
        return 1.0
    ratios = torch.arange(n - c - k + 1, n - c + 1) / torch.arange(n - k + 1, n + 1)
    return float(1 - ratios.prod())


def pass_recursive(n, c, k):  # one level per factor: k levels deep
    if n - c < k:
        return 1.0
    if k == 0:
        return 0.0
    return 1 - (n - c) / n * (1 - pass_recursive(n - 1, c, k - 1))


def pass_falling_factorials(n, c, k):  # each falling factorial alone overflows a float for large k
    if n - c < k:
        return 1.0
    return 1 - float(math.perm(n - c, k)) / float(math.perm(n, k))


def pass_fraction(n, c, k):  # exact, but a Fraction is no float
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_numpy_float_products(n, c, k):  # two products of k floats: inf / inf once they overflow
    if n - c < k:
        return 1.0
    with np.errstate(all="ignore"):
        num = np.prod(np.arange(n - c - k + 1, n - c + 1, dtype=np.float64))
        den = np.prod(np.arange(n - k + 1, n + 1, dtype=np.float64))
        return float(1 - num / den)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (pass_gamma, "171!"),
        (pass_int64, "Right on every case up to n = 20, wrong for n = "),
        (pass_with_replacement, "with replacement"),
        (pass_shortcut_off_by_one, "off by one"),
        (pass_tensor, "should return a Python float, got a Tensor"),
        (pass_lgamma_float32, "float64's precision"),  # float32 log-gammas lose the digits
        (pass_float32_product, "float64's precision"),
        (pass_recursive, "RecursionError"),
        (pass_falling_factorials, "OverflowError"),
        (pass_numpy_float_products, "something overflows"),
        (pass_ignores_k, "k is ignored"),
    ],
)
def test_pass_at_k_mistakes(wrong, fragment):
    assert_fails_with("pass_at_k", wrong, fragment)


def test_pass_at_k_zero_shortcut_is_not_told_it_computed_the_all_wrong_chance():
    """Returning 0.0 where n - c < k agrees with "the chance that all k are wrong" on that case alone; the
    candidate got k = 1 right before, which that mistake does not: it is told about the shortcut."""
    result = run_check("pass_at_k", pass_zero_shortcut)
    text = f"{result.message}\n{result.hint}"
    assert not result.passed
    assert "all k samples are wrong" not in text, text
    assert "The shortcut returns 0.0" in result.message, text


def test_pass_at_k_sweep_covers_the_contract_range():
    """The check tries every regime of the contract's range: n up to 1024 with k from 1 to n, n - c on both
    sides of k, and the sizes where each shortcut breaks (171! overflows a float; C(n, n / 2) is within a
    factor of 40 of float's limit at n = 1024 and overflows it first at n = 1030, outside the range)."""
    from rlhf_tutorial.checks.ch07_reasoning import _sweep

    rows = _sweep()
    assert max(n for n, _, _ in rows) == 1024 and any(n == 171 for n, _, _ in rows)
    assert {(n - c < k, n - c == k) for n, c, k in rows} >= {(True, False), (False, True), (False, False)}
    assert any(n == 1024 and k >= 1000 and n - c >= k for n, c, k in rows)  # a thousand factors, none zero
    assert all(1 <= k <= n and 0 <= c <= n for n, c, k in rows)
    assert math.comb(1024, 512) < 1.8e308 / 40
    with pytest.raises(OverflowError):
        float(math.comb(1030, 515))
    float(math.comb(1029, 514))  # the last n whose binomials all fit


def test_pass_at_k_binomials_in_floats_are_right_within_the_range():
    """float(C(n - c, k)) / float(C(n, k)) is exact to float64 up to n = 1029: inside the contract's range
    (n <= 1024) it is a right answer, and the check accepts it."""
    def float_binomials(n, c, k):
        return 1 - float(math.comb(n - c, k)) / float(math.comb(n, k))

    result = run_check("pass_at_k", float_binomials)
    assert result.passed, result.message


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

    def log1p_sum(n, c, k):
        if c == 0:
            return 0.0
        if n - c < k:
            return 1.0
        return -math.expm1(sum(math.log1p(-c / (n - i)) for i in range(k)))

    def numpy_ratios(n, c, k):
        i = np.arange(k, dtype=np.float64)
        return float(1 - np.prod((n - c - i) / (n - i))) if n - c >= k else 1.0

    for right in (exact_fraction, exact_integers, log_gamma_float64, log1p_sum, numpy_ratios):
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


def select_cap_ignored(rewards, max_per_prompt=None):
    return (rewards.flatten() == 1).nonzero().squeeze(-1)


def select_zero_means_no_cap(rewards, max_per_prompt=None):  # `if max_per_prompt:` treats 0 as None
    keep = rewards == 1
    if max_per_prompt:
        keep &= keep.cumsum(-1) <= max_per_prompt
    return keep.flatten().nonzero().squeeze(-1)


def select_none_as_one(rewards, max_per_prompt=None):  # a default cap of 1 where None means no cap
    cap = 1 if max_per_prompt is None else max_per_prompt
    keep = rewards == 1
    keep &= keep.cumsum(-1) <= cap
    return keep.flatten().nonzero().squeeze(-1)


def select_solved_prompts(rewards, max_per_prompt=None):  # every sample of a prompt solved at least once
    keep = (rewards == 1).any(-1, keepdim=True).expand_as(rewards)
    return keep.flatten().nonzero().squeeze(-1)


def select_squeezed(rewards, max_per_prompt=None):  # .squeeze(): one kept sample becomes a 0-d tensor
    keep = rewards == 1
    if max_per_prompt is not None:
        keep &= keep.cumsum(-1) <= max_per_prompt
    return keep.flatten().nonzero().squeeze()


def select_zeroes_rewards(rewards, max_per_prompt=None):  # drops the samples over the cap in the input itself
    if max_per_prompt is not None:
        for row in rewards:
            seen = 0
            for j in range(row.shape[0]):
                if row[j] == 1:
                    seen += 1
                    if seen > max_per_prompt:
                        row[j] = 0.0
    return (rewards.flatten() == 1).nonzero().squeeze(-1)


def select_float(rewards, max_per_prompt=None):
    return reasoning.select_correct(rewards, max_per_prompt).float()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (select_batch_cap, "whole batch"),
        (select_last, "last correct samples"),
        (select_columns, "column indices"),
        (select_prompts_reversed, "increasing order"),
        (select_int32, "the dtype is int32"),
        pytest.param(select_on_cpu, "is on cpu", marks=needs_gpu),
        (select_zeroes_rewards, "modified an input tensor in place"),
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
def bon_log_n(n):  # the first term alone
    return math.log(n)


def bon_bits(n):
    return math.log2(n) - (n - 1) / n


def bon_flipped(n):
    return (n - 1) / n - math.log(n)


def bon_off_by_one(n):  # a slip in the by-parts integral: 1 / (n + 1) for 1 / n
    return math.log(n) - 1 + 1 / (n + 1)


def bon_large_n_limit(n):
    return math.log(n) - 1


def bon_tensor(n):
    return torch.log(torch.tensor(float(n), dtype=torch.float64)) - (n - 1) / n


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (bon_log_n, "log(n) alone, the first term"),
        (lambda n: math.log(n) - (n - 1) // n, "log(n) alone"),  # integer division: the term vanishes
        (bon_large_n_limit, "large-n limit"),
        (bon_flipped, "sign is flipped"),
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
# the contract, clause by clause (tests/checks/test_contract_clauses.py: every clause of the checker's
# CLAUSES has a version here that breaks it, and the checker rejects each)
# ----------------------------------------------------------------------------------------------------
VIOLATIONS = {
    "extract_answer": {
        "split_on_newline": [answer_splitlines],
        "exact_prefix": [answer_lower_case_too, answer_stripped_lines],
        "spaces_optional": [answer_at_most_one_space, answer_requires_space],
        "plain_spaces_only": [answer_any_whitespace, answer_trailing_whitespace],
        "minus_only": [answer_sign_with_space, answer_via_int],
        "ascii_digits": [answer_any_digit, answer_empty_resets],
        "trailing_spaces": [answer_no_trailing_spaces],
        "nothing_else": [answer_search_in_line],
        "one_line_each": [answer_across_lines],
        "last_line_wins": [answer_first_line],
        "anywhere": [answer_whole_text_tail],
        "none_when_absent": [answer_zero_when_absent, answer_last_number],
        "python_int": [answer_as_text, answer_as_float],
    },
    "verifiable_reward": {
        "strict_parser": [reward_lenient, reward_prefix_parse],
        "own_answer": [reward_any_answer],
        "missing_is_wrong": [reward_none_is_zero],
        "int_comparison": [reward_text_compare],
        "binary": [reward_plus_minus],
        "float32_tensor": [reward_float64, reward_bool, reward_list],
        "shape": [reward_stacked, reward_squeezed],
    },
    "sft_loss": {
        "shifted": [sft_unshifted],
        "mask_aligned": [sft_mask_misaligned],
        "masked_only": [sft_no_mask],
        "first_column_ignored": [sft_counts_position_zero],
        "one_mean_over_tokens": [sft_per_row_mean, sft_count_floored_at_two],
        "mean_not_sum": [sft_summed],
        "negative_log_likelihood": [sft_log_likelihood],
        "empty_mask_zero": [sft_count_not_clamped, sft_cross_entropy_mean],
        "stable": [sft_log_of_softmax],
        "differentiable": [sft_detached_output, sft_under_no_grad, sft_detached_input, sft_item_back_to_tensor,
                           sft_detached_normaliser],
        "scalar": [sft_as_float, sft_shape_one],
        "inputs_unchanged": [sft_clears_first_column],
    },
    "pass_at_k": {
        "without_replacement": [pass_with_replacement],
        "complement": [pass_all_wrong],
        "uses_k": [pass_ignores_k],
        "one_when_n_minus_c_below_k": [pass_zero_shortcut],
        "below_one_at_equality": [pass_shortcut_off_by_one],
        "no_overflow_to_1024": [pass_gamma, pass_int64, pass_recursive, pass_falling_factorials,
                                pass_numpy_float_products],
        "float64_precision": [pass_lgamma_float32, pass_float32_product],
        "python_float": [pass_tensor, pass_fraction],
    },
    "select_correct": {
        "correct_only": [select_solved_prompts],
        "cap_per_prompt": [select_batch_cap],
        "cap_honoured": [select_cap_ignored],
        "zero_is_a_cap": [select_zero_means_no_cap],
        "none_keeps_all": [select_none_as_one],
        "first_kept": [select_last],
        "flat_indices": [select_columns],
        "increasing": [select_prompts_reversed],
        "one_dim": [select_squeezed],
        "int64": [select_int32, select_float],
        "inputs_unchanged": [select_zeroes_rewards],
    },
    "best_of_n_kl": {
        "closed_form": [bon_log_n, bon_large_n_limit],
        "natural_log": [bon_bits],
        "sign": [bon_flipped],
        "zero_at_one": [bon_off_by_one],
        "python_float": [bon_tensor],
    },
}


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
