"""How torch and the course get installed: scripts/install_torch.py then scripts/install.py (run by make),
and the Colab path (torch already there, the course installed as a wheel on top of it)."""

import http.server
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_torch)
_spec = importlib.util.spec_from_file_location("install", ROOT / "scripts" / "install.py")
install = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(install)


def test_plan_per_machine():
    why, cmds = install_torch.plan("torch==2.13.0", gpu=True, cpu_index_ok=True)
    assert "GPU" in why and len(cmds) == 1 and "--index-url" not in cmds[0] and "torch==2.13.0" in cmds[0]
    why, cmds = install_torch.plan("torch==2.13.0", gpu=False, cpu_index_ok=True)
    assert cmds[0][-2:] == ["--index-url", install_torch.CPU_INDEX], "no GPU, index up: the CPU build first"
    assert "--index-url" not in cmds[1], "then the default index if that fails"
    why, cmds = install_torch.plan("torch==2.13.0", gpu=False, cpu_index_ok=False)
    assert len(cmds) == 1 and "--index-url" not in cmds[0] and "did not answer" in why
    assert all("--quiet" not in c and "on" == c[c.index("--progress-bar") + 1] for c in cmds), "progress is shown"


def test_an_unpinned_torch_is_refused(capsys):
    assert install_torch.main(["--spec", "torch", "--dry-run"]) == 2
    assert "unpinned" in capsys.readouterr().err


def test_a_failed_cpu_index_install_falls_back_to_the_default_index(monkeypatch):
    ran = []
    monkeypatch.setattr(install_torch, "has_nvidia_gpu", lambda: False)
    monkeypatch.setattr(install_torch, "index_answers", lambda: True)
    monkeypatch.setattr(install_torch.subprocess, "run",
                        lambda cmd, **_: ran.append(cmd) or subprocess.CompletedProcess(cmd, int(len(ran) == 1)))
    assert install_torch.main(["--spec", "torch==2.13.0"]) == 0
    assert len(ran) == 3 and "--index-url" in ran[0] and "--index-url" not in ran[1]
    assert all("--no-compile" in c for c in ran[:2]) and ran[2][1:3] == ["-m", "compileall"], \
        "pip unpacks, then the bytecode is compiled on every core (-j 0)"
    assert ran[2][ran[2].index("-j") + 1] == "0"


def test_the_course_installs_with_uv_keeping_torch_and_falls_back_to_pip():
    uv, pip = install.commands(["-c", "lock.txt", "-e", ".[dev]"], "uv", "/tmp/keep-torch.txt")
    assert uv[1:5] == ["-m", "uv", "pip", "install"] and uv[uv.index("--python") + 1] == sys.executable
    assert uv[uv.index("/tmp/keep-torch.txt") - 1] == "-c", "uv is held to the installed torch"
    assert uv[-4:] == pip[-4:] == ["-c", "lock.txt", "-e", ".[dev]"], "both get the same arguments"
    assert "--compile-bytecode" in uv and "--no-compile" not in pip, "both leave the bytecode compiled"
    assert pip[1:4] == ["-m", "pip", "install"]
    assert install.commands(["x"], "pip", None) == [[sys.executable, "-m", "pip", "install", "--progress-bar",
                                                     "on", "x"]]
    assert "-c" not in install.commands(["x"], "uv", None)[0], "no torch installed: nothing to hold"


def test_a_failed_uv_install_runs_pip_and_a_bad_installer_is_refused(monkeypatch, capsys):
    ran = []
    monkeypatch.setenv("RLHF_TUTORIAL_INSTALLER", "uv")
    monkeypatch.setattr(install, "ensure_uv", lambda: True)
    monkeypatch.setattr(install.subprocess, "run",  # uv fails, pip succeeds
                        lambda cmd: ran.append(cmd) or subprocess.CompletedProcess(cmd, int(cmd[2] == "uv")))
    assert install.main(["-e", "."]) == 0
    assert [c[2] for c in ran] == ["uv", "pip"] and "pip" in capsys.readouterr().out
    ran.clear()
    monkeypatch.setattr(install, "ensure_uv", lambda: False)  # uv cannot be had: pip alone
    assert install.main(["-e", "."]) == 0 and [c[2] for c in ran] == ["pip"]
    monkeypatch.setenv("RLHF_TUTORIAL_INSTALLER", "conda")
    assert install.main(["-e", "."]) == 2 and "uv or pip" in capsys.readouterr().err


class _Index(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        status = 200 if self.path == "/whl/cpu/torch/" else 404
        self.send_response(status)
        self.end_headers()
        self.wfile.write(self.body if status == 200 else b"")

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("body, expected", [(b'<a href="torch-2.13.0+cpu-cp311.whl">torch</a>', True),
                                            (b"<html>captive portal</html>", False)])
def test_probe_reads_an_index_page(body, expected):
    handler = type("Handler", (_Index,), {"body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert install_torch.index_answers(f"http://127.0.0.1:{server.server_port}/whl/cpu", timeout=5) is expected
        assert install_torch.index_answers(f"http://127.0.0.1:{server.server_port}/other", timeout=5) is False
    finally:
        server.shutdown()


def test_probe_gives_up_on_a_server_that_never_answers():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts the connection, never sends a byte
    try:
        assert install_torch.index_answers(f"http://127.0.0.1:{silent.getsockname()[1]}/whl/cpu", timeout=0.5) is False
    finally:
        silent.close()
    assert install_torch.index_answers("https://download.pytorch.invalid/whl/cpu", timeout=0.5) is False


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~150 s on a busy 2-core machine: two pip installs, a wheel build, chapter 00 (<= 900 s)
def test_colab_path_keeps_the_installed_torch_and_runs_chapter_00(tmp_path):
    """A clean venv with torch already installed (as on Colab), then the course as a wheel built from this
    checkout: torch stays as it was, and chapter 00's solution runs in the tiny world under nbval."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check", "--no-compile"]
    subprocess.run([*pip, "torch==2.13.0"], check=True, capture_output=True, text=True)
    probe = "import torch, pathlib; print(torch.__version__, pathlib.Path(torch.__file__).stat().st_mtime_ns)"
    before = subprocess.run([py, "-c", probe], check=True, capture_output=True, text=True).stdout

    src = tmp_path / "src"  # a copy of the checkout's tracked files: no stale build/ or egg-info
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(src)], check=True, capture_output=True, text=True)
    wheel = next((tmp_path / "dist").glob("rlhf_tutorial-*.whl"))
    install = subprocess.run([*pip, str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    assert "Uninstalling torch" not in install.stdout and "torch-" not in install.stdout.split("Successfully installed")[-1]
    after = subprocess.run([py, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert after == before, "installing the course must keep the torch that was there"

    work = tmp_path / "run"  # outside the checkout: the course is imported from the installed wheel
    work.mkdir()
    shutil.copy(ROOT / "solutions" / "00_setup_and_tour.ipynb", work)
    env = {**os.environ, "RLHF_TUTORIAL_WORLD": "tiny", "RLHF_TUTORIAL_STRICT": "1", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([py, "-c", "import rlhf_tutorial, json; print(json.dumps(rlhf_tutorial.__file__))"],
                           cwd=work, env=env, check=True, capture_output=True, text=True).stdout
    assert str(venv) in json.loads(where), "the notebook must run against the installed wheel"
    run = subprocess.run([py, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider", "-q",
                          "00_setup_and_tour.ipynb"], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:]
