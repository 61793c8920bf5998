"""The harness speed-ups (rlhf_tutorial/speed.py): the fast sampler's tokens and log-probs, the hook-free
forward, and the per-phase time split. No timing is asserted (timings are noisy on a shared CPU): the
figures come from the CLI runs' JSON summaries."""

from __future__ import annotations

import math

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from rlhf_tutorial import grpo, speed
from rlhf_tutorial.devices import course_device, device_of
from rlhf_tutorial.rlhf import get_logprobs
from rlhf_tutorial.trainers import grpo as grpo_trainer
from rlhf_tutorial.trainers.bench import word_level_tokenizer
from rlhf_tutorial.trainers.plug import bind
from rlhf_tutorial.worlds import load_policy


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")  # on the course's device: the harness runs there (simgpu under RLHF_TUTORIAL_DEVICE)


@pytest.fixture(scope="module")
def prompt(policy):
    return policy.to_tokens("This movie was really")  # [1 prompt_len], with BOS


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.7, None), (1.3, 20)])
def test_sampler_logprobs_are_a_forward_pass_logprobs(policy, prompt, temperature, top_k):
    eos = policy.tokenizer.eos_token_id
    torch.manual_seed(0)
    tokens, logprobs = speed.fast_sample(policy, prompt.expand(32, -1), 16, eos, temperature, top_k)
    mask = grpo.completion_mask(tokens[:, prompt.shape[1]:], eos)
    with speed.harness_speedups(False), torch.no_grad():  # TransformerLens's own forward
        forward = grpo.group_token_logprobs(policy, [tokens], [prompt.shape[1]], temperature)
    assert tokens.shape == (32, prompt.shape[1] + 16) and (tokens[:, : prompt.shape[1]] == prompt).all()
    assert ((logprobs - forward).abs() * mask).max() < 1e-5
    assert mask.sum() > 32  # the comparison covers many tokens, not only a few


def test_sampler_draws_from_the_tempered_distribution(policy, prompt):
    """One new token, 20000 rows: the frequencies of the likeliest tokens match softmax(logits / T)."""
    n, temperature = 20000, 0.8
    gen = torch.Generator(device=device_of(policy)).manual_seed(1)  # a generator of the model's device
    tokens, _ = speed.fast_sample(policy, prompt.expand(n, -1), 1, None, temperature, generator=gen)
    with torch.no_grad():
        probs = (policy(prompt)[0, -1] / temperature).softmax(-1)
    counts = torch.bincount(tokens[:, -1], minlength=probs.shape[0]).float() / n
    for token in probs.topk(5).indices:
        p = probs[token].item()
        assert abs(counts[token].item() - p) < 5 * math.sqrt(p * (1 - p) / n), (token, counts[token], p)


def test_top_k_draws_only_the_top_k(policy, prompt):
    tokens, _ = speed.fast_sample(policy, prompt.expand(500, -1), 1, None, 1.0, top_k=3)
    with torch.no_grad():
        top = set(policy(prompt)[0, -1].topk(3).indices.tolist())
    assert set(tokens[:, -1].tolist()) <= top and len(set(tokens[:, -1].tolist())) > 1


def test_rows_stop_at_eos_and_the_loop_ends_when_all_have(tmp_path):
    tokenizer = word_level_tokenizer(40, str(tmp_path))
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=32, d_head=4, n_heads=4, d_vocab=40,
                                  act_fn="gelu_new", normalization_type="LN", seed=0, device=str(course_device()))
    model = HookedTransformer(cfg, tokenizer=tokenizer)
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        model.b_U[eos] = 50.0  # EOS is (almost surely) the first token of every row
    tokens, logprobs = speed.fast_sample(model, torch.tensor([[1, 2, 3]] * 4, device=device_of(model)), 6, eos)
    assert tokens.shape == (4, 9) and (tokens[:, 3:] == eos).all()
    assert logprobs[:, 0].abs().max() < 1e-3 and (logprobs[:, 1:] == 0).all()  # padding after the stop
    # an unprocessed (normalization_type "LN") model is computed like TransformerLens computes it
    with torch.no_grad():
        model.b_U[eos] = 0.0
    assert (_fast_logits(model, tokens) - model(tokens)).abs().max() < 1e-4


