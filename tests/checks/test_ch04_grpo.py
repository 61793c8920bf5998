"""Checkers of chapter 04: the reference passes, the stub fails, catalogued mistakes get their hint, and
correct code written differently passes. Every wrong implementation is written out here."""

import math

import pytest
import torch
from torch import nn

from rlhf_tutorial import grpo
from rlhf_tutorial.checks import run_check
from rlhf_tutorial.checks.core import check_device
from tests.checks.helpers import assert_fails_with

#: A tensor built on the CPU beside the checker's models and cases is a mistake only on another device.
needs_gpu = pytest.mark.skipif(check_device().type == "cpu", reason="needs a GPU or RLHF_TUTORIAL_DEVICE=simgpu")


# ----------------------------------------------------------------------------------------------------
# group_relative_advantages
# ----------------------------------------------------------------------------------------------------
def adv_population_std(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale == "none":
        return centred
    std = rewards.std(-1, keepdim=True, unbiased=False) if scale == "group" else rewards.std(unbiased=False)
    return centred / (std + eps)


def adv_no_eps(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale == "none":
        return centred
    return centred / (rewards.std(-1, keepdim=True) if scale == "group" else rewards.std())


def adv_batch_std_for_group(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred if scale == "none" else centred / (rewards.std() + eps)


def adv_batch_mean(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean()
    if scale == "none":
        return centred
    return centred / ((rewards.std(-1, keepdim=True) if scale == "group" else rewards.std()) + eps)


def adv_over_prompts(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(0, keepdim=True)
    if scale == "none":
        return centred
    return centred / ((rewards.std(0, keepdim=True) if scale == "group" else rewards.std()) + eps)


def adv_none_still_divides(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    return centred / ((rewards.std() if scale == "batch" else rewards.std(-1, keepdim=True)) + eps)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (adv_population_std, "population std"),
        (adv_no_eps, "no eps"),
        (adv_batch_std_for_group, "std is over the batch"),
        (adv_batch_mean, "mean of the whole batch"),
        (adv_over_prompts, "dim 0"),
        (adv_none_still_divides, "only centres"),
    ],
)
def test_group_relative_advantages_mistakes(wrong, fragment):
    assert_fails_with("group_relative_advantages", wrong, fragment)


def test_group_relative_advantages_written_differently():
    def with_loops(rewards, scale="group", eps=1e-4):
        out = torch.empty_like(rewards)
        batch_std = rewards.flatten().var(unbiased=True).sqrt()
        for i, row in enumerate(rewards):
            n = row.numel()
            mean = row.sum() / n
            std = torch.sqrt(((row - mean) ** 2).sum() / (n - 1))
            denom = {"group": std + eps, "batch": batch_std + eps, "none": torch.tensor(1.0)}[scale]
            out[i] = (row - mean) / denom
        return out

    assert run_check("group_relative_advantages", with_loops).passed


def test_group_relative_advantages_in_place_is_caught():
    def in_place(rewards, scale="group", eps=1e-4):
        rewards -= rewards.mean(-1, keepdim=True)
        return rewards / (rewards.std(-1, keepdim=True) + eps) if scale != "none" else rewards

    assert_fails_with("group_relative_advantages", in_place, "in place")


# ----------------------------------------------------------------------------------------------------
# calc_grpo_objective
# ----------------------------------------------------------------------------------------------------
def _surrogate(logprobs, old_logprobs, advantages, clip_eps, high):
    ratio = (logprobs - old_logprobs).exp()
    a = advantages.unsqueeze(-1)
    return torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + high) * a)


def _k3(logprobs, ref_logprobs):
    logr = ref_logprobs - logprobs
    return logr.exp() - 1 - logr


def obj_token_mean_for_grpo(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                            loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = _surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * _k3(logprobs, ref_logprobs)
    per_token = per_token * mask
    if loss_type == "dr_grpo":
        return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))
    return per_token.sum() / mask.sum()  # "grpo" and "dapo" alike: wrong for grpo


def obj_dr_grpo_true_lengths(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                             loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = _surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * _k3(logprobs, ref_logprobs)
    per_token = per_token * mask
    if loss_type == "dapo" or loss_type == "dr_grpo":
        return per_token.sum() / mask.sum()
    return (per_token.sum(1) / mask.sum(1)).mean()


def obj_kl_sign_flipped(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                        loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = _surrogate(logprobs, old_logprobs, advantages, clip_eps, high) + beta * _k3(logprobs, ref_logprobs)
    per_token = per_token * mask
    if loss_type == "grpo":
        return (per_token.sum(1) / mask.sum(1)).mean()
    if loss_type == "dapo":
        return per_token.sum() / mask.sum()
    return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))


def obj_k1(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
           loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = _surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * (logprobs - ref_logprobs)
    per_token = per_token * mask
    if loss_type == "grpo":
        return (per_token.sum(1) / mask.sum(1)).mean()
    if loss_type == "dapo":
        return per_token.sum() / mask.sum()
    return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))


def obj_ignores_clip_high(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                          loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    per_token = _surrogate(logprobs, old_logprobs, advantages, clip_eps, clip_eps) - beta * _k3(logprobs, ref_logprobs)
    per_token = per_token * mask
    if loss_type == "grpo":
        return (per_token.sum(1) / mask.sum(1)).mean()
    if loss_type == "dapo":
        return per_token.sum() / mask.sum()
    return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))


def obj_mask_ignored(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                     loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = _surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * _k3(logprobs, ref_logprobs)
    if loss_type == "dr_grpo":
        return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))
    return per_token.mean()


def obj_kl_swapped(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                   loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = _surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * _k3(ref_logprobs, logprobs)
    per_token = per_token * mask
    if loss_type == "grpo":
        return (per_token.sum(1) / mask.sum(1)).mean()
    if loss_type == "dapo":
        return per_token.sum() / mask.sum()
    return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (obj_token_mean_for_grpo, "that is DAPO"),
        (obj_dr_grpo_true_lengths, "true number of tokens"),
        (obj_kl_sign_flipped, "wrong sign"),
        (obj_k1, "k1"),
        (obj_ignores_clip_high, "clip_eps_high is ignored"),
        (obj_mask_ignored, "mask is ignored"),
        (obj_kl_swapped, "arguments swapped"),
    ],
)
def test_calc_grpo_objective_mistakes(wrong, fragment):
    assert_fails_with("calc_grpo_objective", wrong, fragment)


def test_calc_grpo_objective_written_differently():
    def per_row_loops(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                      loss_type="grpo", clip_eps_high=None, max_completion_len=None):
        upper = 1 + (clip_eps if clip_eps_high is None else clip_eps_high)
        B, g = logprobs.shape
        row_sums, row_counts = [], []
        for b in range(B):
            keep = mask[b]
            lp, old, ref = logprobs[b][keep], old_logprobs[b][keep], ref_logprobs[b][keep]
            ratio = torch.exp(lp - old)
            a = advantages[b]
            clipped = torch.clamp(ratio, min=1 - clip_eps, max=upper)
            surr = torch.where(a >= 0, torch.minimum(ratio, clipped) * a, torch.maximum(ratio, clipped) * a)
            kl = torch.exp(ref - lp) - (ref - lp) - 1
            row_sums.append((surr - beta * kl).sum())
            row_counts.append(keep.sum())
        sums, counts = torch.stack(row_sums), torch.stack(row_counts).float()
        if loss_type == "grpo":
            return (sums / counts).mean()
        if loss_type == "dapo":
            return sums.sum() / counts.sum()
        if loss_type == "dr_grpo":
            return sums.sum() / (B * (g if max_completion_len is None else max_completion_len))
        raise ValueError(f"unknown loss_type {loss_type!r}")

    result = run_check("calc_grpo_objective", per_row_loops)
    assert result.passed, result.message


