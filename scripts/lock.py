"""The lock of what CI passed (``requirements/lock.txt``): write it from a venv, or check a venv against it.

``python scripts/lock.py write requirements/lock.txt``  what this Python has installed, as exact pins
``python scripts/lock.py check requirements/lock.txt``  exit 1 and list every difference, if any

Standard library only. The lock is a pip constraints file: ``make install`` installs with ``-c`` on it, so
every machine gets exactly these versions (``make lock`` refreshes it on purpose, then runs the suite).
Left out of the lock, and of the check: :data:`UNLOCKED` (torch is pinned by the Makefile's
``TORCH_SPEC``; pip is the venv's own and uv the installer, pinned by scripts/install.py; the course is
installed editable) and the CUDA packages that come with a CUDA build of torch (:data:`TORCH_CUDA_PREFIXES`,
fixed by torch's own pin). The lock names the Python it was resolved with (``# python: 3.11``): another
Python may need other packages (backports).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

UNLOCKED = ("torch", "pip", "uv", "rlhf-tutorial")
TORCH_CUDA_PREFIXES = ("nvidia-", "triton", "cuda-")
HEADER = """\
# What `make test` passed with: exact versions of everything in the venv (pip constraints).
# `make install` installs with `-c` on this file; `make lock` refreshes it on purpose (a fresh venv
# resolved without it, then the whole suite); `python scripts/lock.py check` compares a venv with it.
# Not listed: torch (pinned by the Makefile's TORCH_SPEC), pip, uv, the course itself, CUDA packages.
# python: {python}
"""


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503: case and runs of -_. do not matter)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_out(name: str) -> bool:
    """Whether ``name`` is left out of the lock (see the module's docstring)."""
    name = canonical(name)
    return name in UNLOCKED or name.startswith(TORCH_CUDA_PREFIXES)


def read_lock(path: str | Path) -> dict[str, str]:
    """``{canonical name: version}`` of a lock file's ``name==version`` lines."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            if not sep:
                raise ValueError(f"{path}: not an exact pin: {line!r}")
            pins[canonical(name)] = version.strip()
    return pins


def lock_python(path: str | Path) -> str | None:
    """The Python (``major.minor``) the lock was resolved with, from its ``# python:`` line."""
    match = re.search(r"^# python: (\S+)", Path(path).read_text(), re.MULTILINE)
    return match.group(1) if match else None


def installed() -> dict[str, str]:
    """``{canonical name: version}`` of every distribution this Python can import, minus the unlocked."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():  # in sys.path order: the first one found is the one imported
        found.setdefault(canonical(dist.metadata["Name"]), dist.version)
    return {name: version for name, version in sorted(found.items()) if not locked_out(name)}


def differences(lock: dict[str, str], have: dict[str, str]) -> list[str]:
    """What keeps ``have`` from being the locked set: a locked package at another version, or an installed
    package the lock does not list. A locked package that is not installed is no difference (the lock
    also covers the extras, such as ``trl``, which ``make install`` alone does not install)."""
    found = [f"{name} {version} is installed, the lock has {lock[name]}"
             for name, version in have.items() if name in lock and lock[name] != version]
    found += [f"{name} {version} is installed but not in the lock" for name, version in have.items() if name not in lock]
    return found


def write(path: str | Path) -> int:
    """Write the lock from what this Python has installed."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    pins = [f"{name}=={version}" for name, version in installed().items()]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(HEADER.format(python=python) + "\n".join(pins) + "\n")
    print(f"[lock] {len(pins)} pins written to {path} (Python {python})")
    return 0


def check(path: str | Path) -> int:
    """Print every difference between this Python's packages and the lock; 1 if there is any."""
    problems = differences(read_lock(path), installed())
    for problem in problems:
        print(f"[lock] {problem}", file=sys.stderr)
    if problems:
        print(f"[lock] the venv is not the locked set of {path}: `make clean install` installs it", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in {"write", "check"}:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return write(argv[1]) if argv[0] == "write" else check(argv[1])


if __name__ == "__main__":
    sys.exit(main())
