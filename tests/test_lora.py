"""LoRA in the trainers (chapter 08): one mechanism, ``lora_rank`` / ``lora_alpha`` in the args of GRPO,
RLHF and SFT (``trainers.lora``). Only A and B receive gradients, the base weights never move, the
merged policy gives the hooked one's logits, a saved LoRA run exports, a run is deterministic for a seed."""

from __future__ import annotations

import pytest
import torch

from rlhf_tutorial import lora
from rlhf_tutorial.checks.fixtures import small_model
from rlhf_tutorial.trainers import grpo as grpo_trainer
from rlhf_tutorial.trainers import lora as lora_trainer
from rlhf_tutorial.trainers.args import add_flags


def test_only_a_and_b_receive_gradients():
    model = small_model(seed=1)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    adapters = lora_trainer.apply_lora(model, rank=2, alpha=4.0, seed=0)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 8), generator=torch.Generator().manual_seed(0)).to(model.cfg.device)
    assert torch.equal(model(tokens), model(tokens))
    optimizer = torch.optim.AdamW(lora_trainer.trainable(model, adapters), lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        model(tokens).log_softmax(-1)[..., 0].mean().backward()
        assert all(p.grad is None for p in model.parameters()), "a base weight received a gradient"
        assert all(p.grad is not None for p in adapters.parameters())
        optimizer.step()
    assert all(bool(a.A.grad.ne(0).any()) and bool(a.B.grad.ne(0).any()) for a in adapters.values())
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters()), "a base weight moved"
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in adapters.parameters()}


def test_rank_zero_is_full_fine_tuning_and_a_negative_rank_is_refused():
    model = small_model(seed=1)
    assert lora_trainer.apply_lora(model, 0, 16.0) is None
    assert all(p.requires_grad for p in model.parameters())
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())
    assert lora_trainer.merged(model, None) is model
    with pytest.raises(ValueError, match="lora_rank"):
        lora_trainer.apply_lora(model, -1, 16.0)


@pytest.mark.parametrize("args_cls", ["GRPOArgs", "RLHFArgs", "SFTArgs"])
def test_every_trainer_has_the_same_two_fields_and_flags(args_cls):
    import argparse

    from rlhf_tutorial.trainers import grpo, reasoning, rlhf

    cls = {"GRPOArgs": grpo.GRPOArgs, "RLHFArgs": rlhf.RLHFArgs, "SFTArgs": reasoning.SFTArgs}[args_cls]
    args = cls()
    assert args.lora_rank == 0 and args.lora_alpha == 16.0
    parser = argparse.ArgumentParser()
    add_flags(parser, cls, from_preset=True)
    ns = parser.parse_args(["--lora-rank", "4", "--lora-alpha", "8"])
    assert (ns.lora_rank, ns.lora_alpha) == (4, 8.0)


@pytest.fixture(scope="module")
def tiny_policy():
    from rlhf_tutorial.worlds import load_policy

    return load_policy("tiny")


def _grpo(tiny_policy, **overrides):
    import copy

    args = grpo_trainer.GRPOArgs.preset("tiny", groups_per_phase=2, group_size=4, max_new_tokens=8, num_phases=2,
                                        eval_samples=8, num_minibatches=2, lora_rank=1, learning_rate=3e-3,
                                        **overrides)
    return grpo_trainer.train(args, policy=copy.deepcopy(tiny_policy), progress=False)


def test_grpo_with_lora_trains_the_adapters_only_and_merges_exactly(tiny_policy):
    result = _grpo(tiny_policy)
    assert result.adapters is not None and len(result.adapters) == tiny_policy.cfg.n_layers * len(lora.TARGETS)
    assert all(torch.equal(p, q) for p, q in zip(result.policy.parameters(), tiny_policy.parameters()))
    assert any(bool(a.B.ne(0).any()) for a in result.adapters.values()), "the adapters did not move"
    assert not any(hp.fwd_hooks for hp in result.reference.hook_dict.values()), "the reference carries the LoRA"
    # AdamW keeps two moments (plus a step counter) per adapter parameter: nothing for the frozen weights
    n_trained = sum(p.numel() for p in result.adapters.parameters())
    assert n_trained == sum(r * (i + o) for i, o in lora.weight_shapes(tiny_policy).values() for r in [1]) * tiny_policy.cfg.n_layers
    assert result.optimizer_state_mb * 2**20 < 3 * 4 * n_trained
    tokens = tiny_policy.to_tokens(["This movie was", "The acting"], prepend_bos=True)
    merged = lora_trainer.merged(result.policy, result.adapters)
    assert not any(hp.fwd_hooks for hp in merged.hook_dict.values())
    assert torch.allclose(merged(tokens), result.policy(tokens), atol=1e-5, rtol=0)
    assert (merged(tokens) - tiny_policy(tokens)).abs().max() > 0


