"""The figures `make test-gpu` reports (scripts/test_gpu.sh): where the tiny world runs faster, and
GPT-2-sized costs on the GPU. Each run is a CLI command whose JSON summary is read from its last line;
this prints one JSON object on its last line.

- the tiny world, ``train-rlhf`` and ``train-grpo`` (6 phases each), on the CPU and on the GPU: seconds
  a phase (what the tiny world's default device should be);
- ``bench-memory``: one RLHF phase of a GPT-2-small-shaped policy (12 x 768, 50257 tokens, random
  weights, batch 64, 30 tokens) on the GPU: peak memory and seconds.
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


def main() -> dict:
    figures: dict = {"tiny_seconds_per_phase": {}}
    for name in ("train-rlhf", "train-grpo"):
        for device in ("cpu", "cuda"):
            run = command(name, "--world", "tiny", "--num-phases", "6", "--no-progress", "--device", device)
            figures["tiny_seconds_per_phase"][f"{name}@{device}"] = per_phase(run) or run.get("error")
    memory = command("bench-memory", "--modes", "chunked", "--device", "cuda")
    figures["gpt2_small_rlhf_phase"] = {k: v for k, v in memory.items() if k not in {"args"}}
    return figures


if __name__ == "__main__":
    print(json.dumps(main(), default=str))
