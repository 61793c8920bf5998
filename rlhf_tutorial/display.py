"""Where output goes: one home for "am I in a notebook?" and for "HTML there, text elsewhere".

- ``in_kernel()``: inside a Jupyter (IPython) kernel, not a terminal, a script or an IPython shell;
- ``widgets_available()``: a live widget can be shown (a kernel, not forced static by
  ``RLHF_TUTORIAL_STATIC=1`` or ``RLHF_TUTORIAL_STRICT=1``, ipywidgets and anywidget importable);
- ``HTMLText(html, plain)``: an object that renders as HTML in a notebook and as text elsewhere;
- ``show(obj)``: display ``obj`` in a kernel (its HTML form), print its text form elsewhere;
- ``show_object(obj)``: IPython's ``display`` (for widgets).
"""

from __future__ import annotations

import os
from typing import Any


def in_kernel() -> bool:
    """True inside a Jupyter (IPython) kernel, False in a terminal, a plain script or IPython shell."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def widgets_available() -> bool:
    """Whether a live widget can be shown: in a kernel, not forced static, anywidget present."""
    if os.environ.get("RLHF_TUTORIAL_STATIC") == "1" or os.environ.get("RLHF_TUTORIAL_STRICT") == "1":
        return False
    if not in_kernel():
        return False
    try:
        import anywidget  # noqa: F401  (plotly's FigureWidget needs it)
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class HTMLText:
    """HTML in a notebook, plain text in a terminal (``repr`` and ``str`` give the text)."""

    def __init__(self, html_text: str, plain: str):
        self.html, self.plain = html_text, plain

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.plain

    __str__ = __repr__


def show_object(obj: Any) -> None:
    """IPython's ``display(obj)`` (a widget, or anything with an HTML form)."""
    from IPython.display import display

    display(obj)


def show(obj: Any) -> None:
    """Display ``obj`` in a kernel (its HTML form), print its text form elsewhere."""
    if in_kernel():
        show_object(obj)
    else:
        print(str(obj))
