"""Packaging: environment.yml and pyproject.toml list the same packages; the README names the pins."""

import re
from pathlib import Path

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
