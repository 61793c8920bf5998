"""Where the course runs: one device rule, stated once and followed everywhere.

**The rule.** :func:`course_device` is ``$RLHF_TUTORIAL_DEVICE`` when it is set (``cpu``, ``cuda``,
``cuda:1``, or ``simgpu``: the simulated GPU of :mod:`rlhf_tutorial.simgpu`, for tests), else ``cuda``
when torch sees a CUDA GPU, else ``cpu``. The loaders put models there; everything else (trainers,
widgets, reports, checkers, reference solutions) follows the device **of the model it is given**
(:func:`device_of`), never the rule again: a learner who moves a model keeps it where they put it.

Where an exercise creates a tensor or a module, it creates it on the device of its inputs
(``torch.zeros(n, device=x.device)``, ``nn.Linear(...).to(device_of(model))``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

ENV_VAR = "RLHF_TUTORIAL_DEVICE"


def course_device() -> torch.device:
    """The device the course puts its models on: ``$RLHF_TUTORIAL_DEVICE``, else CUDA when present,
    else the CPU."""
    wanted = os.environ.get(ENV_VAR, "").strip()
    if wanted:
        return resolve(wanted)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve(device: Any = None) -> torch.device:
    """``device`` as a ``torch.device`` (None: :func:`course_device`), with a clear error for a CUDA
    device on a machine without one, or an unknown name."""
    if device is None:
        return course_device()
    name = str(device)
    if name.split(":")[0] == "simgpu":
        from rlhf_tutorial import simgpu

        simgpu.install()
        return torch.device(name) if ":" in name else simgpu.sim_device()
    try:
        dev = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"unknown device {name!r} (use cpu, cuda, cuda:N, or set {ENV_VAR}): {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for, but torch sees no CUDA GPU here: use cpu "
                         f"(or unset {ENV_VAR})")
    return dev


def device_of(obj: Any) -> torch.device:
    """The device of a module (its first parameter or buffer), a tensor, or a TransformerLens model's
    ``cfg.device``; the CPU for a module with neither."""
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, torch.nn.Module):
        for tensor in obj.parameters():
            return tensor.device
        for tensor in obj.buffers():
            return tensor.device
    return torch.device("cpu")


def rng_devices(device: Any = None) -> list[torch.device]:
    """The devices whose random state ``torch.random.fork_rng(devices=...)`` must save and restore
    around a seeded draw on ``device`` (default: the course's): a CUDA device samples from its own
    generator; the CPU (and the simulated GPU) from the CPU's, which fork_rng always restores."""
    dev = resolve(device) if not isinstance(device, torch.device) else device
    return [dev] if dev.type == "cuda" else []


def describe(device: Any = None) -> str:
    """One line for a notebook's first cell: the device and what it is."""
    dev = resolve(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"device: {dev} ({torch.cuda.get_device_name(index)})"
    if dev.type == "simgpu":
        return f"device: {dev} (a simulated GPU on the CPU: a test tool that catches mixed-device bugs)"
    return f"device: {dev} ({torch.get_num_threads()} torch threads)"


def same_device(a: torch.device, b: torch.device) -> bool:
    """Equal devices, reading a missing index as the current one (``cuda`` is ``cuda:0``)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)
