"""Chapter 02 reference code: rewards, whitening, shaping, the reward model and its training."""

import math

import pytest
import torch

from rlhf_tutorial import rewards
from rlhf_tutorial.checks.ch02_rewards import small_model, tiny_classifier
from rlhf_tutorial.devices import course_device, device_of, same_device
from rlhf_tutorial.trainers import rewards as rewards_trainer

# small_model() and tiny_classifier() are on the course's device (the CPU, a GPU, or the simulated GPU
# under RLHF_TUTORIAL_DEVICE=simgpu): tensors built here go to their model's device.


# ----------------------------------------------------------------------------------------------------
# rewards from text
# ----------------------------------------------------------------------------------------------------
def test_char_count_counts_and_is_float32():
    r = rewards.reward_fn_char_count(["a.b.c.", "", "no dots", "!.!"], char=".")
    assert r.dtype == torch.float32
    assert r.tolist() == [3.0, 0.0, 0.0, 1.0]
    assert rewards.reward_fn_char_count(["!.!"], char="!").tolist() == [2.0]


def test_sentiment_reads_the_label_index_and_ignores_padding():
    texts = ["this movie was really great . i loved it !", "awful", "boring plot"]
    for order in (("POSITIVE", "NEGATIVE"), ("NEGATIVE", "POSITIVE")):
        clf, tok = tiny_classifier(order)
        pos = rewards.reward_fn_sentiment(texts, clf, tok, "pos")
        neg = rewards.reward_fn_sentiment(texts, clf, tok, "neg")
        assert pos.shape == (3,) and pos.dtype == torch.float32 and not pos.requires_grad
        assert pos.device == clf.device  # the reward is on the classifier's device
        torch.testing.assert_close(pos + neg, torch.ones(3, device=clf.device))
        # one at a time (no padding) gives the same numbers as the padded batch
        alone = torch.cat([rewards.reward_fn_sentiment([t], clf, tok, "pos") for t in texts])
        torch.testing.assert_close(alone, pos, atol=1e-5, rtol=1e-5)
        enc = tok(texts[:1], return_tensors="pt").to(clf.device)
        with torch.no_grad():
            p = clf(**enc).logits.softmax(-1)[0, clf.config.label2id["POSITIVE"]]
        assert math.isclose(pos[0].item(), p.item(), rel_tol=1e-5)
    with pytest.raises(ValueError):
        rewards.reward_fn_sentiment(texts, clf, tok, "positive")


def test_sentiment_batches_in_chunks():
    clf, tok = tiny_classifier()
    calls = []
    handle = clf.register_forward_pre_hook(lambda m, i: calls.append(1))
    out = rewards.reward_fn_sentiment(["great fun"] * 130, clf, tok)
    handle.remove()
    assert out.shape == (130,) and len(calls) == 3  # chunks of 64


def test_whiten_by_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    expected = (x - 2.5) / math.sqrt(1.25)
    torch.testing.assert_close(rewards.whiten(x, eps=0.0), expected)
    torch.testing.assert_close(rewards.whiten(x, shift_mean=False, eps=0.0), expected + 2.5)
    # one mean and variance over all elements: a [2, 2] view gives the same numbers
    torch.testing.assert_close(rewards.whiten(x.reshape(2, 2), eps=0.0), expected.reshape(2, 2))
    w = rewards.whiten(torch.randn(5, 7) * 4 + 3)
    assert abs(w.mean().item()) < 1e-5 and abs(w.std(unbiased=False).item() - 1) < 1e-4
    assert rewards.whiten(torch.tensor([3.0])).item() == 0.0  # biased variance: no 0/0
    assert rewards.whiten(torch.tensor([3.0]), shift_mean=False).item() == 3.0


def test_ngram_repetition_by_hand():
    r = rewards.ngram_repetition(["a b c a b c", "a b", "x  y\tz x y z", "great " * 6, ""], n=3)
    # "a b c a b c": abc bca cab abc -> 3 distinct of 4
    assert r.tolist() == pytest.approx([0.25, 0.0, 0.25, 0.75, 0.0])
    assert rewards.ngram_repetition(["a a a"], n=1).tolist() == pytest.approx([2 / 3])
    assert r.dtype == torch.float32


