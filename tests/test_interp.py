"""Chapter 05 on the tiny world: the shipped tuned policy, the attribution bookkeeping, the patching sanity
check, and the determinism of ``interp-report``."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from rlhf_tutorial import interp
from rlhf_tutorial.tiny.tuned import TUNED_NAME
from rlhf_tutorial.trainers.interp_report import load_pair, main
from rlhf_tutorial.widgets.live import PLOTLY_MIME
from rlhf_tutorial.worlds import tiny_dir

#: Float32 round-off of a sum of ~20 terms of size ~1: far below any attribution we interpret.
CLOSURE_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def pair():
    # No global grad switch here: a module-scoped torch.set_grad_enabled(False) leaked into every later
    # test of the module (build-tuned then trained with gradients off).
    base, tuned = load_pair("tiny")
    setup = interp.sentiment_setup(base)
    return base, tuned, setup["direction"], interp.prompt_tokens(base)


def test_tuned_checkpoint_is_shipped_in_the_manifest():
    folder = tiny_dir()
    manifest = json.loads((folder / "manifest.json").read_text())
    weights = f"{TUNED_NAME}/policy.safetensors"
    assert weights in manifest and f"{TUNED_NAME}/rlhf_config.json" in manifest
    assert hashlib.sha256((folder / weights).read_bytes()).hexdigest() == manifest[weights]
    assert (folder / weights).stat().st_size < 4 * 2**20
    config = json.loads((folder / TUNED_NAME / "rlhf_config.json").read_text())
    # tuned from the base policy that ships now (else: rebuild with `build-tuned --world tiny`)
    assert config["base_policy_sha256"] == manifest["policy/model.safetensors"]
    assert config["args"]["direction"] == "neg" and config["mean_reward_final"] > config["mean_reward_initial"]


def test_tuned_model_is_more_negative_on_every_prompt(pair):
    base, tuned, direction, tokens_list = pair
    for tokens in tokens_list:
        assert interp.final_score(tuned.base_model, tokens, direction) > interp.final_score(base, tokens, direction)


@pytest.mark.parametrize("which", ["base", "tuned"])
def test_attribution_bookkeeping_closes(pair, which):
    """heads + attention biases + MLPs + embedding = ln_pre(resid_final) @ direction, per prompt."""
    base, tuned, direction, tokens_list = pair
    model = base if which == "base" else tuned.base_model
    for tokens in tokens_list:
        logits, cache = model.run_with_cache(tokens)
        parts = interp.component_attributions(model, cache, direction)
        assert interp.closure_error(parts) < CLOSURE_TOLERANCE
        # and the total is what the logits say, bias aside: mean logit of neg words - pos words
        setup = interp.sentiment_setup(base)
        W_U_part = interp.sentiment_direction(model.W_U, setup["pos_ids"], setup["neg_ids"])
        logit_diff = logits[0, -1, setup["neg_ids"]].mean() - logits[0, -1, setup["pos_ids"]].mean()
        bias = model.b_U[setup["neg_ids"]].mean() - model.b_U[setup["pos_ids"]].mean()
        h = cache["ln_final.hook_normalized"][0, -1]
        assert torch.isclose(h @ W_U_part + bias, logit_diff, atol=1e-4)
        if which == "base":
            assert torch.isclose(parts["total"], logit_diff - bias, atol=1e-4)


def test_final_residual_patch_restores_the_shift(pair):
    base, tuned, direction, tokens_list = pair
    sweep = interp.patching_sweep(base, tuned.base_model, tokens_list, direction)
    final = sweep["by_component"][-1, list(interp.PATCH_COMPONENTS).index("resid_post")]
    assert final >= 0.95
    assert sweep["by_position"][-1, -1] >= 0.95  # the last position alone carries it at the end
    # patching nothing at an early position of the embedding restores (almost) nothing
    assert abs(float(sweep["by_position"][0, 0])) < 0.2


@pytest.mark.slow
def test_interp_report_is_deterministic(tmp_path):
    summaries = []
    for run in ("a", "b"):
        summary = main(["--world", "tiny", "--smoke", "--seed", "3", "--out", str(tmp_path / f"{run}.html")])
        assert (tmp_path / f"{run}.html").read_text().count("<script") >= 1
        summary.pop("wall_seconds")
        summary.pop("report")
        summaries.append(summary)
    assert summaries[0] == summaries[1]
    assert summaries[0]["final_resid_patch_restored"] >= 0.95


def test_widgets_live_and_static(pair):
    """Every figure has a static form; the live widgets build and redraw without a kernel."""
    import plotly.graph_objects as go

    from rlhf_tutorial.widgets import interp as w

    base, tuned, direction, tokens_list = pair
    records = interp.lens_records(base, tuned, direction, ["This movie was really bad.", "The film was good."])
    static = w.lens_explorer(records, static=True)
    assert all(isinstance(f, go.Figure) for f in static.figures) and len(static.figures) == 2
    assert len(static.figures[0].layout.updatemenus[0].buttons) == 2  # the sample picker works with no kernel
    box = w.lens_explorer(records, static=False).widget()
    pick, lens = box.children[0].children
    view = box.children[1]  # an Output widget: its saved state is what a reopened notebook shows

    def shown() -> dict:
        return view.outputs[0]["data"][PLOTLY_MIME]

    before = [list(row) for row in shown()["data"][0]["z"]]
    pick.value = 1
    lens.value = "value"
    assert [list(row) for row in shown()["data"][0]["z"]] == records[1]["value_base"] != before
    assert shown()["layout"]["title"]["text"].startswith("value lens")

    calls = []

    def sample(coef):
        calls.append(coef)
        return [(f"text {coef}", 0.5 + coef / 10)]

    view = w.steering_explorer([(" bad", 1.0)], [(" good", -1.0)], sample, 2.0, static=True)
    assert "base + 2 x lens" in view.html and "bad" in repr(view)
    box = w.steering_explorer([(" bad", 1.0)], [(" good", -1.0)], sample, 2.0, static=False)
    slider, out = box.children
    # a frontend that draws no widget shows the bundle's text/plain: the numbers, not "VBox(...)"
    plain = box._repr_mimebundle_()["text/plain"]
    assert "mean reward 0.700" in plain and "text 2.0" in plain
    slider.value = -1.0
    assert "text -1.0" in out.value and calls[-1] == -1.0


def test_explorers_show_numbers_without_a_widget_frontend(pair, monkeypatch):
    """In a kernel whose frontend renders no widget, the lens explorer's plain text holds the lens values."""
    from rlhf_tutorial.widgets import interp as w
    from rlhf_tutorial.widgets import live

    base, tuned, direction, _ = pair
    records = interp.lens_records(base, tuned, direction, ["This movie was really bad."])
    shown = []
    monkeypatch.setattr(live, "widgets_available", lambda: True)
    monkeypatch.setattr(live, "_display", lambda obj, **kw: shown.append(obj))
    w.lens_explorer(records, static=False)._ipython_display_()
    plain = shown[0]._repr_mimebundle_()["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in shown[0]._repr_mimebundle_()
    value = records[0]["value_tuned"][-1][-1]
    assert f"{value:.3f}" in plain and "value lens" in plain and "tuned - base" in plain
    assert "value lens" in repr(w.lens_explorer(records, static=True))  # the static form's text too


def test_a_missing_checkpoint_is_a_message_and_a_json_error(tmp_path, capsys):
    from rlhf_tutorial import cli

    assert cli.main(["interp-report", "--world", "tiny", "--checkpoint", str(tmp_path / "nowhere")]) == 1
    out = capsys.readouterr()
    assert "no tuned policy in" in out.err and "Traceback" not in out.err
    assert "train-rlhf" in json.loads(out.out.strip().splitlines()[-1])["error"]


def test_first_layer_reaching_half_of_the_final_value():
    assert interp.first_layer_reaching([-0.31, 0.34, 0.63]) == 1
    assert interp.first_layer_reaching([0.9, 0.1, 1.0]) == 0
    assert interp.first_layer_reaching([0.1, -0.2, -1.0]) == 2  # a negative final value: measured in its sign
    assert interp.first_layer_reaching([0.0, 0.0, 0.0]) == 0


def test_word_rank_baseline_tells_a_real_separation_from_chance():
    """A direction the negative words share ranks them on top, beyond every random direction; its opposite
    does the reverse; an unrelated direction's gap sits inside the random spread."""
    g = torch.Generator().manual_seed(0)
    W_U = torch.randn(64, 300, generator=g)
    neg_ids, pos_ids = torch.arange(0, 20), torch.arange(20, 40)
    e = torch.zeros(64)
    e[0] = 1.0
    W_U[:, neg_ids] += 4 * e[:, None]  # the negative words share a component along e
    real = interp.word_rank_baseline(e, W_U, pos_ids, neg_ids, n_random=300)
    assert real["negative_words_mean_rank"] < 0.1 < real["positive_words_mean_rank"]
    assert real["gap"] > real["random_gap_mean"] + 2 * real["random_gap_std"] and real["random_at_least_gap"] < 0.02
    assert interp.word_rank_baseline(-e, W_U, pos_ids, neg_ids, n_random=300)["random_at_least_gap"] > 0.98
    other = torch.zeros(64)
    other[5] = 1.0  # a direction the word lists do not differ on
    unrelated = interp.word_rank_baseline(other, W_U, pos_ids, neg_ids, n_random=300)
    assert abs(unrelated["gap"]) < 3 * unrelated["random_gap_std"]
    assert unrelated == interp.word_rank_baseline(other, W_U, pos_ids, neg_ids, n_random=300)  # seeded
    ranks = interp.vocab_ranks(e, W_U)  # 0 = the top: the shifted words sit near it
    assert float(ranks[neg_ids].mean()) == pytest.approx(real["negative_words_mean_rank"]) and float(ranks.min()) == 0.0
