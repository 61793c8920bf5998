"""Chapter 06 running code: the shared evaluation, the DPO trainer's mechanics, the frontier, widgets."""

import copy
import json
import math

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from rlhf_tutorial import dpo
from rlhf_tutorial.devices import course_device, device_of, same_device
from rlhf_tutorial.trainers import dpo as dpo_trainer
from rlhf_tutorial.trainers import frontier, policy_eval
from rlhf_tutorial.widgets import dpo as widgets


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_policy():
    from rlhf_tutorial.worlds import load_policy

    return load_policy("tiny")


def random_model(seed=0, d_vocab=30):
    """A random model on the course's device (the simulated GPU under RLHF_TUTORIAL_DEVICE=simgpu)."""
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=32, d_head=4, n_heads=4, d_vocab=d_vocab,
                                  act_fn="gelu_new", normalization_type="LN", seed=seed, device=str(course_device()))
    return HookedTransformer(cfg).eval()


def _reward_by_length(texts):
    return torch.tensor([min(len(t), 100) / 100 for t in texts])


def small_args(**overrides):
    base = dict(num_pairs=6, group_size=4, max_new_tokens=6, rounds=2, batch_size=4, eval_samples=8,
                eval_samples_per_round=4, min_reward_gap=0.0)
    return dpo_trainer.DPOArgs.preset("tiny", **{**base, **overrides})


# ----------------------------------------------------------------------------------------------------
# policy_eval
# ----------------------------------------------------------------------------------------------------
def test_sequence_kl_is_zero_for_one_model_and_matches_a_loop_for_two():
    a, b = random_model(0), random_model(1)
    device = device_of(a)
    tokens = torch.randint(0, 30, (3, 7), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]], device=device)
    assert torch.allclose(policy_eval.sequence_kl(a, a, tokens, mask), torch.zeros(3, device=device), atol=1e-6)
    got = policy_eval.sequence_kl(a, b, tokens, mask, temperature=0.7, max_rows=2)
    with torch.no_grad():
        la, lb = (a(tokens) / 0.7).log_softmax(-1), (b(tokens) / 0.7).log_softmax(-1)
    expected = torch.zeros(3, device=device)
    for row in range(3):
        for j in range(3):
            if mask[row, j]:
                t = 7 - 3 + j - 1  # the position predicting completion token j
                expected[row] += (la[row, t].exp() * (la[row, t] - lb[row, t])).sum()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_mean_and_se():
    mean, se = policy_eval.mean_and_se([1.0, 2.0, 3.0, 4.0])
    assert mean == pytest.approx(2.5) and se == pytest.approx(math.sqrt(5 / 3) / 2)
    assert policy_eval.mean_and_se([0.3]) == (pytest.approx(0.3), 0.0)


def test_evaluate_policy_is_reproducible_and_zero_kl_against_itself(tiny_policy):
    kw = dict(prompts=("This movie was really",), n_samples=6, max_new_tokens=6, seed=3)
    first = policy_eval.evaluate_policy(tiny_policy, tiny_policy, _reward_by_length, **kw)
    second = policy_eval.evaluate_policy(tiny_policy, tiny_policy, _reward_by_length, **kw)
    assert first["texts"] == second["texts"] and first["reward"] == second["reward"]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6) and len(first["texts"]) == 6
    assert all(t.startswith("This movie was really") for t in first["texts"])


# ----------------------------------------------------------------------------------------------------
# pairs
# ----------------------------------------------------------------------------------------------------
def test_pairs_from_samples_choose_the_best_and_worst_and_mask_the_completion(tiny_policy):
    torch.manual_seed(0)
    args = small_args()
    pairs, stats = dpo_trainer.pairs_from_samples(tiny_policy, _reward_by_length, args)
    assert stats["groups"] == 6 and stats["pairs_kept"] == len(pairs) > 0
    plen = tiny_policy.to_tokens("This movie was really").shape[1]
    for chosen, c_mask, rejected, r_mask, c_text, r_text, gap in pairs:
        assert chosen.device == c_mask.device == r_mask.device == device_of(tiny_policy)
        assert len(c_text) >= len(r_text) and gap >= 0
        assert not c_mask[:plen].any() and c_mask[plen]  # the prompt never counts; the completion does
        assert chosen.shape == c_mask.shape == rejected.shape == r_mask.shape
    strict = small_args(min_reward_gap=10.0)
    none, _ = dpo_trainer.pairs_from_samples(tiny_policy, _reward_by_length, strict)
    assert none == []


