"""The single-source notebook build: committed notebooks are exactly what the build writes."""

import json

import pytest

from rlhf_tutorial import notebooks
from rlhf_tutorial.notebooks import expected_files, parse_source, sources, stub_source
from tests.digests import assert_same_digest


def test_every_chapter_has_a_source():
    stems = [s.stem for s in sources()]
    assert stems[:1] == ["00_setup_and_tour"]
    assert stems == sorted(stems)


@pytest.mark.parametrize("path", sorted(expected_files()), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebook_matches_the_build(path):
    expected = expected_files()[path]
    assert path.exists(), f"{path} is missing: run `python -m rlhf_tutorial build-notebooks`"
    assert_same_digest(path.read_text(), expected, f"{path} and what the build writes",
                       "The notebook is stale: run `python -m rlhf_tutorial build-notebooks`.")


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


def test_exercise_headers_carry_time_and_ratings_and_the_build_shows_them():
    cells = parse_source("# %% exercise rlhf_tutorial.tour:next_token_probs | 10 min | importance 3 | difficulty 1\n")
    assert cells[0].refs == ("rlhf_tutorial.tour:next_token_probs",)
    assert (cells[0].meta.minutes, cells[0].meta.difficulty, cells[0].meta.importance) == (10, 1, 3)
    with pytest.raises(ValueError, match="lacks difficulty"):
        parse_source("# %% exercise rlhf_tutorial.tour:next_token_probs | 10 min | importance 3\n")
    with pytest.raises(ValueError, match="cannot read 'difficulty 7'"):
        parse_source("# %% exercise rlhf_tutorial.tour:next_token_probs | 10 min | difficulty 7 | importance 3\n")
    nb = notebooks.build(cells, "chapter", "00_x")
    heading = nb.cells[0].source
    assert heading.startswith("#### Exercise: `next_token_probs`") and "about 10 minutes" in heading
    assert "**Difficulty** \u2605\u2606\u2606\u2606\u2606 1/5" in heading
    assert "**Importance** \u2605\u2605\u2605\u2606\u2606 3/5" in heading


def test_every_exercise_in_the_course_has_a_heading_before_its_code():
    import nbformat

    files = expected_files()
    for exercise in notebooks.exercises():
        for variant in ("chapters", "solutions"):
            nb = nbformat.reads(files[notebooks.ROOT / variant / f"{exercise.chapter}.ipynb"], as_version=4)
            sources = [c.source for c in nb.cells]
            at = next(i for i, s in enumerate(sources) if s.startswith(f"#### Exercise: `{exercise.name}`"))
            assert nb.cells[at + 1].cell_type == "code" and f" {exercise.name}" in nb.cells[at + 1].source


def test_chapters_say_how_to_work_through_them_and_that_run_all_stops():
    import nbformat

    for path, text in expected_files().items():
        nb = nbformat.reads(text, as_version=4)
        note = nb.cells[1].source
        if path.parent.name == "chapters":
            assert "Run All stops at the first exercise" in note and f"solutions/{path.name}" in note
        else:
            assert f"chapters/{path.name}" in note


def _renders_in_a_default_font(char: str) -> bool:
    """ASCII, or a text character below the blocks where emoji live (Misc Technical U+2300-23FF, Misc
    Symbols and Dingbats U+2600-27BF, Misc Symbols and Arrows U+2B00-2BFF, everything from U+3000 on), or
    one of the two rating stars (U+2605/U+2606: no emoji presentation; DejaVu Sans, Debian's default font, has both)."""
    code = ord(char)
    if char in (notebooks.FULL_STAR, notebooks.EMPTY_STAR) or code < 0x80:
        return True
    return code < 0x2300 or 0x2400 <= code < 0x2600 or 0x27C0 <= code < 0x2B00 or 0x2C00 <= code < 0x3000


def test_the_emoji_filter_rejects_emoji_and_keeps_text_symbols():
    for emoji in ("\U0001f534", "\U0001f535", "\u26aa", "\u2705", "\u231a", "\u2b50", "\ufe0f"):
        assert not _renders_in_a_default_font(emoji), hex(ord(emoji))
    for text in ("a", "\u00b1", "\u00b7", "\u2014", "\u2192", "\u2264", "\u03b5", "\u2605", "\u2606"):
        assert _renders_in_a_default_font(text), hex(ord(text))


@pytest.mark.parametrize("path", sorted(expected_files()), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_generated_notebooks_contain_no_emoji(path):
    """Debian's Chromium with no emoji font draws emoji as empty boxes: the ratings (and all other text)
    use characters a default font has."""
    nb = json.loads(expected_files()[path])
    found = {ch for cell in nb["cells"] for ch in "".join(cell["source"]) if not _renders_in_a_default_font(ch)}
    assert not found, f"{path.name} contains emoji or symbols a default font may lack: " \
                      f"{sorted(f'U+{ord(c):04X}' for c in found)}"


def test_a_harder_exercise_is_never_estimated_shorter_than_an_easier_one():
    """Ratings mean the same in every chapter (docs/AUTHORING.md, "Estimates"): across the whole course,
    the longest estimate of a difficulty is at most the shortest of the next harder one."""
    minutes: dict[int, list[tuple[int, str]]] = {}
    for exercise in notebooks.exercises():
        minutes.setdefault(exercise.meta.difficulty, []).append((exercise.meta.minutes, exercise.name))
    levels = sorted(minutes)
    for easier, harder in zip(levels, levels[1:]):
        slowest, fastest = max(minutes[easier]), min(minutes[harder])
        assert slowest[0] <= fastest[0], (
            f"{slowest[1]} (difficulty {easier}) is estimated at {slowest[0]} min, longer than {fastest[1]} "
            f"(difficulty {harder}) at {fastest[0]} min: one of the two ratings or estimates is off")
