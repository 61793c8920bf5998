"""The chapter-03 reference: the trainer's mechanics, the memory rule, saving/loading, the CLI, the
memory benchmark and the widgets' static forms.

Most tests run on a small random HookedTransformer with a word-level tokenizer (no tiny world needed,
seconds); the ones that need the tiny world's policy and classifier say so.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from rlhf_tutorial import rlhf
from rlhf_tutorial.devices import course_device
from rlhf_tutorial.trainers import rlhf as rlhf_trainer
from rlhf_tutorial.trainers.bench import word_level_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return word_level_tokenizer(60, str(tmp_path_factory.mktemp("tok")))


def random_policy(tokenizer, seed: int = 0) -> HookedTransformer:
    """On the course's device, as the worlds' policies (the trainer follows it; the toy reward stays on
    the CPU, and the trainer moves it)."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=32, n_ctx=64, d_head=8, n_heads=4, d_vocab=60,
                                  act_fn="gelu_new", normalization_type="LN", seed=seed, device=str(course_device()))
    return HookedTransformer(cfg, tokenizer=tokenizer)


def count_bad(texts: list[str]) -> torch.Tensor:
    """A toy task reward: the share of words that are 'bad'."""
    return torch.tensor([t.split().count("bad") / max(len(t.split()), 1) for t in texts])


def small_args(**overrides) -> rlhf_trainer.RLHFArgs:
    base = dict(batch_size=16, gen_len=6, num_minibatches=4, update_epochs=2, num_phases=3,
                warmup_steps=0, learning_rate=1e-3, head_lr=1e-3, early_stopping=False, eval_samples=16)
    return rlhf_trainer.RLHFArgs(**{**base, **overrides})


def make(tokenizer, **overrides) -> rlhf_trainer.RLHFTrainer:
    return rlhf_trainer.RLHFTrainer(small_args(**overrides), random_policy(tokenizer), random_policy(tokenizer), count_bad)


