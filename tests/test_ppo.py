"""The reference PPO (rlhf_tutorial/ppo.py), its command line and the chapter-01 widgets. No CartPole
solving here: the timing and the solved figure come from the CLI run."""

import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from rlhf_tutorial import display, ppo
from rlhf_tutorial.trainers import ppo as ppo_trainer
from rlhf_tutorial.widgets import live
from rlhf_tutorial.widgets import ppo as ppo_widgets

TINY = dict(num_envs=2, num_steps=16, total_timesteps=2 * 16 * 3, num_minibatches=2, update_epochs=2, hidden=8)


# ----------------------------------------------------------------------------------------------------
# The pieces, on numbers worked out by hand
# ----------------------------------------------------------------------------------------------------
def test_compute_gae_by_hand():
    # one env, three steps, the episode ends with step 1; gamma = 0.5, lambda = 0.5
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [2.0]])
    next_value = torch.tensor([4.0])
    dones = torch.tensor([[False], [True], [False]])
    adv = ppo.compute_gae(rewards, values, next_value, dones, gamma=0.5, gae_lambda=0.5)
    d2 = 3 + 0.5 * 4 - 2  # 3.0, bootstraps from next_value
    d1 = 2 - 1.0  # 1.0, the episode ended: no bootstrap
    d0 = 1 + 0.5 * 1.0 - 0.5  # 1.0
    a1 = d1
    a0 = d0 + 0.25 * a1
    assert torch.allclose(adv, torch.tensor([[a0], [a1], [d2]]))


def test_clipped_surrogate_by_hand():
    # advantages [1, -1] normalise to [1/sqrt 2, -1/sqrt 2]; ratio 1.5 for both, clip_coef 0.2
    old = torch.log(torch.tensor([0.2, 0.4]))
    new = old + math.log(1.5)
    obj = ppo.calc_clipped_surrogate_objective(new, old, torch.tensor([1.0, -1.0]), clip_coef=0.2)
    a = 1 / math.sqrt(2)
    expected = (1.2 * a + (-1.5 * a)) / 2  # good action: clipped at 1.2; bad action: unclipped 1.5
    assert obj.shape == () and math.isclose(obj.item(), expected, rel_tol=1e-5)


def test_value_loss_and_entropy_by_hand():
    loss = ppo.calc_value_function_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0]), vf_coef=0.5)
    assert math.isclose(loss.item(), 0.5 * 0.5 * (1 + 4) / 2)
    uniform = ppo.calc_entropy_bonus(torch.zeros(3, 4), ent_coef=0.1)
    assert math.isclose(uniform.item(), 0.1 * math.log(4), rel_tol=1e-6)
    peaked = ppo.calc_entropy_bonus(torch.tensor([[1e4, 0.0, -1e4]]), ent_coef=1.0)
    assert torch.isfinite(peaked) and abs(peaked.item()) < 1e-6


def test_clipped_value_loss_by_hand():
    returns, old = torch.tensor([2.0, 2.0, 2.0]), torch.zeros(3)
    values = torch.tensor([1.0, 0.1, -1.0], requires_grad=True)
    loss = ppo.calc_clipped_value_loss(values, old, returns, vf_coef=0.5, clip=0.2)
    # per element: max((v - R)^2, (clip(v) - R)^2) = max(1, 3.24), max(3.61, 3.61), max(9, 4.84)
    assert loss.item() == pytest.approx(0.5 * 0.5 * (3.24 + 3.61 + 9.0) / 3)
    loss.backward()
    # the first value moved past the clip range towards its target: the clipped branch wins, no gradient;
    # the third moved away from its target: the unclipped branch wins, full gradient
    assert values.grad.tolist() == pytest.approx([0.0, 0.5 * 0.5 * 2 * (0.1 - 2) / 3, 0.5 * 0.5 * 2 * (-1 - 2) / 3])
    # an infinite range is the plain value loss
    v = torch.randn(4, 5)
    r = torch.randn(4, 5)
    assert ppo.calc_clipped_value_loss(v, torch.randn(4, 5), r, 0.3, math.inf).item() == pytest.approx(
        ppo.calc_value_function_loss(v, r, 0.3).item())