def test_grpo_with_lora_is_deterministic_for_a_seed(tiny_policy):
    first, second = _grpo(tiny_policy, seed=3), _grpo(tiny_policy, seed=3)
    assert first.reward_per_phase == second.reward_per_phase
    assert all(torch.equal(a, b) for a, b in zip(first.adapters.parameters(), second.adapters.parameters()))


def test_a_saved_rlhf_lora_run_is_merged_and_exports(tiny_policy, tmp_path):
    import copy

    from rlhf_tutorial.rewards import sentiment_reward_fn
    from rlhf_tutorial.trainers import export, rlhf
    from rlhf_tutorial.trainers.checkpoint import load_tuned_policy, save_tuned_policy

    args = rlhf.RLHFArgs.preset("tiny", batch_size=8, gen_len=6, num_minibatches=2, update_epochs=1, num_phases=1,
                                warmup_steps=0, early_stopping=False, eval_samples=8, lora_rank=2)
    trainer = rlhf.RLHFTrainer(args, copy.deepcopy(tiny_policy), copy.deepcopy(tiny_policy),
                               sentiment_reward_fn("tiny", "neg"))
    trainer.train(progress=False)
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.base_model.parameters(), tiny_policy.parameters()))
    saved = save_tuned_policy(trainer.model_to_save(), tmp_path / "run", args)
    loaded = load_tuned_policy(saved, device=tiny_policy.cfg.device)
    tokens = tiny_policy.to_tokens(["This movie was"], prepend_bos=True)
    with torch.no_grad():
        assert torch.allclose(loaded.base_model(tokens), trainer.model.base_model(tokens), atol=1e-5, rtol=0)
    summary = export.main(["--checkpoint", str(saved), "--out", str(tmp_path / "hf")])
    assert "error" not in summary and summary["value_head"], summary
    assert summary["max_abs_logit_diff"] < 1e-4


def test_sft_with_lora_leaves_the_base_weights(tmp_path):
    from rlhf_tutorial.trainers import reasoning
    from rlhf_tutorial.worlds import load_reasoning_policy

    policy = load_reasoning_policy("tiny")
    before = [p.detach().clone() for p in policy.parameters()]
    args = reasoning.SFTArgs.preset("tiny", n_demonstrations=32, lora_rank=1, learning_rate=3e-3)
    result = reasoning.train_sft(args, policy=policy, evaluate_before_after=False, progress=False)
    assert result.adapters is not None and len(result.losses) == 2
    assert all(torch.equal(p, q) for p, q in zip(policy.parameters(), before))
    assert any(bool(a.B.ne(0).any()) for a in result.adapters.values())


def test_spectrum_counts_the_directions_of_a_known_change():
    import copy

    from rlhf_tutorial.trainers.lora_compare import spectrum

    base = small_model(seed=2)
    tuned = copy.deepcopy(base)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a rank-2 change of layer 0's W_in, nothing else
        tuned.blocks[0].mlp.W_in += (torch.randn(32, 2, generator=g) @ torch.randn(2, 128, generator=g)).to(base.cfg.device)
    out = spectrum(base, tuned)
    assert out["matrices"]["L0_mlp_in"]["k_90"] <= 2 and out["matrices"]["L0_mlp_in"]["k_50"] == 1
    assert all(m["k_90"] == 0 for key, m in out["matrices"].items() if key != "L0_mlp_in")
    assert out["random_median_k_90"] > 10
    total = sum(p.numel() for p in base.parameters())
    assert abs(out["fraction_changed"] - base.blocks[0].mlp.W_in.numel() / total) < 1e-3  # every entry of W_in moved


