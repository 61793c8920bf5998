"""One way to measure a tuned policy, the same for every method of the course (chapter 06).

``evaluate_policy`` samples completions from the policy itself (stopping at EOS, at most
``max_new_tokens``), scores them with the task reward, and measures the **sequence KL** to the
reference on those same samples:

    KL(pi || pi_ref) = E_{y ~ pi} [ sum_t KL( pi(. | x, y_<t) || pi_ref(. | x, y_<t) ) ]

summed over the completion's tokens (EOS included). Each sample contributes the exact KL of the full
next-token distributions along its own path (an unbiased estimate of the sequence KL with less
variance than log pi(y) - log pi_ref(y)); the mean over samples and its standard error are reported,
with the mean reward and its standard error. PPO (chapter 03), GRPO, RLOO, GSPO (chapter 04) and
DPO / IPO (chapter 06) are all measured with this function for the frontier.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from rlhf_tutorial.devices import device_of, rng_devices
from rlhf_tutorial.grpo import decode_completions, eos_id, sample_group
from rlhf_tutorial.rewards import ngram_repetition


def sequence_kl(
    policy: HookedTransformer,
    reference: HookedTransformer,
    tokens: Int[Tensor, "b s"],
    mask: Bool[Tensor, "b g"],
    temperature: float = 1.0,
    max_rows: int = 32,
) -> Float[Tensor, "b"]:
    """Per row, sum over its completion tokens (mask True; g = the last g positions of ``tokens``) of
    KL(pi(. | prefix) || pi_ref(. | prefix)) between the full next-token distributions of
    ``logits / temperature``. Runs in chunks of ``max_rows`` rows (the [rows, s, v] logits stay small)."""
    g = mask.shape[1]
    out = []
    with torch.no_grad():
        for chunk, chunk_mask in zip(tokens.split(max_rows), mask.split(max_rows)):
            logp = (policy(chunk)[:, -g - 1 : -1] / temperature).log_softmax(-1)  # [rows g v]
            ref_logp = (reference(chunk)[:, -g - 1 : -1] / temperature).log_softmax(-1)
            kl = (logp.exp() * (logp - ref_logp)).sum(-1)  # [rows g]
            out.append(torch.where(chunk_mask, kl, torch.zeros_like(kl)).sum(-1))
    return torch.cat(out)


def mean_and_se(values: Sequence[float] | Tensor) -> tuple[float, float]:
    """The mean and its standard error (std / sqrt(n), unbiased std; 0 for one value)."""
    x = torch.as_tensor(values, dtype=torch.float64).flatten()
    se = x.std().item() / math.sqrt(len(x)) if len(x) > 1 else 0.0
    return x.mean().item(), se


@torch.no_grad()
def evaluate_policy(
    policy: HookedTransformer,
    reference: HookedTransformer,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]],
    prompts: Sequence[str],
    n_samples: int,
    max_new_tokens: int,
    seed: int,
    temperature: float = 1.0,
    prepend_bos: bool = True,
) -> dict[str, Any]:
    """Sample ``n_samples`` completions spread over ``prompts`` (its own RNG stream: the same seed gives
    the same draws from the same policy) and measure them.

    Returns ``reward`` / ``reward_se`` (mean task reward and its standard error), ``kl`` / ``kl_se``
    (sequence KL to ``reference``, see ``sequence_kl``), ``kl_per_token`` (the same summed KL over all
    samples divided by their number of tokens), ``completion_len``, ``repetition`` (3-gram), and the
    ``texts`` with their ``rewards``.
    """
    policy_mode = policy.training
    policy.eval()
    eos = eos_id(policy)
    texts, kls, lengths = [], [], []
    per_prompt = math.ceil(n_samples / len(prompts))
    with torch.random.fork_rng(devices=rng_devices(device_of(policy))):  # the GPU's stream too
        torch.manual_seed(seed)
        for prompt in prompts:
            prompt_tokens = policy.to_tokens(prompt, prepend_bos=prepend_bos)[0]
            tokens, mask = sample_group(policy, prompt_tokens, per_prompt, max_new_tokens, eos, temperature)
            texts += decode_completions(policy, tokens, mask, prompt)
            kls.append(sequence_kl(policy, reference, tokens, mask, temperature))
            lengths.append(mask.sum(-1))
    policy.train(policy_mode)
    texts = texts[:n_samples]
    kl = torch.cat(kls)[:n_samples]
    length = torch.cat(lengths)[:n_samples].float()
    rewards = reward_fn(texts).float().cpu()
    reward, reward_se = mean_and_se(rewards)
    kl_mean, kl_se = mean_and_se(kl.cpu())
    return {
        "reward": reward,
        "reward_se": reward_se,
        "kl": kl_mean,
        "kl_se": kl_se,
        "kl_per_token": (kl.sum() / length.sum()).item(),
        "completion_len": length.mean().item(),
        "repetition": ngram_repetition(texts).mean().item(),
        "texts": texts,
        "rewards": rewards.tolist(),
    }