def test_masked_mean_over_the_true_elements_and_zero_over_none():
    x = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert ppo.masked_mean(x, mask).item() == pytest.approx(7.0 / 3)  # (1 + 2 + 4) / 3, not / 6
    assert ppo.masked_mean(x).item() == pytest.approx(x.mean().item())
    assert ppo.masked_mean(x, torch.zeros_like(mask)).item() == 0.0  # no True: 0, not NaN
    assert ppo.masked_mean(x > 3, mask).item() == pytest.approx(1 / 3)  # a share, from a bool tensor
    assert ppo.masked_mean(x.double(), mask).dtype == torch.float32
    assert ppo.masked_mean(torch.tensor([float("nan"), 1.0]), torch.tensor([True, True])).isnan()  # not hidden


def test_layer_init_is_orthogonal_and_in_place():
    layer = torch.nn.Linear(5, 3)
    assert ppo.layer_init(layer, std=2.0, bias_const=0.1) is layer
    w = layer.weight.detach()
    assert torch.allclose(w @ w.T, 4.0 * torch.eye(3), atol=1e-5)
    assert torch.allclose(layer.bias.detach(), torch.full((3,), 0.1))


def test_minibatch_indices_cover_the_batch_once():
    mbs = ppo.get_minibatch_indices(12, 4, torch.Generator().manual_seed(0))
    assert len(mbs) == 3 and all(mb.shape == (4,) for mb in mbs)
    assert sorted(torch.cat(mbs).tolist()) == list(range(12))
    again = ppo.get_minibatch_indices(12, 4, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(mbs, again))


def test_explained_variance():
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert ppo.explained_variance(returns, returns) == 1.0
    assert abs(ppo.explained_variance(torch.full((4,), 2.5), returns)) < 1e-6
    assert math.isnan(ppo.explained_variance(returns, torch.ones(4)))


def test_agent_initial_policy_is_near_uniform():
    torch.manual_seed(0)
    agent = ppo.Agent(4, 2)
    logits = agent.actor(torch.randn(16, 4))
    assert logits.shape == (16, 2) and logits.abs().max() < 0.1
    assert agent.critic(torch.randn(16, 4)).shape == (16, 1)


def test_vector_env_resets_in_the_same_step():
    from rlhf_tutorial.probes import Probe3

    envs = ppo.make_vector_env(Probe3, 2)
    obs, _ = envs.reset(seed=0)
    assert obs[:, 0].tolist() == [0.0, 0.0]
    obs, _, terminated, _, _ = envs.step(np.zeros(2, dtype=np.int64))
    assert obs[:, 0].tolist() == [1.0, 1.0] and not terminated.any()
    obs, reward, terminated, _, _ = envs.step(np.zeros(2, dtype=np.int64))
    assert terminated.all() and reward.tolist() == [1.0, 1.0]
    assert obs[:, 0].tolist() == [0.0, 0.0], "SAME_STEP autoreset returns the next episode's first obs"


# ----------------------------------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------------------------------
def test_train_is_seeded_and_counts_steps():
    args = ppo_trainer.PPOArgs(seed=3, **TINY)
    a = ppo_trainer.train(args, progress=False)
    b = ppo_trainer.train(args, progress=False)
    assert a.env_steps == args.num_updates * args.batch_size == 96
    assert len(a.history) == args.num_updates
    assert a.episode_returns == b.episode_returns and len(a.episode_returns) > 0
    assert [h["approx_kl"] for h in a.history] == [h["approx_kl"] for h in b.history]
    assert all(torch.equal(p, q) for p, q in zip(a.agent.parameters(), b.agent.parameters()))
    c = ppo_trainer.train(ppo_trainer.PPOArgs(seed=4, **TINY), progress=False)
    assert c.episode_returns != a.episode_returns