def test_compare_lora_summarises_every_rank_and_the_scan():
    from rlhf_tutorial.trainers.lora_compare import CompareLoRAArgs, compare_lora

    args = CompareLoRAArgs(world="tiny", ranks=(0, 2), lr_multipliers=(1.0, 3.0), num_phases=1, groups_per_phase=2,
                           eval_samples=4)
    out = compare_lora(args)
    assert set(out["runs"]) == {"0", "2"} and set(out["scan"]["2"]) == {"1", "3"}
    assert out["runs"]["0"]["learning_rate"] == 3e-4 and out["runs"]["2"]["learning_rate"] == 3e-3
    assert out["runs"]["2"]["trainable_parameters"] < out["runs"]["0"]["trainable_parameters"] / 10
    assert out["runs"]["2"]["optimizer_state_mb"] < out["runs"]["0"]["optimizer_state_mb"] / 10
    assert out["best_multiplier"]["0"] in ("1", "3")


def test_the_lora_figures_read_full_then_the_ranks_down_with_readable_axes():
    from rlhf_tutorial.widgets import lora as lora_widgets

    run = {"trainable_parameters": 4608, "optimizer_state_mb": 0.035, "mean_reward_final": 0.89,
           "reward_per_phase": [0.3, 0.5], "kl_per_phase": [0.0, 0.1]}
    runs = {"0": {**run, "trainable_parameters": 865766, "optimizer_state_mb": 6.6}, "1": run, "16": run, "4": run}
    curves = lora_widgets.rank_curves(runs)
    assert [t.name for t in curves.data if t.showlegend] == ["full fine-tuning", "LoRA rank 16", "LoRA rank 4", "LoRA rank 1"]
    assert curves.layout.xaxis.dtick == 1  # two phases: ticks 1 and 2, none at 1.5
    costs = lora_widgets.cost_figure(runs, sft={r: {"pass_at_1_final": 0.5} for r in runs})
    assert list(costs.data[0].x) == ["full", "rank 16", "rank 4", "rank 1"]
    assert list(costs.data[0].text) == ["865,766", "4,608", "4,608", "4,608"] and costs.data[1].text[3] == "0.035"
    assert costs.layout.yaxis.type == "log" and costs.layout.yaxis.dtick == 1
    # each rank has the same colour in both figures
    assert [t.line.color for t in curves.data if t.showlegend] == list(costs.data[0].marker.color)


def test_the_cost_figure_shows_the_seeds_spread_of_the_reward_with_one_draw_marked():
    """With ``seeds`` the reward panel is the mean over seeds with a bar from the lowest to the highest seed,
    and the runs' own (seed-0) rewards are markers: one seed is one draw."""
    from rlhf_tutorial.widgets import lora as lora_widgets

    run = {"trainable_parameters": 4608, "optimizer_state_mb": 0.035}
    runs = {"0": {**run, "mean_reward_final": 0.9}, "1": {**run, "mean_reward_final": 0.89}}
    seeds = {"0": {"mean_reward_final": {"mean": 0.89, "min": 0.85, "max": 0.93, "per_seed": [0.9, 0.85, 0.93]}},
             "1": {"mean_reward_final": {"mean": 0.73, "min": 0.63, "max": 0.89, "per_seed": [0.89, 0.63, 0.67]}}}
    plain = lora_widgets.cost_figure(runs)
    assert list(plain.data[2].y) == [0.9, 0.89] and len(plain.data) == 3
    spread = lora_widgets.cost_figure(runs, seeds=seeds)
    bars, marks = spread.data[2], spread.data[3]
    assert list(bars.x) == ["full", "rank 1"] and list(bars.y) == [0.89, 0.73]
    assert [round(v, 2) for v in bars.error_y.array] == [0.04, 0.16]
    assert [round(v, 2) for v in bars.error_y.arrayminus] == [0.04, 0.10]
    assert list(marks.y) == [0.9, 0.89] and list(marks.x) == list(bars.x)
    assert "3 seeds" in spread.layout.annotations[2].text
    partial = lora_widgets.cost_figure({**runs, "4": {**run, "mean_reward_final": 0.5}}, seeds=seeds)
    assert len(partial.data) == 3  # a rank without seeds: the plain figure, no half-filled spread


