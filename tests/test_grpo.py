"""Chapter 04 reference code: the GRPO pieces, the trainer's mechanics on the tiny world, the CLI, widgets."""

import copy
import json
import math

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from rlhf_tutorial import grpo
from rlhf_tutorial.devices import course_device, device_of, same_device
from rlhf_tutorial.rlhf import approx_kl
from rlhf_tutorial.trainers import grpo as grpo_trainer
from rlhf_tutorial.trainers import runtime
from rlhf_tutorial.widgets import grpo as widgets


@pytest.fixture(autouse=True)
def one_thread():
    """Small models run faster on one thread (and far faster on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_model(seed=0, d_vocab=40):
    """A random model on the course's device (the simulated GPU under RLHF_TUTORIAL_DEVICE=simgpu)."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=48, d_head=4, n_heads=4, d_vocab=d_vocab,
                                  act_fn="gelu_new", normalization_type="LN", seed=seed, device=str(course_device()))
    return HookedTransformer(cfg).eval()


# ----------------------------------------------------------------------------------------------------
# advantages
# ----------------------------------------------------------------------------------------------------
def test_advantages_have_zero_mean_per_group_and_unit_std():
    rewards = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    adv = grpo.group_relative_advantages(rewards)
    assert adv.shape == (5, 8)
    torch.testing.assert_close(adv.mean(-1), torch.zeros(5), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv.std(-1), torch.ones(5), atol=1e-3, rtol=0)


def test_an_all_equal_group_gets_zero_advantages_in_every_scaling():
    rewards = torch.tensor([[0.3, 0.3, 0.3], [0.0, 1.0, 0.5]])
    for scale in ["group", "batch", "none"]:
        adv = grpo.group_relative_advantages(rewards, scale)
        assert torch.equal(adv[0], torch.zeros(3)), scale
        assert adv[1].abs().sum() > 0


def test_batch_scaling_divides_every_group_by_the_same_std():
    rewards = torch.tensor([[0.0, 1.0, 2.0], [10.0, 10.5, 11.0]])
    adv = grpo.group_relative_advantages(rewards, "batch", eps=0.0)
    centred = rewards - rewards.mean(-1, keepdim=True)
    torch.testing.assert_close(adv, centred / rewards.std())


# ----------------------------------------------------------------------------------------------------
# the objective
# ----------------------------------------------------------------------------------------------------
def _batch():
    gen = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(4, 6, generator=gen) * 2
    lengths = torch.tensor([6, 2, 4, 1])
    mask = torch.arange(6)[None] < lengths[:, None]
    return logprobs, lengths, mask, torch.tensor([1.0, -0.5, 2.0, -1.0])


def test_at_ratio_one_without_kl_the_aggregations_weigh_sequences_and_tokens_as_documented():
    logprobs, lengths, mask, adv = _batch()
    kwargs = dict(beta=0.0)
    grpo_obj = grpo.calc_grpo_objective(logprobs, logprobs, logprobs, adv, mask, loss_type="grpo", **kwargs)
    dapo = grpo.calc_grpo_objective(logprobs, logprobs, logprobs, adv, mask, loss_type="dapo", **kwargs)
    dr = grpo.calc_grpo_objective(logprobs, logprobs, logprobs, adv, mask, loss_type="dr_grpo",
                                  max_completion_len=10, **kwargs)
    n = lengths.float()
    torch.testing.assert_close(grpo_obj, adv.mean())  # every sequence weighs the same
    torch.testing.assert_close(dapo, (n * adv).sum() / n.sum())  # every token weighs the same
    torch.testing.assert_close(dr, (n * adv).sum() / (4 * 10))  # a constant denominator


def test_masked_tokens_change_nothing_not_even_the_gradient():
    logprobs, _, mask, adv = _batch()
    gen = torch.Generator().manual_seed(2)
    old = logprobs + 0.3 * torch.randn(4, 6, generator=gen)
    ref = logprobs + 0.3 * torch.randn(4, 6, generator=gen)
    junk = torch.where(mask, 0.0, 7.0 * torch.randn(4, 6, generator=gen))
    for loss_type in ["grpo", "dapo", "dr_grpo"]:
        outs, grads = [], []
        for shift in (0.0, 1.0):
            lp = (logprobs + shift * junk).requires_grad_(True)
            obj = grpo.calc_grpo_objective(lp, old - shift * junk, ref + shift * junk, adv, mask, loss_type=loss_type)
            obj.backward()
            outs.append(obj.detach())
            grads.append(lp.grad[mask])
        torch.testing.assert_close(outs[0], outs[1])
        torch.testing.assert_close(grads[0], grads[1])


