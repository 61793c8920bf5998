"""Packaging: environment.yml and pyproject.toml list the same packages; the README names the pins; the
installed packages are the lock of what CI passed (requirements/lock.txt)."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_and_pyproject_list_the_same_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = {_name(r) for r in project["dependencies"] + extras["dev"] + extras["trl"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_name(r) for r in pip_section if not r.startswith("-e")}
    assert listed == declared


def test_transformer_lens_is_pinned_below_4_and_the_readme_says_so():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pin = next(r for r in project["dependencies"] if _name(r) == "transformer-lens")
    assert "==3." in pin
    assert pin.split("==")[1].split()[0] in (ROOT / "README.md").read_text()


def test_makefile_pins_torch():
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()


# --- the lock of what CI passed (requirements/lock.txt, scripts/lock.py) ------------------------------------
LOCK = ROOT / "requirements" / "lock.txt"
_spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts" / "lock.py")
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)


def test_the_installed_packages_are_the_locked_set():
    """What `make install` gives on any machine: every installed package at its locked version, none
    outside the lock (torch, pip and the course aside: see scripts/lock.py)."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if lock.lock_python(LOCK) != python:
        pytest.skip(f"the lock was resolved with Python {lock.lock_python(LOCK)}, this is {python}")
    problems = lock.differences(lock.read_lock(LOCK), lock.installed())
    assert not problems, "\n".join(problems) + "\n`make clean install` installs the locked set"


def test_the_lock_check_finds_another_version_and_an_unlisted_package():
    pins = {"numpy": "2.4.6", "trl": "1.16.0"}
    assert lock.differences(pins, {"numpy": "2.4.6"}) == []  # an extra not installed is no difference
    problems = lock.differences(pins, {"numpy": "2.5.0", "left-pad": "1.0"})
    assert problems == ["numpy 2.5.0 is installed, the lock has 2.4.6", "left-pad 1.0 is installed but not in the lock"]
    assert lock.canonical("Charset_Normalizer") == lock.canonical("charset-normalizer")
    assert lock.locked_out("torch") and lock.locked_out("nvidia-cublas-cu12") and not lock.locked_out("numpy")


def test_the_lock_pins_exactly_what_pyproject_pins_and_leaves_torch_to_the_makefile():
    pins = lock.read_lock(LOCK)
    assert "torch" not in pins and "rlhf-tutorial" not in pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"] + project["optional-dependencies"]["trl"]:
        if "==" in requirement:
            name, version = requirement.split("#")[0].split("==")
            assert pins[lock.canonical(name)] == version.strip(), requirement
    declared = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    assert declared - {"torch"} <= set(pins), "every declared package is locked"


def test_makefile_installs_the_locked_set():
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCK := requirements/lock.txt" in makefile
    assert makefile.count("-c $(LOCK)") == 2  # the course with its dev extra, then the TRL extra
    assert "scripts/lock.py write $(LOCK)" in makefile  # make lock
