"""Install packages into the running Python with uv when it can be had, else with pip (``make`` runs it).

``python scripts/install.py [pip-install arguments]``, for example ``-c requirements/lock.txt -e ".[dev]"``
(standard library only: it runs before anything else is installed, in the venv's Python):

* uv (``UV_SPEC``, pinned) is put into the venv with pip unless it is there at that version, then
  ``python -m uv pip install --python <this Python> <arguments>`` installs. uv resolves and unpacks the
  course's ~160 packages in parallel: about 30 s on a 2-core machine, bytecode compiled, where pip takes
  about 2 min.
* The torch already installed stays exactly as it is: uv is given the constraint ``torch==<installed
  version>`` (scripts/install_torch.py installed the right build first), so no resolution can swap it for
  another build (on Linux, PyPI's default is the CUDA one: several GB).
* uv reads no pip configuration (``pip.conf``, ``PIP_INDEX_URL``, ...): where packages come only from an
  index set there, or uv cannot be installed, or it fails for any reason, the same arguments go to pip,
  which does read it. ``RLHF_TUTORIAL_INSTALLER=pip`` asks for pip from the start.

Bytecode is compiled at install time (uv's ``--compile-bytecode``, on every core; pip compiles as it
installs): where ``PYTHONDONTWRITEBYTECODE`` is set, as on this project's CI machines, no import writes it,
and without it every process would compile its modules from source again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib import metadata

UV_SPEC = "uv==0.13.8"


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def ensure_uv(spec: str = UV_SPEC) -> bool:
    """Whether ``python -m uv`` at ``spec``'s version can run here (pip-installing it if needed)."""
    wanted = spec.partition("==")[2]
    if installed_version("uv") != wanted:
        print(f"[install] {spec} with pip, to install the rest", flush=True)
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--progress-bar", "off", "-q", spec])
        if done.returncode != 0:
            return False
    return subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True).returncode == 0


def commands(args: list[str], installer: str, torch_pin: str | None) -> list[list[str]]:
    """The install commands to try, in order (the next only if the previous failed)."""
    pip = [sys.executable, "-m", "pip", "install", "--progress-bar", "on", *args]
    if installer == "pip":
        return [pip]
    keep_torch = ["-c", torch_pin] if torch_pin else []
    uv = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, "--compile-bytecode"]
    return [[*uv, *keep_torch, *args], pip]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    installer = os.environ.get("RLHF_TUTORIAL_INSTALLER", "uv")
    if installer not in {"uv", "pip"}:
        print(f"RLHF_TUTORIAL_INSTALLER={installer!r}: uv or pip", file=sys.stderr)
        return 2
    if installer == "uv" and not ensure_uv():
        print("[install] uv is not available here: pip installs instead", flush=True)
        installer = "pip"
    torch = installed_version("torch")
    with tempfile.TemporaryDirectory() as tmp:
        torch_pin = None
        if torch:
            torch_pin = os.path.join(tmp, "keep-torch.txt")
            with open(torch_pin, "w") as f:
                f.write(f"torch=={torch}\n")
        todo = commands(args, installer, torch_pin)
        for i, cmd in enumerate(todo):
            print(f"[install] {' '.join(cmd[2:])}", flush=True)
            if subprocess.run(cmd).returncode == 0:
                return 0
            if i + 1 < len(todo):
                print("[install] uv failed (it reads no pip configuration): the same with pip", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