def test_train_anneals_the_learning_rate_and_calls_back():
    args = ppo_trainer.PPOArgs(seed=0, learning_rate=0.01, **TINY)
    calls = []
    result = ppo_trainer.train(args, progress=False, callback=lambda step, **m: calls.append((step, m)))
    lrs = [h["learning_rate"] for h in result.history]
    assert lrs == pytest.approx([0.01 * (1 - u / args.num_updates) for u in range(args.num_updates)])
    episode_calls = [m for _, m in calls if "episodic_return" in m]
    update_calls = [m for _, m in calls if "approx_kl" in m]
    assert len(episode_calls) == len(result.episode_returns)
    assert len(update_calls) == args.num_updates
    assert {"value_loss", "entropy", "clipfrac", "explained_variance"} <= set(update_calls[0])
    flat = ppo_trainer.train(ppo_trainer.PPOArgs(seed=0, learning_rate=0.01, anneal_lr=False, **TINY), progress=False)
    assert {h["learning_rate"] for h in flat.history} == {0.01}


def test_train_runs_a_replaced_function_inside_the_reference_learning_phase():
    calls = []

    def my_gae(*args, **kwargs):
        calls.append(1)
        return ppo.compute_gae(*args, **kwargs)

    args = ppo_trainer.PPOArgs(seed=0, **TINY)
    ppo_trainer.train(args, progress=False, compute_gae=my_gae)
    assert len(calls) == args.num_updates
    # the module's own function is untouched: a plain run does not call my_gae
    ppo_trainer.train(args, progress=False)
    assert len(calls) == args.num_updates


def test_train_changes_with_a_buggy_function_and_rejects_unknown_names():
    args = ppo_trainer.PPOArgs(seed=0, **TINY)
    good = ppo_trainer.train(args, progress=False)
    bad = ppo_trainer.train(args, progress=False, calc_value_function_loss=lambda v, r, c: -0.5 * c * ((v - r) ** 2).mean())
    assert not all(torch.equal(p, q) for p, q in zip(good.agent.critic.parameters(), bad.agent.critic.parameters()))
    with pytest.raises(TypeError, match="cannot replace"):
        ppo_trainer.train(args, progress=False, compute_advantages=ppo.compute_gae)


def test_layer_init_override_reaches_the_agent():
    def zero_init(layer, std=1.0, bias_const=0.0):
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
        return layer

    result = ppo_trainer.train(ppo_trainer.PPOArgs(seed=0, **{**TINY, "total_timesteps": 32}), progress=False, layer_init=zero_init)
    first = result.agent.actor[0].weight
    assert first.abs().max() < 0.1  # zero-initialised, then one update of small steps


def test_learner_functions_picks_the_pluggable_names():
    namespace = {"compute_gae": ppo.compute_gae, "layer_init": ppo.layer_init, "other": print, "rollout_step": 3}
    assert learner_names(namespace) == ["compute_gae", "layer_init"]


def learner_names(namespace):
    return sorted(ppo_trainer.learner_functions(namespace))


# ----------------------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------------------
def test_main_prints_the_summary_keys(tmp_path):
    report = tmp_path / "ppo.html"
    summary = ppo_trainer.main(["--env", "CartPole-v1", "--seed", "1", "--total-timesteps", "1024", "--num-envs", "2",
                        "--num-steps", "128", "--no-progress", "--report", str(report)])
    for key in ("mean_return_last20", "env_steps", "wall_seconds", "episodes", "solved", "reward_threshold"):
        assert key in summary
    assert summary["env_steps"] == 1024 and summary["updates"] == 4
    assert summary["reward_threshold"] == 475.0 and summary["solved"] is False
    assert 8 < summary["mean_return_last20"] < 475
    assert report.exists() and "plotly" in report.read_text()


def test_parser_covers_every_field():
    ns = ppo_trainer._parser().parse_args(["--no-anneal-lr", "--learning-rate", "0.1", "--env", "Acrobot-v1"])
    assert ns.anneal_lr is False and ns.learning_rate == 0.1 and ns.env_id == "Acrobot-v1"
    defaults = ppo_trainer._parser().parse_args([])
    for f in ppo_trainer.fields(ppo_trainer.PPOArgs):
        assert getattr(defaults, f.name) == f.default


