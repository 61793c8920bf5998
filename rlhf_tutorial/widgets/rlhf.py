"""Chapter 03 visuals: the RLHF training dashboard, a token-level explorer, base vs tuned samples.

- :func:`rlhf_dashboard`: a :class:`~rlhf_tutorial.widgets.live.LiveDashboard` of mean reward, KL to the
  reference, entropy, value loss, clip fraction, KL coefficient and learning rate per phase, plus a
  table of samples per phase (a phase slider in JupyterLab). Hand its ``update`` to
  ``RLHFTrainer.train(callback=...)``.
- :func:`token_explorer`: one sample token by token: tokens coloured by the value head's output, the
  per-token KL to the reference (full distributions) and the per-token advantage.
- :func:`base_vs_tuned`: completions of the same prompt from the reference and the tuned policy.
- :func:`samples_table`: texts and rewards as a table; :func:`runs_figure`: several runs side by side.
- :func:`write_report`: a self-contained HTML report of a ``train-rlhf`` run (curves and samples).

Every visual has a static form (HTML in a notebook, plain text in a terminal) used where widgets
cannot show: a terminal, nbval (``RLHF_TUTORIAL_STRICT=1``), ``RLHF_TUTORIAL_STATIC=1``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from rlhf_tutorial import rlhf
from rlhf_tutorial.display import HTMLText, in_kernel, show_object, widgets_available
from rlhf_tutorial.widgets.live import Explorer, LiveDashboard, Updatable, html_output

if TYPE_CHECKING:
    from rlhf_tutorial.trainers.rlhf import RLHFTrainer

PANELS = ["reward", "kl", "entropy", "value_loss", "clipfrac", "kl_coef", "lr"]
TITLES = {
    "reward": "mean reward (task)",
    "kl": "KL(policy || ref), nats per token (k3)",
    "entropy": "entropy of the policy",
    "value_loss": "value loss",
    "clipfrac": "clip fraction",
    "kl_coef": "KL coefficient beta (per token)",
    "lr": "learning rate (transformer)",
}


# ----------------------------------------------------------------------------------------------------
# Samples tables
# ----------------------------------------------------------------------------------------------------
def _reward_colour(r: float) -> str:
    """Green for a high reward, red for a low one (rewards in [0, 1])."""
    r = min(max(r, 0.0), 1.0)
    return f"rgba(26,127,55,{0.5 * r:.2f})" if r >= 0.5 else f"rgba(207,34,46,{0.5 * (1 - r):.2f})"


def _samples_html(rows: Sequence[tuple[str, float]], title: str = "") -> str:
    head = f"<div style='font-family:sans-serif;margin:4px 0'><b>{html.escape(title)}</b></div>" if title else ""
    body = "".join(
        f"<tr><td style='padding:2px 8px;font-family:monospace;text-align:right;background:{_reward_colour(r)}'>"
        f"{r:.3f}</td><td style='padding:2px 8px;font-family:monospace;font-size:90%;text-align:left'>"
        f"{html.escape(t)}</td></tr>"
        for t, r in rows
    )
    return (head + "<table style='border-collapse:collapse'><tr><th>reward</th>"
            "<th style='text-align:left'>sample</th></tr>" + body + "</table>")


def _samples_text(rows: Sequence[tuple[str, float]], title: str = "") -> str:
    lines = [title] if title else []
    lines += [f"  {r:6.3f}  {t!r}" for t, r in rows]
    return "\n".join(lines)


def samples_table(texts: Sequence[str], rewards: Sequence[float] | torch.Tensor, title: str = "") -> HTMLText:
    """A table of samples with their rewards."""
    values = rewards.tolist() if isinstance(rewards, torch.Tensor) else list(rewards)
    rows = list(zip(texts, values))
    return HTMLText(_samples_html(rows, title), _samples_text(rows, title))


# ----------------------------------------------------------------------------------------------------
# The training dashboard
# ----------------------------------------------------------------------------------------------------
class RLHFDashboard:
    """Curves per phase (a ``LiveDashboard``) and the samples of each phase.

    ``update(record)`` takes one record of ``RLHFTrainer.history`` (the trainer's callback). Live in
    JupyterLab: the curves redraw while training runs, and a slider under them picks the phase whose
    samples are shown. Static: ``finish()`` shows the curves and the last phase's samples.
    """

    def __init__(self, title: str = "RLHF", static: bool | None = None):
        self.live = LiveDashboard(PANELS, title=title, titles=TITLES, cols=4, x_title="phase", static=static,
                                  height_per_row=230)
        self.records: list[dict[str, Any]] = []
        self._slider = self._table = None
        if not self.live.static and widgets_available():
            import ipywidgets

            self._slider = ipywidgets.IntSlider(value=0, min=0, max=0, description="phase", disabled=True)
            self._slider.observe(lambda change: self._show_phase(change["new"]), names="value")
            show_object(self._slider)
            self._table = Updatable(html_output("<i>samples of each phase appear here</i>"))

    @property
    def static(self) -> bool:
        return self.live.static

    def update(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.live.update(record)
        if self._slider is not None:
            self._slider.max = len(self.records) - 1
            self._slider.disabled = False
            self._slider.value = len(self.records) - 1
            self._show_phase(len(self.records) - 1)

    def phase_samples(self, index: int = -1) -> HTMLText:
        record = self.records[index]
        extra = " (early stopping fired)" if record.get("early_stopped") else ""
        title = (f"phase {record['phase']}: mean reward {record['reward']:.3f}, KL per token {record['kl']:.3f}, "
                 f"3-gram repetition {record['repetition']:.3f}{extra}")
        return HTMLText(_samples_html(record["samples"], title), _samples_text(record["samples"], title))

    def _show_phase(self, index: int) -> None:
        if self._table is not None and self.records:
            self._table.update(html_output(self.phase_samples(index).html))

    def to_figure(self):
        return self.live.to_figure()

    def finish(self) -> None:
        """Draw the final state; in static mode show the curves and the last phase's samples (in a kernel)."""
        was_static = self.live.static
        self.live.finish()
        if was_static and self.records:
            if in_kernel():
                show_object(self.phase_samples(-1))


def rlhf_dashboard(title: str = "RLHF", static: bool | None = None) -> RLHFDashboard:
    """The chapter-03 dashboard; pass its ``update`` as ``trainer.train(callback=dashboard.update)``."""
    return RLHFDashboard(title=title, static=static)


def runs_figure(histories: dict[str, Sequence[dict[str, Any]]], title: str = "") -> go.Figure:
    """Reward, 3-gram repetition and KL per phase for several runs (one colour per run)."""
    metrics = [("reward", "mean reward"), ("repetition", "3-gram repetition"), ("kl", "KL per token")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in metrics], horizontal_spacing=0.07)
    palette = ["#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd"]
    for i, (name, history) in enumerate(histories.items()):
        for col, (key, _) in enumerate(metrics, start=1):
            fig.add_trace(go.Scatter(x=[r["phase"] for r in history], y=[r[key] for r in history], mode="lines",
                                     name=name, legendgroup=name, showlegend=col == 1,
                                     line=dict(color=palette[i % len(palette)])), row=1, col=col)
            fig.update_xaxes(title_text="phase", row=1, col=col)
    fig.update_layout(title=title or None, height=380, margin=dict(l=50, r=20, t=80 if title else 50, b=110),
                      legend=dict(orientation="h", yanchor="top", y=-0.25, x=0))
    return fig


