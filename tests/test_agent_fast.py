"""The harness's cached multi-turn rollout (``speed.fast_multi_turn_rollout``) against chapter 09's reference
``agent.multi_turn_rollout``: from the same random stream, the same trajectories, spans, masks and calls, and the
same log-probs to float rounding; ``train-agent`` takes it only where the reference is bound."""

from __future__ import annotations

import pytest
import torch

from rlhf_tutorial import agent, speed
from rlhf_tutorial.devices import device_of
from rlhf_tutorial.grpo import eos_id
from rlhf_tutorial.trainers import agent as run


@pytest.fixture(scope="module")
def policy():
    from rlhf_tutorial.worlds import load_agent_policy

    return load_agent_policy("tiny")


def _rows(policy, texts: list[str], n: int) -> torch.Tensor:
    prompts = [policy.to_tokens(t, prepend_bos=True)[0] for t in texts]
    assert len({len(p) for p in prompts}) == 1
    return torch.stack(prompts).repeat_interleave(n, dim=0).to(device_of(policy))


def _both(policy, rows, seed, tool=agent.calculator, max_turns=3, max_new_tokens=28, temperature=1.0, **kw):
    encode, decode = run.tokenizer_fns(policy)
    out = []
    for fn, extra in ((agent.multi_turn_rollout, {}), (speed.fast_multi_turn_rollout, kw)):
        g = torch.Generator(device=device_of(policy)).manual_seed(seed)  # the course's rule: on the policy's device
        out.append(fn(policy, rows, tool, encode, decode, max_turns, max_new_tokens, eos_token_id=eos_id(policy),
                      temperature=temperature, generator=g, **extra))
    return out


def _assert_same(ref: agent.AgentRollout, fast: agent.AgentRollout) -> None:
    assert torch.equal(ref.tokens, fast.tokens)
    assert torch.equal(ref.mask, fast.mask) and fast.mask.dtype == torch.bool
    assert ref.env_spans == fast.env_spans
    assert torch.equal(ref.lengths, fast.lengths) and torch.equal(ref.num_calls, fast.num_calls)
    assert ref.prompt_len == fast.prompt_len
    assert fast.logprobs.dtype == torch.float32
    torch.testing.assert_close(fast.logprobs, ref.logprobs, atol=2e-5, rtol=0)


# Prompts whose continuation is mostly a call (the open tag written into the prompt), so that the environment's
# spans, later turns and the turn limit are exercised, besides plain problems.
CALLING = ["Q: 47*86\n<calc>47*8", "Q: 12*34\n<calc>12*3"]
PLAIN = ["Q: 47*86\n", "Q: 52*19\n"]


@pytest.mark.parametrize("texts, max_turns, temperature, seed", [
    (CALLING, 3, 1.0, 0), (CALLING, 1, 1.0, 1), (CALLING, 2, 1.5, 2), (PLAIN, 3, 1.0, 3), (PLAIN, 3, 0.7, 4)])
def test_fast_rollout_draws_the_references_trajectories(policy, texts, max_turns, temperature, seed):
    rows = _rows(policy, texts, 12)
    ref, fast = _both(policy, rows, seed, max_turns=max_turns, temperature=temperature)
    _assert_same(ref, fast)
    if texts is CALLING:  # the case exercised what it is there for
        assert (ref.num_calls > 0).any() if max_turns > 1 else (ref.num_calls == 0).all()


def test_fast_rollout_with_another_tool_budget_and_mask(policy):
    """A tool whose text is long (the budget cuts calls), a short budget, and the bound mask function used."""
    rows = _rows(policy, CALLING, 8)
    seen = []

    def mask_fn(tokens, prompt_len, env_spans, lengths):
        seen.append(len(env_spans))
        return agent.policy_token_mask(tokens, prompt_len, env_spans, lengths)

    for budget in (6, 12, 20):
        ref, fast = _both(policy, rows, budget, tool=lambda text: " = " + "1234567" * 2, max_new_tokens=budget,
                          token_mask=None)
        _assert_same(ref, fast)
    _, fast = _both(policy, rows, 5, token_mask=mask_fn)
    assert seen == [rows.shape[0]]


def test_trainer_takes_the_fast_rollout_only_for_the_reference(policy):
    args = run.AgentArgs(world="tiny")
    fns = run.bind(agent, run.AGENT_PLUGGABLE, {})
    assert run.fast_rollout(policy, fns["multi_turn_rollout"], args)
    assert not run.fast_rollout(policy, fns["multi_turn_rollout"], run.AgentArgs(world="tiny", fast=False))

    def my_rollout(*a, **k):  # a learner's version runs as it is
        return agent.multi_turn_rollout(*a, **k)

    assert not run.fast_rollout(policy, my_rollout, args)
    # and the trainer's measurement is the same with and without the harness's rollout
    small = run.AgentArgs(world="tiny", eval_problems=6, eval_samples=2)
    fast_eval = run.evaluate(policy, small, difficulties=("hard", "easy"))
    slow_eval = run.evaluate(policy, run.AgentArgs(**{**small.__dict__, "fast": False}), difficulties=("hard", "easy"))
    for d in ("hard", "easy"):
        for k in ("accuracy", "calls_per_problem", "length", "samples"):
            assert fast_eval[d][k] == slow_eval[d][k], (d, k)