# ----------------------------------------------------------------------------------------------------
# shaping
# ----------------------------------------------------------------------------------------------------
def test_shaping_terms():
    lengths = torch.tensor([10, 20, 30])
    assert rewards.length_penalty(lengths, coef=0.1).tolist() == pytest.approx([-1.0, -2.0, -3.0])
    assert rewards.length_penalty(lengths, coef=0.1, target=20).tolist() == pytest.approx([-1.0, 0.0, -1.0])
    eos = 50
    completions = torch.tensor([[1, 2, eos], [1, 2, 3], [eos, 0, 0]])
    assert rewards.missing_eos_penalty(completions, eos, 2.0).tolist() == [0.0, -2.0, 0.0]
    scores = torch.tensor([0.9, 0.9, 0.9])
    samples = ["a b c a b c", "fine text here", "x"]
    shaped = rewards.shaped_reward(
        scores, samples, repetition_coef=1.0, lengths=lengths, length_coef=0.1,
        completion_tokens=completions, eos_token_id=eos, eos_penalty=2.0,
    )
    assert shaped.tolist() == pytest.approx([0.9 - 0.25 - 1.0, 0.9 - 2.0 - 2.0, 0.9 - 3.0])
    assert rewards.shaped_reward(scores, samples).tolist() == pytest.approx(scores.tolist())


# ----------------------------------------------------------------------------------------------------
# Bradley-Terry loss and pooling
# ----------------------------------------------------------------------------------------------------
def test_bradley_terry_loss_values_and_gradient():
    assert rewards.bradley_terry_loss(torch.zeros(4), torch.zeros(4)).item() == pytest.approx(math.log(2))
    c, r = torch.tensor([-300.0, 300.0]), torch.tensor([0.0, 0.0])
    loss = rewards.bradley_terry_loss(c, r)
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(150.0)
    c = torch.tensor([0.3, -1.0], requires_grad=True)
    rewards.bradley_terry_loss(c, torch.tensor([0.0, 0.0])).backward()
    assert (c.grad < 0).all()  # descending the loss raises the chosen rewards


def test_pooling_by_hand():
    x = torch.arange(12.0).reshape(2, 6)  # rows 0..5 and 6..11
    right = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1]])
    assert rewards.pool_last_token(x, right).tolist() == [2.0, 11.0]
    assert rewards.pool_last_token(x, left).tolist() == [5.0, 11.0]
    assert rewards.pool_mean(x, right).tolist() == [1.0, 8.5]
    assert rewards.pool_mean(x, left.bool()).tolist() == [4.0, 9.0]
    h = torch.randn(2, 6, 3)
    h[0, 3:] = float("inf")  # garbage at padding positions must not leak
    assert torch.isfinite(rewards.pool_mean(h, right)).all()
    torch.testing.assert_close(rewards.pool_last_token(h, right)[0], h[0, 2])


# ----------------------------------------------------------------------------------------------------
# RewardModel
# ----------------------------------------------------------------------------------------------------
def _padded(rows: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(0, len(r)) if side == "right" else slice(width - len(r), width)
        tokens[i, sl], mask[i, sl] = r, 1
    return tokens, mask


def _on(model, *tensors):
    return tuple(t.to(device_of(model)) for t in tensors)


@pytest.mark.parametrize("pooling", rewards.POOLINGS)
def test_reward_model_does_not_depend_on_padding(pooling):
    torch.manual_seed(0)
    rm = rewards.RewardModel(small_model(seed=1), pooling=pooling, head_hidden=16)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(1, 40, (n,), generator=g) for n in (7, 3, 5)]
    with torch.no_grad():
        alone = torch.cat([rm(*_on(rm, r[None])) for r in rows])
        for side in ("right", "left"):
            torch.testing.assert_close(rm(*_on(rm, *_padded(rows, side))), alone, atol=1e-5, rtol=1e-5)


def test_mean_poolings_agree_with_a_linear_head_and_differ_with_an_mlp():
    base = small_model(seed=2)
    tokens, mask = _on(base, *_padded([torch.tensor([1, 5, 7, 9]), torch.tensor([3, 4])], "right"))
    for head_hidden, same in ((None, True), (16, False)):
        torch.manual_seed(0)
        a = rewards.RewardModel(base, "mean_scores", head_hidden)
        b = rewards.RewardModel(base, "mean_hidden", head_hidden)
        b.head.load_state_dict(a.head.state_dict())
        with torch.no_grad():
            assert torch.allclose(a(tokens, mask), b(tokens, mask), atol=1e-5) == same


