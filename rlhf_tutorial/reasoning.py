"""Chapter 07: reasoning with verifiable rewards (RLVR), in a tiny arithmetic world.

A worked solution ends with a line ``Answer: N``. Whether it is right needs no reward model: a
program reads N and compares it with the true result. That is a **verifiable reward**, and with it
the chapter runs the methods of today's reasoning models side by side, each from the same base model:
supervised fine-tuning (SFT) on correct demonstrations, best-of-N and rejection-sampling fine-tuning
(SFT on the model's own correct samples), and GRPO (chapter 04's trainer) with the verifier as the
reward, started from the base model as in DeepSeek-R1-Zero. The pieces a learner writes, in the
order the chapter builds them:

1. ``extract_answer``     the strict parser: the last line ``Answer: N`` of a completion, or None
2. ``verifiable_reward``  1.0 where the parsed answer is the true one, else 0.0
3. ``sft_loss``           next-token cross-entropy on the completion only (the prompt is masked)
4. ``pass_at_k``          the unbiased estimator of pass@k from n samples of which c are correct
5. ``select_correct``     which samples rejection-sampling fine-tuning trains on (at most m per prompt)
6. ``best_of_n_kl``       the KL of best-of-n sampling from the reference, an integral evaluated by hand

``lenient_extract_answer`` is the verifier done wrong (the first number anywhere in the text): a
policy trained against it learns to put the right-looking number first, and the chapter shows it.
"""

from __future__ import annotations

import math
import re

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

# ----------------------------------------------------------------------------------------------------
# The verifier
# ----------------------------------------------------------------------------------------------------


def extract_answer(completion: str) -> int | None:
    """The final answer of a worked solution, read strictly.

    The completion is split on ``"\\n"``. A line counts when the whole line is ``Answer:``, then
    optional plain spaces, an optional ``-``, one or more ASCII digits 0-9, optional trailing spaces,
    and nothing else. Among those lines the **last** one wins, wherever it stands (text after it is
    ignored). Returns its N as a Python ``int``, or ``None`` when no line has that form:
    ``"Answer: 12 apples"``, ``"answer: 12"``, ``"  Answer: 12"``, ``"Answer: +12"``, ``"Answer: 1.5"``
    and digits of other scripts (``"Answer: ٤٢"``, which ``int()`` reads as 42) are not answers.
    """
    # >>> exercise
    answer = None
    for line in completion.split("\n"):
        match = re.fullmatch(r"Answer: *(-?[0-9]+) *", line)
        if match:
            answer = int(match.group(1))
    return answer
    # <<< exercise


def lenient_extract_answer(completion: str) -> int | None:
    """A lenient verifier, for the chapter to hack: the first integer anywhere in the completion
    (``-?[0-9]+``), or None. It accepts ``"12 apples"`` and a number in the working before the
    answer line; a policy rewarded through it learns to say a likely number early."""
    match = re.search(r"-?[0-9]+", completion)
    return int(match.group(0)) if match else None


def verifiable_reward(completions: list[str], answers: list[int]) -> Float[Tensor, "b"]:
    """The verifiable reward of each completion, against the true answers: r_i is 1.0 when the answer
    that ``extract_answer`` reads from completion i equals ``answers[i]`` (as integers), and 0.0
    otherwise. A completion with no answer line gets 0.0, whatever the true answer (0 included). Returns a float32 tensor of shape ``[len(completions)]``
    on the CPU (its inputs are text; trainers move rewards to the model's device, as for every
    reward function of the course).
    """
    # >>> exercise
    rewards = [1.0 if extract_answer(text) == answer else 0.0 for text, answer in zip(completions, answers)]
    return torch.tensor(rewards, dtype=torch.float32)
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Supervised fine-tuning
# ----------------------------------------------------------------------------------------------------


