"""Chapter 02 visuals: a reward explorer and the reward model's training curve.

- :func:`reward_explorer`: pick one of a few texts or type your own, and see side by side what the
  sentiment classifier, the n-gram repetition penalty and the reward model make of it (ipywidgets).
  :func:`reward_table` is its static twin (an HTML table, the same numbers), for plain output and nbval.
- :func:`reward_model_curve`: the Bradley-Terry loss and the pairwise accuracy (training batches and
  held-out pairs) against optimizer steps, from the history of ``rewards.train_reward_model``; and
  :class:`LiveRewardModelCurve`, the same drawn live during training (on the shared live dashboard).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial import rewards
from rlhf_tutorial.display import HTMLText
from rlhf_tutorial.widgets.live import LiveDashboard

COLUMNS = ("sentiment", "repetition", "shaped", "reward_model")
LABELS = {
    "sentiment": "classifier reward p(label | x)",
    "repetition": "3-gram repetition",
    "shaped": "sentiment - coef * repetition",
    "reward_model": "reward model r(x)",
}


def score_rows(
    texts: Sequence[str],
    classifier=None,
    tokenizer=None,
    reward_model: rewards.RewardModel | None = None,
    direction: str = "pos",
    n: int = 3,
    repetition_coef: float = 1.0,
    sentiment_fn: Callable | None = None,
    repetition_fn: Callable | None = None,
) -> list[dict]:
    """One row per text: the classifier reward, the repetition score, the shaped reward, the RM score.

    A column whose model is not given is left out. ``sentiment_fn`` / ``repetition_fn`` default to the
    package's ``reward_fn_sentiment`` / ``ngram_repetition``: pass your own to see your functions at work.
    """
    texts = list(texts)
    sentiment_fn = sentiment_fn or rewards.reward_fn_sentiment
    repetition_fn = repetition_fn or rewards.ngram_repetition
    rows = [{"text": t} for t in texts]
    repetition = repetition_fn(texts, n).float().cpu()
    for row, value in zip(rows, repetition.tolist()):
        row["repetition"] = value
    if classifier is not None and tokenizer is not None:
        sentiment = sentiment_fn(texts, classifier, tokenizer, direction).float().cpu()
        for row, s, r in zip(rows, sentiment.tolist(), repetition.tolist()):
            row["sentiment"] = s
            row["shaped"] = s - repetition_coef * r
    if reward_model is not None:
        for row, value in zip(rows, rewards.score_texts(reward_model, texts).tolist()):
            row["reward_model"] = value
    return rows


def _table_html(rows: list[dict]) -> str:
    present = [c for c in COLUMNS if any(c in r for r in rows)]
    head = "".join(f"<th style='text-align:right;padding:2px 8px'>{html.escape(LABELS[c])}</th>" for c in present)
    body = []
    for row in rows:
        text = row["text"] if len(row["text"]) <= 120 else row["text"][:117] + "..."
        cells = "".join(
            f"<td style='text-align:right;padding:2px 8px;font-family:monospace'>{row[c]:+.3f}</td>"
            if c in row else "<td></td>"
            for c in present
        )
        body.append(f"<tr><td style='text-align:left;padding:2px 8px'>{html.escape(text)}</td>{cells}</tr>")
    return (
        "<table style='border-collapse:collapse'><tr><th style='text-align:left;padding:2px 8px'>text</th>"
        f"{head}</tr>{''.join(body)}</table>"
    )


def _table_text(rows: list[dict]) -> str:
    present = [c for c in COLUMNS if any(c in r for r in rows)]
    lines = ["  ".join(f"{c:>12}" for c in present) + "  text"]
    for row in rows:
        values = "  ".join(f"{row[c]:>+12.3f}" if c in row else " " * 12 for c in present)
        lines.append(f"{values}  {row['text'][:80]}")
    return "\n".join(lines)


def reward_table(texts: Sequence[str], classifier=None, tokenizer=None, reward_model=None, **kwargs) -> HTMLText:
    """The static reward explorer: a table of every reward for each text (HTML in Jupyter, text elsewhere)."""
    rows = score_rows(texts, classifier, tokenizer, reward_model, **kwargs)
    return HTMLText(_table_html(rows), _table_text(rows))


def reward_bars(rows: list[dict]) -> go.Figure:
    """Grouped bars: one group per text, one bar per reward (a static plotly figure)."""
    present = [c for c in COLUMNS if any(c in r for r in rows)]
    labels = [r["text"] if len(r["text"]) <= 40 else r["text"][:37] + "..." for r in rows]
    fig = go.Figure()
    for c in present:
        fig.add_bar(name=LABELS[c], x=labels, y=[r.get(c) for r in rows])
    fig.update_layout(barmode="group", height=380, title="rewards side by side", yaxis_title="value")
    return fig


def reward_explorer(
    texts: Sequence[str],
    classifier=None,
    tokenizer=None,
    reward_model: rewards.RewardModel | None = None,
    direction: str = "pos",
    **kwargs,
):
    """Pick a text from ``texts`` or type one: its classifier reward, repetition and RM score, live.

    Returns an ipywidgets box; without ipywidgets, returns the static :func:`reward_table` instead.
    """
    try:
        import ipywidgets as widgets
    except ImportError:  # pragma: no cover - ipywidgets is a dependency, but keep the fallback
        return reward_table(texts, classifier, tokenizer, reward_model, direction=direction, **kwargs)

    texts = list(texts)
    picker = widgets.Dropdown(options=texts, value=texts[0] if texts else None, description="pick",
                              layout=widgets.Layout(width="95%"))
    box = widgets.Textarea(value=texts[0] if texts else "", description="or type", continuous_update=False,
                           layout=widgets.Layout(width="95%", height="70px"))  # scores when you leave the box
    direction_w = widgets.ToggleButtons(options=["pos", "neg"], value=direction, description="direction")
    out = widgets.HTML()

    def refresh(*_) -> None:
        text = box.value.strip()
        if not text:
            out.value = "<i>type a text</i>"
            return
        rows = score_rows([text], classifier, tokenizer, reward_model, direction=direction_w.value, **kwargs)
        out.value = _table_html(rows)

    def on_pick(change) -> None:
        box.value = change["new"]

    picker.observe(on_pick, names="value")
    box.observe(refresh, names="value")
    direction_w.observe(refresh, names="value")
    refresh()
    return widgets.VBox([picker, box, direction_w, out])


class LiveRewardModelCurve:
    """Pass an instance as ``on_eval=`` to ``train_reward_model``: the loss and the pairwise accuracy
    (training batches, smoothed, and held-out pairs) redraw in JupyterLab after every evaluation.

    Built on the shared :class:`rlhf_tutorial.widgets.live.LiveDashboard`; where no widget can show
    (a terminal, nbval) it draws nothing, and :func:`reward_model_curve` gives the static figure.
    """

    def __init__(self, static: bool | None = None, smooth: int = 10):
        self.dashboard = LiveDashboard(
            [("loss", "heldout_loss"), ("accuracy", "heldout_accuracy")],
            title="reward model training",
            titles={"loss": "Bradley-Terry loss", "accuracy": "pairwise accuracy"},
            smooth={"loss": smooth, "accuracy": smooth},
            cols=2,
            x_title="optimizer step",
            static=static,
        )
        self._seen = 0

    def __call__(self, history: dict[str, list]) -> None:
        for i in range(self._seen, len(history["step"])):
            self.dashboard.update(history["step"][i], loss=history["loss"][i], accuracy=history["accuracy"][i])
        self._seen = len(history["step"])
        self.dashboard.update(
            history["eval_step"][-1],
            heldout_loss=history["heldout_loss"][-1],
            heldout_accuracy=history["heldout_accuracy"][-1],
        )


def reward_model_curve(history: dict[str, list], smooth: int = 10) -> go.Figure:
    """Loss (left) and pairwise accuracy (right) against optimizer steps.

    Training-batch values are noisy, so they are shown with a running mean over ``smooth`` steps;
    held-out values are the evaluations on the test pairs (step 0 is before any training).
    """

    def running_mean(xs: list[float]) -> list[float]:
        out, total = [], 0.0
        for i, x in enumerate(xs):
            total += x
            if i >= smooth:
                total -= xs[i - smooth]
            out.append(total / min(i + 1, smooth))
        return out

    fig = make_subplots(rows=1, cols=2, subplot_titles=("Bradley-Terry loss", "pairwise accuracy"))
    fig.add_scatter(x=history["step"], y=running_mean(history["loss"]), name="train loss (smoothed)",
                    line={"color": "#1f77b4"}, row=1, col=1)
    fig.add_scatter(x=history["eval_step"], y=history["heldout_loss"], name="held-out loss", mode="lines+markers",
                    line={"color": "#ff7f0e"}, row=1, col=1)
    fig.add_scatter(x=history["step"], y=running_mean(history["accuracy"]), name="train accuracy (smoothed)",
                    line={"color": "#2ca02c"}, row=1, col=2)
    fig.add_scatter(x=history["eval_step"], y=history["heldout_accuracy"], name="held-out accuracy",
                    mode="lines+markers", line={"color": "#d62728"}, row=1, col=2)
    fig.add_hline(y=0.5, line_dash="dot", line_color="grey", row=1, col=2)
    fig.update_xaxes(title_text="optimizer step")
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_layout(height=360, title="reward model training")
    return fig
