"""How an artifact was built: library versions, the torch build, the CPU and its kernel level.

The builders (``build-tiny``'s ``metadata.json``, ``build-tuned``'s ``rlhf_config.json``) record
:func:`build_info`, and ``world-info`` shows it. Why it matters: the same seed gives the same bytes on one
machine, but another CPU's kernels round differently (AVX-512 vs AVX2 vs none), and an RL run amplifies
the difference; see ``rlhf_tutorial.tiny.tuned.REBUILD_BANDS``. The kernel level can be forced down for a
run with the environment variables in :data:`KERNEL_ENV` (``ATEN_CPU_CAPABILITY=avx2``: torch's own
kernels; ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's; ``MKL_ENABLE_INSTRUCTIONS=AVX2``: MKL's matrix products).
"""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

#: The distributions whose versions an artifact records.
LIBRARIES = ("torch", "transformers", "transformer-lens", "numpy", "safetensors", "tokenizers")
#: Environment variables that choose the CPU kernels a run uses (recorded when set).
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")
#: What :func:`describe` says of an artifact built before its builder recorded any of this.
NOT_RECORDED = "not recorded (built before the builders recorded library versions, torch build and CPU)"


def library_versions() -> dict[str, str | None]:
    """Installed version of each of :data:`LIBRARIES` (None when not installed)."""
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware")) and ":" in line:
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def torch_build() -> dict[str, Any]:
    """torch's version, its CUDA version (None for a CPU build), the CPU kernel level it dispatches to
    here (``DEFAULT``, ``AVX2``, ``AVX512``...) and its intra-op thread count."""
    import torch

    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}


def build_info() -> dict[str, Any]:
    """Everything above for the running process: what a builder writes into its artifact's metadata."""
    return {
        "libraries": library_versions(),
        "torch_build": torch_build(),
        "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
    }


def describe(record: dict[str, Any] | None, **known: Any) -> dict[str, Any]:
    """An artifact's recorded build info; when it has none, :data:`NOT_RECORDED` with whatever else the
    artifact did record (``known``, e.g. the tiny world's ``torch_version``)."""
    return record if record else {"build_info": NOT_RECORDED, **known}


def artifact_records(folder: str | Path) -> dict[str, dict[str, Any]]:
    """What each artifact in a world's folder recorded of its build, keyed by its path in the folder: the
    world's ``metadata.json`` (``build-tiny``, which also kept ``torch_version`` before it recorded more)
    and every tuned policy's ``*/rlhf_config.json`` (``build-tuned``), through :func:`describe`."""
    folder = Path(folder)
    records = {}
    for path in [folder / "metadata.json", *sorted(folder.glob("*/rlhf_config.json"))]:
        if path.exists():
            record = json.loads(path.read_text())
            known = {"torch_version": record["torch_version"]} if "torch_version" in record else {}
            records[path.relative_to(folder).as_posix()] = describe(record.get("build_info"), **known)
    return records