# ----------------------------------------------------------------------------------------------------
# Widgets
# ----------------------------------------------------------------------------------------------------
def test_widgets_are_static_outside_a_kernel(monkeypatch):
    assert not display.widgets_available()  # pytest is not a Jupyter kernel
    monkeypatch.setattr(display, "in_kernel", lambda: True)
    monkeypatch.setenv("RLHF_TUTORIAL_STATIC", "1")
    assert not display.widgets_available()
    monkeypatch.delenv("RLHF_TUTORIAL_STATIC")
    monkeypatch.setenv("RLHF_TUTORIAL_STRICT", "1")
    assert not display.widgets_available()


def test_live_dashboard_static_mode_records_and_draws(tmp_path):
    dash = live.LiveDashboard(["loss", ("reward", "kl")], title="t", smooth={"reward": 2})
    assert dash.static
    for step in range(4):
        dash.update(step, loss=1.0 / (step + 1), reward=float(step), kl=None, extra=5.0)
    assert dash.history["extra"] == ([0.0, 1.0, 2.0, 3.0], [5.0] * 4)  # kept, not drawn
    assert dash.finish() is None
    fig = dash.to_figure()
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["loss"].y) == [1.0, 0.5, 1 / 3, 0.25]
    assert list(by_name["reward (mean of last 2)"].y) == [0.0, 0.5, 1.5, 2.5]
    assert all(math.isnan(y) for y in by_name["kl"].y)
    assert "extra" not in by_name
    path = dash.save(str(tmp_path / "d.html"))
    assert "plotly" in open(path).read()


def test_ppo_dashboard_has_the_six_panels():
    dash = ppo_widgets.ppo_dashboard(static=True)
    names = {t.name for t in dash.to_figure().data}
    assert set(ppo_widgets.PPO_PANELS) <= names


def test_clipped_objective_figure_follows_the_formula():
    fig = ppo_widgets.clipped_objective_figure(epsilon=0.2, ratio=1.5)
    lclip = [t for t in fig.data if t.name == "L_CLIP = min(...)"]
    assert len(lclip) == 2
    r = np.asarray(lclip[0].x)
    assert np.allclose(lclip[0].y, np.minimum(r, np.clip(r, 0.8, 1.2)))  # A = +1
    assert np.allclose(lclip[1].y, np.minimum(-r, -np.clip(r, 0.8, 1.2)))  # A = -1
    markers = [t for t in fig.data if t.name == "current r"]
    assert [float(t.y[0]) for t in markers] == pytest.approx([1.2, -1.5])


@pytest.mark.parametrize("ratio, advantage, words", [
    (1.5, 1.0, "flat"), (0.5, 1.0, "pulls its probability back up"), (0.5, -1.0, "flat"),
    (1.5, -1.0, "pushes it back down"), (1.0, 1.0, "inside"),
])
def test_explain_names_the_active_branch(ratio, advantage, words):
    assert words in ppo_widgets.explain(ratio, advantage, 0.2)


def test_explorer_falls_back_to_a_static_figure(capsys):
    out = ppo_widgets.clipped_objective_explorer(epsilon=0.1, ratio=1.3)
    assert isinstance(out, go.Figure)
    assert "1 + eps" in capsys.readouterr().out


def _fake_display(monkeypatch):
    """Record what the live layer shows (mime bundles) and each in-place update (index, bundle)."""
    shown, updates = [], []

    class Handle:
        def __init__(self, index):
            self.index = index

        def update(self, data, raw=False, metadata=None):
            updates.append((self.index, data))

    def display(obj, display_id=False, raw=False, metadata=None):
        shown.append(obj)
        return Handle(len(shown) - 1) if display_id else None

    monkeypatch.setattr(live, "_display", display)
    return shown, updates


