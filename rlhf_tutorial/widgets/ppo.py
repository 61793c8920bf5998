"""Chapter 01 widgets: the clipped-objective explorer and the PPO training dashboard."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlhf_tutorial.display import widgets_available
from rlhf_tutorial.widgets.live import LiveDashboard

# ---------------------------------------------------------------------------------------------------
# The clipped surrogate, one sample at a time
# ---------------------------------------------------------------------------------------------------


def clipped_term(ratio: np.ndarray | float, advantage: float, epsilon: float) -> np.ndarray:
    """``min(r A, clip(r, 1 - eps, 1 + eps) A)`` for one sample (the term PPO averages)."""
    ratio = np.asarray(ratio, dtype=float)
    return np.minimum(ratio * advantage, np.clip(ratio, 1 - epsilon, 1 + epsilon) * advantage)


def explain(ratio: float, advantage: float, epsilon: float) -> str:
    """In words: which branch of the min is active at ``ratio`` and what the gradient does there."""
    good = advantage > 0
    lo, hi = 1 - epsilon, 1 + epsilon
    action = "a good action (A > 0)" if good else "a bad action (A < 0)"
    if good and ratio > hi:
        return (f"r = {ratio:.2f} > 1 + eps = {hi:.2f} for {action}: the new policy already made it "
                f"{ratio:.2f}x likelier, more than 1 + eps allows. The term is flat (clipped): no gradient pushes it further this update.")
    if not good and ratio < lo:
        return (f"r = {ratio:.2f} < 1 - eps = {lo:.2f} for {action}: the new policy already made it rarer "
                f"({ratio:.2f}x) by more than eps. The term is flat (clipped): no gradient pushes it down further.")
    if good and ratio < lo:
        return (f"r = {ratio:.2f} < 1 - eps for {action}: the update made a good action rarer. min() keeps "
                "r A (the smaller term), so the full gradient pulls its probability back up: clipping only "
                "ever removes the incentive to move further in the direction that helps.")
    if not good and ratio > hi:
        return (f"r = {ratio:.2f} > 1 + eps for {action}: the update made a bad action likelier. min() keeps "
                "r A (more negative), so the full gradient pushes it back down: the objective is pessimistic.")
    return (f"r = {ratio:.2f} inside [1 - eps, 1 + eps] = [{lo:.2f}, {hi:.2f}]: both terms are equal and the "
            f"gradient is A = {advantage:+.0f}, the plain policy-gradient (importance-sampled) direction.")


def clipped_objective_figure(epsilon: float = 0.2, ratio: float | None = 1.0, r_max: float = 2.0) -> go.Figure:
    """L^CLIP as a function of the ratio r for A = +1 and A = -1 (Figure 1 of the PPO paper).

    Dashed: the unclipped ``r A``; dotted: ``clip(r) A``; solid: their minimum, which PPO maximises.
    The shaded band is ``[1 - eps, 1 + eps]``; the marker is at ``ratio``.
    """
    r = np.linspace(0.0, r_max, 401)
    fig = make_subplots(rows=1, cols=2, subplot_titles=["A > 0 (A = +1)", "A < 0 (A = -1)"],
                        horizontal_spacing=0.1)
    for col, adv in ((1, 1.0), (2, -1.0)):
        show = col == 1
        fig.add_trace(go.Scatter(x=r, y=r * adv, mode="lines", name="r A (unclipped)", showlegend=show,
                                 line=dict(color="#888", dash="dash")), row=1, col=col)
        fig.add_trace(go.Scatter(x=r, y=np.clip(r, 1 - epsilon, 1 + epsilon) * adv, mode="lines",
                                 name="clip(r, 1-eps, 1+eps) A", showlegend=show,
                                 line=dict(color="#ff7f0e", dash="dot")), row=1, col=col)
        fig.add_trace(go.Scatter(x=r, y=clipped_term(r, adv, epsilon), mode="lines", name="L_CLIP = min(...)",
                                 showlegend=show, line=dict(color="#1f77b4", width=3)), row=1, col=col)
        x0 = 1.0 if ratio is None else ratio
        fig.add_trace(go.Scatter(x=[x0], y=[float(clipped_term(x0, adv, epsilon))], mode="markers",
                                 name="current r", showlegend=show, visible=ratio is not None,
                                 marker=dict(size=11, color="#d62728")), row=1, col=col)
        fig.add_vrect(x0=1 - epsilon, x1=1 + epsilon, fillcolor="#2ca02c", opacity=0.08, line_width=0,
                      row=1, col=col)
        fig.update_xaxes(title_text="ratio r = pi / pi_old", range=[0, r_max], row=1, col=col)
        fig.update_yaxes(range=[-r_max - 0.1, r_max + 0.1], row=1, col=col)
    fig.update_layout(title=f"The clipped surrogate objective, eps = {epsilon:.2f}", height=380,
                      template="plotly_white", margin=dict(l=50, r=20, t=70, b=40),
                      legend=dict(orientation="h", y=-0.22))
    return fig


def clipped_objective_explorer(epsilon: float = 0.2, ratio: float = 1.3, static: bool | None = None):
    """Sliders for eps and r over the figure of ``clipped_objective_figure``, with a live explanation.

    Returns an ipywidgets box in JupyterLab; where widgets cannot show (see ``live.py``) the static
    figure for the given values instead, with the explanations printed.
    """
    if static if static is not None else not widgets_available():
        for adv in (1.0, -1.0):
            print(explain(ratio, adv, epsilon))
        return clipped_objective_figure(epsilon, ratio)

    import ipywidgets as w

    fig = go.FigureWidget(clipped_objective_figure(epsilon, ratio))
    eps_slider = w.FloatSlider(value=epsilon, min=0.05, max=0.5, step=0.01, description="eps",
                               continuous_update=True)
    ratio_slider = w.FloatSlider(value=ratio, min=0.0, max=2.0, step=0.01, description="ratio r",
                                 continuous_update=True)
    text = w.HTML()
    r = np.linspace(0.0, 2.0, 401)

    def redraw(_=None) -> None:
        eps, x0 = eps_slider.value, ratio_slider.value
        with fig.batch_update():
            for k, adv in enumerate((1.0, -1.0)):
                fig.data[4 * k + 1].y = np.clip(r, 1 - eps, 1 + eps) * adv
                fig.data[4 * k + 2].y = clipped_term(r, adv, eps)
                fig.data[4 * k + 3].x = [x0]
                fig.data[4 * k + 3].y = [float(clipped_term(x0, adv, eps))]
            for shape in fig.layout.shapes:
                shape.x0, shape.x1 = 1 - eps, 1 + eps
            fig.layout.title.text = f"The clipped surrogate objective, eps = {eps:.2f}"
        text.value = "<br>".join(f"<b>{'A > 0' if adv > 0 else 'A < 0'}:</b> {explain(x0, adv, eps)}"
                                 for adv in (1.0, -1.0))

    eps_slider.observe(redraw, names="value")
    ratio_slider.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([eps_slider, ratio_slider]), fig, text])


# ---------------------------------------------------------------------------------------------------
# Training dashboard
# ---------------------------------------------------------------------------------------------------

PPO_PANELS = ["episodic_return", "value_loss", "entropy", "approx_kl", "clipfrac", "explained_variance"]
PPO_TITLES = {
    "episodic_return": "episodic return",
    "value_loss": "value loss (vf_coef * 0.5 MSE)",
    "entropy": "policy entropy (nats)",
    "approx_kl": "approx KL(old || new)",
    "clipfrac": "clip fraction",
    "explained_variance": "explained variance",
}


def ppo_dashboard(title: str = "PPO", static: bool | None = None, smooth: int = 20) -> LiveDashboard:
    """The chapter-01 dashboard; pass its ``update`` as ``trainers.ppo.train(..., callback=dash.update)``."""
    return LiveDashboard(PPO_PANELS, title=title, titles=PPO_TITLES, smooth={"episodic_return": smooth},
                         x_title="env steps", static=static)