def test_preference_pairs_are_flipped_for_negative_sentiment_only(tiny_policy):
    from rlhf_tutorial.rewards import pair_texts
    from rlhf_tutorial.worlds import load_preference_pairs

    raw = load_preference_pairs("tiny")[:6]
    neg = dpo_trainer.pairs_from_preferences(tiny_policy, small_args(pairs="preferences", direction="neg"))
    pos = dpo_trainer.pairs_from_preferences(tiny_policy, small_args(pairs="preferences", direction="pos"))
    for pair, n, p in zip(raw, neg, pos):
        assert n[0].device == n[1].device == n[3].device == device_of(tiny_policy)  # tokens and masks
        plen = tiny_policy.to_tokens(pair.get("prompt", "")).shape[1]
        assert not n[1][:plen].any() and n[1][plen:].all()  # the prompt never counts, the rest does
        chosen, rejected = pair_texts(pair)
        assert (p[4], p[5]) == (chosen, rejected)
        assert (n[4], n[5]) == ((rejected, chosen) if pair["kind"] == "sentiment" else (chosen, rejected))


def test_first_step_from_the_reference_has_zero_margin_and_log2_loss(tiny_policy):
    torch.manual_seed(0)
    policy = copy.deepcopy(tiny_policy)
    raw, _ = dpo_trainer.pairs_from_samples(tiny_policy, _reward_by_length, small_args())
    batch = dpo_trainer.to_batch(raw, tiny_policy)
    assert batch.chosen.device == batch.reward_gap.device == batch.ref_chosen_logps.device == device_of(tiny_policy)
    direct = torch.stack([dpo.sequence_logprobs(tiny_policy(t[None]), t[None], m[None])[0]
                          for t, m in zip(batch.chosen, batch.chosen_mask)])
    torch.testing.assert_close(batch.ref_chosen_logps, direct, rtol=1e-4, atol=1e-4)
    fns = {name: getattr(dpo, name) for name in dpo_trainer.PLUGGABLE}
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    stats = dpo_trainer.dpo_step(policy, optimizer, batch, small_args(), fns)
    assert stats["loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert stats["margin"] == pytest.approx(0.0, abs=1e-4) and stats["accuracy"] == 0.0


def test_kto_and_orpo_steps_pass_the_pairs_as_their_contracts_ask(tiny_policy):
    """KTO: every chosen completion desirable, every rejected one undesirable, z0 the step's mean log-ratio
    (with its graph: kto_loss detaches it); ORPO: the completions' token counts as lengths. At the first
    step the policy is the reference: r = 0 everywhere, so KTO's loss is 1 - sigmoid(0) = 0.5."""
    torch.manual_seed(0)
    raw, _ = dpo_trainer.pairs_from_samples(tiny_policy, _reward_by_length, small_args())
    batch = dpo_trainer.to_batch(raw, tiny_policy)
    seen = {}

    def my_kto(policy_logps, ref_logps, desirable, z0, **kwargs):
        seen["kto"] = (policy_logps, ref_logps, desirable, z0, kwargs)
        return dpo.kto_loss(policy_logps, ref_logps, desirable, z0, **kwargs)

    def my_orpo(chosen_logps, rejected_logps, chosen_lengths, rejected_lengths, **kwargs):
        seen["orpo"] = (chosen_lengths, rejected_lengths, kwargs)
        return dpo.orpo_loss(chosen_logps, rejected_logps, chosen_lengths, rejected_lengths, **kwargs)

    fns = {name: getattr(dpo, name) for name in dpo_trainer.PLUGGABLE} | {"kto_loss": my_kto, "orpo_loss": my_orpo}
    optimizer = torch.optim.SGD(copy.deepcopy(tiny_policy).parameters(), lr=0.0)
    kto_args = small_args(loss_type="kto", beta=0.3, kto_lambda_d=1.0, kto_lambda_u=1.0)
    stats = dpo_trainer.dpo_step(copy.deepcopy(tiny_policy), optimizer, batch, kto_args, fns)
    policy_logps, ref_logps, desirable, z0, kwargs = seen["kto"]
    n = len(batch)
    assert desirable.tolist() == [True] * n + [False] * n
    torch.testing.assert_close(ref_logps, torch.cat([batch.ref_chosen_logps, batch.ref_rejected_logps]))
    torch.testing.assert_close(z0, (policy_logps - ref_logps).mean())
    assert z0.requires_grad
    assert kwargs == {"beta": 0.3, "lambda_d": 1.0, "lambda_u": 1.0}
    assert stats["loss"] == pytest.approx(0.5, abs=1e-4)
    dpo_trainer.dpo_step(copy.deepcopy(tiny_policy), optimizer, batch, small_args(loss_type="orpo", orpo_lambda=0.25),
                         fns)
    chosen_lengths, rejected_lengths, kwargs = seen["orpo"]
    assert chosen_lengths.tolist() == batch.chosen_mask[:, 1:].sum(-1).tolist()
    assert rejected_lengths.tolist() == batch.rejected_mask[:, 1:].sum(-1).tolist() and kwargs == {"lam": 0.25}


# ----------------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------------
def test_train_runs_the_learners_loss_is_deterministic_and_leaves_the_reference(tiny_policy):
    calls = []

    def my_loss(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
        calls.append(pc.shape[0])
        return dpo.dpo_loss(pc, pr, rc, rr, beta, loss_type, label_smoothing)

    runs = []
    for _ in range(2):
        policy = copy.deepcopy(tiny_policy)
        start = {k: v.clone() for k, v in policy.state_dict().items()}
        result = dpo_trainer.train(small_args(), policy=policy, reward_fn=_reward_by_length, progress=False,
                                   dpo_loss=my_loss)
        assert all(torch.equal(result.reference.state_dict()[k], v) for k, v in start.items())
        assert any(not torch.equal(policy.state_dict()[k], v) for k, v in start.items())
        for key in ["loss", "margin", "accuracy", "reward", "kl", "kl_se", "pairs_kept"]:
            assert key in result.history[0]
        assert "pairs_kept" not in result.history[1]  # offline: the pairs of round 0 are reused
        runs.append(result)
    assert len(calls) >= 4
    assert [r["loss"] for r in runs[0].history] == [r["loss"] for r in runs[1].history]
    assert runs[0].eval_final["texts"] == runs[1].eval_final["texts"]
    with pytest.raises(TypeError, match="cannot replace"):
        dpo_trainer.train(small_args(), policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                          group_relative_advantages=lambda r: r)


def test_online_draws_new_pairs_every_round_and_evaluate_false_skips_measuring(tiny_policy):
    result = dpo_trainer.train(small_args(online=True), policy=copy.deepcopy(tiny_policy),
                               reward_fn=_reward_by_length, evaluate=False, progress=False)
    assert all("pairs_kept" in r for r in result.history)
    assert result.eval_initial is None and "reward" not in result.history[0]


def test_cli_main_prints_the_acceptance_keys(tmp_path):
    summary = dpo_trainer.main(["--world", "tiny", "--num-pairs", "4", "--group-size", "4", "--max-new-tokens", "6",
                                "--rounds", "1", "--eval-samples", "8", "--eval-samples-per-round", "4",
                                "--no-progress", "--report", str(tmp_path / "dpo.html")])
    for key in ["mean_reward_initial", "mean_reward_final", "kl_final", "pair_accuracy_final", "wall_seconds"]:
        assert key in summary
    assert same_device(torch.device(summary["device"]), course_device())  # where the policy ran and its memory was measured
    json.dumps(summary)
    page = (tmp_path / "dpo.html").read_text()
    assert "held-out classifier reward" in page and "plotly" in page


def test_cli_commands_are_registered():
    from rlhf_tutorial.cli import COMMANDS

    assert COMMANDS["train-dpo"][0] == "rlhf_tutorial.trainers.dpo:main"
    assert COMMANDS["frontier"][0] == "rlhf_tutorial.trainers.frontier:main"


# ----------------------------------------------------------------------------------------------------
# the frontier
# ----------------------------------------------------------------------------------------------------
def test_strengths_and_unknown_methods():
    args = frontier.FrontierArgs()
    assert all(len(frontier.strengths(args, m)) >= 3 for m in frontier.METHODS)
    with pytest.raises(ValueError, match="unknown method"):
        frontier.strengths(args, "reinforce")


def test_run_frontier_measures_every_point_the_same_way():
    args = frontier.FrontierArgs(world="tiny", methods=("grpo", "ipo"), grpo_kl_coefs=(0.1,), ipo_betas=(0.1, 0.5),
                                 rl_phases=1, dpo_rounds=1, dpo_pairs=4, eval_samples=8, max_new_tokens=6)
    result = frontier.run_frontier(args, progress=False)
    assert [(p["method"], p["strength"]) for p in result["points"]] == [("grpo", 0.1), ("ipo", 0.1), ("ipo", 0.5)]
    assert same_device(torch.device(result["device"]), course_device())
    for point in result["points"]:
        assert 0 <= point["reward"] <= 1 and point["kl"] >= 0 and point["kl_se"] >= 0
        assert len(point["samples"]) == 3 and point["settings"]
    assert result["methods"]["ipo"]["points"] == 2 and result["base"]["kl"] == pytest.approx(0.0, abs=1e-6)
    fig = widgets.frontier_figure(result)
    assert [t.name for t in fig.data] == ["GRPO (ch. 04)", "IPO", "base policy"]
    assert "beta = 0.5" in "".join(fig.data[1].hovertext)
    table = str(widgets.FrontierTable(result))
    assert table.count("\n") == 4 and "IPO" in table


def test_frontier_strengths_of_reinforce_pp_and_cispo():
    """REINFORCE++'s KL strength is its own sweep (kl_coef weighs the k1 KL inside the rewards); CISPO's is the
    GRPO family's (beta of the k3 term in the loss). Neither is in the default grid, both are accepted."""
    args = frontier.FrontierArgs(grpo_kl_coefs=(0.2, 0.4), reinforce_pp_kl_coefs=(0.05,))
    assert frontier.strengths(args, "reinforce_pp") == [0.05]
    assert frontier.strengths(args, "cispo") == [0.2, 0.4]
    assert {"reinforce_pp", "cispo"} <= set(frontier.ALL_METHODS) and not {"reinforce_pp", "cispo"} & set(frontier.METHODS)
    ns = frontier._parser().parse_args(["--methods", "reinforce_pp", "cispo", "--reinforce-pp-kl-coefs", "0.03", "0.3"])
    assert list(ns.methods) == ["reinforce_pp", "cispo"] and [float(v) for v in ns.reinforce_pp_kl_coefs] == [0.03, 0.3]


def test_run_frontier_trains_reinforce_pp_and_cispo_through_grpo_and_measures_them_the_same_way():
    args = frontier.FrontierArgs(world="tiny", methods=("grpo", "reinforce_pp", "cispo"), grpo_kl_coefs=(0.1,),
                                 reinforce_pp_kl_coefs=(0.03,), rl_phases=1, eval_samples=8, max_new_tokens=6)
    result = frontier.run_frontier(args, progress=False)
    assert [(p["method"], p["strength"]) for p in result["points"]] == [("grpo", 0.1), ("reinforce_pp", 0.03),
                                                                         ("cispo", 0.1)]
    by_method = {p["method"]: p for p in result["points"]}
    # each ran the GRPO trainer with its option, its strength as the trainer's kl_coef, the rest as GRPO's
    assert by_method["reinforce_pp"]["settings"]["advantage_estimator"] == "reinforce_pp"
    assert by_method["reinforce_pp"]["settings"]["kl_coef"] == 0.03
    assert by_method["cispo"]["settings"]["policy_loss"] == "cispo"
    assert by_method["cispo"]["settings"]["kl_coef"] == 0.1
    assert by_method["grpo"]["settings"]["policy_loss"] == "clip"
    assert by_method["grpo"]["settings"]["advantage_estimator"] == "group"
    for name in ("reinforce_pp", "cispo"):
        point, grpo_settings = by_method[name], by_method["grpo"]["settings"]
        differ = {k for k in point["settings"] if point["settings"][k] != grpo_settings[k]}
        assert differ <= {"advantage_estimator", "policy_loss", "kl_coef"}, (name, differ)
        # measured like every other point: the same keys, reward in [0, 1], sequence KL with its standard error
        assert point.keys() == by_method["grpo"].keys() and point["strength_name"] == "kl_coef"
        assert 0 <= point["reward"] <= 1 and point["kl"] >= 0 and point["kl_se"] >= 0 and len(point["samples"]) == 3
        assert result["methods"][name]["points"] == 1
    # the tuned policies differ from GRPO's (another objective trained them)
    assert len({p["kl"] for p in result["points"]}) == 3
    fig = widgets.frontier_figure(result)
    assert [t.name for t in fig.data] == ["GRPO (ch. 04)", "REINFORCE++", "CISPO", "base policy"]
    assert len({t.marker.color for t in fig.data}) == 4
    rl_button = fig.layout.updatemenus[0].buttons[1]
    assert "REINFORCE++" in rl_button.label and "CISPO" in rl_button.label
    assert rl_button.args[0]["visible"] == [True, True, True, True]


def test_frontier_report_has_the_figure_the_costs_and_the_table(tmp_path):
    point = {"method": "dpo", "strength": 0.1, "strength_name": "beta", "reward": 0.8, "reward_se": 0.02, "kl": 3.0,
             "kl_se": 0.3, "train_seconds": 10.0, "peak_memory_mb": 100.0, "samples": [("a text", 0.9)],
             "settings": {"learning_rate": 2e-4}}
    result = {"world": "tiny", "points": [point, {**point, "method": "ppo", "strength_name": "kl_coef"}],
              "methods": {"dpo": {"points": 1, "train_seconds": 10.0, "peak_memory_mb": 100.0},
                          "ppo": {"points": 1, "train_seconds": 12.0, "peak_memory_mb": 150.0}},
              "base": {"reward": 0.3, "reward_se": 0.03, "kl": 0.0, "kl_se": 0.0, "samples": [("b", 0.2)]}}
    page = widgets.write_frontier_report(tmp_path / "f.html", result).read_text()
    assert page.count("<table") == 1 and "kl_coef = 0.1" in page and "training wall time" in page
    assert len(widgets.cost_figure(result).data) == 2


def test_dpo_curves_have_the_five_panels():
    history = [{"round": i, "loss": 0.6 - 0.1 * i, "margin": 0.1 * i, "accuracy": 0.5 + 0.1 * i, "reward": 0.3 + 0.1 * i,
                "kl": float(i), "samples": [("x", 0.5)]} for i in range(3)]
    fig = widgets.dpo_curves(history)
    assert len(fig.data) == 5 and list(fig.data[3].y) == [0.3, 0.4, 0.5]


def test_a_run_whose_rounds_keep_no_pair_ends_with_a_message_and_a_showable_result(tiny_policy, capsys):
    """Every group's rewards equal: no pair passes min_reward_gap. The run ends (no exception), says
    why, leaves the policy as it was, and its last record still has what chapter 06 prints."""
    policy = copy.deepcopy(tiny_policy)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    result = dpo_trainer.train(small_args(min_reward_gap=0.05), policy=policy, reward_fn=lambda t: torch.zeros(len(t)),
                               evaluate=False, progress=False)
    assert [r["pairs_kept"] for r in result.history] == [0, 0]
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in start.items())
    assert "no pair was kept in any round" in result.note and "min_reward_gap = 0.05" in result.note
    assert "no pair was kept" in capsys.readouterr().err
    assert math.isnan(result.history[-1]["accuracy"]) and f"{result.history[-1]['accuracy']:.2f}" == "nan"
    assert dpo_trainer._number(result.history[-1]["loss"]) is None


def test_a_plugged_function_without_a_graph_is_named_by_the_trainer(tiny_policy):
    """sequence_logprobs under torch.no_grad(): the trainer stops naming it, not with torch's
    'element 0 of tensors does not require grad' from inside backward()."""

    @torch.no_grad()
    def my_sequence_logprobs(logits, tokens, mask):
        return dpo.sequence_logprobs(logits, tokens, mask)

    def my_loss(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
        return dpo.dpo_loss(pc, pr, rc, rr, beta, loss_type, label_smoothing).detach()

    from rlhf_tutorial.trainers.plug import NoGradientError

    for name, fn in [("sequence_logprobs", my_sequence_logprobs), ("dpo_loss", my_loss)]:
        with pytest.raises(NoGradientError, match=f"your `{name}` returned a tensor with no gradient graph"):
            dpo_trainer.train(small_args(rounds=1), policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                              evaluate=False, progress=False, **{name: fn})


def _frontier_point(method, strength, kl, reward, name="beta"):
    return {"method": method, "strength": strength, "strength_name": name, "reward": reward, "reward_se": 0.05,
            "kl": kl, "kl_se": 0.01, "train_seconds": 0.3, "peak_memory_mb": 0.0039, "samples": [], "settings": {}}


def test_frontier_labels_of_points_at_the_same_place_cover_neither_each_other_nor_a_marker():
    """Smoke-size runs put DPO's and IPO's points on the base policy's (KL 0): their labels go apart."""
    points = [_frontier_point("dpo", 0.03, 0.01, 0.30), _frontier_point("dpo", 0.5, 0.0, 0.29),
              _frontier_point("ipo", 0.02, 0.01, 0.31), _frontier_point("ipo", 0.5, 0.0, 0.30),
              _frontier_point("ppo", 0.1, 0.3, 0.35, "kl_coef")]
    base = {"reward": 0.30, "reward_se": 0.05, "kl": 0.0, "kl_se": 0.0, "samples": []}
    result = {"points": points, "base": base, "methods": {}}
    fig = widgets.frontier_figure(result)
    positions = [pos for trace in fig.data[:-1] for pos in trace.textposition]
    assert len(set(positions[:4])) == 4, positions  # four points on one spot: four sides
    # the placement itself, in pixels: no two labels overlap, no label covers a marker
    xy = [(p["kl"], p["reward"]) for p in points]
    texts = [f"{p['strength']:g}" for p in points]
    chosen = widgets.label_positions(xy, texts, markers=[(0.0, 0.30)], x_range=(-0.02, 0.32))
    px = [((x + 0.02) / 0.34 * widgets.PLOT_PX[0], (1.05 - y) / 1.05 * widgets.PLOT_PX[1]) for x, y in xy + [(0.0, 0.30)]]
    boxes = [widgets._label_box(*px[i], texts[i], pos) for i, pos in enumerate(chosen)]
    markers = [(x - widgets.MARKER_PX, y - widgets.MARKER_PX, x + widgets.MARKER_PX, y + widgets.MARKER_PX) for x, y in px]
    assert all(widgets._overlap(a, b) == 0 for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(widgets._overlap(b, m) == 0 for b in boxes for m in markers)
    # a lone point keeps the usual place, above its marker
    assert widgets.label_positions([(1.0, 0.5)], ["0.1"]) == ["top center"]


def test_cost_bars_show_two_significant_digits():
    """A DPO run of 0.3 s reads 0.3, not 0; a GSPO peak of 0.0039 MB reads 0.0039; 261.2 s reads 261."""
    methods = {"dpo": {"train_seconds": 0.3, "peak_memory_mb": 0.0039}, "ppo": {"train_seconds": 261.2, "peak_memory_mb": 44.82}}
    fig = widgets.cost_figure({"methods": methods})
    assert list(fig.data[0].text) == ["0.3", "261"] and list(fig.data[1].text) == ["0.0039", "45"]


def test_given_pairs_and_no_evaluations_make_no_reference_and_train_the_same(tiny_policy):
    """Offline pairs carry their reference log-probs: without evaluations nothing reads a reference, so
    none is copied (a model's worth of memory), and training is the same as with one given."""
    args = small_args()
    pairs, _ = dpo_trainer.pairs_from_samples(copy.deepcopy(tiny_policy).eval(), _reward_by_length, args)
    batch = dpo_trainer.to_batch(pairs, copy.deepcopy(tiny_policy).eval().requires_grad_(False))
    trained = []
    for reference in (copy.deepcopy(tiny_policy), None):
        policy = copy.deepcopy(tiny_policy)
        result = dpo_trainer.train(args, policy=policy, reference=reference, reward_fn=_reward_by_length,
                                   pairs=batch, evaluate=False, progress=False)
        assert (result.reference is None) == (reference is None)
        trained.append(policy.state_dict())
    assert any(not torch.equal(trained[0][k], v) for k, v in tiny_policy.state_dict().items())  # it trained
    assert all(torch.equal(trained[0][k], trained[1][k]) for k in trained[0])
    # evaluations read the reference: then one is still made
    result = dpo_trainer.train(small_args(rounds=1), policy=copy.deepcopy(tiny_policy), reward_fn=_reward_by_length,
                               pairs=batch, evaluate=True, progress=False)
    assert result.reference is not None