# ----------------------------------------------------------------------------------------------------
# The trainer's mechanics
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("estimator", ["one_step", "gae"])
def test_phase_mechanics(tokenizer, estimator):
    trainer = make(tokenizer, advantage_estimator=estimator)
    ref_before = [p.detach().clone() for p in trainer.ref_model.parameters()]
    policy_before = [p.detach().clone() for p in trainer.model.parameters()]
    memory = rlhf.rollout_phase(trainer)
    g, s = trainer.args.gen_len, trainer.prefix_len + trainer.args.gen_len
    assert memory.tokens.shape == (16, s)
    for name in ("logprobs", "ref_logprobs", "values", "advantages"):
        assert getattr(memory, name).shape == (16, g), name
    # Before any update the policy is the reference: KL is exactly 0.
    assert trainer.history[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(memory.logprobs, memory.ref_logprobs)
    stats = rlhf.learning_phase(trainer, memory)
    assert {"objective", "clipped_surrogate", "value_loss", "entropy", "kl", "approx_kl", "clipfrac"} <= set(stats)
    assert all(math.isfinite(v) for v in stats.values())
    assert all(torch.equal(a, b) for a, b in zip(ref_before, trainer.ref_model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(policy_before, trainer.model.parameters()))
    # 4 minibatches x 2 passes optimizer steps, one scheduler step.
    assert {int(st["step"]) for st in trainer.optimizer.state.values()} == {8}
    assert trainer.scheduler.last_epoch == 1


def test_objective_kl_coef_is_zero_with_gae(tokenizer):
    assert make(tokenizer, advantage_estimator="gae").objective_kl_coef == 0.0
    assert make(tokenizer, advantage_estimator="one_step", kl_coef=0.3).objective_kl_coef == 0.3


def count_forwards(module) -> list[int]:
    """Record the batch size of every forward pass of ``module`` from now on."""
    rows, original = [], module.forward

    def wrapped(tokens, *a, **k):
        rows.append(tokens.shape[0])
        return original(tokens, *a, **k)

    module.forward = wrapped
    return rows


@pytest.mark.parametrize("estimator, coef, ref_forwards", [("gae", 0.1, 0), ("one_step", 0.1, 8), ("one_step", 0.0, 0)])
def test_no_reference_forward_when_the_objective_holds_no_kl(tokenizer, estimator, coef, ref_forwards):
    """With the objective's KL coefficient 0 (GAE, or beta = 0) the learning phase never runs the reference
    (8 = 4 minibatches x 2 passes otherwise), and its logged kl is the k3 of the stored log-probs."""
    trainer = make(tokenizer, advantage_estimator=estimator, kl_estimator="full", kl_coef=coef)
    memory = rlhf.rollout_phase(trainer)
    rows = count_forwards(trainer.ref_model)
    stats = rlhf.learning_phase(trainer, memory)
    assert len(rows) == ref_forwards
    assert math.isfinite(stats["kl"]) and stats["kl"] >= 0


def test_skipping_the_zero_kl_term_leaves_the_objective_and_gradients_unchanged(tokenizer):
    trainer = make(tokenizer, kl_estimator="full")
    memory = rlhf.rollout_phase(trainer)
    mb = memory.get_minibatches(4, 1, torch.Generator().manual_seed(0))[0]
    args = trainer.args
    grads, values = [], []
    for kl_coef in (0.0, 1e-30):  # 1e-30: the full-KL path, numerically a zero coefficient
        trainer.model.zero_grad()
        objective, _ = rlhf.compute_rlhf_objective(trainer.model, trainer.ref_model, mb, trainer.prefix_len,
                                                   kl_coef, args)
        objective.backward()
        values.append(objective.item())
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    assert values[0] == pytest.approx(values[1], abs=1e-7)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-7, rtol=1e-6)


def test_gae_advantages_take_the_states_that_chose_the_generated_tokens():
    """``compute_gae_advantages`` takes the sequence's values, as ``compute_advantages`` does: with
    gamma = lambda = 1 and the score at the last token only, A_i = score - V(state that chose token i),
    the states at positions prefix_len - 1 .. s - 2 (never the last position's value)."""
    values = torch.tensor([[9.0, 0.5, 0.25, 0.125, 7.0]])  # s = 5; prefix_len = 2 -> g = 3
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    advantages = rlhf.compute_gae_advantages(rewards, values, 2, gamma=1.0, gae_lambda=1.0)
    assert torch.allclose(advantages, torch.tensor([[0.5, 0.75, 0.875]]))
    # lambda = 0: the one-step estimate, the same as compute_advantages' on the per-token rewards
    one_step = rlhf.compute_gae_advantages(rewards, values, 2, gamma=1.0, gae_lambda=0.0)
    assert torch.allclose(one_step, rlhf.compute_advantages(values, torch.tensor([1.0]), 2))


def test_optimizer_has_no_weight_decay(tokenizer):
    trainer = make(tokenizer)
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [0.0, 0.0]


def test_value_clipping_option(tokenizer):
    """cliprange_value changes the value loss (and only it) once values have moved; training stays finite."""
    plain, clipped = make(tokenizer), make(tokenizer, cliprange_value=0.01)
    for trainer in (plain, clipped):
        trainer.train(progress=False)
    assert all(math.isfinite(r["value_loss"]) for r in clipped.history)
    assert [r["value_loss"] for r in plain.history] != [r["value_loss"] for r in clipped.history]
    # on the first rollout, before any update, values equal their rollout values: clipping changes nothing
    a = make(tokenizer)
    mem_a = rlhf.rollout_phase(a)
    b = make(tokenizer, cliprange_value=0.01)  # seeded again in its constructor: the same samples
    mem_b = rlhf.rollout_phase(b)
    torch.testing.assert_close(mem_a.tokens, mem_b.tokens)
    mb_a = mem_a.get_minibatches(4, 1, torch.Generator().manual_seed(0))[0]
    mb_b = mem_b.get_minibatches(4, 1, torch.Generator().manual_seed(0))[0]
    out_a = rlhf.compute_rlhf_objective(a.model, a.ref_model, mb_a, a.prefix_len, 0.0, a.args)[1]
    out_b = rlhf.compute_rlhf_objective(b.model, b.ref_model, mb_b, b.prefix_len, 0.0, b.args)[1]
    assert out_a["value_loss"] == pytest.approx(out_b["value_loss"], rel=1e-5)


def test_adaptive_kl_controller_moves_beta_both_ways_with_the_default_horizon():
    """With the default horizon (640 samples) and batch 64, beta moves up to 2% a phase: it controls."""
    args = rlhf_trainer.RLHFArgs()
    ctl = rlhf.AdaptiveKLController(0.1, args.kl_target, args.kl_horizon)
    for _ in range(20):
        ctl.update(0.0, args.batch_size)  # KL far below target
    assert ctl.value == pytest.approx(0.1 * (1 - 0.2 * 64 / 640) ** 20)  # ~0.67x
    low = ctl.value
    for _ in range(20):
        ctl.update(10 * args.kl_target, args.batch_size)
    assert ctl.value > 1.4 * low
    gpt2 = rlhf_trainer.RLHFArgs.preset("gpt2")
    assert 0.2 * gpt2.batch_size / gpt2.kl_horizon >= 0.01  # at least 1% a phase in the GPT-2 preset


def test_same_seed_same_curve(tokenizer):
    curves = []
    for _ in range(2):
        trainer = make(tokenizer)
        trainer.train(progress=False)
        curves.append([(r["reward"], r["kl"], r["objective"]) for r in trainer.history])
    assert curves[0] == curves[1]


def test_memory_rule_no_full_batch_forward(tokenizer):
    """Outside generation, no forward pass of the policy or the reference sees more than one minibatch."""
    trainer = make(tokenizer, kl_estimator="full")
    rows = []
    for module in (trainer.model, trainer.ref_model):
        original = module.forward

        def wrapped(tokens, *a, _original=original, **k):
            rows.append(tokens.shape[0])
            return _original(tokens, *a, **k)

        module.forward = wrapped
    memory = rlhf.rollout_phase(trainer)
    rlhf.learning_phase(trainer, memory)
    assert rows and max(rows) <= trainer.args.minibatch_size, rows


def test_adaptive_kl_and_early_stopping_in_the_loop(tokenizer):
    trainer = make(tokenizer, adaptive_kl=True, kl_coef=0.5, kl_target=1e-6, kl_horizon=16, num_phases=4)
    trainer.train(progress=False)
    betas = [r["kl_coef"] for r in trainer.history]
    # Phase 0's rollout is the reference's (KL exactly 0, below any target): beta went down once ...
    assert betas[1] < betas[0] == 0.5
    # ... then the KL is far above its (tiny) target: beta goes up every phase.
    assert betas[1:] == sorted(betas[1:]) and trainer.kl_coef > 0.5

    stopper = make(tokenizer, early_stopping=True, patience=2, kl_threshold=-1.0, num_phases=5)
    history = stopper.train(progress=False)
    assert len(history) == 2 and history[-1]["early_stopped"]  # every phase violates: stop at the 2nd


def test_warmup_starts_at_zero(tokenizer):
    trainer = make(tokenizer, warmup_steps=2, num_phases=4)
    trainer.train(progress=False)
    assert [round(r["lr"] / trainer.args.learning_rate, 3) for r in trainer.history] == [0.0, 0.5, 1.0, 0.55]


@pytest.mark.parametrize("estimator", ["one_step", "gae"])
def test_the_record_kl_is_the_rollouts_and_drives_the_controller(tokenizer, estimator):
    """Phase 0 runs at learning rate 0 (warmup), so phase 1's rollout still samples from the reference:
    its logged KL (the rollout's k3, which the text, the curves and the controller use) is exactly 0,
    while the update's own KL goes in as ``update_kl``; the controller is fed the rollout's KL."""
    trainer = make(tokenizer, advantage_estimator=estimator, warmup_steps=2, num_phases=3, adaptive_kl=True,
                   kl_coef=0.5, kl_target=0.5, kl_horizon=16)
    seen = []
    update = trainer.kl_controller.update
    trainer.kl_controller.update = lambda kl, n: (seen.append(kl), update(kl, n))[1]
    history = trainer.train(progress=False)
    assert history[1]["lr"] > 0 == history[0]["lr"]
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert history[1]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert history[2]["kl"] > 1e-4  # phase 1 learnt: phase 2's rollout has moved
    assert all("update_kl" in r and "kl" in r for r in history)
    assert history[1]["update_kl"] > 0  # the policy moved during phase 1's own minibatch steps
    assert seen == [r["kl"] for r in history]  # the controller saw the rollout's KL, phase by phase


def test_add_stats_keeps_one_key_per_quantity():
    from rlhf_tutorial.trainers.records import add_stats

    record = add_stats({"kl": 0.0, "reward": 0.5}, {"kl": 0.3, "loss": 1.0}, prefix="update_")
    assert record == {"kl": 0.0, "reward": 0.5, "update_kl": 0.3, "loss": 1.0}
    with pytest.raises(KeyError, match="share a name"):
        add_stats(record, {"kl": 0.1}, prefix="update_")


def test_learner_functions_are_plugged_in(tokenizer):
    calls = []

    def my_get_logprobs(logits, tokens, prefix_len=None):
        calls.append(tokens.shape)
        return rlhf.get_logprobs(logits, tokens, prefix_len)

    namespace = {"get_logprobs": my_get_logprobs, "not_an_exercise": print}
    picked = rlhf_trainer.learner_functions(namespace)
    assert set(picked) == {"get_logprobs"}
    trainer = rlhf_trainer.RLHFTrainer(small_args(num_phases=1), random_policy(tokenizer), random_policy(tokenizer),
                               count_bad, **picked)
    trainer.train(progress=False)
    # The reference rollout called it twice per chunk of 4 rows (policy, reference), and the reference
    # learning phase, through the reference objective, once per minibatch: 8 + 8 calls.
    assert len(calls) == 16
    with pytest.raises(TypeError):
        rlhf_trainer.RLHFTrainer(small_args(), random_policy(tokenizer), random_policy(tokenizer), count_bad, train=print)


def test_temperature_scales_the_stored_logprobs(tokenizer):
    trainer = make(tokenizer, temperature=0.5)
    memory = rlhf.rollout_phase(trainer)
    with torch.no_grad():
        logits, _ = trainer.model(memory.tokens)
    p = trainer.prefix_len
    torch.testing.assert_close(memory.logprobs, rlhf.get_logprobs(logits / 0.5, memory.tokens, p))


def test_get_samples_general(tokenizer):
    """Shapes, cloned tokens and texts, with and without BOS; reusable by chapter 04."""
    model = random_policy(tokenizer)
    tokens, texts = rlhf.get_samples(model, "This movie was really", 3, 5)
    assert tokens.shape == (3, 5 + 5) and not tokens.is_inference()
    assert all(t.startswith("This movie was really") for t in texts)
    tokens, _ = rlhf.get_samples(model, "This movie", 2, 4, prepend_bos=False, top_k=3, temperature=0.7)
    assert tokens.shape == (2, 2 + 4)


# ----------------------------------------------------------------------------------------------------
# Presets, CLI parser
# ----------------------------------------------------------------------------------------------------
def test_presets_follow_the_seed_for_gpt2():
    args = rlhf_trainer.RLHFArgs.preset("gpt2")
    assert (args.learning_rate, args.head_lr, args.max_grad_norm, args.clip_coef, args.ent_coef) == (8e-6, 8e-5, 0.5, 0.3, 0.01)
    assert 0.8 <= args.kl_coef <= 1.0 and args.prefix == "This movie was really" and args.world == "gpt2"
    assert rlhf_trainer.RLHFArgs.preset("tiny", kl_coef=0.2).kl_coef == 0.2


def test_every_arg_is_documented_and_parsed():
    from dataclasses import fields

    parser = rlhf_trainer._parser()
    for f in fields(rlhf_trainer.RLHFArgs):
        assert f.metadata.get("help"), f.name
    ns = parser.parse_args(["--kl-coef", "0.3", "--no-whiten-rewards", "--top-k", "5", "--reward-threshold", "0.9"])
    assert (ns.kl_coef, ns.whiten_rewards, ns.top_k, ns.reward_threshold) == (0.3, False, 5, 0.9)
    assert ns.gen_len is None  # not given: the preset decides


# ----------------------------------------------------------------------------------------------------
# Tiny world: save / load, the CLI, the widgets
# ----------------------------------------------------------------------------------------------------
def tiny_trainer(**overrides) -> rlhf_trainer.RLHFTrainer:
    args = rlhf_trainer.RLHFArgs.preset("tiny", **{**dict(batch_size=8, gen_len=6, num_minibatches=2, num_phases=1,
                                                   eval_samples=8), **overrides})
    return rlhf_trainer.RLHFTrainer(args)


def test_save_and_load_tuned_policy(tmp_path):
    trainer = tiny_trainer()
    trainer.train(progress=False)
    folder = rlhf_trainer.save_tuned_policy(trainer.model, tmp_path / "tuned", trainer.args, note="test")
    assert (folder / rlhf_trainer.WEIGHTS_FILE).exists()
    config = json.loads((folder / rlhf_trainer.CONFIG_FILE).read_text())
    assert config["world"] == "tiny" and config["note"] == "test"
    reloaded = rlhf_trainer.load_tuned_policy(folder)
    tokens = trainer.model.base_model.to_tokens("This movie was really")
    with torch.no_grad():
        logits, values = trainer.model(tokens)
        logits2, values2 = reloaded(tokens)
    torch.testing.assert_close(logits2, logits)
    torch.testing.assert_close(values2, values)


def test_cli_summary_and_report(tmp_path):
    report = tmp_path / "report.html"
    summary = rlhf_trainer.main(["--world", "tiny", "--direction", "neg", "--seed", "0", "--num-phases", "2",
                         "--batch-size", "8", "--gen-len", "6", "--num-minibatches", "2", "--eval-samples", "8",
                         "--report", str(report), "--save", str(tmp_path / "tuned"), "--no-progress", "--threads", "1"])
    for key in ("mean_reward_initial", "mean_reward_final", "kl_final", "phases", "wall_seconds", "peak_memory_mb",
                "repetition_final", "reward_per_phase"):
        assert key in summary, key
    assert summary["phases"] == 2 and len(summary["reward_per_phase"]) == 2
    assert 0.0 <= summary["mean_reward_initial"] <= 1.0 and summary["peak_memory_mb"] > 0
    text = report.read_text()
    assert "Samples before and after training" in text and "plotly" in text.lower()
    assert (tmp_path / "tuned" / rlhf_trainer.WEIGHTS_FILE).exists()
    json.dumps(summary)  # serialisable, as the CLI prints it


def test_widgets_static_forms():
    from rlhf_tutorial.widgets import rlhf as w

    trainer = tiny_trainer(num_phases=2)
    dashboard = w.rlhf_dashboard(static=True)
    trainer.train(callback=dashboard.update, progress=False)
    assert len(dashboard.records) == 2 and dashboard.to_figure().data
    assert "phase 1" in repr(dashboard.phase_samples(-1))
    explorer = w.token_explorer(trainer, n_samples=2, seed=0, static=True)
    assert "value" in explorer._repr_html_() and "reward" in repr(explorer)
    records = rlhf.token_records(trainer, *rlhf.get_samples(trainer.model.base_model, trainer.args.prefix, 2, 6))
    assert len(records[0]["tokens"]) == len(records[0]["kl"]) == len(records[0]["advantage"]) == 6
    assert min(records[0]["kl"]) >= -1e-6
    comparison = w.base_vs_tuned(trainer, n=2, seed=0, static=True)
    assert "base (reference)" in repr(comparison) and "tuned" in comparison._repr_html_()
    table = w.samples_table(["a", "b"], torch.tensor([0.1, 0.9]), title="t")
    assert "0.900" in repr(table)
    assert w.runs_figure({"run": trainer.history}).data


# ----------------------------------------------------------------------------------------------------
# The memory benchmark (small shapes: the mechanics, not the GPT-2 figure)
# ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_memory_small():
    from rlhf_tutorial.trainers import bench

    out = bench.main(["--n-layers", "1", "--d-model", "32", "--d-vocab", "2000", "--batch-size", "8",
                      "--gen-len", "4", "--num-minibatches", "2", "--threads", "1"])
    for mode in ("chunked", "full_batch_logits"):
        assert out[mode]["phase_peak_mb"] >= out[mode]["setup_peak_mb"] > 0
    assert out["full_batch_logits_tensor_mb"] == pytest.approx(8 * 9 * 2000 * 4 / 2**20, abs=0.1)