def test_clipped_tokens_get_no_gradient_and_clip_higher_lets_them_grow():
    logprobs = torch.zeros(1, 3, requires_grad=True)
    old = torch.log(torch.tensor([[1 / 1.25, 1 / 1.1, 1.0]]))  # ratios 1.25, 1.1, 1.0
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.tensor([1.0])
    grpo.calc_grpo_objective(logprobs, old, logprobs.detach(), adv, mask, clip_eps=0.2, beta=0.0).backward()
    assert logprobs.grad[0, 0] == 0 and logprobs.grad[0, 1] > 0  # 1.25 > 1.2: clipped
    logprobs.grad = None
    grpo.calc_grpo_objective(logprobs, old, logprobs.detach(), adv, mask, clip_eps=0.2, beta=0.0,
                             clip_eps_high=0.28).backward()
    assert logprobs.grad[0, 0] > 0  # 1.25 < 1.28: free to grow
    clipped = grpo.clipped_tokens(logprobs.detach(), old, adv, mask, 0.2)
    assert clipped.tolist() == [[True, False, False]]


def test_with_zero_advantages_the_objective_is_minus_beta_times_the_k3_kl():
    logprobs, _, mask, _ = _batch()
    ref = logprobs + 0.4
    obj = grpo.calc_grpo_objective(logprobs, logprobs, ref, torch.zeros(4), mask, beta=0.5, loss_type="dapo")
    k3 = approx_kl(logprobs, ref, "k3")
    torch.testing.assert_close(obj, -0.5 * k3[mask].mean())
    assert obj < 0  # k3 >= 0: the penalty only ever lowers the objective


# ----------------------------------------------------------------------------------------------------
# masks, sampling, rewards
# ----------------------------------------------------------------------------------------------------
def test_completion_mask_counts_the_first_eos_and_nothing_after():
    completions = torch.tensor([[4, 5, 0, 0], [0, 3, 0, 3], [1, 2, 3, 4]])
    assert grpo.completion_mask(completions, 0).tolist() == [
        [True, True, True, False], [True, False, False, False], [True, True, True, True]]


def test_sample_group_pads_to_full_length_when_every_row_stops_at_once():
    model = random_model()
    with torch.no_grad():
        model.unembed.b_U[5] = 50.0  # EOS = 5, always
    tokens, mask = grpo.sample_group(model, torch.tensor([1, 2, 3], device=device_of(model)), 4, 7, eos_token_id=5)
    assert tokens.shape == (4, 10) and mask.shape == (4, 7)
    assert tokens.device == mask.device == device_of(model)
    assert (tokens[:, 3:] == 5).all()
    assert mask[:, 0].all() and not mask[:, 1:].any()
    assert not tokens.is_inference()


def test_group_token_logprobs_stacks_groups_without_changing_them():
    model = random_model(seed=3)
    gen = torch.Generator().manual_seed(4)
    tokens = [torch.randint(0, 40, (3, 9), generator=gen), torch.randint(0, 40, (3, 7), generator=gen),
              torch.randint(0, 40, (3, 9), generator=gen)]
    tokens = [t.to(device_of(model)) for t in tokens]
    prefix_lens = [4, 2, 4]
    with torch.no_grad():
        stacked = grpo.group_token_logprobs(model, tokens, prefix_lens, temperature=0.7, max_rows=4)
        one_by_one = torch.cat([grpo.group_token_logprobs(model, [t], [p], temperature=0.7)
                                for t, p in zip(tokens, prefix_lens)])
    assert stacked.shape == (9, 5)
    torch.testing.assert_close(stacked, one_by_one, atol=1e-5, rtol=1e-5)


def test_rule_reward():
    texts = ["The plot was thin. The acting was wooden.",
             "The plot was thin. The acting was wooden. I left. Avoid it.",
             "The plot was thin.",
             "The plot was thin and the acting",
             "ACTING! was fine?"]
    assert grpo.reward_fn_rule(texts, aspect="acting", max_sentences=3).tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert grpo.reward_fn_rule(["the actings were"], aspect="acting").tolist() == [0.0]  # whole words only