def _aggregate(per_token, mask, loss_type, max_completion_len):
    per_token = per_token * mask
    if loss_type == "grpo":
        return (per_token.sum(1) / mask.sum(1)).mean()
    if loss_type == "dapo":
        return per_token.sum() / mask.sum()
    if loss_type == "dr_grpo":
        return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))
    raise ValueError(f"loss_type must be 'grpo', 'dapo' or 'dr_grpo', got {loss_type!r}")


def obj_dual_clip_clamped_k3(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                             loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    """A dual-clip surrogate (floor 3 * A for A < 0) and a k3 with its log-ratio clamped to [-10, 10]."""
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    surr = _surrogate(logprobs, old_logprobs, advantages, clip_eps, high)
    a = advantages.unsqueeze(-1)
    surr = torch.where(a < 0, torch.max(surr, 3.0 * a), surr)
    logr = (ref_logprobs - logprobs).clamp(-10, 10)
    return _aggregate(surr - beta * (logr.exp() - 1 - logr), mask, loss_type, max_completion_len)


def obj_k3_clamped_only(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                        loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    k3 = _k3(logprobs, ref_logprobs).clamp(max=50.0)
    return _aggregate(_surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * k3, mask, loss_type,
                      max_completion_len)


def obj_dr_grpo_by_length_only(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                               loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = (_surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * _k3(logprobs, ref_logprobs))
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (max_completion_len or mask.shape[1])
    return _aggregate(per_token, mask, loss_type, max_completion_len)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (obj_dual_clip_clamped_k3, "dual clip"),
        (obj_k3_clamped_only, "clamped"),
        (obj_dr_grpo_by_length_only, "B * max_completion_len"),
    ],
)
def test_calc_grpo_objective_saturation_escapes(wrong, fragment):
    assert_fails_with("calc_grpo_objective", wrong, fragment)


# ----------------------------------------------------------------------------------------------------
# completion_mask
# ----------------------------------------------------------------------------------------------------
def mask_drops_eos(completions, eos_token_id):
    return torch.cumsum(completions == eos_token_id, dim=1) == 0


def mask_keeps_everything(completions, eos_token_id):
    return torch.ones(completions.shape, dtype=torch.bool, device=completions.device)


def mask_only_eos_removed(completions, eos_token_id):
    return completions != eos_token_id


def mask_as_long(completions, eos_token_id):
    is_eos = (completions == eos_token_id).long()
    return ((is_eos.cumsum(-1) - is_eos) == 0).long()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (mask_drops_eos, "EOS token itself is masked out"),
        (mask_keeps_everything, "after the first EOS are kept"),
        (mask_only_eos_removed, "masked only the EOS tokens"),
        (mask_as_long, "dtype"),
    ],
)
def test_completion_mask_mistakes(wrong, fragment):
    assert_fails_with("completion_mask", wrong, fragment)


def test_completion_mask_written_differently():
    def by_argmax(completions, eos_token_id):
        b, g = completions.shape
        is_eos = completions == eos_token_id
        has_eos = is_eos.any(-1)
        first = torch.where(has_eos, is_eos.int().argmax(-1), torch.full((b,), g, device=completions.device))
        return torch.arange(g, device=completions.device)[None, :] <= first[:, None]  # first EOS index, or g

    assert run_check("completion_mask", by_argmax).passed


def mask_positions_on_the_cpu(completions, eos_token_id):
    # right on a CPU; on a GPU the positions (no device=) meet the completions' first-EOS index
    is_eos = (completions == eos_token_id).long()
    first = torch.where(is_eos.any(-1), is_eos.argmax(-1), completions.shape[1])
    return torch.arange(completions.shape[1])[None, :] <= first[:, None]


def mask_from_python_lists(completions, eos_token_id):
    # right values, rebuilt from Python lists: torch.tensor(...) without device= lands on the CPU
    rows = []
    for row in completions.tolist():
        stop = row.index(eos_token_id) + 1 if eos_token_id in row else len(row)
        rows.append([t < stop for t in range(len(row))])
    return torch.tensor(rows)


@needs_gpu
def test_completion_mask_built_on_the_cpu_is_named():
    result = run_check("completion_mask", mask_positions_on_the_cpu)
    assert not result.passed and "mixed devices" in result.message, result.message
    assert "torch.arange(completions.shape[1])" in result.message  # the learner's line
    assert "device=x.device" in result.hint and "checker" not in result.message
    result = run_check("completion_mask", mask_from_python_lists)
    assert not result.passed and "your output is on cpu" in result.message, result.message


# ----------------------------------------------------------------------------------------------------
# sample_group
# ----------------------------------------------------------------------------------------------------
def _generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature, top_k=None):
    return model.generate(prompt_tokens[None].expand(group_size, -1), max_new_tokens=max_new_tokens,
                          eos_token_id=eos_token_id, temperature=temperature, top_k=top_k, verbose=False)


def _pad(tokens, length, eos):
    return nn.functional.pad(tokens, (0, length - tokens.shape[1]), value=eos)


def sample_not_cloned(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    tokens = _generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature)
    return tokens, grpo.completion_mask(tokens[:, len(prompt_tokens):], eos_token_id)


def sample_mask_over_whole_sequence(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                                    top_k=None):
    tokens = _pad(_generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature).clone(),
                  len(prompt_tokens) + max_new_tokens, eos_token_id)
    return tokens, grpo.completion_mask(tokens, eos_token_id)


def sample_mask_drops_eos(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    tokens = _pad(_generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature).clone(),
                  len(prompt_tokens) + max_new_tokens, eos_token_id)
    return tokens, (tokens[:, len(prompt_tokens):] == eos_token_id).cumsum(-1) == 0


def sample_no_padding(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    tokens = _generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature).clone()
    return tokens, grpo.completion_mask(tokens[:, len(prompt_tokens):], eos_token_id)


def sample_once_repeated(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    one = _pad(_generate(model, prompt_tokens, 1, max_new_tokens, eos_token_id, temperature).clone(),
               len(prompt_tokens) + max_new_tokens, eos_token_id)
    tokens = one.repeat(group_size, 1)
    return tokens, grpo.completion_mask(tokens[:, len(prompt_tokens):], eos_token_id)


def sample_ignores_temperature(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                               top_k=None):
    tokens = _pad(_generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, 1.0).clone(),
                  len(prompt_tokens) + max_new_tokens, eos_token_id)
    return tokens, grpo.completion_mask(tokens[:, len(prompt_tokens):], eos_token_id)


def sample_never_stops(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    tokens = model.generate(prompt_tokens[None].expand(group_size, -1), max_new_tokens=max_new_tokens,
                            stop_at_eos=False, temperature=temperature, verbose=False).clone()
    return tokens, torch.ones(group_size, max_new_tokens, dtype=torch.bool, device=tokens.device)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        pytest.param(sample_not_cloned, "inference tensor", marks=pytest.mark.skipif(
            check_device().type == "simgpu", reason="the simulated GPU runs inference_mode as no_grad: no "
            "inference tensors there (a real GPU has them)")),
        (sample_mask_over_whole_sequence, "completion only"),
        (sample_mask_drops_eos, "EOS token itself is masked out"),
        (sample_no_padding, "pad the output"),
        (sample_once_repeated, "same completion"),
        (sample_ignores_temperature, "temperature"),
        (sample_never_stops, "after the first EOS are kept"),
    ],
)
def test_sample_group_mistakes(wrong, fragment):
    assert_fails_with("sample_group", wrong, fragment)


