"""Where the tiny world's tuned policy lives: chapter 03's RLHF run towards negative reviews, shipped for
chapter 05 in ``tiny/artifacts/tuned_neg/`` (policy and value head, safetensors, in the manifest).

``python -m rlhf_tutorial build-tuned --world tiny`` (``trainers.interp_report.build_tuned_main``)
trains and writes it; chapter 05 loads it with ``trainers.interp_report.load_pair``, so it never depends
on another notebook having been run. A rebuild gives the shipped bytes only on the shipping machine's
kernels; elsewhere its reward and KL land within :data:`REBUILD_BANDS` (``tests/test_rebuild.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TUNED_NAME = "tuned_neg"

#: CPU kernel settings that reproduce another CPU's rounding on one machine (environment variables read
#: by torch, oneDNN and MKL at start-up; a level the CPU lacks is ignored). "native" is what the CPU offers.
KERNEL_SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx2-mkl": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default"},
    "default-mkl": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41",
                    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def tuned_dir() -> Path:
    """The shipped tuned checkpoint of the tiny world (``$RLHF_TUTORIAL_TINY_DIR`` is honoured)."""
    from rlhf_tutorial.worlds import WorldUnavailable, tiny_dir

    folder = tiny_dir() / TUNED_NAME
    if not (folder / "policy.safetensors").exists():
        raise WorldUnavailable(f"The tiny world's tuned policy is missing from {folder}. Rebuild it with "
                               "`python -m rlhf_tutorial build-tuned --world tiny` (about a minute).")
    return folder


#: Where ``build-tuned --world tiny --seed 0`` lands on any CPU: ``(low, high)`` of its evaluation (128
#: samples, seed 1) after the 50 phases. The same seed gives the same bytes on one machine, but each CPU's
#: kernels round differently and 50 RL phases amplify it, so the weights differ across machines and these
#: figures move. Measured on 2026-11-26 with ``scripts/measure_rebuild_bands.py`` (torch 2.13.0+cpu, the
#: locked stack, one thread; every setting below rebuilt on one AMD EPYC with AVX-512, forced down with
#: the environment variables of ``KERNEL_SETTINGS``; every run gave other weights, seven outcomes):
#:   setting       kernels (torch / oneDNN / MKL)   reward   KL
#:   shipped       another machine, not recorded    0.9617   0.3071
#:   native        AVX512 / AVX512                  0.9497   0.2885   (5 runs and aten-avx512: the same bytes)
#:   onednn-avx2   AVX512 / AVX2                    0.9471   0.3138
#:   aten-avx2     AVX2 / AVX512                    0.9433   0.3258
#:   avx2          AVX2 / AVX2                      0.9649   0.2358   (avx2-mkl, MKL AVX2 too: the same bytes)
#:   default       DEFAULT / AVX512                 0.9544   0.2756
#:   default-mkl   DEFAULT / SSE41 / SSE4_2         0.9289   0.3368
#: Measured spread: reward 0.929-0.965, KL 0.236-0.337; each band adds half the spread on either side (for
#: kernels not tried: ARM, Intel's MKL paths), rounded outwards.
#: Those runs (and the shipped policy) sampled with TransformerLens's generate. Since ``RLHFArgs.fast`` is on by
#: default (issue 23) a rebuild samples with the harness's sampler, which draws other tokens: on the native
#: AVX-512 kernels above it lands at reward 0.9191, KL 0.3048 (one run, 2026-11-26), within the bands, so the
#: shipped policy was kept (chapter 05's figures are of it).
REBUILD_BANDS: dict[str, tuple[float, float]] = {
    "mean_reward_final": (0.90, 0.99),
    "kl_final": (0.18, 0.39),
}


def band_problems(summary: dict[str, Any]) -> list[str]:
    """Each figure of a ``build-tuned`` summary (or ``rlhf_config.json``) outside :data:`REBUILD_BANDS`,
    as a sentence; empty when the run landed where every measured CPU's did."""
    return [f"{key} {summary[key]} is outside [{low}, {high}]"
            for key, (low, high) in REBUILD_BANDS.items() if not low <= summary[key] <= high]


def other_kernel_setting(native: str) -> str | None:
    """A name in :data:`KERNEL_SETTINGS` whose kernel level differs from ``native`` (what
    ``torch.backends.cpu.get_cpu_capability()`` reports): AVX2 kernels on an AVX-512 machine, none on an
    AVX2 one; None where no lower x86 level can be forced (already DEFAULT, or another architecture)."""
    return {"AVX512": "avx2", "AVX2": "default"}.get(native)


def rebuild_in_subprocess(out: str | Path, kernel_env: dict[str, str] | None = None, seed: int = 0,
                          timeout: float | None = None) -> dict[str, Any]:
    """Run ``build-tuned --out OUT`` in a fresh Python with ``kernel_env`` added to the environment (the
    kernel level is chosen when torch loads, so it takes a new process). Returns its JSON summary, which
    names the kernel level it ran on (``cpu_capability``) and the digest of the weights (``policy_sha256``)."""
    env = {**os.environ, **(kernel_env or {})}
    cmd = [sys.executable, "-m", "rlhf_tutorial", "build-tuned", "--out", str(out), "--seed", str(seed), "--no-progress",
           "--device", "cpu"]  # the bands are the CPU's: the shipped policy is a CPU build
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"build-tuned failed ({run.returncode}) with {kernel_env}: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])