def test_reward_model_head_is_created_on_the_base_models_device():
    """The head and the reward follow the backbone's device (only a GPU or RLHF_TUTORIAL_DEVICE=simgpu can
    tell a head left on the CPU: on a CPU-only run every device is the CPU)."""
    for head_hidden in (None, 8):
        base = small_model(seed=3)
        rm = rewards.RewardModel(base, head_hidden=head_hidden)
        assert {p.device for p in rm.head.parameters()} == {device_of(base)}  # cuda:0, a parameter's own
        assert same_device(device_of(base), course_device())  # the rule's `cuda` is cuda:0
        tokens, mask = _on(rm, *_padded([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], "right"))
        assert rm(tokens, mask).device == device_of(base) == rm(tokens).device  # the default mask too


def test_reward_model_gradient_reaches_the_backbone():
    rm = rewards.RewardModel(small_model(seed=3))
    rm(*_on(rm, *_padded([torch.tensor([1, 2, 3]), torch.tensor([4, 5])], "right"))).sum().backward()
    assert rm.base_model.blocks[0].attn.W_Q.grad.abs().sum() > 0
    assert rm.head.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        rewards.RewardModel(small_model(), pooling="max")


# ----------------------------------------------------------------------------------------------------
# training, on synthetic pairs (no world needed): chosen texts contain token 7, rejected ones token 9
# ----------------------------------------------------------------------------------------------------
def synthetic_pairs(n: int, seed: int) -> rewards.PairBatch:
    g = torch.Generator().manual_seed(seed)
    out = []
    for marker in (7, 9):
        rows = []
        for _ in range(n):
            row = torch.randint(10, 40, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g)
            row[0] = 0
            row[int(torch.randint(1, len(row), (1,), generator=g))] = marker
            rows.append(row)
        out += list(_padded(rows, "right"))
    return rewards.PairBatch(*out)


def test_train_step_lowers_the_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    rm = rewards.RewardModel(small_model(seed=4))
    opt = torch.optim.AdamW(rm.parameters(), lr=1e-3)
    batch = synthetic_pairs(8, seed=0).select(torch.arange(8), device_of(rm))
    losses = [rewards.reward_model_train_step(rm, opt, *batch)["loss"] for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]
    assert set(rewards.reward_model_train_step(rm, opt, *batch)) == {"loss", "accuracy", "margin"}


def _train_synthetic(seed: int):
    torch.manual_seed(seed)
    rm = rewards.RewardModel(small_model(seed=5))
    args = rewards_trainer.RewardModelArgs(seed=seed, epochs=2, batch_size=16, learning_rate=1e-3, head_lr=3e-3, eval_every=8,
                                   progress=False)
    return rewards_trainer.train_reward_model(args, model=rm, train_pairs=synthetic_pairs(160, 1),
                                      test_pairs=synthetic_pairs(64, 2))


def test_train_reward_model_learns_and_is_deterministic():
    _, h1 = _train_synthetic(0)
    _, h2 = _train_synthetic(0)
    assert h1["heldout_accuracy"][-1] >= 0.9
    assert h1["heldout_loss"][-1] < h1["heldout_loss"][0]
    assert h1["loss"] == h2["loss"] and h1["heldout_accuracy"] == h2["heldout_accuracy"]
    assert h1["step"][-1] == 20 and h1["eval_step"] == [0, 8, 16, 20]
    assert h1["n_train_pairs"] == [160] and h1["n_test_pairs"] == [64]


def test_train_reward_model_uses_the_given_train_step():
    calls = []

    def my_step(model, optimizer, *batch):
        calls.append(batch[0].shape[0])
        return rewards.reward_model_train_step(model, optimizer, *batch)

    torch.manual_seed(0)
    rm = rewards.RewardModel(small_model(seed=5))
    args = rewards_trainer.RewardModelArgs(epochs=1, batch_size=10, max_train_pairs=25, progress=False)
    rewards_trainer.train_reward_model(args, model=rm, train_pairs=synthetic_pairs(40, 1),
                               test_pairs=synthetic_pairs(8, 2), reward_model_train_step=my_step)
    assert sorted(calls) == [5, 10, 10]