def test_sample_group_written_differently():
    """An explicit sampling loop without generate (no KV cache), stopping rows by hand, top_k by hand."""

    @torch.no_grad()
    def own_loop(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
        tokens = prompt_tokens.repeat(group_size, 1)
        done = torch.zeros(group_size, dtype=torch.bool, device=tokens.device)
        for _ in range(max_new_tokens):
            logits = model(tokens)[:, -1] / temperature
            if top_k is not None:  # keep the top_k most likely tokens
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.distributions.Categorical(logits=logits).sample()
            nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
            done |= nxt == eos_token_id
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        completions = tokens[:, len(prompt_tokens):]
        seen = torch.zeros(group_size, dtype=torch.bool, device=tokens.device)
        mask = torch.zeros_like(completions, dtype=torch.bool)
        for t in range(max_new_tokens):
            mask[:, t] = ~seen
            seen |= completions[:, t] == eos_token_id
        return tokens, mask

    result = run_check("sample_group", own_loop)
    assert result.passed, result.message


def sample_mask_on_the_cpu(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                           top_k=None):
    # its one mistake is the mask's device (a CPU pass of the check sees nothing else wrong)
    tokens = _pad(_generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature,
                            top_k).clone(), len(prompt_tokens) + max_new_tokens, eos_token_id)
    mask = torch.ones(group_size, max_new_tokens, dtype=torch.bool)  # no device=: the CPU
    for t in range(1, max_new_tokens):
        mask[:, t] = mask[:, t - 1] & (tokens[:, len(prompt_tokens) + t - 1] != eos_token_id)
    return tokens, mask


@needs_gpu
def test_sample_group_mask_built_on_the_cpu_is_named():
    result = run_check("sample_group", sample_mask_on_the_cpu)
    assert not result.passed and "mixed devices" in result.message, result.message
    assert "mask[:, t] = " in result.message and "checker" not in result.message


# ----------------------------------------------------------------------------------------------------
# grpo_step
# ----------------------------------------------------------------------------------------------------
def _objective(policy, batch, args, temperature=None, old=None):
    logprobs = grpo.group_token_logprobs(policy, batch.tokens, batch.prefix_lens,
                                      args.temperature if temperature is None else temperature)
    return logprobs, grpo.calc_grpo_objective(
        logprobs, batch.old_logprobs if old is None else old(logprobs), batch.ref_logprobs, batch.advantages,
        batch.mask, clip_eps=args.clip_coef, beta=args.kl_coef, loss_type=args.loss_type,
        clip_eps_high=args.clip_coef_high, max_completion_len=args.max_new_tokens)


def step_minimises(policy, optimizer, batch, args):
    _, objective = _objective(policy, batch, args)
    optimizer.zero_grad()
    (-objective).backward()
    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
    optimizer.step()
    return {"objective": objective.item()}


def step_no_zero_grad(policy, optimizer, batch, args):
    _, objective = _objective(policy, batch, args)
    objective.backward()
    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
    optimizer.step()
    return {"objective": objective.item()}


def step_no_clipping(policy, optimizer, batch, args):
    _, objective = _objective(policy, batch, args)
    optimizer.zero_grad()
    objective.backward()
    optimizer.step()
    return {"objective": objective.item()}


def step_ratio_always_one(policy, optimizer, batch, args):
    _, objective = _objective(policy, batch, args, old=lambda lp: lp.detach())
    optimizer.zero_grad()
    objective.backward()
    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
    optimizer.step()
    return {"objective": objective.item()}


def step_without_temperature(policy, optimizer, batch, args):
    _, objective = _objective(policy, batch, args, temperature=1.0)
    optimizer.zero_grad()
    objective.backward()
    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
    optimizer.step()
    return {"objective": objective.item()}


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (step_minimises, "wrong way"),
        (step_no_zero_grad, "zero_grad"),
        (step_no_clipping, "not clipped"),
        (step_ratio_always_one, "always 1"),
        (step_without_temperature, "temperature"),
    ],
)
def test_grpo_step_mistakes(wrong, fragment):
    assert_fails_with("grpo_step", wrong, fragment)


def test_grpo_step_written_differently():
    """Gradient scaled by hand instead of clip_grad_norm_, objective built from per-group forward passes."""

    def manual(policy, optimizer, batch, args):
        rows = []
        for tokens, plen in zip(batch.tokens, batch.prefix_lens):
            logp = torch.log_softmax(policy(tokens) / args.temperature, dim=-1)  # [G s v]
            rows.append(torch.gather(logp[:, plen - 1:-1], 2, tokens[:, plen:].unsqueeze(-1)).squeeze(-1))
        logprobs = torch.cat(rows, dim=0)
        objective = grpo.calc_grpo_objective(
            logprobs, batch.old_logprobs, batch.ref_logprobs, batch.advantages, batch.mask, args.clip_coef,
            args.kl_coef, args.loss_type, args.clip_coef_high, args.max_new_tokens)
        for p in policy.parameters():
            p.grad = None
        objective.backward()
        norm = torch.sqrt(sum((p.grad ** 2).sum() for p in policy.parameters() if p.grad is not None))
        scale = min(1.0, args.max_grad_norm / (float(norm) + 1e-6))
        for p in policy.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        optimizer.step()
        return {"objective": float(objective.detach())}

    result = run_check("grpo_step", manual)
    assert result.passed, result.message


def test_grpo_step_that_changes_the_batch_is_caught():
    def mutating(policy, optimizer, batch, args):
        batch.advantages.mul_(2.0)
        return grpo.grpo_step(policy, optimizer, batch, args)

    assert_fails_with("grpo_step", mutating, "in place")


# ----------------------------------------------------------------------------------------------------
# Decisions of the composite exercises, each with its own message (issue 15)
# ----------------------------------------------------------------------------------------------------
def sample_mask_whole_then_sliced(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                                  top_k=None):
    tokens = _pad(_generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature).clone(),
                  len(prompt_tokens) + max_new_tokens, eos_token_id)
    is_eos = (tokens == eos_token_id).long()
    whole = (is_eos.cumsum(-1) - is_eos) == 0  # over prompt + completion: a BOS = EOS prompt ends it at once
    return tokens, whole[:, len(prompt_tokens):]


def sample_without_stopping(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                            top_k=None):
    tokens = model.generate(prompt_tokens[None].expand(group_size, -1), max_new_tokens=max_new_tokens,
                            stop_at_eos=False, temperature=temperature, verbose=False).clone()
    return tokens, grpo.completion_mask(tokens[:, len(prompt_tokens):], eos_token_id)


def sample_padded_with_zero(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                            top_k=None):
    tokens = _generate(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature).clone()
    tokens = _pad(tokens, len(prompt_tokens) + max_new_tokens, 0)  # a "pad id" that is not EOS
    return tokens, grpo.completion_mask(tokens[:, len(prompt_tokens):], eos_token_id)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (sample_mask_whole_then_sliced, "over the whole sequence and then sliced"),
        (sample_without_stopping, "did not stop at EOS"),
        (sample_padded_with_zero, "padding after EOS is 0"),
    ],
)
def test_sample_group_decisions(wrong, fragment):
    assert_fails_with("sample_group", wrong, fragment)


def step_ignores_max_completion_len(policy, optimizer, batch, args):
    logprobs = grpo.group_token_logprobs(policy, batch.tokens, batch.prefix_lens, args.temperature)
    objective = grpo.calc_grpo_objective(logprobs, batch.old_logprobs, batch.ref_logprobs, batch.advantages,
                                         batch.mask, clip_eps=args.clip_coef, beta=args.kl_coef,
                                         loss_type=args.loss_type, clip_eps_high=args.clip_coef_high)
    optimizer.zero_grad()
    objective.backward()
    nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
    optimizer.step()
    return {"objective": objective.item()}


