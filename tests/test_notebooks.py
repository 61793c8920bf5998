"""The single-source notebook build: committed notebooks are exactly what the build writes."""

import json

import pytest

from rlhf_tutorial import notebooks
from rlhf_tutorial.notebooks import expected_files, parse_source, sources, stub_source


def test_every_chapter_has_a_source():
    stems = [s.stem for s in sources()]
    assert stems[:1] == ["00_setup_and_tour"]
    assert stems == sorted(stems)


@pytest.mark.parametrize("path", sorted(expected_files()), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebook_matches_the_build(path):
    expected = expected_files()[path]
    assert path.exists(), f"{path} is missing: run `python -m rlhf_tutorial build-notebooks`"
    assert path.read_text() == expected, f"{path} is stale: run `python -m rlhf_tutorial build-notebooks`"


@pytest.mark.parametrize("path", sorted(expected_files()), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebooks_have_no_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


def test_chapter_notebooks_hide_solutions_and_solutions_show_them():
    import nbformat

    files = expected_files()
    for src in sources():
        cells = parse_source(src.read_text())
        code = {}
        for variant in ("chapters", "solutions"):
            nb = nbformat.reads(files[notebooks.ROOT / variant / f"{src.stem}.ipynb"], as_version=4)
            code[variant] = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        for cell in cells:
            for ref in cell.refs:
                name = notebooks.exercise_name(ref)
                body = notebooks.solution_source(notebooks.resolve(ref))
                if cell.kind == "source":  # a reference helper: shown whole in both, no check
                    assert body in code["solutions"] and body in code["chapters"]
                    continue
                assert body in code["solutions"]
                assert body not in code["chapters"]
                assert f"exercise {name}: your code here" in code["chapters"]
                assert f"check({name})" in code["chapters"] and f"check({name})" in code["solutions"]


def test_stub_keeps_signature_and_docstring_and_drops_the_body():
    from rlhf_tutorial import tour

    stub = stub_source(tour.next_token_probs, "next_token_probs")
    assert stub.startswith("def next_token_probs(")
    assert '"""The policy\'s distribution' in stub
    assert "softmax" not in stub.split('"""')[-1]
    assert "raise NotImplementedError" in stub


def test_parse_source_rejects_unknown_headers():
    with pytest.raises(ValueError, match="unknown cell header"):
        parse_source("# %% bogus\nx = 1\n")
