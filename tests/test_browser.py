"""The learner's JupyterLab in a real browser: run a solution notebook, look at it, move a slider, reopen.

Headless Chromium (Debian's ``chromium``, installed by ``make chromium``) driven by Playwright. For each
notebook: JupyterLab serves a temporary copy of the repository's notebooks (rooted like ``make lab``),
the notebook is opened and run top to bottom, and the test asserts that

- no cell raised, no output reads "Error displaying widget" or shows a raw ``FigureWidget(...)`` repr;
- every dashboard and explorer cell shows its plotly figure(s);
- moving one slider changes what the explorer shows;
- after saving, shutting the kernel down and reopening the file, every figure is still drawn.

Screenshots of each stage go to ``reports/browser/`` (test artifacts). The runs use the tiny world with
``RLHF_TUTORIAL_SMOKE=1`` so that the training cells stay short.

Marked ``browser``: ``make unit`` leaves it out, ``make browser`` (part of ``make test``) runs it. It
fails, never skips, when Chromium or Playwright is missing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "reports" / "browser"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
RUN_TIMEOUT_S = 420
# pytest-timeout's limit per notebook: its own Run All limit, plus starting the lab and the browser (the
# first test's set-up), opening, saving and reopening (each notebook took about 100 s on a busy 2-core machine).
pytestmark = [pytest.mark.browser, pytest.mark.timeout(RUN_TIMEOUT_S + 300)]
LAB_SETTINGS = {
    # every cell in the DOM (no virtual scrolling), so outputs can be found and counted
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False,
    },
}


def chromium_executable() -> str:
    """The Chromium binary: ``$RLHF_TUTORIAL_CHROMIUM`` or the first of the usual names on PATH."""
    explicit = os.environ.get("RLHF_TUTORIAL_CHROMIUM")
    if explicit:
        if not os.access(explicit, os.X_OK):
            pytest.fail(f"RLHF_TUTORIAL_CHROMIUM={explicit} is not an executable file.")
        return explicit
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "Chromium is not installed, so the browser test cannot run (this is a failure, not a skip). "
        "Install it with `make chromium` (apt-get install chromium, as root) or point "
        "RLHF_TUTORIAL_CHROMIUM at a Chromium/Chrome binary."
    )


# ----------------------------------------------------------------------------------------------------
# What each notebook must show
# ----------------------------------------------------------------------------------------------------
@dataclass
class Visual:
    """A cell whose source contains ``marker`` must show at least ``plots`` plotly figures (and, with
    ``plots=0``, some HTML: an explorer's view)."""

    marker: str
    plots: int = 1
    interact: str | None = None  # "slider" or "dropdown": move it and expect the output to change


@dataclass
class Spec:
    notebook: str
    visuals: list[Visual] = field(default_factory=list)


SPECS = [
    Spec("solutions/01_ppo.ipynb", [
        Visual("clipped_objective_explorer(", interact="slider"),
        Visual("dashboard = ppo_dashboard("),
    ]),
    Spec("solutions/02_rewards.ipynb", [
        Visual("reward_explorer(explorer_texts", plots=0, interact="dropdown"),
    ]),
    Spec("solutions/03_rlhf_ppo.ipynb", [
        Visual("dashboard = rlhf_dashboard(", interact="slider"),
        Visual("token_explorer(trainer", plots=0, interact="dropdown"),
        Visual("runs_figure("),
    ]),
    Spec("solutions/04_grpo.ipynb", [
        Visual("curves = grpo_dashboard("),
        Visual("rule_curves = grpo_dashboard("),
        Visual("comparison_figure("),
        Visual("group_viewer(groups", plots=0, interact="dropdown"),
    ]),
    Spec("solutions/05_interpretability.ipynb", [
        Visual("lens_explorer(records)", interact="dropdown"),
    ]),
    Spec("solutions/07_reasoning.ipynb", [
        Visual("dashboard = reasoning_dashboard("),
        Visual("grpo_reasoning_curves("),
        Visual("pass_at_k_figure("),
        Visual("held_out_figure("),
        Visual("best_of_n_figure("),
    ]),
    Spec("solutions/08_lora.ipynb", [
        Visual("rank_curves("),
        Visual("cost_figure("),
        Visual("spectrum_figure("),
    ]),
]


# ----------------------------------------------------------------------------------------------------
# JupyterLab and the browser
# ----------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    log: Path

    def page_url(self, path: str) -> str:
        return f"{self.url}/lab/tree/{path}?token={self.token}&reset"


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Lab:
    root = tmp_path_factory.mktemp("lab")
    for folder in ("chapters", "solutions"):
        shutil.copytree(ROOT / folder, root / folder)
    settings = tmp_path_factory.mktemp("settings")
    for rel, value in LAB_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "RLHF_TUTORIAL_WORLD": "tiny",
        "RLHF_TUTORIAL_SMOKE": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path_factory.mktemp("workspaces")),
        "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("runtime")),
    }
    log = root.parent / "lab.log"
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
        f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True", "--ServerApp.open_browser=False",
        f"--LabApp.app_settings_dir={ROOT / 'jupyterlab-settings'}",  # as `make lab`: widget state saved
        *(["--allow-root"] if os.geteuid() == 0 else []),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited early:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"JupyterLab did not answer within 120 s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield Lab(url, token, root, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def browser():
    executable = chromium_executable()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: it is in the dev extra (pip install -e '.[dev]').")
    with sync_playwright() as p:
        try:
            chromium = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except Exception as exc:  # noqa: BLE001 - say why the browser did not start
            pytest.fail(f"Chromium ({executable}) did not start: {exc}")
        yield chromium
        chromium.close()