@pytest.mark.parametrize(
    "wrong, nudge",
    [
        (step_minimises, "The update goes the wrong way."),
        (step_no_zero_grad, "Gradients accumulate from one step to the next."),
        (step_no_clipping, "The gradient norm is not clipped."),
        (step_without_temperature, "The log-probs are of the raw logits."),
        (step_ignores_max_completion_len, "max_completion_len is not passed."),
    ],
)
def test_grpo_step_each_mistake_has_its_own_message(wrong, nudge):
    """The nudge (what is wrong) is in the message itself, not only in the full hint."""
    result = run_check("grpo_step", wrong)
    assert not result.passed and nudge in result.message, result.message


def mask_by_argmax_forgetting_rows_without_eos(completions, eos_token_id):
    # only a row with no EOS at all exposes it: argmax of an all-False row is 0, so only the first token counts
    first = (completions == eos_token_id).int().argmax(-1)
    return torch.arange(completions.shape[1], device=completions.device)[None, :] <= first[:, None]


def test_completion_mask_edge_only_mistake():
    result = run_check("completion_mask", mask_by_argmax_forgetting_rows_without_eos)
    assert not result.passed and "no EOS" in result.message, result.message


def test_sample_group_that_ignores_top_k_or_the_eos_argument_is_named():
    """A loop that forgets top_k, and one that stops at a fixed EOS id instead of the argument."""

    def no_top_k(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
        return grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature, None)

    def fixed_eos(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
        return grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, 7, temperature, top_k)

    def fixed_temperature(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
        return grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, 0.5, top_k)

    assert_fails_with("sample_group", no_top_k, "top_k is ignored")
    assert_fails_with("sample_group", fixed_eos, "Use the eos_token_id argument")
    assert_fails_with("sample_group", fixed_temperature, "at temperature 2.0")


# ----------------------------------------------------------------------------------------------------
# The contract, clause by clause: a version breaking each (tests/checks/test_contract_clauses.py)
# ----------------------------------------------------------------------------------------------------
def adv_eps_inside_sqrt(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale == "none":
        return centred
    var = rewards.var(-1, keepdim=True) if scale == "group" else rewards.var()
    return centred / torch.sqrt(var + eps)


def adv_fixed_eps(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale == "none":
        return centred
    return centred / ((rewards.std(-1, keepdim=True) if scale == "group" else rewards.std()) + 1e-4)


def adv_batch_raises_value_error(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale == "group":
        return centred / (rewards.std(-1, keepdim=True) + eps)
    if scale == "none":
        return centred
    raise ValueError(f"unknown scale {scale}")


def adv_batch_not_implemented(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale == "batch":
        raise NotImplementedError("batch scaling: later")
    return centred if scale == "none" else centred / (rewards.std(-1, keepdim=True) + eps)


def adv_batch_whitened(rewards, scale="group", eps=1e-4):
    if scale == "batch":  # centred on the batch mean, not on each group's
        return (rewards - rewards.mean()) / (rewards.std() + eps)
    centred = rewards - rewards.mean(-1, keepdim=True)
    return centred if scale == "none" else centred / (rewards.std(-1, keepdim=True) + eps)


def adv_unknown_scale_is_group(rewards, scale="group", eps=1e-4):
    centred = rewards - rewards.mean(-1, keepdim=True)
    if scale == "none":
        return centred
    if scale == "batch":
        return centred / (rewards.std() + eps)
    return centred / (rewards.std(-1, keepdim=True) + eps)


def adv_float64(rewards, scale="group", eps=1e-4):
    r = rewards.double()
    centred = r - r.mean(-1, keepdim=True)
    if scale == "none":
        return centred
    return centred / ((r.std(-1, keepdim=True) if scale == "group" else r.std()) + eps)


def _objective_with(*, ratio_clamp=None, dual=None, k3_clamp=None, kl="k3", kl_sign=-1.0, kl_against_old=False,
                    high_default=None, high_or=False, beta_or=False, low=None, detach_ratio=False, reducer="min",
                    invert=False, agg=None, in_place=False, item=False):
    """A calc_grpo_objective as a learner writes it, with one decision made wrong (each keyword one)."""

    def objective(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                  loss_type="grpo", clip_eps_high=None, max_completion_len=None):
        if high_or:
            high = clip_eps_high or clip_eps
        else:
            high = clip_eps_high if clip_eps_high is not None else (high_default or clip_eps)
        if beta_or:
            beta = beta or 0.04
        if in_place:
            logprobs.masked_fill_(~mask, 0.0)
            old_logprobs.masked_fill_(~mask, 0.0)
        logr = (old_logprobs - logprobs) if invert else (logprobs - old_logprobs)
        if ratio_clamp is not None:  # "to be safe"
            logr = logr.clamp(-ratio_clamp, ratio_clamp)
        ratio = logr.exp()
        if detach_ratio:
            ratio = ratio.detach()
        a = advantages.unsqueeze(-1)
        clipped = ratio.clamp(1 - (clip_eps if low is None else low), 1 + high) * a
        surr = {"min": torch.min(ratio * a, clipped), "max": torch.max(ratio * a, clipped),
                "clipped": clipped}[reducer]
        if dual is not None:
            surr = torch.where(a < 0, torch.max(surr, dual * a), surr)
        other = old_logprobs if kl_against_old else ref_logprobs
        log_q = other - logprobs
        if k3_clamp is not None:
            log_q = log_q.clamp(-k3_clamp, k3_clamp)
        kl_term = {"k3": log_q.exp() - 1 - log_q, "k1": -log_q, "k2": 0.5 * log_q ** 2,
                   "k3_swapped": (-log_q).exp() - 1 + log_q}[kl]
        per_token = (surr + kl_sign * beta * kl_term) * mask
        if agg is not None:
            out = agg(per_token, mask, loss_type, max_completion_len)
        else:
            out = _aggregate(per_token, mask, loss_type, max_completion_len)
        return out.item() if item else out

    return objective


def obj_ratio_clamped_below_only(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                                 loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    """Only the small ratios are guarded (log r >= -10 "to avoid underflow"): the gradient shows it."""
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    ratio = (logprobs - old_logprobs).clamp(min=-10.0).exp()
    a = advantages.unsqueeze(-1)
    surr = torch.min(ratio * a, ratio.clamp(1 - clip_eps, 1 + high) * a)
    return _aggregate(surr - beta * _k3(logprobs, ref_logprobs), mask, loss_type, max_completion_len)


def _agg_unknown_is_dr_grpo(per_token, mask, loss_type, max_completion_len):
    """Every loss_type other than "grpo" and "dapo" falls through to the last branch."""
    return _aggregate(per_token, mask, loss_type if loss_type in ("grpo", "dapo") else "dr_grpo", max_completion_len)


def _agg_dr_by_true_tokens(per_token, mask, loss_type, max_completion_len):
    if loss_type == "dr_grpo":
        return per_token.sum() / mask.sum()
    return _aggregate(per_token, mask, loss_type, max_completion_len)


def _agg_dr_ignores_max_len(per_token, mask, loss_type, max_completion_len):
    return _aggregate(per_token, mask, loss_type, None)


def _agg_dapo_per_sequence(per_token, mask, loss_type, max_completion_len):
    return _aggregate(per_token, mask, "grpo" if loss_type == "dapo" else loss_type, max_completion_len)


def obj_padded_mean(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                    loss_type="grpo", clip_eps_high=None, max_completion_len=None):
    high = clip_eps_high if clip_eps_high is not None else clip_eps
    per_token = (_surrogate(logprobs, old_logprobs, advantages, clip_eps, high) - beta * _k3(logprobs, ref_logprobs))
    per_token = per_token * mask
    if loss_type == "dr_grpo":
        return per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))
    if loss_type == "grpo":
        return per_token.mean(-1).mean()  # zeros counted as tokens
    return per_token.mean()


def adv_in_place(rewards, scale="group", eps=1e-4):
    rewards -= rewards.mean(-1, keepdim=True)
    if scale == "none":
        return rewards
    return rewards / ((rewards.std(-1, keepdim=True) if scale == "group" else rewards.std()) + eps)


def mask_to_last_eos(completions, eos_token_id):
    is_eos = (completions == eos_token_id).long()
    eos_from_t_on = is_eos.flip(-1).cumsum(-1).flip(-1)  # EOS tokens at t or later
    return (eos_from_t_on - is_eos > 0) | (is_eos.cumsum(-1) - is_eos == 0)


def sample_fixed_eos(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    return grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, 7, temperature, top_k)


def sample_no_top_k(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    return grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature, None)


def mask_fixed_eos(completions, eos_token_id):
    is_eos = (completions == 9).long()
    return is_eos.cumsum(-1) - is_eos == 0


def sample_repeated_prompt_missing(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                                   top_k=None):
    tokens, mask = grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature,
                                     top_k)
    return tokens[:, len(prompt_tokens) - 1:], mask  # forgot the prompt: wrong length, wrong start


def sample_wrong_first_token(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0,
                             top_k=None):
    tokens, mask = grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature,
                                     top_k)
    return torch.cat([tokens[:, 1:2], tokens[:, 1:]], dim=1), mask  # the prompt's first token lost


def sample_mask_as_long(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature=1.0, top_k=None):
    tokens, mask = grpo.sample_group(model, prompt_tokens, group_size, max_new_tokens, eos_token_id, temperature,
                                     top_k)
    return tokens, mask.long()


def _step_with(*, zero_grad=True, sign=1.0, clip=True, old="old", ref="ref", temperature=True, kwargs=None,
               step=True, objective_after=False, grad_norm_after_clip=False, modify_batch=False):
    """A grpo_step as a learner writes it, with one decision made wrong (each keyword one)."""

    def grpo_step(policy, optimizer, batch, args):
        if modify_batch:
            batch.advantages.mul_(2.0)
        logprobs = grpo.group_token_logprobs(policy, batch.tokens, batch.prefix_lens,
                                             args.temperature if temperature else 1.0)
        old_lp = {"old": batch.old_logprobs, "detached": logprobs.detach(), "ref": batch.ref_logprobs}[old]
        ref_lp = {"ref": batch.ref_logprobs, "old": batch.old_logprobs}[ref]
        options = dict(clip_eps=args.clip_coef, beta=args.kl_coef, loss_type=args.loss_type,
                       clip_eps_high=args.clip_coef_high, max_completion_len=args.max_new_tokens)
        options.update(kwargs or {})
        options = {k: v for k, v in options.items() if v is not None}
        objective = grpo.calc_grpo_objective(logprobs, old_lp, ref_lp, batch.advantages, batch.mask, **options)
        if zero_grad:
            optimizer.zero_grad()
        (sign * objective).backward()
        grad_norm = nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm if clip else 1e9)
        if grad_norm_after_clip:
            grad_norm = torch.sqrt(sum((p.grad ** 2).sum() for p in policy.parameters() if p.grad is not None))
        if step:
            optimizer.step()
        if objective_after:
            with torch.no_grad():
                logprobs = grpo.group_token_logprobs(policy, batch.tokens, batch.prefix_lens, args.temperature)
                objective = grpo.calc_grpo_objective(logprobs, old_lp, ref_lp, batch.advantages, batch.mask,
                                                     **options)
        return {"objective": objective.item(), "grad_norm": float(grad_norm)}

    return grpo_step


