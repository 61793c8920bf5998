"""Install the pinned torch into the running Python, the right build for this machine (``make`` runs it).

``python scripts/install_torch.py [--spec torch==2.13.0] [--dry-run]`` (standard library only: it runs
before anything else is installed):

* an NVIDIA GPU (``nvidia-smi -L`` lists one, or the driver exposes one under /proc): the default index
  (pip's configured one, usually PyPI), whose Linux wheel is the CUDA build;
* no NVIDIA GPU and PyTorch's CPU index answers within a few seconds: the CPU build from
  ``https://download.pytorch.org/whl/cpu`` (about 200 MB instead of several GB of CUDA packages);
* no NVIDIA GPU and that index does not answer (offline, a firewall, a mirror-only machine): the default
  index. If the CPU index fails halfway, the default index is tried too.

The probe runs in a daemon thread that is abandoned after ``PROBE_TIMEOUT_S``: a name lookup that hangs
cannot hold up the install. pip shows its progress bar (nothing is run with ``--quiet``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import urllib.request
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5.0
DEFAULT_SPEC = "torch==2.13.0"


def has_nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU with a driver (what a CUDA build of torch needs)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def index_answers(url: str = CPU_INDEX, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``url/torch/`` answers with a page listing torch wheels within ``timeout`` seconds."""
    result: list[bool] = []

    def attempt() -> None:
        try:
            with urllib.request.urlopen(f"{url}/torch/", timeout=timeout) as response:
                result.append(response.status == 200 and b"torch-" in response.read(1 << 16))
        except Exception:
            result.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout + 1)
    return bool(result and result[0])


def plan(spec: str, gpu: bool, cpu_index_ok: bool) -> tuple[str, list[list[str]]]:
    """Why, and the pip commands to try in order (the next only if the previous failed)."""
    # --no-compile: pip compiles the bytecode one file at a time (~25 s of its ~35 s); compile_bytecode then
    # compiles it on every core
    pip = [sys.executable, "-m", "pip", "install", "--progress-bar", "on", "--no-compile", spec]
    if gpu:
        return "an NVIDIA GPU is present: the default index (CUDA build on Linux)", [pip]
    if cpu_index_ok:
        return (f"no NVIDIA GPU and {CPU_INDEX} answers: the CPU build from there",
                [pip + ["--index-url", CPU_INDEX], pip])
    return (f"no NVIDIA GPU, and {CPU_INDEX} did not answer within {PROBE_TIMEOUT_S:g} s: the default index "
            "(on Linux it may pull the CUDA build, several GB)", [pip])


def compile_bytecode() -> None:
    """Compile the bytecode of what is installed (torch and its dependencies), on every core: ~10 s where
    pip's own compilation takes ~25 s. Installed ``.pyc`` files matter where ``PYTHONDONTWRITEBYTECODE``
    is set (as on this project's CI machines): there no import ever writes them, and every process would
    compile torch's modules again from source (importing the course: ~7 s -> ~15 s)."""
    site = sysconfig.get_paths()["purelib"]
    print(f"[install-torch] compiling the bytecode of {site}", flush=True)
    # a few files in some packages are not Python 3 (kept as data): compileall reports them and goes on
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", site], stdout=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=os.environ.get("TORCH_SPEC", DEFAULT_SPEC))
    parser.add_argument("--dry-run", action="store_true", help="print the plan, install nothing")
    args = parser.parse_args(argv)
    if "==" not in args.spec:
        print(f"refusing an unpinned torch ({args.spec!r}): pass --spec torch==X.Y.Z", file=sys.stderr)
        return 2
    gpu = has_nvidia_gpu()
    why, commands = plan(args.spec, gpu, cpu_index_ok=False if gpu else index_answers())
    print(f"[install-torch] {args.spec}: {why}", flush=True)
    for i, cmd in enumerate(commands):
        print(f"[install-torch] {' '.join(cmd[1:])}", flush=True)
        if args.dry_run:
            continue
        if subprocess.run(cmd).returncode == 0:
            compile_bytecode()
            return 0
        if i + 1 < len(commands):
            print("[install-torch] that failed; trying the default index", flush=True)
    return 0 if args.dry_run else 1


if __name__ == "__main__":
    sys.exit(main())