def test_rollout_minibatches_partition_the_groups():
    size, g = 3, 4
    rollout = grpo.GroupRollout(
        tokens=[torch.full((size, 6), i) for i in range(5)], prefix_lens=[2] * 5, prompts=list("abcde"),
        mask=torch.ones(15, g, dtype=torch.bool), rewards=torch.arange(15.0).view(5, size),
        advantages=torch.arange(15.0), old_logprobs=torch.zeros(15, g), ref_logprobs=torch.zeros(15, g),
        texts=[str(i) for i in range(15)],
    )
    parts = rollout.minibatches(2, torch.Generator().manual_seed(0))
    seen = sorted(int(t[0, 0]) for part in parts for t in part.tokens)
    assert seen == [0, 1, 2, 3, 4]
    for part in parts:  # rows stay with their group
        for t, rewards, texts in zip(part.tokens, part.rewards, [part.texts[i:i + size] for i in range(0, 99, size)]):
            group = int(t[0, 0])
            assert rewards.tolist() == [group * size + j for j in range(size)]
            assert texts == [str(group * size + j) for j in range(size)]


# ----------------------------------------------------------------------------------------------------
# the trainer on the tiny world
# ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_policy():
    from rlhf_tutorial.worlds import load_policy

    return load_policy("tiny")


def small_args(**overrides):
    base = dict(groups_per_phase=2, group_size=4, max_new_tokens=8, num_phases=2, eval_samples=8, num_minibatches=2)
    return grpo_trainer.GRPOArgs.preset("tiny", **{**base, **overrides})


def test_all_equal_rewards_give_zero_advantages_and_dynamic_sampling_drops_them(tiny_policy):
    reference = copy.deepcopy(tiny_policy)
    constant = lambda texts: torch.ones(len(texts))  # noqa: E731
    rollout, stats = grpo.collect_rollout(tiny_policy, reference, constant, small_args())
    assert stats["frac_reward_zero_std"] == 1.0
    assert rollout.rewards.device.type == "cpu" and rollout.advantages.device == device_of(tiny_policy)
    assert torch.equal(rollout.advantages.cpu(), torch.zeros(8))
    assert rollout.mask.shape == (8, 8) and rollout.mask[:, 0].all()
    rollout, stats = grpo.collect_rollout(tiny_policy, reference, constant,
                                          small_args(dynamic_sampling=True, max_sampling_rounds=3))
    assert rollout is None
    assert stats["groups_sampled"] == 6 and stats["groups_kept"] == 0 and stats["sampling_rounds"] == 3


def test_old_logprobs_are_the_policy_at_rollout_time(tiny_policy):
    reference = copy.deepcopy(tiny_policy)
    reward = lambda texts: torch.tensor([float(len(t)) for t in texts])  # noqa: E731
    torch.manual_seed(0)
    rollout, stats = grpo.collect_rollout(tiny_policy, reference, reward, small_args())
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before training
    torch.testing.assert_close(rollout.old_logprobs, rollout.ref_logprobs)
    assert rollout.rewards.shape == (2, 4)
    torch.testing.assert_close(rollout.advantages.view(2, 4).cpu(), grpo.group_relative_advantages(rollout.rewards))


def _reward_by_length(texts):
    return torch.tensor([len(t) / 100 for t in texts])


def test_train_mechanics_reference_frozen_kl_from_zero_and_deterministic(tiny_policy):
    calls = []

    def my_advantages(rewards, scale="group", eps=1e-4):
        calls.append(rewards.shape)
        return grpo.group_relative_advantages(rewards, scale, eps)

    results = []
    for _ in range(2):
        policy = copy.deepcopy(tiny_policy)
        start = {k: v.clone() for k, v in policy.state_dict().items()}
        # collect_rollout handed back unchanged (as learner_functions does when it is imported) must
        # still call the learner's group_relative_advantages
        result = grpo_trainer.train(small_args(), policy=policy, reward_fn=_reward_by_length, progress=False,
                            group_relative_advantages=my_advantages, collect_rollout=grpo.collect_rollout)
        results.append(result)
        reference_state = result.reference.state_dict()
        assert all(torch.equal(reference_state[k], v) for k, v in start.items())  # reference untouched
        assert any(not torch.equal(policy.state_dict()[k], v) for k, v in start.items())  # policy trained
        assert result.history[0]["kl"] == pytest.approx(0.0, abs=1e-6)
        for key in ["reward", "frac_reward_zero_std", "kl", "clipfrac", "clip_active_frac", "objective", "approx_kl", "grad_norm"]:
            assert key in result.history[-1]
        assert result.eval_final is not None and result.peak_memory_mb >= 0
    assert calls == [(2, 4)] * 4  # the learner's function ran in every phase of both runs
    assert results[0].reward_per_phase == results[1].reward_per_phase  # same seed, same curve