VIOLATIONS = {
    "group_relative_advantages": {
        "group_mean": [adv_batch_mean, adv_over_prompts],
        "group_std": [adv_batch_std_for_group],
        "unbiased_std": [adv_population_std],
        "eps_added": [adv_no_eps, adv_eps_inside_sqrt],
        "eps_honoured": [adv_fixed_eps],
        "batch_mode": [adv_batch_raises_value_error, adv_batch_not_implemented, adv_batch_whitened],
        "none_mode": [adv_none_still_divides],
        "unknown_scale": [adv_unknown_scale_is_group],
        "not_in_place": [adv_in_place],
        "dtype": [adv_float64],
    },
    "calc_grpo_objective": {
        "ratio": [_objective_with(invert=True)],
        "pessimistic_min": [_objective_with(reducer="max"), _objective_with(reducer="clipped")],
        "clip_eps": [_objective_with(low=0.2)],
        "clip_eps_high": [obj_ignores_clip_high, _objective_with(high_or=True)],
        "clip_eps_high_default": [_objective_with(high_default=0.28)],
        "no_dual_clip": [_objective_with(dual=3.0)],
        "large_log_ratios": [_objective_with(ratio_clamp=5.0), _objective_with(ratio_clamp=10.0),
                             obj_ratio_clamped_below_only],
        "k3": [obj_k1, _objective_with(kl="k2"), obj_kl_swapped],
        "k3_exact": [obj_k3_clamped_only, _objective_with(k3_clamp=10.0)],
        "kl_subtracted": [obj_kl_sign_flipped],
        "kl_to_reference": [_objective_with(kl_against_old=True)],
        "beta": [_objective_with(beta_or=True)],
        "mask": [obj_mask_ignored, obj_padded_mean],
        "grpo_aggregation": [obj_token_mean_for_grpo],
        "dapo_aggregation": [_objective_with(agg=_agg_dapo_per_sequence)],
        "dr_grpo_aggregation": [obj_dr_grpo_true_lengths, obj_dr_grpo_by_length_only,
                                _objective_with(agg=_agg_dr_by_true_tokens)],
        "max_completion_len": [_objective_with(agg=_agg_dr_ignores_max_len)],
        "differentiable": [_objective_with(detach_ratio=True)],
        "not_in_place": [_objective_with(in_place=True)],
        "scalar": [_objective_with(item=True)],
        "unknown_loss_type": [_objective_with(agg=_agg_unknown_is_dr_grpo)],
    },
    "completion_mask": {
        "eos_counted": [mask_drops_eos],
        "after_eos_masked": [mask_keeps_everything, mask_only_eos_removed],
        "first_eos": [mask_to_last_eos],
        "no_eos": [mask_by_argmax_forgetting_rows_without_eos],
        "eos_argument": [mask_fixed_eos],
        "bool": [mask_as_long],
    },
    "sample_group": {
        "shape": [sample_no_padding, sample_mask_as_long],
        "prompt_first": [sample_wrong_first_token, sample_repeated_prompt_missing],
        "group_sampled": [sample_once_repeated],
        "stops_at_eos": [sample_without_stopping, sample_never_stops],
        "eos_argument": [sample_fixed_eos],
        "padded": [sample_no_padding, sample_padded_with_zero],
        "mask_counts_eos": [sample_mask_drops_eos],
        "mask_completion_only": [sample_mask_whole_then_sliced, sample_mask_over_whole_sequence],
        "temperature": [sample_ignores_temperature],
        "top_k": [sample_no_top_k],
    },
    "grpo_step": {
        "temperature": [step_without_temperature],
        "old_logprobs": [step_ratio_always_one, _step_with(old="ref")],
        "reference": [_step_with(ref="old")],
        "args_passed": [_step_with(kwargs={"clip_eps_high": None}), _step_with(kwargs={"beta": 0.04}),
                        _step_with(kwargs={"loss_type": None})],
        "max_completion_len": [step_ignores_max_completion_len],
        "zero_grad": [step_no_zero_grad],
        "ascent": [step_minimises],
        "grad_clip": [step_no_clipping, _step_with(clip=False)],
        "steps": [_step_with(step=False)],
        "objective_returned": [_step_with(objective_after=True)],
        "grad_norm": [_step_with(grad_norm_after_clip=True)],
        "batch_read_only": [_step_with(modify_batch=True)],
    },
}