def test_pair_texts_joins_prompt_and_completion():
    assert rewards.pair_texts({"prompt": "It was", "chosen": " good.", "rejected": " bad."}) == ("It was good.", "It was bad.")
    assert rewards.pair_texts({"prompt": "It was", "chosen": "good", "rejected": "!"}) == ("It was good", "It was!")
    assert rewards.pair_texts({"chosen": "a", "rejected": "b"}) == ("a", "b")


# ----------------------------------------------------------------------------------------------------
# the tiny world and the command line
# ----------------------------------------------------------------------------------------------------
def test_tokenize_texts_on_the_tiny_policy():
    from rlhf_tutorial.worlds import load_policy

    policy = load_policy("tiny")
    texts = ["This movie was really good.", "Bad."]
    tokens, mask = rewards.tokenize_texts(policy, texts)
    assert tokens.device == mask.device == torch.device("cpu")  # a data set: batches move when used
    for i, text in enumerate(texts):
        n = int(mask[i].sum())
        assert torch.equal(tokens[i, :n], policy.to_tokens(text)[0].cpu())
        assert mask[i, n:].sum() == 0
    short_tokens, short_mask = rewards.tokenize_texts(policy, texts, max_len=3)
    assert short_tokens.shape == (2, 3)


@pytest.mark.slow
def test_cli_trains_on_the_tiny_world():
    """A shortened run (640 pairs, one epoch): it learns the repetition cue and beats chance clearly.
    (The full run, `train-reward-model --world tiny --seed 0`, reaches >= 0.9: see the chapter's report.)"""
    summary = rewards_trainer.main(["--world", "tiny", "--seed", "0", "--max-train-pairs", "640", "--max-test-pairs",
                            "200", "--epochs", "1", "--eval-every", "20", "--no-progress"])
    for key in ("heldout_accuracy", "wall_seconds", "initial_heldout_accuracy", "steps", "n_train_pairs"):
        assert key in summary
    assert summary["world"] == "tiny" and summary["n_train_pairs"] == 640 and summary["steps"] == 40
    assert [s for s, _ in summary["heldout_curve"]] == [0, 20, 40]
    assert summary["heldout_accuracy"] >= 0.65 > summary["initial_heldout_accuracy"]
    assert summary["heldout_accuracy_by_kind"]["repetition"] >= 0.9


# ----------------------------------------------------------------------------------------------------
# widgets
# ----------------------------------------------------------------------------------------------------
def test_widgets_build(monkeypatch):
    from rlhf_tutorial.widgets import rewards as w

    clf, tok = tiny_classifier(("NEGATIVE", "POSITIVE"))
    texts = ["great fun", "great great great great great"]
    rows = w.score_rows(texts, clf, tok)
    assert [set(r) for r in rows] == [{"text", "sentiment", "repetition", "shaped"}] * 2
    assert rows[1]["repetition"] == pytest.approx(2 / 3)
    assert rows[1]["shaped"] == pytest.approx(rows[1]["sentiment"] - 2 / 3)
    table = w.reward_table(texts, clf, tok)
    assert "great fun" in table._repr_html_() and "great fun" in repr(table)
    assert len(w.reward_bars(rows).data) == 3
    assert "great fun" in repr(w.reward_explorer(texts, clf, tok))  # no kernel: the static table
    monkeypatch.setattr(w, "widgets_available", lambda: True)
    explorer = w.reward_explorer(texts, clf, tok)
    assert "+" in explorer.render().data  # the result table of the first text
    explorer.controls[1].value = "great great great great great"  # typed: scored on render
    assert "great great" in explorer.render().data
    history = {"step": [1, 2, 3], "loss": [0.7, 0.6, 0.5], "accuracy": [0.5, 0.6, 0.8],
               "eval_step": [0, 3], "heldout_accuracy": [0.5, 0.75], "heldout_loss": [0.69, 0.55]}
    fig = w.reward_model_curve(history, smooth=2)
    assert len(fig.data) == 4 and list(fig.data[3].y) == history["heldout_accuracy"]
    live = w.LiveRewardModelCurve(static=True)
    live({**history, "step": history["step"][:2], "loss": history["loss"][:2], "eval_step": [0],
          "heldout_accuracy": [0.5], "heldout_loss": [0.69]})
    live(history)
    assert live.dashboard.history["loss"] == ([1.0, 2.0, 3.0], [0.7, 0.6, 0.5])
    assert live.dashboard.history["heldout_accuracy"] == ([0.0, 3.0], [0.5, 0.75])
