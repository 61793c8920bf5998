"""The browser test's list of explorers is complete, and every explorer is in a solution notebook.

``tests/test_browser.py`` moves one control of every explorer it meets; it learns which cells are
explorers from ``EXPLORERS``. A new function in ``rlhf_tutorial/widgets/`` that builds ipywidgets
controls, or an explorer no notebook calls (so no browser run moves it), fails here, without a browser.
"""

import ast
import re
from pathlib import Path

from tests.test_browser import EXPLORERS, SOLUTIONS

ROOT = Path(__file__).resolve().parents[1]
# ipywidgets classes a learner moves or types into
CONTROL = re.compile(r"\b(IntSlider|FloatSlider|Dropdown|ToggleButtons|Button|Text|Textarea|Checkbox|SelectionSlider)\(")
# a class that builds controls, and the function that returns it
FACTORIES = {"RLHFDashboard": "rlhf_dashboard"}


def _with_controls() -> set[str]:
    found = set()
    for path in (ROOT / "rlhf_tutorial" / "widgets").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and CONTROL.search(ast.get_source_segment(
                    path.read_text(), node) or ""):
                found.add(FACTORIES.get(node.name, node.name))
    return found


def test_every_widget_function_with_controls_is_an_explorer_of_the_browser_test():
    found = _with_controls()
    assert found, "no control found in rlhf_tutorial/widgets/: the pattern is broken"
    assert found == set(EXPLORERS), (
        f"missing from EXPLORERS in tests/test_browser.py: {sorted(found - set(EXPLORERS))}; "
        f"no longer building controls: {sorted(set(EXPLORERS) - found)}")


def test_every_explorer_is_called_in_a_solution_notebook():
    import json

    code = "".join("".join(c["source"]) for p in SOLUTIONS
                   for c in json.loads((ROOT / p).read_text())["cells"] if c["cell_type"] == "code")
    missing = [n for n in EXPLORERS if f"{n}(" not in code]
    assert not missing, f"explorers the browser test never meets (no solution notebook calls them): {missing}"
    assert len(SOLUTIONS) >= 8 and "solutions/06_dpo_and_frontier.ipynb" in SOLUTIONS