def test_compare_lora_over_seeds_summarises_each_ranks_spread():
    from rlhf_tutorial.trainers.lora_compare import CompareLoRAArgs, compare_lora, learning_rate, run_grpo

    args = CompareLoRAArgs(world="tiny", ranks=(2,), seeds=(0, 1), num_phases=1, groups_per_phase=2, eval_samples=4)
    out = compare_lora(args)
    stats = out["runs"]["2"]
    assert out["seeds"] == [0, 1] and set(stats["curves"]) == {"0", "1"}
    single = run_grpo(CompareLoRAArgs(**{**vars(args), "seeds": (), "seed": 1}), 2, learning_rate("sentiment", 2))
    assert stats["mean_reward_final"]["per_seed"][1] == single["mean_reward_final"]  # each seed is that seed's run
    values = stats["kl_final"]["per_seed"]
    assert stats["kl_final"]["min"] == min(values) and stats["kl_final"]["max"] == max(values)
    mean = sum(values) / 2
    assert stats["kl_final"]["std"] == pytest.approx(((values[0] - mean) ** 2 + (values[1] - mean) ** 2) ** 0.5, abs=1e-4)
    with pytest.raises(ValueError, match="--seeds is for --task sentiment"):
        compare_lora(CompareLoRAArgs(world="tiny", task="arithmetic", seeds=(0, 1)))


def test_compare_lora_over_seeds_with_several_rates_scans_each_rank_at_each_seed():
    from rlhf_tutorial.trainers.lora_compare import CompareLoRAArgs, compare_lora, learning_rate, run_grpo

    args = CompareLoRAArgs(world="tiny", ranks=(2,), seeds=(0, 1), lr_multipliers=(0.5, 2.0), num_phases=1,
                           groups_per_phase=2, eval_samples=4)
    out = compare_lora(args)
    scan = out["scan"]["2"]
    assert set(scan) == {"0.5", "2"} and scan["2"]["learning_rate"] == learning_rate("sentiment", 2, 2.0)
    single = run_grpo(CompareLoRAArgs(**{**vars(args), "seeds": (), "seed": 1}), 2, learning_rate("sentiment", 2, 0.5))
    assert scan["0.5"]["mean_reward_final"]["per_seed"][1] == single["mean_reward_final"]  # that rate, that seed
    means = {m: stats["mean_reward_final"]["mean"] for m, stats in scan.items()}
    assert out["best_multiplier"]["2"] == max(means, key=means.get)
    assert out["runs"]["2"] == scan[out["best_multiplier"]["2"]]  # no multiplier 1: the best one stands for the rank


def test_the_three_seed_rate_scan_reads_as_chapter_08_says():
    """Section 4's claims on the recorded bracketing scan: full fine-tuning best at three times its preset;
    every LoRA cell below full fine-tuning's worst; every rank's KL blown up at three times the LoRA rate,
    ranks 1 and 16 losing reward there; at a third of the LoRA rate no rank far from its LoRA-rate reward; at a tenth
    every rank worse than at a third (the scan brackets each rank's best)."""
    from rlhf_tutorial import figures

    full = figures.recorded()["lora_scan_seeds_full"]["summary"]["scan"]["0"]
    lora_scan = figures.recorded()["lora_scan_seeds"]["summary"]["scan"]
    reward = {m: r["mean_reward_final"]["mean"] for m, r in full.items()}
    assert max(reward, key=reward.get) == "3"
    assert all(r["mean_reward_final"]["mean"] < min(reward.values()) for by_m in lora_scan.values() for r in by_m.values())
    for by_m in lora_scan.values():
        assert by_m["3"]["kl_final"]["mean"] > 5 * by_m["1"]["kl_final"]["mean"]
        low, mid = by_m["0.3"]["mean_reward_final"], by_m["1"]["mean_reward_final"]
        assert low["max"] >= mid["min"] and mid["max"] >= low["min"]  # the seeds' ranges overlap
    for rank in ("1", "16"):
        assert lora_scan[rank]["3"]["mean_reward_final"]["mean"] < lora_scan[rank]["1"]["mean_reward_final"]["mean"] - 0.1
    # a tenth of the LoRA rate: every rank's mean below its mean at a third, so each rank's best (by the mean) is an
    # inner cell of 0.1 / 0.3 / 1 / 3: the scan brackets it, as the text says
    low = figures.recorded()["lora_scan_seeds_low"]["summary"]
    assert low["args"]["lr_multipliers"] == [0.1] and low["seeds"] == [0, 1, 2]
    for rank, by_m in lora_scan.items():
        means = {"0.1": low["runs"][rank]["mean_reward_final"]["mean"],
                 **{m: r["mean_reward_final"]["mean"] for m, r in by_m.items()}}
        assert means["0.1"] < means["0.3"], rank
        assert max(means, key=means.get) in ("0.3", "1"), (rank, means)
