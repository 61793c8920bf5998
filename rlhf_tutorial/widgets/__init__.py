"""Plotly and ipywidgets visuals, one module per chapter; ``live`` is the shared training dashboard."""