def _fast_logits(model, tokens):
    return speed.fast_residual(model, tokens) @ model.W_U + model.b_U


def test_fast_residual_gives_the_model_logits_and_gradients(policy, prompt):
    tokens = speed.fast_sample(policy, prompt.expand(4, -1), 10, None)[0]
    ours = _fast_logits(policy, tokens)
    theirs = policy(tokens)
    assert (ours - theirs).abs().max() < 1e-4
    grads = []
    for logits in (ours, theirs):
        policy.zero_grad()
        logits.log_softmax(-1)[..., 7].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None]))
    policy.zero_grad()
    assert torch.allclose(grads[0], grads[1], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_get_logprobs_on_the_model_and_their_gradients(policy, prompt, temperature):
    """The fused unembedding + log-prob (values and parameter gradients) against chapter 03's
    get_logprobs on TransformerLens's own forward, with a weighting that differs per token."""
    torch.manual_seed(2)
    tokens = speed.fast_sample(policy, prompt.expand(6, -1), 12, None)[0]
    prefix_len = prompt.shape[1]
    weights = torch.randn(6, 12).to(device_of(policy))
    results = []
    for enabled in (True, False):
        policy.zero_grad()
        with speed.harness_speedups(enabled):
            logprobs = speed.token_logprobs(policy, tokens, prefix_len, temperature)  # [6 12]
        (logprobs * weights).sum().backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
        results.append((logprobs.detach(), grads))
    policy.zero_grad()
    (fast, fast_grads), (slow, slow_grads) = results
    with torch.no_grad():
        expected = get_logprobs(policy(tokens) / temperature, tokens, prefix_len)
    assert torch.equal(slow, expected) and (fast - expected).abs().max() < 1e-5
    assert fast_grads.keys() == slow_grads.keys() and "W_U" in " ".join(fast_grads)
    for name, grad in slow_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)
    with torch.no_grad(), speed.harness_speedups(True):  # no graph: the same numbers
        assert (speed.token_logprobs(policy, tokens, prefix_len, temperature) - fast).abs().max() == 0


def test_sequence_logprobs_match_chapter_06_on_the_model_and_their_gradients(policy, prompt):
    """DPO's forward (speed.sequence_logprobs): ragged masks (a row masked on a few middle tokens only, a row
    with no masked token, padding after the last masked column) against dpo.sequence_logprobs on
    TransformerLens's own forward, values and parameter gradients."""
    from rlhf_tutorial import dpo

    torch.manual_seed(3)
    tokens = speed.fast_sample(policy, prompt.expand(4, -1), 10, None)[0]  # [4 s]
    plen, s = prompt.shape[1], tokens.shape[1]
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[0, plen:] = True
    mask[1, plen + 2 : plen + 5] = True  # a hole at either end
    mask[3, plen : s - 3] = True  # the last 3 columns predict nothing: the fast forward stops before them
    weights = torch.tensor([1.0, -2.0, 3.0, 0.5]).to(device_of(policy))
    results = []
    for enabled in (True, False):
        policy.zero_grad()
        with speed.harness_speedups(enabled):
            out = speed.sequence_logprobs(policy, tokens, mask)  # [4]
        (out * weights).sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}))
    policy.zero_grad()
    (fast, fast_grads), (slow, slow_grads) = results
    with torch.no_grad():
        expected = dpo.sequence_logprobs(policy(tokens), tokens, mask)
    assert torch.equal(slow, expected) and (fast - expected).abs().max() < 1e-4
    assert fast[2] == 0 and (expected[[0, 1, 3]] < -1).all()  # the comparison is of real log-probs
    assert fast_grads.keys() == slow_grads.keys() and "W_U" in " ".join(fast_grads)
    for name, grad in slow_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, atol=1e-4, rtol=1e-3, msg=name)