# JavaScript helpers, run in the page (JupyterLab exposes its application as window.jupyterapp).
JS_CURRENT = "() => window.jupyterapp.shell.currentWidget"
JS_READY = """() => {
  const app = window.jupyterapp; if (!app) return false;
  const w = app.shell.currentWidget;
  return !!(w && w.content && w.content.model && w.sessionContext && w.sessionContext.session
            && w.sessionContext.session.kernel && w.sessionContext.session.kernel.status === 'idle');
}"""
JS_CELLS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  return Array.from(w.content.model.cells).map(c => ({
    type: c.type, source: c.sharedModel.getSource(),
    outputs: c.type === 'code' ? c.outputs.toJSON() : []}));
}"""
JS_BUSY = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const prompts = Array.from(document.querySelectorAll('.jp-Notebook .jp-InputPrompt'));
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  return prompts.some(p => p.textContent.includes('*')) || !kernel || kernel.status !== 'idle';
}"""


def _start_session(lab: Lab, path: str) -> None:
    body = json.dumps({"path": path, "name": Path(path).name, "type": "notebook",
                       "kernel": {"name": "python3"}}).encode()
    request = urllib.request.Request(f"{lab.url}/api/sessions?token={lab.token}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        kernel_id = json.loads(response.read())["kernel"]["id"]
    deadline = time.time() + 60
    while time.time() < deadline:
        with urllib.request.urlopen(f"{lab.url}/api/kernels/{kernel_id}?token={lab.token}", timeout=10) as r:
            if json.loads(r.read())["execution_state"] == "idle":
                return
        time.sleep(1)


def _open(page, lab: Lab, path: str) -> None:
    page.goto(lab.page_url(path))
    page.wait_for_function(JS_READY, timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)


def _cells(page) -> list[dict]:
    return page.evaluate(JS_CELLS)


def _cell_index(cells: list[dict], marker: str) -> int:
    matches = [i for i, c in enumerate(cells) if c["type"] == "code" and marker in c["source"]]
    assert matches, f"no code cell contains {marker!r}"
    return matches[0]


def _cell(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def _raw_reprs(cells: list[dict]) -> list[int]:
    """Cells with an output that shows a widget's text repr (no widget view to render it instead)."""
    raw = []
    for i, cell in enumerate(cells):
        for out in cell["outputs"]:
            data = out.get("data", {})
            text = out.get("text", "") if out.get("output_type") == "stream" else data.get("text/plain", "")
            text = text if isinstance(text, str) else "".join(text)
            if "FigureWidget(" in text and "application/vnd.jupyter.widget-view+json" not in data:
                raw.append(i)
    return raw


def _shot(locator, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path))
    return path


# A figure counts as drawn when JupyterLab's plotly renderer shows it, either as an interactive plot
# (an SVG) or as the PNG snapshot it stores in the output (what a reopened notebook shows first).
JS_DRAWN = """(cell) => Array.from(cell.querySelectorAll('.jp-OutputArea .jp-RenderedPlotly')).filter(r => {
  const svg = r.querySelector('.plot-container .main-svg');
  const img = r.querySelector('img.plot-img');
  const shown = el => el && getComputedStyle(el).display !== 'none' && el.getBoundingClientRect().height > 20;
  return (svg && shown(r.querySelector('.plot-container'))) || (img && img.src.startsWith('data:image/png') && shown(img));
}).length"""


def _drawn(page, index: int) -> int:
    return page.evaluate(f"(i) => ({JS_DRAWN})(document.querySelectorAll('.jp-Notebook .jp-Cell')[i])", index)


def _assert_visuals(page, cells: list[dict], spec: Spec, stage: str) -> dict[str, int]:
    """Every visual's cell shows its plots; returns the plot count per marker. Screenshots each."""
    counts = {}
    for visual in spec.visuals:
        index = _cell_index(cells, visual.marker)
        output = _cell(page, index).locator(".jp-Cell-outputArea")
        output.scroll_into_view_if_needed()
        deadline = time.time() + 30
        while _drawn(page, index) < visual.plots and time.time() < deadline:
            time.sleep(0.5)
        count = _drawn(page, index)
        name = f"{Path(spec.notebook).stem}-{stage}-cell{index:03d}"
        shot = _shot(output, name)
        if visual.plots == 0:
            html_views = output.locator(".jp-RenderedHTMLCommon").count()
            assert html_views >= 1 and output.inner_text().strip(), \
                f"{spec.notebook} ({stage}): the cell with {visual.marker!r} shows no view (screenshot {shot})"
        assert count >= visual.plots, (
            f"{spec.notebook} ({stage}): the cell with {visual.marker!r} shows {count} plotly figure(s), "
            f"expected {visual.plots}. Its output reads: {output.inner_text()[:500]!r} (screenshot {shot})"
        )
        counts[visual.marker] = count
    return counts


def _assert_no_broken_output(page, cells: list[dict], notebook: str, stage: str) -> None:
    errors = [(i, o) for i, c in enumerate(cells) for o in c["outputs"] if o.get("output_type") == "error"]
    assert not errors, f"{notebook} ({stage}): cell {errors[0][0]} raised {errors[0][1].get('ename')}: " \
                       f"{errors[0][1].get('evalue')}"
    page_text = page.locator(".jp-Notebook").inner_text()
    assert "Error displaying widget" not in page_text, f"{notebook} ({stage}): 'Error displaying widget' shown"
    raw = _raw_reprs(cells)
    assert not raw and "FigureWidget(" not in page_text, \
        f"{notebook} ({stage}): a raw FigureWidget(...) repr is shown instead of a figure (cells {raw})"


def _interact(page, index: int, kind: str, notebook: str) -> None:
    """Move the cell's first slider (drag its handle) or pick the next dropdown option; the cell's
    output (text and figures) must change."""
    cell = _cell(page, index)
    output = cell.locator(".jp-Cell-outputArea")

    def state() -> str:
        plots = output.locator(".js-plotly-plot")
        data = [plots.nth(i).evaluate("gd => JSON.stringify([gd.data, gd.layout.title])") for i in range(plots.count())]
        return output.inner_text() + "".join(data)

    before = state()
    if kind == "slider":
        handle = output.locator(".widget-slider .noUi-handle").first
        assert handle.count() == 1, f"{notebook}: the cell has no slider"
        handle.scroll_into_view_if_needed()
        box = handle.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] / 2 - 80, box["y"] + box["height"] / 2, steps=6)
        page.mouse.up()
    else:
        select = output.locator(".widget-dropdown select").first
        assert select.count() == 1, f"{notebook}: the cell has no dropdown"
        options = select.locator("option")
        assert options.count() >= 2, f"{notebook}: the dropdown has a single option"
        select.select_option(index=1)
    deadline = time.time() + 30
    while time.time() < deadline:
        if state() != before:
            return
        time.sleep(0.5)
    pytest.fail(f"{notebook}: moving the {kind} of the cell with index {index} changed nothing in its output")