def test_iterative_variant_refreshes_the_reference(tiny_policy):
    policy = copy.deepcopy(tiny_policy)
    result = grpo_trainer.train(small_args(ref_refresh_every=1, num_phases=1), policy=policy, reward_fn=_reward_by_length,
                        evaluate_before_after=False, progress=False)
    assert result.history[0]["reference_refreshed"]
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), result.reference.parameters()))


def test_rloo_estimator_runs_the_learners_rloo_advantages(tiny_policy):
    calls = []

    def my_rloo(rewards):
        calls.append(rewards.shape)
        size = rewards.shape[1]
        return size / (size - 1) * (rewards - rewards.mean(1, keepdim=True))

    result = grpo_trainer.train(small_args(advantage_estimator="rloo", num_phases=1), policy=copy.deepcopy(tiny_policy),
                        reward_fn=_reward_by_length, evaluate_before_after=False, progress=False,
                        rloo_advantages=my_rloo)
    assert calls == [(2, 4)]
    rollout = result.last_rollout
    expected = rollout.rewards - (rollout.rewards.sum(1, keepdim=True) - rollout.rewards) / 3
    torch.testing.assert_close(rollout.advantages.view(2, 4).cpu(), expected)
    with pytest.raises(ValueError, match="advantage_estimator"):
        grpo_trainer.train(small_args(advantage_estimator="ppo"), policy=copy.deepcopy(tiny_policy),
                   reward_fn=_reward_by_length, evaluate_before_after=False, progress=False)


def test_gspo_objective_clips_one_ratio_per_sequence():
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    old = torch.tensor([[-1.2, -2.4, 5.0], [-0.5, -0.5, -0.5]])  # row 0: log-ratios 0.2, 0.4 (+ junk)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -1.0])
    obj = grpo.calc_gspo_objective(logprobs, old, logprobs, adv, mask, clip_eps=0.2, beta=0.0)
    # row 0: s = exp(0.3) = 1.35 > 1.2 with A > 0: clipped to 1.2; row 1: s = 1, A = -1
    assert obj.item() == pytest.approx((1.2 - 1.0) / 2)
    ref = logprobs + torch.tensor([[0.1, 0.3, 7.0], [0.0, 0.0, 0.0]])
    with_kl = grpo.calc_gspo_objective(logprobs, old, ref, adv, mask, clip_eps=0.2, beta=1.0)
    k3 = approx_kl(logprobs, ref, "k3")
    assert with_kl.item() == pytest.approx(obj.item() - (k3[0, :2].mean().item() + 0.0) / 2, rel=1e-5)


def test_sequence_level_runs_the_learners_gspo_ratio_and_refuses_a_learners_step(tiny_policy):
    calls = []

    def my_ratio(logprobs, old_logprobs, mask):
        calls.append(logprobs.shape)
        m = mask.float()
        return torch.exp(((logprobs - old_logprobs) * m).sum(-1) / m.sum(-1))

    grpo_trainer.train(small_args(importance_level="sequence", num_phases=1), policy=copy.deepcopy(tiny_policy),
               reward_fn=_reward_by_length, evaluate_before_after=False, progress=False, gspo_sequence_ratio=my_ratio)
    assert len(calls) == 2 * 2 and all(shape[0] == 4 for shape in calls)  # 2 passes x 2 minibatches of 4 rows

    def my_step(policy, optimizer, batch, args):
        return grpo.grpo_step(policy, optimizer, batch, args)

    with pytest.raises(ValueError, match="reference grpo_step"):
        grpo_trainer.train(small_args(importance_level="sequence"), policy=copy.deepcopy(tiny_policy),
                   reward_fn=_reward_by_length, progress=False, grpo_step=my_step)