def sft_loss(
    logits: Float[Tensor, "b s v"], tokens: Int[Tensor, "b s"], loss_mask: Bool[Tensor, "b s"]
) -> Float[Tensor, ""]:
    """The SFT loss: next-token cross-entropy on the completion's tokens only, one mean over them all.

        L = - (1 / N) * sum_{b, t >= 1 : loss_mask[b, t]} log_softmax(logits[b, t - 1])[tokens[b, t]]
        N = number of (b, t >= 1) with loss_mask[b, t]

    ``logits[:, t - 1]`` predicts token t (the shift by one); ``loss_mask`` is True on the tokens to
    learn (the completion), False on the prompt and padding; ``loss_mask[:, 0]`` is ignored (the first
    token has no prediction). Every token weighs the same: a long completion counts more than a short
    one (a mean of per-row means would not), and a row with no True contributes nothing. A batch with
    no True at all gives 0.0. Differentiable in ``logits``; a scalar on ``logits.device``.
    """
    # >>> exercise
    logps = logits[:, :-1].log_softmax(dim=-1)  # [b s-1 v]: position t-1 predicts token t
    token_logps = logps.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [b s-1]
    mask = loss_mask[:, 1:]
    return -torch.where(mask, token_logps, 0.0).sum() / mask.sum().clamp(min=1)
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Measuring: pass@k
# ----------------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k (Chen et al. 2021), from n samples of which c are correct:

        pass@k = 1 - C(n - c, k) / C(n, k)       (1 <= k <= n, 0 <= c <= n)

    the chance that k of the n samples, drawn without replacement, include a correct one; 1.0 when
    n - c < k (every k-subset holds a correct sample). The ratio of binomials is computed as a
    product of k factors, C(n - c, k) / C(n, k) = prod_{i=0}^{k-1} (n - c - i) / (n - i), each in
    [0, 1]: nothing overflows (C(1024, 512) is about 4.5e306, and factorials overflow a float from
    171!). Raises ValueError outside the ranges above.
    """
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"pass_at_k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    # >>> exercise
    if n - c < k:
        return 1.0
    all_wrong = 1.0  # C(n - c, k) / C(n, k): the chance that k samples are all wrong
    for i in range(k):
        all_wrong *= (n - c - i) / (n - i)
    return 1.0 - all_wrong
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Rejection sampling and best-of-n
# ----------------------------------------------------------------------------------------------------


def select_correct(rewards: Float[Tensor, "p G"], max_per_prompt: int | None = None) -> Int[Tensor, "m"]:
    """Which samples rejection-sampling fine-tuning (expert iteration) trains on.

    ``rewards[i, j]`` is the verifiable reward (0.0 or 1.0) of sample j of prompt i. Returns the flat
    indices ``i * G + j`` (row-major, as ``rewards.flatten()`` orders them) of the samples with reward
    1.0, in increasing order, keeping of each prompt only its first ``max_per_prompt`` correct samples
    (None: all of them), so that the easy prompts, right every time, do not flood the training set. A
    prompt with no correct sample contributes nothing. int64, on ``rewards.device``.
    """
    # >>> exercise
    correct = rewards == 1.0  # [p G]
    if max_per_prompt is not None:
        rank = correct.long().cumsum(dim=-1)  # [p G]: 1 at a prompt's first correct sample, 2 at its 2nd
        correct = correct & (rank <= max_per_prompt)
    return correct.flatten().nonzero().squeeze(-1)
    # <<< exercise


def best_of_n_kl(n: int) -> float:
    """The KL divergence (nats) of best-of-n sampling from the reference policy it samples from,
    for a reward with a continuous distribution under the reference (no ties): this integral,
    evaluated in closed form in n,

        KL(pi_best-of-n || pi_ref) = integral_0^1 n u^(n-1) ln(n u^(n-1)) du        (n >= 1)

    (u: the reward's quantile under pi_ref; n u^(n-1): the density of the best of n quantiles, so
    pi_best-of-n / pi_ref = n u^(n-1)). 0.0 at n = 1 (best-of-1 is the reference itself), and below
    ln n for n > 1. This closed form is the value usually quoted for best-of-n; Beirami et al. (2024)
    show that for discrete outputs (a language model's, whose samples repeat) it is an upper bound on
    the true KL, exact only in the continuous case. A Python float.
    """
    # >>> exercise
    return math.log(n) - (n - 1) / n
    # <<< exercise