def test_hooks_or_other_architectures_fall_back_to_the_model(policy, tmp_path):
    assert speed.can_fast_sample(policy)
    seen = []
    policy.add_hook("blocks.0.hook_resid_post", lambda x, hook: seen.append(1))
    try:
        assert not speed.can_fast_sample(policy)
        speed.token_logprobs(policy, torch.tensor([[1, 2, 3]], device=device_of(policy)), 1)  # the speed-ups are on
        assert seen  # the hook ran: the model's own forward was used
    finally:
        policy.reset_hooks()
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=32, d_head=4, n_heads=4, d_vocab=40,
                                  act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary")
    assert not speed.can_fast_sample(HookedTransformer(cfg))


def test_collect_rollout_keeps_the_sampler_logprobs_only_with_the_reference_sampler(policy):
    args = grpo_trainer.GRPOArgs.preset("tiny", groups_per_phase=2, group_size=4, max_new_tokens=8, num_minibatches=2)
    reward = lambda texts: torch.rand(len(texts))  # noqa: E731
    torch.manual_seed(0)
    rollout, _ = grpo.collect_rollout(policy, policy, reward, args)
    with torch.no_grad():
        forward = grpo.group_token_logprobs(policy, rollout.tokens, rollout.prefix_lens)
    assert ((rollout.old_logprobs - forward).abs() * rollout.mask).max() < 1e-5
    # the policy is its own reference here: old and reference log-probs agree to the same tolerance
    assert ((rollout.old_logprobs - rollout.ref_logprobs).abs() * rollout.mask).max() < 1e-5

    calls = []

    def my_sample_group(*a, **kw):  # a learner's version: must be the one that runs
        calls.append(1)
        return grpo.sample_group(*a, **kw)

    fns = bind(grpo, grpo_trainer.PLUGGABLE, {"sample_group": my_sample_group})
    rollout, _ = fns["collect_rollout"](policy, policy, reward, args)
    assert calls and ((rollout.old_logprobs - rollout.ref_logprobs).abs() * rollout.mask).max() < 1e-5


def test_time_split_and_time_to_reward():
    history = [
        {"reward": 0.5, "seconds_sampling": 1.0, "seconds_optimisation": 2.0, "seconds_phase": 4.0},
        {"reward": 0.95, "seconds_sampling": 3.0, "seconds_optimisation": 2.0, "seconds_phase": 6.0},
        {"reward": 0.97, "seconds_sampling": 1.0, "seconds_optimisation": 1.0, "seconds_phase": 2.0},
    ]
    split = speed.time_split(history)
    assert split == {"sampling": round(5 / 3, 4), "optimisation": round(5 / 3, 4),
                     "other": round(4 - 10 / 3, 4), "phase": 4.0}
    assert speed.time_to_reward(history, 0.9) == {"phases_to_target": 2, "seconds_to_target": 10.0,
                                                  "reward_target": 0.9}
    assert speed.time_to_reward(history, 0.99)["phases_to_target"] is None


def test_phase_clock_times_methods_and_modules():
    clock = speed.PhaseClock()

    class Thing:
        def work(self):
            return 3

    thing, module = Thing(), torch.nn.Linear(2, 2)
    with clock.method(thing, "work", "scoring"), clock.module(module, "ref_logprobs"):
        assert thing.work() == 3
        module(torch.zeros(1, 2))
    assert "work" not in vars(thing) and not module._forward_hooks and not module._forward_pre_hooks
    taken = clock.take()
    assert set(taken) == {"seconds_scoring", "seconds_ref_logprobs"} and all(v >= 0 for v in taken.values())
    assert clock.take() == {}