def test_cli_main_prints_the_acceptance_keys(tiny_policy, tmp_path):
    summary = grpo_trainer.main(["--world", "tiny", "--num-phases", "2", "--groups-per-phase", "2", "--group-size", "4",
                         "--max-new-tokens", "8", "--eval-samples", "8", "--no-progress",
                         "--report", str(tmp_path / "report.html")])
    for key in ["mean_reward_initial", "mean_reward_final", "kl_final", "frac_reward_zero_std", "phases",
                "wall_seconds", "peak_memory_mb"]:
        assert key in summary
    assert summary["phases"] == 2 and len(summary["reward_per_phase"]) == 2
    assert same_device(torch.device(summary["device"]), course_device())  # where the policy ran and its memory was measured
    json.dumps(summary)
    assert (tmp_path / "report.html").read_text().count("<table") >= 2  # one per group of the last phase


def test_cli_is_registered():
    from rlhf_tutorial.cli import COMMANDS

    assert COMMANDS["train-grpo"][0] == "rlhf_tutorial.trainers.grpo:main"


# ----------------------------------------------------------------------------------------------------
# widgets and memory
# ----------------------------------------------------------------------------------------------------
GROUPS = [{"prompt": "This movie was really", "completions": [
    {"text": "a", "tokens": [" dull", "."], "reward": 0.9, "advantage": 1.2, "ratio": [1.4, 1.0],
     "clipped": [True, False]},
    {"text": "b", "tokens": [" good", "<|endoftext|>"], "reward": 0.1, "advantage": -1.2, "ratio": [0.9, 1.0],
     "clipped": [False, False]},
]}]


def test_group_viewer_static_marks_clipped_tokens():
    table = widgets.group_viewer(GROUPS, static=True)
    text, page = str(table), table._repr_html_()
    assert "[ dull]" in text and "[ good]" not in text
    assert page.count("outline:2px solid") == 1 and "ratio 1.400 (clipped)" in page
    assert "+1.20" in page and "-1.20" in page


def test_group_viewer_flags_all_equal_groups():
    flat = [{"prompt": "p", "completions": [dict(c, reward=1.0, advantage=0.0) for c in GROUPS[0]["completions"]]}]
    assert "no signal" in widgets.group_html(flat[0])


def test_dashboard_keeps_the_all_equal_fraction_on_zero_to_one():
    # the classifier's reward never gives an all-equal group: a constant 0, which plotly would centre on [-1, 1]
    history = [{"phase": i, "reward": 0.3 + 0.1 * i, "frac_reward_zero_std": 0.0, "kl": 0.01 * i,
                "clip_active_frac": 0.03} for i in range(4)]
    fig = widgets.grpo_curves(history)
    panel = widgets.GRPO_PANELS.index("frac_reward_zero_std") + 1
    low, high = fig.layout[f"yaxis{panel}"].range
    assert -0.05 < low <= 0.0 and 1.0 <= high < 1.05
    assert fig.layout.yaxis.range is None  # the other panels scale to their data
    assert fig.data[panel - 1].y == (0.0, 0.0, 0.0, 0.0)