# ----------------------------------------------------------------------------------------------------
# Token-level explorer
# ----------------------------------------------------------------------------------------------------
_QUANTITIES = {"value": "value V(s) of the state that chose the token", "kl": "KL(policy || ref) at the token",
               "advantage": "advantage of the token"}


def _colour(x: float, scale: float, diverging: bool) -> str:
    a = min(abs(x) / max(scale, 1e-8), 1.0) * 0.6
    if not diverging:
        return f"rgba(130,80,223,{a:.2f})"
    return f"rgba(26,127,55,{a:.2f})" if x >= 0 else f"rgba(207,34,46,{a:.2f})"


def sample_html(rec: dict[str, Any], colour_by: str = "value") -> str:
    """One sample: tokens coloured by ``colour_by``, then a table of value, KL and advantage per token."""
    series = rec[colour_by]
    scale = max((abs(x) for x in series), default=1.0)
    diverging = colour_by != "kl"
    spans = []
    for j, token in enumerate(rec["tokens"]):
        tip = (f"value {rec['value'][j]:+.3f} | KL {rec['kl'][j]:.3f} | advantage {rec['advantage'][j]:+.3f} | "
               f"log p {rec['logprob'][j]:.2f} (ref {rec['ref_logprob'][j]:.2f})")
        text = html.escape(token).replace(" ", "&nbsp;") or "&#8203;"
        spans.append(f"<span title='{tip}' style='background:{_colour(series[j], scale, diverging)};"
                     f"padding:1px 1px;border-radius:2px'>{text}</span>")
    cells = "".join(f"<th style='padding:1px 4px;font-weight:normal'>{html.escape(t)}</th>" for t in rec["tokens"])

    def row(name: str, fmt: str) -> str:
        return f"<tr><td><b>{name}</b></td>" + "".join(
            f"<td style='padding:1px 4px;text-align:right'>{format(x, fmt)}</td>" for x in rec[name]) + "</tr>"

    return (
        f"<div style='font-family:sans-serif;margin:6px 0'>reward <b>{rec['reward']:.3f}</b> &middot; coloured by "
        f"{_QUANTITIES[colour_by]} (hover a token for all numbers)</div>"
        f"<div style='font-family:monospace;font-size:105%;line-height:1.8'>"
        f"<span style='color:#6e7781'>{html.escape(rec['prompt'])}</span>{''.join(spans)}</div>"
        f"<div style='overflow-x:auto'><table style='font-family:monospace;font-size:80%;border-collapse:collapse'>"
        f"<tr><td></td>{cells}</tr>{row('value', '+.2f')}{row('kl', '.3f')}{row('advantage', '+.2f')}</table></div>"
    )


