"""The figures `make test-gpu` reports (scripts/test_gpu.sh): where the tiny world runs faster, and
GPT-2-sized costs on the GPU. Each run is a CLI command whose JSON summary is read from its last line;
this prints one JSON object on its last line.

- the tiny world, ``train-rlhf`` and ``train-grpo`` (6 phases each), on the CPU and on the GPU: seconds
  a phase (what the tiny world's default device should be);
- ``bench-memory``: one RLHF phase of a GPT-2-small-shaped policy (12 x 768, 50257 tokens, random
  weights, batch 64, 30 tokens) on the GPU: peak memory and seconds;
- ``bench-trl --algo grpo --size gpt2 --device cuda``: the GRPO race against TRL on the same policy, 64
  completions of 30 tokens a phase (``bench_trl.GPT2_GPU_SIZES``), seeds 0 and 1: seconds a phase with the
  split, peak memory, ours / TRL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def command(*args: str) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rlhf_tutorial", *args], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        summary = {"error": (done.stderr or done.stdout)[-600:]}
    summary["command_seconds"] = round(time.perf_counter() - start, 1)
    return summary


def per_phase(summary: dict) -> float | None:
    if "wall_seconds" not in summary or not summary.get("phases"):
        return None
    return round(summary["wall_seconds"] / summary["phases"], 3)


#: The figures, in the order they run; ``python scripts/gpu_figures.py [NAME ...]`` runs some of them.
FIGURES = ("tiny", "memory", "race")


def main(names: list[str]) -> dict:
    names = names or list(FIGURES)
    unknown = set(names) - set(FIGURES)
    if unknown:
        raise SystemExit(f"unknown figures {sorted(unknown)}: choose from {FIGURES}")
    figures: dict = {}
    if "tiny" in names:
        figures["tiny_seconds_per_phase"] = {}
        for name in ("train-rlhf", "train-grpo"):
            for device in ("cpu", "cuda"):
                run = command(name, "--world", "tiny", "--num-phases", "6", "--no-progress", "--device", device)
                figures["tiny_seconds_per_phase"][f"{name}@{device}"] = per_phase(run) or run.get("error")
    if "memory" in names:
        memory = command("bench-memory", "--modes", "chunked", "--device", "cuda")
        figures["gpt2_small_rlhf_phase"] = {k: v for k, v in memory.items() if k not in {"args"}}
    if "race" in names:
        figures.update(race())
    import torch

    figures["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    figures["torch"] = torch.__version__
    return figures


def race() -> dict:
    """The GRPO race against TRL at GPT-2 small's shape on the GPU (``$GPU_RACE_SEEDS``, default 0 1)."""
    import os

    seeds = os.environ.get("GPU_RACE_SEEDS", "0 1").split()
    race = command("bench-trl", "--algo", "grpo", "--size", "gpt2", "--device", "cuda", "--seeds", *seeds)
    keep = ("device", "median", "median_seconds_per_phase_split", "ratio_ours_over_trl", "trl_version", "policy",
            "error", "command_seconds")
    out = {k: race[k] for k in keep if k in race}
    out["sizes"] = {k: race.get("settings", {}).get(k) for k in
                    ("groups_per_phase", "group_size", "max_new_tokens", "num_phases")}
    out["per_seed"] = {side: [{k: r.get(k) for k in ("seed", "seconds_per_phase", "peak_memory_mb")}
                              for r in race.get("runs", {}).get(side, [])] for side in ("ours", "trl")}
    return {"gpt2_small_grpo_race": out}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), default=str))
