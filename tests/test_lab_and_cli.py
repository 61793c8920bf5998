"""The two front doors: `make lab` serves JupyterLab, and the command line prints a JSON last line."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_lab_serves_the_lab_rooted_at_the_repository():
    port = _free_port()
    args = f"--no-browser --port={port} --ip=127.0.0.1 --ServerApp.token= --ServerApp.password="
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_ARGS={args}", f"PYTHON={sys.executable}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline, status = time.time() + 90, None
        while time.time() < deadline and status is None:
            if proc.poll() is not None:
                pytest.fail(f"make lab exited early:\n{proc.stdout.read().decode()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=5) as response:
                    status, body = response.status, response.read().decode()
            except OSError:
                time.sleep(1)
        assert status == 200, "JupyterLab did not answer on /lab within 90 s"
        assert "JupyterLab" in body
        # Rooted at the repository: the chapters and their solutions are both one click away.
        for path in ("chapters/03_rlhf_ppo.ipynb", "solutions/03_rlhf_ppo.ipynb"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/{path}?content=0", timeout=10) as r:
                assert r.status == 200 and json.loads(r.read())["type"] == "notebook", path
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            assert response.url.rstrip("/").endswith("/lab/tree/chapters"), "the lab opens on chapters/"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlhf_tutorial", *args], cwd=ROOT, capture_output=True, text=True)


def test_cli_help_lists_every_command():
    from rlhf_tutorial.cli import COMMANDS

    result = _cli("--help")
    assert result.returncode == 0
    for name in COMMANDS:
        assert name in result.stdout


def test_cli_unknown_command_is_an_error_with_usage():
    result = _cli("no-such-command")
    assert result.returncode == 2 and "unknown command" in result.stderr


def test_build_notebooks_check_prints_a_json_summary_last():
    result = _cli("build-notebooks", "--check")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["stale"] == [] and "00_setup_and_tour.py" in summary["sources"]


def test_an_unavailable_world_is_a_message_and_a_json_error_not_a_traceback():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "rlhf_tutorial", "world-info", "--world", "gpt2"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert "tiny" in summary["error"]


def test_every_command_takes_a_device_and_reports_it():
    """``--device`` (the course's device rule for one run) works with any command and is reported;
    a device this machine lacks is a message and a JSON error, not a traceback."""
    from rlhf_tutorial.cli import pop_device

    assert pop_device(["--world", "tiny", "--device", "cpu", "--x"]) == (["--world", "tiny", "--x"], "cpu")
    assert pop_device(["--device=cuda:1"]) == ([], "cuda:1")
    assert pop_device(["--world", "tiny"]) == (["--world", "tiny"], None)
    result = _cli("world-info", "--world", "tiny", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["device"] == "cpu"
    import torch

    if not torch.cuda.is_available():
        result = _cli("world-info", "--world", "tiny", "--device", "cuda")
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "no CUDA GPU" in json.loads(result.stdout.strip().splitlines()[-1])["error"]


@pytest.mark.parametrize("name", sorted(__import__("rlhf_tutorial.cli", fromlist=["COMMANDS"]).COMMANDS))
def test_every_commands_help_exits_0(name, capsys):
    """`python -m rlhf_tutorial <command> --help` is the first thing a newcomer types (a % in a field's
    help once broke argparse's formatting of train-rlhf's)."""
    import importlib

    from rlhf_tutorial.cli import COMMANDS

    module_name, func_name = COMMANDS[name][0].split(":")
    with pytest.raises(SystemExit) as done:
        getattr(importlib.import_module(module_name), func_name)(["--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_the_gpu_sweep_runs_or_names_every_command(tmp_path):
    """``make test-gpu`` runs every CLI command once on the GPU (scripts/gpu_cli.py); a command added to the
    CLI must join its list or its list of skips, with the reason."""
    import importlib.util

    from rlhf_tutorial.cli import COMMANDS

    spec = importlib.util.spec_from_file_location("gpu_cli", Path(__file__).resolve().parents[1] / "scripts" / "gpu_cli.py")
    gpu_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_cli)
    runs = gpu_cli.commands(tmp_path)
    assert all(argv[0] == name.split()[0] for name, argv in runs.items())
    covered = {name.split()[0] for name in runs} | {name.split()[0] for name in gpu_cli.SKIPPED}
    assert covered == set(COMMANDS), covered ^ set(COMMANDS)
    assert all(reason for reason in gpu_cli.SKIPPED.values())
    assert set(gpu_cli.OTHER_DEVICE) <= set(runs) and all(why for _, why in gpu_cli.OTHER_DEVICE.values())


def test_the_gpu_sweep_fails_a_command_that_reports_another_device():
    """A command passes the sweep only when its summary reports the device it was meant to run on: here
    ``world-info`` on the CPU passes as ``cpu`` and fails when ``cuda`` was expected of it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_cli", Path(__file__).resolve().parents[1] / "scripts" / "gpu_cli.py")
    gpu_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_cli)
    argv = ("world-info", "--world", "tiny", "--samples", "1")
    assert gpu_cli.run_one(argv, "cpu", 300)["ok"]
    wrong = gpu_cli.run_one(argv, "cpu", 300, expected="cuda")
    assert not wrong["ok"] and wrong["device"] == "cpu"
