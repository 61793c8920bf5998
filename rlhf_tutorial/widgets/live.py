"""A live training dashboard, reused by every chapter that trains something.

    dash = LiveDashboard(["episodic_return", "value_loss", ("reward", "kl")], title="PPO")
    for step in ...:
        dash.update(step, episodic_return=..., value_loss=..., reward=..., kl=...)
    dash.finish()

In JupyterLab the figure is a plotly ``FigureWidget`` that redraws while the cell runs (at most every
``refresh_seconds``, in one ``batch_update``). Where no widget front end can show it (a terminal,
nbval, ``RLHF_TUTORIAL_STATIC=1`` or ``RLHF_TUTORIAL_STRICT=1``, or no ``anywidget``), nothing is drawn
during training and ``finish()`` shows one static plotly figure instead (in a kernel; in a terminal
it shows nothing: ``save(path)`` writes an HTML file).
"""

from __future__ import annotations

import html
import math
import os
import time
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial import display


class LiveDashboard:
    """A grid of line plots, one per panel, fed with ``update(step, **metrics)``.

    Args:
        panels: one entry per subplot: a metric name, or a tuple of names drawn together.
        title: the figure's title.
        titles: subplot titles by panel (the first metric's name); default: the name with spaces.
        smooth: ``{metric: k}`` adds a line of the mean of the last ``k`` points of that metric, and
            draws the raw points faintly (for noisy series such as episodic return).
        cols: subplots per row.
        x_title: label of every x axis.
        refresh_seconds: the shortest time between two redraws of the live figure.
        static: force static (True) or live (False) mode; default: live where widgets can show.
        height_per_row: pixels per row of subplots.

    Metrics that are in no panel are kept in ``history`` but not drawn. NaN and None are gaps.
    """

    def __init__(
        self,
        panels: Sequence[str | Sequence[str]],
        title: str = "",
        *,
        titles: dict[str, str] | None = None,
        smooth: dict[str, int] | None = None,
        cols: int = 3,
        x_title: str = "step",
        refresh_seconds: float = 0.5,
        static: bool | None = None,
        height_per_row: int = 260,
    ) -> None:
        self.panels = [(p,) if isinstance(p, str) else tuple(p) for p in panels]
        self.title = title
        self.smooth = dict(smooth or {})
        self.refresh_seconds = refresh_seconds
        self.history: dict[str, tuple[list[float], list[float]]] = {}
        self.notes: list[str] = []
        self._last_draw = 0.0
        self._finished = False

        titles = titles or {}
        n = len(self.panels)
        self.cols = max(1, min(cols, n))
        rows = math.ceil(n / self.cols)
        fig = make_subplots(
            rows=rows,
            cols=self.cols,
            subplot_titles=[titles.get(p[0], " / ".join(m.replace("_", " ") for m in p)) for p in self.panels],
            horizontal_spacing=0.08,
            vertical_spacing=min(0.5 / max(rows, 1), 0.12),
        )
        # One trace per metric (and one more per smoothed metric); remember which trace is which.
        self._trace: dict[str, int] = {}
        self._smooth_trace: dict[str, int] = {}
        palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
        for i, panel in enumerate(self.panels):
            row, col = i // self.cols + 1, i % self.cols + 1
            for j, metric in enumerate(panel):
                colour = palette[j % len(palette)]
                raw_style = dict(mode="markers", marker=dict(size=3, color=colour, opacity=0.35)) \
                    if metric in self.smooth else dict(mode="lines", line=dict(color=colour, width=1.5))
                self._trace[metric] = len(fig.data)
                fig.add_trace(go.Scatter(x=[], y=[], name=metric, showlegend=len(panel) > 1, **raw_style),
                              row=row, col=col)
                if metric in self.smooth:
                    self._smooth_trace[metric] = len(fig.data)
                    fig.add_trace(go.Scatter(x=[], y=[], mode="lines", name=f"{metric} (mean of last {self.smooth[metric]})",
                                             line=dict(color=colour, width=2), showlegend=False),
                                  row=row, col=col)
            fig.update_xaxes(title_text=x_title, row=row, col=col)
        fig.update_layout(
            title=title or None,
            height=rows * height_per_row + (80 if title else 40),
            margin=dict(l=50, r=20, t=70 if title else 40, b=40),
            template="plotly_white",
            legend=dict(orientation="h", y=-0.15),
        )
        for annotation in fig.layout.annotations:  # smaller subplot titles
            annotation.font.size = 13

        self.static = (not display.widgets_available()) if static is None else static
        self._note_widget = None
        if not self.static:
            try:
                self.fig = go.FigureWidget(fig)
            except Exception:  # noqa: BLE001 - no widget support after all: fall back to static
                self.static = True
        if self.static:
            self.fig = fig
        else:
            import ipywidgets

            self._note_widget = ipywidgets.HTML()
            display.show_object(ipywidgets.VBox([self.fig, self._note_widget]))

    # ------------------------------------------------------------------------------------------
    def update(self, step: float, **metrics: float | None) -> None:
        """Record ``metrics`` at x = ``step``; the live figure redraws at most every refresh_seconds."""
        for name, value in metrics.items():
            value = float("nan") if value is None else float(value)
            xs, ys = self.history.setdefault(name, ([], []))
            xs.append(float(step))
            ys.append(value)
        if not self.static and time.monotonic() - self._last_draw >= self.refresh_seconds:
            self._draw()

    def note(self, text: str) -> None:
        """Show a line of text under the live figure (samples, status); static mode keeps them for finish."""
        self.notes.append(text)
        if self._note_widget is not None:
            self._note_widget.value = f"<pre style='white-space:pre-wrap'>{html.escape(text)}</pre>"

    def _smoothed(self, ys: list[float], k: int) -> list[float]:
        out, window = [], []
        for y in ys:
            if not math.isnan(y):
                window.append(y)
                window = window[-k:]
            out.append(sum(window) / len(window) if window else float("nan"))
        return out

    def _fill(self, fig: go.Figure) -> None:
        for metric, index in self._trace.items():
            xs, ys = self.history.get(metric, ([], []))
            fig.data[index].x, fig.data[index].y = list(xs), list(ys)
            if metric in self._smooth_trace:
                s = fig.data[self._smooth_trace[metric]]
                s.x, s.y = list(xs), self._smoothed(ys, self.smooth[metric])

    def _draw(self) -> None:
        with self.fig.batch_update():
            self._fill(self.fig)
        self._last_draw = time.monotonic()

    # ------------------------------------------------------------------------------------------
    def to_figure(self) -> go.Figure:
        """A static ``go.Figure`` with everything recorded so far (for saving or showing)."""
        fig = go.Figure(self.fig)
        self._fill(fig)
        return fig

    def save(self, path: str) -> str:
        """Write the figure as a self-contained HTML file (plotly.js inlined, so it opens offline)."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.to_figure().write_html(path, include_plotlyjs=True)
        return path

    def finish(self) -> None:
        """Draw the final state; in static mode show the figure (once, and only in a kernel).

        Returns nothing, so that ``dash.finish()`` as the last line of a cell does not show the figure a
        second time; ``to_figure()`` gives the figure itself.
        """
        if not self.static:
            self._draw()
            return
        if not self._finished and display.in_kernel():
            display.show_object(self.to_figure())
            if self.notes:
                from IPython.display import HTML

                display.show_object(HTML(f"<pre style='white-space:pre-wrap'>{html.escape(self.notes[-1])}</pre>"))
        self._finished = True