def test_comparison_figure_has_reward_time_and_memory_for_both():
    runs = {"PPO": widgets.run_summary([0.2, 0.5], 10.0, 300.0, 64),
            "GRPO": widgets.run_summary([0.2, 0.6], 8.0, 250.0, 64)}
    fig = widgets.comparison_figure(runs)
    assert len(fig.data) == 6
    assert [t.type for t in fig.data] == ["scatter", "bar", "bar"] * 2
    assert fig.data[4].y == (8.0,) and fig.data[5].y == (250.0,)
    assert "of the process" in fig.layout.annotations[2].text
    for run, mb in zip(runs.values(), (40.0, 30.0)):
        run["peak_memory_training_mb"] = mb
    fig = widgets.comparison_figure(runs)  # both runs measured the training loop: that is shown
    assert fig.data[5].y == (30.0,) and "of training" in fig.layout.annotations[2].text
    assert "cuda" not in fig.layout.annotations[2].text
    for run in runs.values():
        run["device"] = "cuda:0"  # the CLI summaries say where the runs measured their memory
    assert "peak cuda:0 memory" in widgets.comparison_figure(runs).layout.annotations[2].text


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_peak_memory_sees_an_allocation(device):
    """The probe measures the device it is given (on a GPU machine, CPU memory is still CPU memory)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (make test-gpu)")
    with runtime.PeakMemory(device) as memory:
        block = torch.ones(50_000_000, device=device)  # 200 MB
        block += 1
    assert memory.peak_mb > 150


def test_peak_memory_is_never_below_zero_when_memory_is_freed_at_entry(monkeypatch):
    """Memory freed between reading the resident set and resetting the high-water mark, or the kernel's
    approximate (per-CPU batched) counters, used to give a negative peak (unit-simgpu saw -0.08 and
    -0.22 MB): the probe measures from the reset mark itself, and nothing allocated reads 0."""
    reads = {"VmRSS": [1000], "VmHWM": [900, 880]}  # 100 KiB freed before the reset; the counters then drift down

    def fake_rss_kb(field: str = "VmRSS") -> int:
        return reads[field].pop(0)

    monkeypatch.setattr(runtime.PeakMemory, "_rss_kb", staticmethod(fake_rss_kb))
    with runtime.PeakMemory("cpu") as memory:
        pass
    if memory.mode == "hwm":
        assert memory.peak_mb == 0.0
    else:  # /proc/self/clear_refs not writable here: the polling probe starts from its own base
        assert memory.peak_mb >= 0.0


def test_a_run_that_dynamic_sampling_empties_ends_with_a_message_and_a_rollout_to_show(tiny_policy, capsys):
    """Every group of every phase all-equal: nothing is trained, the run says so, and last_rollout is a
    rollout the notebook's next cell can read (chapter 04's truncation cell used to die on None)."""
    policy = copy.deepcopy(tiny_policy)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    constant = lambda texts: torch.zeros(len(texts))  # noqa: E731
    result = grpo_trainer.train(small_args(dynamic_sampling=True, max_sampling_rounds=2), policy=policy,
                                reward_fn=constant, progress=False, evaluate_before_after=False)
    assert [r["groups_kept"] for r in result.history] == [0, 0]
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in start.items())  # nothing was trained
    assert "kept no group in any of the 2 phases" in result.note and "not updated" in result.note
    assert "kept no group" in capsys.readouterr().err
    last = result.last_rollout
    assert last is not None and last.rewards.shape == (2, 4) and last.mask.shape[0] == 8
    # what chapter 04's cell reads
    assert last.mask.sum(-1).shape == (8,) and len(last.tokens) == 2 and len(last.prefix_lens) == 2
    kept = grpo_trainer.train(small_args(num_phases=1), policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                              progress=False, evaluate_before_after=False)
    assert kept.note is None


def test_a_plugged_objective_without_a_graph_is_named_by_the_trainer(tiny_policy):
    from rlhf_tutorial.trainers.plug import NoGradientError

    def my_objective(*args, **kwargs):
        return grpo.calc_grpo_objective(*args, **kwargs).detach()

    with pytest.raises(NoGradientError, match="your `calc_grpo_objective` returned a tensor with no gradient graph"):
        grpo_trainer.train(small_args(num_phases=1), policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                           progress=False, evaluate_before_after=False, calc_grpo_objective=my_objective)


def test_the_truncation_sentence_says_none_were_cut_off_instead_of_a_nan_mean():
    none_cut = widgets.truncation_text([False, False, False], [1.0, 0.0, 1.0], max_new_tokens=40)
    assert "0 of 3" in none_cut and "every completion ended with an EOS" in none_cut
    assert "nan" not in none_cut.lower() and "mean" not in none_cut
    some_cut = widgets.truncation_text([True, False, True, False], [0.0, 1.0, 1.0, 1.0], max_new_tokens=40)
    assert some_cut.startswith("truncated (no EOS in 40 tokens): 2 of 4") and "their mean reward 0.50" in some_cut


def test_reinforce_pp_runs_the_learners_advantages_per_token(tiny_policy):
    """advantage_estimator="reinforce_pp": the rollout's advantages are the (learner's) reinforce_pp_advantages of
    its rewards and log-probs, one per token, and the phase trains on them."""
    calls = []

    def my_advantages(rewards, logprobs, ref_logprobs, mask, beta=0.01, eps=1e-8):
        calls.append((tuple(rewards.shape), tuple(logprobs.shape), beta))
        return grpo.reinforce_pp_advantages(rewards, logprobs, ref_logprobs, mask, beta, eps)

    result = grpo_trainer.train(small_args(advantage_estimator="reinforce_pp", num_phases=1, kl_coef=0.3),
                                policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                                evaluate_before_after=False, progress=False, reinforce_pp_advantages=my_advantages)
    assert calls == [((8,), (8, 8), 0.3)]
    rollout = result.last_rollout
    expected = grpo.reinforce_pp_advantages(rollout.rewards.flatten().to(rollout.mask.device), rollout.old_logprobs,
                                            rollout.ref_logprobs, rollout.mask, 0.3)
    torch.testing.assert_close(rollout.advantages, expected)
    assert math.isfinite(result.history[0]["objective"]) and math.isfinite(result.history[0]["clip_active_frac"])


def test_cispo_runs_the_learners_objective_and_options_that_replace_the_objective_exclude_each_other(tiny_policy):
    calls = []

    def my_cispo(logprobs, old_logprobs, advantages, mask, eps_low=0.2, eps_high=0.28):
        calls.append((eps_low, eps_high))
        return grpo.cispo_objective(logprobs, old_logprobs, advantages, mask, eps_low, eps_high)

    grpo_trainer.train(small_args(policy_loss="cispo", num_phases=1, clip_coef=0.1, clip_coef_high=3.0),
                       policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length, evaluate_before_after=False,
                       progress=False, cispo_objective=my_cispo)
    assert calls == [(0.1, 3.0)] * 4  # 2 passes x 2 minibatches
    for options in ({"policy_loss": "cispo", "importance_level": "sequence"},
                    {"policy_loss": "cispo", "advantage_estimator": "reinforce_pp"}):
        with pytest.raises(ValueError, match="choose one"):
            grpo_trainer.train(small_args(**options), policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                               progress=False)
    with pytest.raises(ValueError, match="policy_loss"):
        grpo_trainer.train(small_args(policy_loss="ppo"), policy=copy.deepcopy(tiny_policy),
                           reward_fn=_reward_by_length, progress=False)


def test_cispo_grpo_objective_keeps_the_gradient_of_clipped_tokens():
    logprobs = torch.tensor([[0.0, -1.0]]).requires_grad_(True)
    old = torch.tensor([[-1.0, -1.0]])  # ratios e and 1
    obj = grpo.calc_cispo_grpo_objective(logprobs, old, logprobs.detach(), torch.tensor([1.0]),
                                         torch.ones(1, 2, dtype=torch.bool), clip_eps=0.2, beta=0.0)
    obj.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[1.2 / 2, 1.0 / 2]]))


def test_a_bfloat16_sampler_records_the_mismatch_and_tis_weights_the_advantages(tiny_policy):
    """sampler_dtype="bfloat16": a bfloat16 copy samples, pi_old stays the float32 policy's, the phase records the
    per-token mismatch; tis_cap > 0 multiplies each token's advantage by the (learner's) truncated weights."""
    calls = []

    def my_weights(train_logprobs, sampler_logprobs, mask, cap=2.0):
        calls.append(cap)
        return grpo.truncated_is_weights(train_logprobs, sampler_logprobs, mask, cap)

    result = grpo_trainer.train(small_args(sampler_dtype="bfloat16", tis_cap=1.5, num_phases=1),
                                policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                                evaluate_before_after=False, progress=False, truncated_is_weights=my_weights)
    record, rollout = result.history[0], result.last_rollout
    assert calls == [1.5]
    assert 0 < record["mismatch_abs_logratio"] <= record["mismatch_max_abs_logratio"]
    assert 0 < record["tis_weight_mean"] <= 1.5
    assert rollout.advantages.shape == rollout.mask.shape and rollout.old_logprobs.dtype == torch.float32
    assert next(result.policy.parameters()).dtype == torch.float32
    plain = grpo_trainer.train(small_args(sampler_dtype="bfloat16", num_phases=1), policy=copy.deepcopy(tiny_policy),
                               reward_fn=_reward_by_length, evaluate_before_after=False, progress=False)
    assert plain.last_rollout.advantages.dim() == 1 and "tis_weight_mean" not in plain.history[0]
    with pytest.raises(ValueError, match="sampler_dtype='bfloat16'"):
        grpo_trainer.train(small_args(tis_cap=2.0), policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                           progress=False)


def test_token_advantage_objective_is_grpos_with_the_advantage_repeated_over_tokens():
    gen = torch.Generator().manual_seed(0)
    logprobs, old, ref = (-torch.rand(3, 5, generator=gen) for _ in range(3))
    adv = torch.randn(3, generator=gen)
    mask = torch.arange(5)[None, :] < torch.tensor([[5], [2], [4]])
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        want = grpo.calc_grpo_objective(logprobs, old, ref, adv, mask, beta=0.3, loss_type=loss_type)
        got = grpo.calc_token_advantage_objective(logprobs, old, ref, adv[:, None].expand(3, 5), mask, beta=0.3,
                                                  loss_type=loss_type)
        torch.testing.assert_close(got, want)
    no_kl = grpo.calc_reinforce_pp_objective(logprobs, old, ref, adv[:, None].expand(3, 5), mask, beta=0.3)
    torch.testing.assert_close(no_kl, grpo.calc_grpo_objective(logprobs, old, ref, adv, mask, beta=0.0))


def _perturbed(model, seed=0):
    """A copy of ``model`` with every weight moved a little: a reference the policy is not equal to."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.device))
    return other


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_reference_kl_off_skips_the_reference_only_where_beta_is_zero_and_trains_the_same(tiny_policy, kl_coef):
    # train(reference_kl=False): with beta = 0 nothing learns from the reference's log-probs, so skipping its forward
    # must leave the training bit for bit as it was; with beta > 0 the switch must change nothing at all
    reference = _perturbed(tiny_policy)  # a real KL to report: the policy is not its own reference
    results = []
    for reference_kl in (True, False):
        result = grpo_trainer.train(small_args(kl_coef=kl_coef), policy=copy.deepcopy(tiny_policy),
                                    reference=copy.deepcopy(reference), reward_fn=_reward_by_length, progress=False,
                                    evaluate_before_after=False, reference_kl=reference_kl)
        results.append(result)
    on, off = results
    assert all(torch.equal(a, b) for a, b in zip(on.policy.state_dict().values(), off.policy.state_dict().values()))
    assert on.reward_per_phase == off.reward_per_phase
    assert all(r["kl"] > 0 and r["kl_ref"] > 0 for r in on.history)
    if kl_coef == 0:
        assert not any("kl" in r or "kl_ref" in r for r in off.history)  # pi_old stood in: no KL to report
        assert [r["objective"] for r in on.history] == [r["objective"] for r in off.history]
    else:
        assert [r["kl"] for r in on.history] == [r["kl"] for r in off.history]
    assert grpo.HARNESS == {"reference_kl": True, "batched_prompts": False}  # restored after the run