def sample_text(rec: dict[str, Any]) -> str:
    lines = [f"reward {rec['reward']:.3f}: {rec['text']!r}", f"  {'token':>16} {'value':>7} {'KL':>7} {'adv':>7}"]
    for j, t in enumerate(rec["tokens"]):
        lines.append(f"  {t!r:>16} {rec['value'][j]:+7.3f} {rec['kl'][j]:7.3f} {rec['advantage'][j]:+7.3f}")
    return "\n".join(lines)


def token_explorer(trainer: RLHFTrainer, n_samples: int = 4, seed: int = 0, static: bool | None = None):
    """Sample ``n_samples`` completions from the trainer's policy and explore them token by token.

    Live: a dropdown picks the sample and buttons pick what colours the tokens (value, KL, advantage).
    Static: every sample, coloured by value, with its table (HTML in a notebook, text in a terminal).
    """
    from rlhf_tutorial.devices import rng_devices

    args = trainer.args
    with torch.random.fork_rng(devices=rng_devices(trainer.device)):
        torch.manual_seed(seed)
        tokens, texts = rlhf.get_samples(trainer.model.base_model, args.prefix, n_samples, args.gen_len,
                                         args.temperature, args.top_k, args.prepend_bos)
    records = rlhf.token_records(trainer, tokens, texts)
    if (not widgets_available()) if static is None else static:
        return HTMLText("".join(sample_html(r) for r in records), "\n\n".join(sample_text(r) for r in records))
    import ipywidgets as widgets

    pick = widgets.Dropdown(options=[(f"{i}: r={r['reward']:.2f} {r['text'][:60]!r}", i) for i, r in enumerate(records)],
                            value=0, description="sample", layout=widgets.Layout(width="70%"))
    colour = widgets.ToggleButtons(options=list(_QUANTITIES), value="value", description="colour by")
    return Explorer([pick, colour], lambda: html_output(sample_html(records[pick.value], colour.value)))