def test_live_dashboard_is_live_then_leaves_a_static_figure(monkeypatch):
    shown, updates = _fake_display(monkeypatch)
    dash = live.LiveDashboard(["loss"], static=False, refresh_seconds=0.0)
    assert not dash.static and isinstance(dash.fig, go.FigureWidget)
    assert len(shown) == 1 and "application/vnd.jupyter.widget-view+json" in shown[0]  # live while training
    dash.update(0, loss=2.0)
    dash.update(1, loss=1.0)
    assert list(dash.fig.data[0].y) == [2.0, 1.0]  # redrawn during training, not only at the end
    dash.note("sample text")
    assert len(shown) == 2 and "sample text" in shown[1]["text/html"]
    dash.note("more text")
    assert "more text" in updates[-1][1]["text/html"] and len(shown) == 2  # replaced, not appended
    dash.finish()
    index, final = updates[-1]
    assert index == 0, "the widget's own output is replaced"
    assert "application/vnd.jupyter.widget-view+json" not in final
    assert final[live.PLOTLY_MIME]["data"][0]["y"] == [2.0, 1.0]  # the static figure, with the curve
    dash.finish()
    assert len(updates) == 2 and len(shown) == 2  # once


def test_explorer_is_controls_above_output_views_redrawn_when_a_control_moves(monkeypatch):
    import ipywidgets

    monkeypatch.setattr(ppo_widgets, "widgets_available", lambda: True)
    monkeypatch.delenv("RLHF_TUTORIAL_STRICT", raising=False)
    monkeypatch.delenv("RLHF_TUTORIAL_STATIC", raising=False)

    class Shell:  # the kernel's formatter, for the HTML view
        class display_formatter:
            @staticmethod
            def format(obj):
                return {"text/html": obj.data}, {}

    monkeypatch.setattr("IPython.get_ipython", lambda: Shell())
    explorer = ppo_widgets.clipped_objective_explorer(epsilon=0.2, ratio=1.3)
    assert isinstance(explorer, live.Explorer)
    box = explorer.widget()
    controls, figure_view, text_view = box.children
    assert isinstance(controls, ipywidgets.HBox) and isinstance(figure_view, ipywidgets.Output)
    assert not any(isinstance(w, go.FigureWidget) for w in box.children)  # plain widgets: state is small

    def shown():
        assert len(figure_view.outputs) == 1 and len(text_view.outputs) == 1  # replaced, never appended
        figure = figure_view.outputs[0]["data"][live.PLOTLY_MIME]
        return figure["layout"]["title"]["text"], text_view.outputs[0]["data"]["text/html"]

    title, text = shown()
    assert "eps = 0.20" in title and "r = 1.30" in text
    explorer.controls[0].value = 0.35  # eps
    title, text = shown()
    assert "eps = 0.35" in title and "0.65" in text


def test_every_figure_uses_the_course_template():
    import plotly.io as pio

    assert pio.templates.default == live.COURSE_TEMPLATE
    template = ppo_widgets.clipped_objective_figure().layout.template
    assert template.layout.paper_bgcolor == "white" and template.layout.title.x == 0.01  # plotly_white + ours


def test_significant_keeps_small_numbers_readable():
    assert [live.significant(v) for v in (0.3, 0.0039, 2.84, 45.2, 261.2, 0.0, -0.56)] == \
        ["0.3", "0.0039", "2.8", "45", "261", "0", "-0.56"]
    assert live.significant(float("nan")) == "" and live.significant(0.012345, 3) == "0.0123"


def test_counts_get_integer_ticks_and_a_lone_point_is_drawn():
    """Rounds 1..3 (or a single round) tick at every integer, not at 1.5; long runs keep automatic ticks;
    a series of fewer than five points shows its markers (one point alone draws no line)."""
    assert live.integer_ticks([1, 2, 3]) == {"tickmode": "linear", "tick0": 0, "dtick": 1}
    assert live.integer_ticks([0.5, 1.0])["dtick"] is None and live.integer_ticks(range(40))["dtick"] is None
    dash = live.LiveDashboard(["loss"], x_title="round", static=True)
    dash.update(1, loss=0.7)
    fig = dash.to_figure()
    assert fig.layout.xaxis.dtick == 1 and fig.data[0].mode == "lines+markers"
    for step in range(2, 30):
        dash.update(step, loss=0.7)
    fig = dash.to_figure()
    assert fig.layout.xaxis.dtick is None and fig.data[0].mode == "lines"