def test_batched_prompts_sample_each_group_from_its_own_prompt(tiny_policy):
    prompts = ("I watched this film", "The plot was", "I watched this film and", "The plot")  # token lengths differ
    args = small_args(prompts=prompts, groups_per_phase=6, group_size=3)  # prompts repeat within the phase
    torch.manual_seed(0)
    with grpo.harness(batched_prompts=True):
        rollout, stats = grpo.collect_rollout(tiny_policy, tiny_policy, _reward_by_length, args)
    assert stats["groups_sampled"] == 6 and rollout.rewards.shape == (6, 3)
    assert rollout.prompts == [prompts[k % 4] for k in range(6)]
    for tokens, prefix_len, prompt in zip(rollout.tokens, rollout.prefix_lens, rollout.prompts):
        own = tiny_policy.to_tokens(prompt, prepend_bos=True)[0]
        assert tokens.shape == (3, len(own) + args.max_new_tokens) and prefix_len == len(own)
        assert (tokens[:, :prefix_len] == own).all()
    assert all(text.startswith(p) for text, p in zip(rollout.texts, [p for p in rollout.prompts for _ in range(3)]))
    with torch.no_grad():  # the sampler's log-probs are still pi_old's
        forward = grpo.group_token_logprobs(tiny_policy, rollout.tokens, rollout.prefix_lens)
    assert ((rollout.old_logprobs - forward).abs() * rollout.mask).max() < 1e-5
    assert not grpo.HARNESS["batched_prompts"]