@pytest.mark.parametrize("wrong", [adv_batch_raises_value_error, adv_batch_not_implemented])
def test_a_missing_scale_mode_is_named_not_called_the_stub(wrong):
    """An attempt whose "batch" branch raises (its final ValueError, or its own NotImplementedError) is told
    that mode is missing, never to replace the stub's raise line."""
    result = run_check("group_relative_advantages", wrong)
    assert not result.passed
    assert 'scale="batch" raised' in result.message and "no answer for this mode" in result.message, result.message
    assert "not implemented yet" not in result.message and "raise NotImplementedError(...)" not in result.message


@pytest.mark.parametrize("bound, fragment", [
    (5.0, "clamped (to [-5, 5])"),
    (10.0, "clamped (to [-10, 10])"),
])
def test_calc_grpo_objective_a_clamped_log_ratio_is_named(bound, fragment):
    """A clamp of log(pi_theta / pi_old) "to be safe": at log r = 12 with a negative advantage it changes the
    value (and zeroes the gradient of the clamped tokens)."""
    assert_fails_with("calc_grpo_objective", _objective_with(ratio_clamp=bound), fragment)


def test_calc_grpo_objective_a_clamp_below_shows_in_the_gradient():
    result = run_check("calc_grpo_objective", obj_ratio_clamped_below_only)
    assert not result.passed and "log r = -11" in result.message, result.message
    assert "clamp of the log-ratio" in result.hint, result.hint


def test_calc_grpo_objective_in_float64_and_as_a_ratio_of_probabilities_passes():
    """Right answers written differently must pass the large log-ratio cases too: float64 inside, the ratio
    as exp(logprobs) / exp(old_logprobs), the clipped branch chosen with torch.where."""

    def float64_inside(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps=0.2, beta=0.04,
                       loss_type="grpo", clip_eps_high=None, max_completion_len=None):
        lp, old, ref = logprobs.double(), old_logprobs.double(), ref_logprobs.double()
        upper = 1 + (clip_eps if clip_eps_high is None else clip_eps_high)
        ratio = lp.exp() / old.exp()
        a = advantages.double()[:, None]
        clipped = ratio.clamp(1 - clip_eps, upper)
        surr = torch.where(ratio * a < clipped * a, ratio * a, clipped * a)
        logr = ref - lp
        per_token = torch.where(mask, surr - beta * (torch.expm1(logr) - logr), 0.0)
        counts = mask.sum(-1).double()
        if loss_type == "grpo":
            out = (per_token.sum(-1) / counts).mean()
        elif loss_type == "dapo":
            out = per_token.sum() / counts.sum()
        elif loss_type == "dr_grpo":
            out = per_token.sum() / (mask.shape[0] * (max_completion_len or mask.shape[1]))
        else:
            raise ValueError(loss_type)
        return out.float()

    result = run_check("calc_grpo_objective", float64_inside)
    assert result.passed, result.message


# ----------------------------------------------------------------------------------------------------
# reinforce_pp_advantages
# ----------------------------------------------------------------------------------------------------
def _masked_whiten(returns, mask, eps, unbiased=False):
    values = returns[mask]
    mean = values.mean()
    var = values.var(unbiased=unbiased)
    return torch.where(mask, (returns - mean) / torch.sqrt(var + eps), 0.0)


def _returns_to_go(rewards, logprobs, ref_logprobs, mask, beta):
    kl = (logprobs - ref_logprobs) * mask
    to_go = kl + kl.sum(-1, keepdim=True) - kl.cumsum(-1)  # sum over s >= t
    return rewards[:, None] - beta * to_go