# ----------------------------------------------------------------------------------------------------
# Base vs tuned
# ----------------------------------------------------------------------------------------------------
def _compare(trainer: RLHFTrainer, prompt: str, n: int, seed: int) -> dict[str, list[tuple[str, float]]]:
    from rlhf_tutorial.devices import rng_devices

    args = trainer.args
    out = {}
    for name, model in [("base (reference)", trainer.ref_model), ("tuned", trainer.model.base_model)]:
        with torch.random.fork_rng(devices=rng_devices(trainer.device)):
            torch.manual_seed(seed)
            _, texts = rlhf.get_samples(model, prompt, n, args.gen_len, args.temperature, args.top_k,
                                        args.prepend_bos)
        out[name] = list(zip(texts, trainer.reward_fn(texts).tolist()))
    return out


def _compare_html(result: dict[str, list[tuple[str, float]]]) -> str:
    cols = "".join(
        f"<td style='vertical-align:top;padding:4px'>"
        f"{_samples_html(rows, f'{name}: mean reward {sum(r for _, r in rows) / len(rows):.3f}')}</td>"
        for name, rows in result.items()
    )
    return f"<table><tr>{cols}</tr></table>"


def _compare_text(result: dict[str, list[tuple[str, float]]]) -> str:
    return "\n\n".join(
        _samples_text(rows, f"{name}: mean reward {sum(r for _, r in rows) / len(rows):.3f}")
        for name, rows in result.items()
    )


def base_vs_tuned(trainer: RLHFTrainer, prompt: str | None = None, n: int = 6, seed: int = 0,
                  static: bool | None = None):
    """``n`` completions of the same prompt from the reference (base) model and the tuned policy, with
    their rewards (same seed for both). Live: a text box to try another prompt."""
    prompt = trainer.args.prefix if prompt is None else prompt
    result = _compare(trainer, prompt, n, seed)
    if (not widgets_available()) if static is None else static:
        return HTMLText(_compare_html(result), _compare_text(result))
    import ipywidgets as widgets

    box = widgets.Text(value=prompt, description="prompt", layout=widgets.Layout(width="60%"),
                       continuous_update=False)
    button = widgets.Button(description="sample again")
    state = {"seed": seed, "result": result}

    def render():
        return html_output(_compare_html(state["result"]))

    explorer = Explorer([box, button], render)

    def resample(*_) -> None:
        state["seed"] += 1
        state["result"] = _compare(trainer, box.value, n, state["seed"])
        explorer.redraw()

    button.on_click(resample)
    box.observe(resample, names="value")  # observed before the explorer's own redraw: resample first
    return explorer


# ----------------------------------------------------------------------------------------------------
# The report of `train-rlhf --report PATH`
# ----------------------------------------------------------------------------------------------------
def write_report(path: str | Path, dashboard: RLHFDashboard, summary: dict[str, Any], before: dict[str, Any],
                 after: dict[str, Any]) -> Path:
    """A self-contained HTML file (plotly.js inlined): the summary, the curves, samples before and after
    training, and the samples of the first, middle and last phases."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scalars = {k: v for k, v in summary.items() if not isinstance(v, (list, dict))}
    title = f"RLHF with PPO: {summary.get('world')} world, towards {summary.get('direction')}, seed {summary.get('seed')}"
    parts = [
        f"<h1 style='font-family:sans-serif'>{html.escape(title)}</h1>",
        "<pre>" + html.escape(json.dumps(scalars, indent=1)) + "</pre>",
        dashboard.to_figure().to_html(full_html=False, include_plotlyjs=True),
        "<h2 style='font-family:sans-serif'>Samples before and after training</h2><table><tr>",
    ]
    for name, stats in [("before", before), ("after", after)]:
        rows = list(zip(stats["texts"][:10], stats["rewards"][:10]))
        label = f"{name}: mean reward {stats['reward']:.3f} over {len(stats['texts'])} samples"
        parts.append(f"<td style='vertical-align:top;padding:4px'>{_samples_html(rows, label)}</td>")
    parts.append("</tr></table><h2 style='font-family:sans-serif'>Samples per phase</h2>")
    n = len(dashboard.records)
    for i in sorted({0, n // 2, n - 1}) if n else []:
        parts.append(dashboard.phase_samples(i).html)
    path.write_text("<html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title></head><body>"
                    + "".join(parts) + "</body></html>")
    return path