def test_rlhf_fast_forward_matches_the_reference_values_logits_and_gradients(policy):
    """RLHFArgs.fast: the reference TransformerWithValueHead runs hook-free, with the same logits, values
    and parameter gradients; a learner's class is left alone."""
    import copy

    from rlhf_tutorial import rlhf
    from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer

    reward = lambda texts: torch.rand(len(texts))  # noqa: E731
    fast = RLHFTrainer(RLHFArgs.preset("tiny", fast=True), model=copy.deepcopy(policy),
                       ref_model=copy.deepcopy(policy), reward_fn=reward)
    assert "forward" in vars(fast.model)  # the instance runs the hook-free forward
    tokens = torch.randint(0, policy.cfg.d_vocab, (3, 14)).to(device_of(policy))
    grads = []
    for forward in (fast.model.forward, lambda t: rlhf.TransformerWithValueHead.forward(fast.model, t)):
        fast.model.zero_grad()
        logits, values = forward(tokens)
        (logits.log_softmax(-1)[..., 5].sum() + values.sum()).backward()
        grads.append((logits.detach(), values.detach(),
                      {n: p.grad.clone() for n, p in fast.model.named_parameters() if p.grad is not None}))
    (l1, v1, g1), (l2, v2, g2) = grads
    assert (l1 - l2).abs().max() < 1e-4 and (v1 - v2).abs().max() < 1e-4
    assert g1.keys() == g2.keys() and any("value_head" in n for n in g1)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], atol=1e-4, rtol=1e-3, msg=name)

    class Mine(rlhf.TransformerWithValueHead):  # a learner's class: runs as written
        pass

    mine = RLHFTrainer(RLHFArgs.preset("tiny", fast=True), model=copy.deepcopy(policy),
                       ref_model=copy.deepcopy(policy), reward_fn=reward, TransformerWithValueHead=Mine)
    assert "forward" not in vars(mine.model)
    slow = RLHFTrainer(RLHFArgs.preset("tiny", fast=False), model=copy.deepcopy(policy),
                       ref_model=copy.deepcopy(policy), reward_fn=reward)
    assert "forward" not in vars(slow.model)  # --no-fast: the model's own forward
    assert RLHFArgs.preset("tiny").fast and RLHFArgs.preset("gpt2").fast  # on by default


def test_rlhf_fast_sampler_replaces_only_the_reference_get_samples(policy):
    import copy

    from rlhf_tutorial import rlhf
    from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer

    reward = lambda texts: torch.rand(len(texts))  # noqa: E731
    args = RLHFArgs.preset("tiny", fast=True, batch_size=8, num_minibatches=2, gen_len=6, num_phases=1)
    trainer = RLHFTrainer(args, model=copy.deepcopy(policy), ref_model=copy.deepcopy(policy), reward_fn=reward)
    tokens, texts = trainer.fns["rollout_phase"].__globals__["get_samples"](
        trainer.model.base_model, args.prefix, 8, 6, 1.0, None, True)
    prompt = policy.to_tokens(args.prefix)
    assert tokens.shape == (8, prompt.shape[1] + 6) and (tokens[:, : prompt.shape[1]] == prompt).all()
    assert texts == policy.tokenizer.batch_decode(tokens, skip_special_tokens=True)
    record = trainer.train(progress=False)[0]
    assert record["seconds_sampling"] > 0  # the fast sampler is timed as sampling

    calls = []

    def my_get_samples(*a, **kw):  # a learner's version: must be the one that runs
        calls.append(1)
        return rlhf.get_samples(*a, **kw)

    mine = RLHFTrainer(args, model=copy.deepcopy(policy), ref_model=copy.deepcopy(policy), reward_fn=reward,
                       get_samples=my_get_samples)
    mine.train(progress=False)
    assert calls


def test_unvectorised_level_gelu_is_the_models_own_activation(policy, prompt, monkeypatch):
    # at ATEN_CPU_CAPABILITY=default the fast forward computes the tanh GELU as TransformerLens's gelu_new does
    from transformer_lens.utilities.activation_functions import gelu_new

    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0)) * 4
    monkeypatch.setattr(speed, "_SCALAR_KERNELS", True)
    assert torch.equal(speed._gelu_tanh(x), gelu_new(x))
    assert (speed._gelu_tanh(x) - torch.nn.functional.gelu(x, approximate="tanh")).abs().max() < 1e-5
    tokens = speed.fast_sample(policy, prompt.expand(4, -1), 10, None)[0]
    ours = _fast_logits(policy, tokens)
    assert (ours - policy(tokens)).abs().max() < 1e-4
    monkeypatch.setattr(speed, "_SCALAR_KERNELS", False)
    assert torch.equal(speed._gelu_tanh(x), torch.nn.functional.gelu(x, approximate="tanh"))