def _widget_outputs(state: dict, model_id: str, seen: set | None = None) -> list[dict]:
    """The outputs held by the Output widgets in the saved widget state under ``model_id``."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in state:
        return []
    seen.add(model_id)
    model = state[model_id]["state"]
    found = list(model.get("outputs", []))
    for value in model.values():
        for ref in value if isinstance(value, list) else [value]:
            if isinstance(ref, str) and ref.startswith("IPY_MODEL_"):
                found += _widget_outputs(state, ref[len("IPY_MODEL_"):], seen)
    return found


def _assert_saved_outputs(path: Path, spec: Spec) -> None:
    """The .ipynb on disk: every visual's cell keeps what it showed in a form drawn with no kernel:
    ordinary outputs (a plotly figure, HTML) or, for an explorer, the saved state of its widgets."""
    nb = json.loads(path.read_text())
    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for visual in spec.visuals:
        cell = next(c for c in cells if visual.marker in "".join(c["source"]))
        outputs = [o for o in cell["outputs"] if o.get("output_type") in ("display_data", "execute_result")]
        for o in list(outputs):
            view = o.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            if view:
                assert view["model_id"] in state, \
                    f"{path.name}: a widget of the cell with {visual.marker!r} is not in the saved widget state"
                outputs += _widget_outputs(state, view["model_id"])
        figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
        views = [o for o in outputs if {"application/vnd.plotly.v1+json", "text/html"} & set(o.get("data", {}))]
        assert len(figures) >= visual.plots and views, (
            f"{path.name}: the saved cell with {visual.marker!r} keeps {len(figures)} plotly figure(s) "
            f"(expected {visual.plots}) and {len(views)} view(s) that are drawn without a kernel")
        live_figures = [o for o in cell["outputs"] if "FigureWidget" in str(o.get("data", {}).get("text/plain", ""))]
        assert not live_figures, f"{path.name}: a live FigureWidget was left in the cell with {visual.marker!r}"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: Path(s.notebook).stem)
def test_solution_runs_renders_and_survives_a_reopen(lab, browser, spec):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    stem = Path(spec.notebook).stem
    try:
        _open(page, lab, spec.notebook)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        started = time.time()
        time.sleep(2)
        while page.evaluate(JS_BUSY):
            if time.time() - started > RUN_TIMEOUT_S:
                pytest.fail(f"{spec.notebook}: Run All did not finish in {RUN_TIMEOUT_S} s")
            time.sleep(1)
        cells = _cells(page)
        _assert_no_broken_output(page, cells, spec.notebook, "after Run All")
        shown = _assert_visuals(page, cells, spec, "run")

        for visual in spec.visuals:
            if visual.interact:
                index = _cell_index(cells, visual.marker)
                _interact(page, index, visual.interact, spec.notebook)
                _shot(_cell(page, index).locator(".jp-Cell-outputArea"), f"{stem}-{visual.interact}-moved-cell{index:03d}")

        # Save, stop the kernel, close the tab; then open the file again in a fresh page.
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(f"() => !({JS_CURRENT})().context.model.dirty", timeout=30_000)
        page.evaluate(f"async () => {{ await ({JS_CURRENT})().sessionContext.shutdown(); }}")
        page.evaluate("() => window.jupyterapp.commands.execute('application:close-all')")
        page.close()
        saved = ARTIFACTS / "saved" / Path(spec.notebook).name
        saved.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lab.root / spec.notebook, saved)  # kept for inspection
        _assert_saved_outputs(saved, spec)

        # A fresh kernel (no widget models in it) is started for the file before the page opens: the
        # widget manager of jupyterlab-manager 5 reads the saved widget state only when the kernel is
        # there as the page loads (if the kernel comes later it restores from the kernel alone and
        # shows "model not found"; re-running the cell mends it). Figures need no kernel at all.
        _start_session(lab, spec.notebook)
        page = context.new_page()
        page.on("pageerror", lambda exc: console_errors.append(str(exc)))
        _open(page, lab, spec.notebook)
        cells = _cells(page)
        assert any(c["outputs"] for c in cells), f"{spec.notebook}: the reopened notebook has no outputs"
        reopened = _assert_visuals(page, cells, spec, "reopened")
        for marker, count in shown.items():
            assert reopened[marker] >= count, \
                f"{spec.notebook}: the cell with {marker!r} showed {count} figure(s), {reopened[marker]} after reopening"
        _assert_no_broken_output(page, cells, spec.notebook, "reopened")
    finally:
        context.close()
    assert not console_errors, f"{spec.notebook}: JavaScript errors in the page: {console_errors[:3]}"
