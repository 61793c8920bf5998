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


def _learner_copy():
    """A learner's rollout that draws exactly as the reference does (another function object)."""
    calls = []

    def my_rollout(*a, **k):
        calls.append(1)
        return agent.multi_turn_rollout(*a, **k)

    return my_rollout, calls


def test_a_learners_rollout_that_matches_the_cached_one_hands_over_to_it(policy):
    """The first call runs the learner's (its rollout is returned) and the cached one from the same state;
    they agree, so later calls run the cached one, and the random stream goes on as if only one had run."""
    args = run.AgentArgs(world="tiny")
    mine, calls = _learner_copy()
    fns, note = run.agent_functions(policy, args, multi_turn_rollout=mine)
    assert note["rollout"] == "yours"
    rows = _rows(policy, CALLING, 6)
    encode, decode = run.tokenizer_fns(policy)
    g, g_ref = (torch.Generator(device=device_of(policy)).manual_seed(7) for _ in range(2))
    for _ in range(3):
        got = fns["multi_turn_rollout"](policy, rows, agent.calculator, encode, decode, 3, 28,
                                        eos_token_id=eos_id(policy), generator=g)
        want = agent.multi_turn_rollout(policy, rows, agent.calculator, encode, decode, 3, 28,
                                        eos_token_id=eos_id(policy), generator=g_ref)
        _assert_same(want, got)
    assert len(calls) == 1 and "matched" in note["rollout"]
    assert torch.equal(g.get_state(), g_ref.get_state())


def test_a_learners_rollout_with_other_draws_runs_throughout(policy):
    """A rollout that draws differently (one extra draw first: still a valid sampler) is never replaced."""
    calls = []

    def other_draws(*a, generator=None, **k):
        calls.append(1)
        torch.rand(1, generator=generator, device=generator.device)
        return agent.multi_turn_rollout(*a, generator=generator, **k)

    args = run.AgentArgs(world="tiny", eval_problems=2, eval_samples=2)
    fns, note = run.agent_functions(policy, args, multi_turn_rollout=other_draws)
    run.evaluate(policy, args, fns, difficulties=("hard", "easy"))
    assert len(calls) >= 2 and note["rollout"].startswith("yours throughout")
    assert run.agent_functions(policy, run.AgentArgs(world="tiny", fast=False), multi_turn_rollout=other_draws
                               )[0]["multi_turn_rollout"] is other_draws


def test_training_with_a_matching_learners_rollout_is_the_reference_run(policy):
    """The run's numbers are the same whichever of the two sampled: the hand-over changes only the time."""
    import copy

    args = run.AgentArgs(world="tiny", num_phases=2, problems_per_difficulty=2, group_size=4, eval_problems=3,
                         eval_samples=2, difficulties="hard")
    mine, calls = _learner_copy()
    a = run.train_agent(args, policy=copy.deepcopy(policy), progress=False, multi_turn_rollout=mine)
    b = run.train_agent(args, policy=copy.deepcopy(policy), progress=False)
    assert len(calls) == 1 and "matched" in a.rollout and b.rollout == "the course's, cached"
    assert run.summary(args, a, 0, 0)["reward_per_phase"] == run.summary(args, b, 0, 0)["reward_per_phase"]
    assert a.eval_final == b.eval_final