def pp_per_sequence_whitening(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    returns = _returns_to_go(rewards, logprobs, ref_logprobs, mask, beta)
    out = torch.zeros_like(returns)
    for b in range(returns.shape[0]):
        row = returns[b][mask[b]]
        out[b][mask[b]] = (row - row.mean()) / torch.sqrt(row.var(unbiased=False) + eps)
    return out


def pp_whiten_every_position(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    returns = _returns_to_go(rewards, logprobs, ref_logprobs, mask, beta) * mask
    mean, var = returns.mean(), returns.var(unbiased=False)
    return (returns - mean) / torch.sqrt(var + eps) * mask


def pp_unbiased_variance(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    return _masked_whiten(_returns_to_go(rewards, logprobs, ref_logprobs, mask, beta), mask, eps, unbiased=True)


def pp_eps_on_std(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    returns = _returns_to_go(rewards, logprobs, ref_logprobs, mask, beta)
    values = returns[mask]
    return torch.where(mask, (returns - values.mean()) / (values.std(unbiased=False) + eps), 0.0)


def pp_fixed_eps(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    return _masked_whiten(_returns_to_go(rewards, logprobs, ref_logprobs, mask, beta), mask, 1e-8)


def pp_forward_cumsum(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    kl = (logprobs - ref_logprobs) * mask
    return _masked_whiten(rewards[:, None] - beta * kl.cumsum(-1), mask, eps)


def pp_whole_sequence_kl(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    kl = ((logprobs - ref_logprobs) * mask).sum(-1, keepdim=True)
    returns = (rewards[:, None] - beta * kl).expand_as(logprobs)
    return _masked_whiten(returns, mask, eps)


def pp_reward_on_last_token_only(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    kl = (logprobs - ref_logprobs) * mask
    token_rewards = -beta * kl
    last = mask.sum(-1) - 1
    token_rewards[torch.arange(len(rewards)), last] += rewards
    return _masked_whiten(token_rewards, mask, eps)  # per-token rewards, never summed into returns


def pp_discounted(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8, gamma=0.99):
    token_rewards = -beta * (logprobs - ref_logprobs) * mask
    token_rewards[torch.arange(len(rewards)), mask.sum(-1) - 1] += rewards
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(rewards)
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
    return _masked_whiten(returns, mask, eps)


def pp_k3(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    logr = ref_logprobs - logprobs
    kl = (torch.exp(logr) - 1 - logr) * mask
    to_go = kl.flip(-1).cumsum(-1).flip(-1)
    return _masked_whiten(rewards[:, None] - beta * to_go, mask, eps)


def pp_kl_added(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    kl = (logprobs - ref_logprobs) * mask
    return _masked_whiten(rewards[:, None] + beta * kl.flip(-1).cumsum(-1).flip(-1), mask, eps)


def pp_beta_or_default(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    return _masked_whiten(_returns_to_go(rewards, logprobs, ref_logprobs, mask, beta or 0.01), mask, eps)


def pp_masked_not_zero(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    returns = _returns_to_go(rewards, logprobs, ref_logprobs, mask, beta)
    values = returns[mask]
    return (returns - values.mean()) / torch.sqrt(values.var(unbiased=False) + eps)


def pp_junk_in_the_kl(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    kl = logprobs - ref_logprobs
    return _masked_whiten(rewards[:, None] - beta * kl.flip(-1).cumsum(-1).flip(-1), mask, eps)


def pp_in_place(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    kl = logprobs.sub_(ref_logprobs).mul_(mask)
    return _masked_whiten(rewards[:, None] - beta * kl.flip(-1).cumsum(-1).flip(-1), mask, eps)


def pp_clipped_to_be_safe(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    returns = _returns_to_go(rewards, logprobs, ref_logprobs, mask, beta)
    return _masked_whiten(returns, mask, eps).clamp(-5.0, 5.0)  # "advantage clipping", as some trainers do


def pp_return_from_the_next_token(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    kl = (logprobs - ref_logprobs) * mask
    to_go = kl.flip(-1).cumsum(-1).flip(-1) - kl  # off by one: the sum over s > t
    return _masked_whiten(rewards[:, None] - beta * to_go, mask, eps)


def pp_centred_only(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    returns = _returns_to_go(rewards, logprobs, ref_logprobs, mask, beta)
    return torch.where(mask, returns - returns[mask].mean(), 0.0)  # "a baseline": the mean, no scaling


def pp_float64(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
    return grpo.reinforce_pp_advantages(rewards.double(), logprobs.double(), ref_logprobs.double(), mask, beta, eps)


@pytest.mark.parametrize("wrong, fragment", [
    (pp_per_sequence_whitening, "each sequence on its own"),
    (pp_whiten_every_position, "include the masked positions"),
    (pp_unbiased_variance, "unbiased variance"),
    (pp_eps_on_std, "inside the square root"),
    (pp_forward_cumsum, "from the start of the sequence"),
    (pp_whole_sequence_kl, "whole sequence"),
    (pp_reward_on_last_token_only, "not returns"),
    (pp_discounted, "discounted"),
    (pp_k3, "k3"),
    (pp_kl_added, "wrong sign"),
    (pp_masked_not_zero, "masked positions are not 0"),
    (pp_junk_in_the_kl, "junk"),
    (pp_return_from_the_next_token, "own KL penalty"),
    (pp_centred_only, "centred but not scaled"),
])
def test_reinforce_pp_advantages_mistakes(wrong, fragment):
    assert_fails_with("reinforce_pp_advantages", wrong, fragment)


def test_reinforce_pp_advantages_written_differently():
    def with_loops_in_float64(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
        B, g = logprobs.shape
        returns = torch.zeros(B, g, dtype=torch.float64)
        for b in range(B):
            running = float(rewards[b])
            for t in reversed(range(g)):
                if mask[b, t]:
                    running -= beta * float(logprobs[b, t] - ref_logprobs[b, t])
                    returns[b, t] = running
        values = returns[mask.cpu()]
        mu = values.mean()
        var = ((values - mu) ** 2).mean()
        out = torch.where(mask.cpu(), (returns - mu) / (var + eps).sqrt(), torch.zeros(()).double())
        return out.to(logprobs)

    def through_whiten(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
        from rlhf_tutorial.rewards import whiten

        penalty = -beta * torch.where(mask, logprobs - ref_logprobs, torch.zeros_like(logprobs))
        returns = rewards.unsqueeze(1) + torch.fliplr(torch.cumsum(torch.fliplr(penalty), dim=1))
        out = torch.zeros_like(returns)
        out[mask] = whiten(returns[mask], eps=eps)
        return out

    for fn in (with_loops_in_float64, through_whiten):
        result = run_check("reinforce_pp_advantages", fn)
        assert result.passed, (fn.__name__, result.message)


# ----------------------------------------------------------------------------------------------------
# cispo_objective
# ----------------------------------------------------------------------------------------------------
def cispo_ppo_surrogate(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    ratio = torch.exp(logprobs - old_logprobs)
    a = advantages[:, None]
    surr = torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    return (surr * mask).sum() / mask.sum()


def cispo_weight_not_detached(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high)
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_returns_the_loss(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high).detach()
    return -(weight * advantages[:, None] * logprobs)[mask].mean()  # "a loss, to minimise"


def cispo_without_the_log_prob(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high)  # J read as "clip(r) * A"
    return (weight * advantages[:, None])[mask].mean()


def cispo_no_gradient_on_clipped_tokens(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    ratio = torch.exp(logprobs - old_logprobs).detach()
    clipped = (ratio < 1 - eps_low) | (ratio > 1 + eps_high)
    weight = ratio.clamp(1 - eps_low, 1 + eps_high)
    lp = torch.where(clipped, logprobs.detach(), logprobs)  # "as PPO does, clipped tokens get no gradient"
    return (weight * advantages[:, None] * lp * mask).sum() / mask.sum()


def cispo_drops_clipped_tokens(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    ratio = torch.exp(logprobs - old_logprobs).detach()
    keep = mask & (ratio >= 1 - eps_low) & (ratio <= 1 + eps_high)
    return (ratio * advantages[:, None] * logprobs * keep).sum() / mask.sum()


def cispo_per_sequence_mean(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high).detach()
    per_token = weight * advantages[:, None] * logprobs * mask
    return (per_token.sum(1) / mask.sum(1)).mean()


def cispo_padded_mean(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high).detach()
    return (weight * advantages[:, None] * logprobs * mask).mean()


def cispo_mask_ignored(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high).detach()
    return (weight * advantages[:, None] * logprobs).sum() / mask.sum()


def cispo_eps_low_both_sides(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_low).detach()
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_upper_clip_only(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(max=1 + eps_high).detach()  # "MiniMax drops the lower clip"
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_eps_high_or_default(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + (eps_high or 0.28)).detach()
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_eps_low_or_default(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - (eps_low or 0.2), 1 + eps_high).detach()
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_ratio_inverted(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(old_logprobs - logprobs).clamp(1 - eps_low, 1 + eps_high).detach()
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_ratio_of_probabilities(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    ratio = logprobs.exp() / old_logprobs.exp()
    weight = ratio.clamp(1 - eps_low, 1 + eps_high).detach()
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_all_detached(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high)
    return ((weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()).detach()


def cispo_in_place(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = old_logprobs.neg_().add_(logprobs.detach()).exp_().clamp_(1 - eps_low, 1 + eps_high)
    return (weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()


def cispo_as_list(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
    weight = torch.exp(logprobs - old_logprobs).clamp(1 - eps_low, 1 + eps_high).detach()
    return ((weight * advantages[:, None] * logprobs * mask).sum() / mask.sum()).reshape(1)


@pytest.mark.parametrize("wrong, fragment", [
    (cispo_ppo_surrogate, "PPO's clipped surrogate"),
    (cispo_drops_clipped_tokens, "dropped"),
    (cispo_per_sequence_mean, "each sequence first"),
    (cispo_padded_mean, "counted in the mean"),
    (cispo_eps_low_both_sides, "eps_low on both sides"),
    (cispo_upper_clip_only, "not clipped below"),
    (cispo_ratio_inverted, "upside down"),
    (cispo_ratio_of_probabilities, "NaN or inf"),
    (cispo_returns_the_loss, "objective's opposite"),
    (cispo_without_the_log_prob, "log-prob factor is missing"),
])
def test_cispo_objective_mistakes(wrong, fragment):
    assert_fails_with("cispo_objective", wrong, fragment)


@pytest.mark.parametrize("wrong", [cispo_weight_not_detached, cispo_no_gradient_on_clipped_tokens])
def test_cispo_objective_gradient_mistakes_show_in_the_gradient(wrong):
    """Right values, wrong gradient: the weight must be a constant and every token keeps its gradient."""
    result = run_check("cispo_objective", wrong)
    assert not result.passed and "gradient" in result.message, result.message


def test_cispo_objective_a_weight_left_in_the_graph_is_named_as_such():
    """The weight not detached gives a gradient with a term too many: the message says so, and does not
    tell the learner that something was detached (the opposite of what they did)."""
    result = run_check("cispo_objective", cispo_weight_not_detached)
    assert not result.passed and "weight carries a gradient" in result.message, result.message
    assert "is detached or replaced" not in result.message, result.message


def test_cispo_objective_written_differently():
    def float64_with_where(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
        lp, old = logprobs.double(), old_logprobs.double()
        with torch.no_grad():
            ratio = (lp - old).exp()
            weight = torch.where(ratio > 1 + eps_high, 1 + eps_high, torch.where(ratio < 1 - eps_low, 1 - eps_low, ratio))
        terms = torch.where(mask, weight * advantages.double().unsqueeze(-1) * lp, torch.zeros_like(lp))
        return (terms.sum() / mask.double().sum()).float()

    def masked_select(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
        adv = advantages[:, None].expand_as(logprobs)
        ratio = torch.exp(logprobs[mask].detach() - old_logprobs[mask])
        weight = torch.clip(ratio, min=1 - eps_low, max=1 + eps_high)
        return (weight * adv[mask] * logprobs[mask]).mean()

    for fn in (float64_with_where, masked_select):
        result = run_check("cispo_objective", fn)
        assert result.passed, (fn.__name__, result.message)


# ----------------------------------------------------------------------------------------------------
# truncated_is_weights
# ----------------------------------------------------------------------------------------------------
def tis_inverted(train_logprobs, sampler_logprobs, mask, cap=2.0):
    return torch.where(mask, torch.exp(sampler_logprobs - train_logprobs).clamp(max=cap), 0.0).detach()


def tis_clamped_both_sides(train_logprobs, sampler_logprobs, mask, cap=2.0):
    return torch.where(mask, torch.exp(train_logprobs - sampler_logprobs).clamp(1 / cap, cap), 0.0).detach()


def tis_fixed_cap(train_logprobs, sampler_logprobs, mask, cap=2.0):
    return torch.where(mask, torch.exp(train_logprobs - sampler_logprobs).clamp(max=2.0), 0.0).detach()


def tis_per_sequence(train_logprobs, sampler_logprobs, mask, cap=2.0):
    seq = ((train_logprobs - sampler_logprobs) * mask).sum(-1, keepdim=True)  # log of pi_train(y) / pi_sampler(y)
    return (torch.exp(seq).clamp(max=cap) * mask).detach()


def tis_masked_kept(train_logprobs, sampler_logprobs, mask, cap=2.0):
    return torch.exp(train_logprobs - sampler_logprobs).clamp(max=cap).detach()


def tis_multiplied_before_the_cap(train_logprobs, sampler_logprobs, mask, cap=2.0):
    return torch.minimum(torch.exp(train_logprobs - sampler_logprobs) * mask, torch.tensor(cap)).detach()


def tis_ratio_of_probabilities(train_logprobs, sampler_logprobs, mask, cap=2.0):
    ratio = train_logprobs.exp() / sampler_logprobs.exp()
    return torch.where(mask, ratio.clamp(max=cap), 0.0).detach()


def tis_not_detached(train_logprobs, sampler_logprobs, mask, cap=2.0):
    return torch.where(mask, torch.exp(train_logprobs - sampler_logprobs).clamp(max=cap), 0.0)


def tis_in_place(train_logprobs, sampler_logprobs, mask, cap=2.0):
    w = train_logprobs.detach().sub_(sampler_logprobs).exp_().clamp_(max=cap)  # detach() shares the storage
    return torch.where(mask, w, 0.0)


def tis_float64(train_logprobs, sampler_logprobs, mask, cap=2.0):
    w = torch.exp(train_logprobs.double() - sampler_logprobs.double()).clamp(max=cap)
    return torch.where(mask, w, 0.0).detach()


def tis_cap_on_the_log_ratio(train_logprobs, sampler_logprobs, mask, cap=2.0):
    with torch.no_grad():
        return torch.where(mask, (train_logprobs - sampler_logprobs).clamp(max=cap).exp(), 0.0)


def tis_no_cap_at_all(train_logprobs, sampler_logprobs, mask, cap=2.0):
    return torch.where(mask, torch.exp(train_logprobs - sampler_logprobs), 0.0).detach()


@pytest.mark.parametrize("wrong, fragment", [
    (tis_inverted, "upside down"),
    (tis_clamped_both_sides, "from below too"),
    (tis_fixed_cap, "hard-coded"),
    (tis_per_sequence, "one weight per sequence"),
    (tis_masked_kept, "Masked positions are not 0"),
    (tis_multiplied_before_the_cap, "NaN or inf"),
    (tis_ratio_of_probabilities, "NaN or inf"),
    (tis_not_detached, "carry a gradient"),
    (tis_cap_on_the_log_ratio, "applied to the log-ratio"),
])
def test_truncated_is_weights_mistakes(wrong, fragment):
    assert_fails_with("truncated_is_weights", wrong, fragment)


def test_truncated_is_weights_written_differently():
    def with_minimum_and_mask_product(train_logprobs, sampler_logprobs, mask, cap=2.0):
        logr = torch.where(mask, train_logprobs - sampler_logprobs, torch.zeros_like(train_logprobs)).detach()
        return torch.minimum(logr.exp(), torch.full_like(logr, cap)) * mask

    def float64_log_space(train_logprobs, sampler_logprobs, mask, cap=2.0):
        logr = (train_logprobs.detach().double() - sampler_logprobs.double()).clamp(max=math.log(cap))
        return torch.where(mask, logr.exp(), 0.0).to(train_logprobs.dtype)

    for fn in (with_minimum_and_mask_product, float64_log_space):
        result = run_check("truncated_is_weights", fn)
        assert result.passed, (fn.__name__, result.message)


VIOLATIONS.update({
    "reinforce_pp_advantages": {
        "kl_per_token": [pp_k3, pp_kl_added],
        "beta": [pp_beta_or_default],
        "returns_to_go": [pp_forward_cumsum, pp_whole_sequence_kl, pp_return_from_the_next_token],
        "gamma_one": [pp_discounted, pp_reward_on_last_token_only],
        "batch_whitening": [pp_per_sequence_whitening],
        "masked_statistics": [pp_whiten_every_position],
        "biased_variance": [pp_unbiased_variance],
        "scaled": [pp_centred_only],
        "eps": [pp_eps_on_std, pp_fixed_eps],
        "no_clip": [pp_clipped_to_be_safe],
        "masked_zero": [pp_masked_not_zero],
        "masked_ignored": [pp_junk_in_the_kl],
        "not_in_place": [pp_in_place],
        "dtype": [pp_float64],
    },
    "cispo_objective": {
        "ratio": [cispo_ratio_inverted],
        "weight_times_logprob": [cispo_ppo_surrogate, cispo_without_the_log_prob],
        "maximised": [cispo_returns_the_loss],
        "detached_weight": [cispo_weight_not_detached],
        "clipped_tokens_keep_gradient": [cispo_no_gradient_on_clipped_tokens, cispo_drops_clipped_tokens],
        "eps_low": [cispo_upper_clip_only, cispo_eps_low_or_default],
        "eps_high": [cispo_eps_low_both_sides, cispo_eps_high_or_default],
        "token_mean": [cispo_per_sequence_mean],
        "mask": [cispo_mask_ignored, cispo_padded_mean],
        "large_log_ratios": [cispo_ratio_of_probabilities],
        "differentiable": [cispo_all_detached],
        "not_in_place": [cispo_in_place],
        "scalar": [cispo_as_list],
    },
    "truncated_is_weights": {
        "ratio": [tis_inverted],
        "cap": [tis_fixed_cap, tis_no_cap_at_all, tis_cap_on_the_log_ratio],
        "above_only": [tis_clamped_both_sides],
        "per_token": [tis_per_sequence],
        "masked_zero": [tis_masked_kept, tis_multiplied_before_the_cap],
        "large_log_ratios": [tis_ratio_of_probabilities],
        "detached": [tis_not_detached],
        "not_in_place": [tis_in_place],
        "dtype": [tis_float64],
    },
})
