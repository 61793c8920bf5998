"""Every command of the CLI, once, at a small size, on one device (``make test-gpu`` runs it with ``cuda``).

Each command runs in a fresh process as a learner types it (``python -m rlhf_tutorial NAME ... --device
DEVICE``); it passes when it exits 0 and its last-line JSON summary reports the device it was given. The
commands the unit suite already runs through the same entry point are here too, so that one list answers
"does each command run on this device". Not here, with the reason in ``SKIPPED``: the world builders and
``build-tuned`` (full-length builds pinned to their own settings), the races that need an extra TRL
(``bench-trl --algo ppo``) and the commands that touch no model. A command that reports another device by
design (``OTHER_DEVICE``, with the reason) passes when it reports that one.

    python scripts/gpu_cli.py [--device cuda] [--jobs 4]

The last line is a JSON object: per command ``ok`` / the error's tail, seconds, and the counts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TINY = ("--world", "tiny")
QUIET = ("--no-progress",)


def commands(tmp: Path) -> dict[str, tuple[str, ...]]:
    """Each command's small run (argv after ``python -m rlhf_tutorial``)."""
    return {
        "world-info": ("world-info", *TINY, "--samples", "2"),
        "train-rlhf": ("train-rlhf", *TINY, "--num-phases", "2", "--batch-size", "16", "--eval-samples", "8"),
        "train-grpo": ("train-grpo", *TINY, "--num-phases", "2", "--groups-per-phase", "2", *QUIET),
        "train-dpo": ("train-dpo", *TINY, "--num-pairs", "16", "--rounds", "1", "--eval-samples", "8",
                      "--eval-samples-per-round", "8", *QUIET),
        "train-reward-model": ("train-reward-model", *TINY, "--epochs", "1", "--max-train-pairs", "64",
                               "--max-test-pairs", "32"),
        "train-ppo": ("train-ppo", "--env-id", "CartPole-v1", "--total-timesteps", "1024", *QUIET),
        "train-sft": ("train-sft", *TINY, "--n-demonstrations", "64", "--epochs", "1", "--eval-problems", "8",
                      "--eval-samples", "2", *QUIET),
        "train-rejection-sampling": ("train-rejection-sampling", *TINY, "--n-demonstrations", "64", "--epochs", "1",
                                     "--rs-rounds", "1", "--rs-prompts", "8", "--rs-samples", "2",
                                     "--eval-problems", "8", "--eval-samples", "2", *QUIET),
        "pass-at-k": ("pass-at-k", *TINY, "--samples", "4", "--problems", "8", *QUIET),
        "overoptimization": ("overoptimization", *TINY, "--rm-train-pairs", "64", "--rm-epochs", "1",
                             "--rm-test-pairs", "32", "--num-phases", "2", "--batch-size", "16", *QUIET),
        "frontier": ("frontier", *TINY, "--methods", "ppo", "dpo", "--ppo-kl-coefs", "0.1", "--dpo-betas", "0.1",
                     "--rl-phases", "2", "--dpo-rounds", "1", "--dpo-pairs", "16", "--eval-samples", "8", *QUIET),
        "interp-report": ("interp-report", *TINY, "--smoke", "--out", str(tmp / "interp")),
        "export-hf": ("export-hf", *TINY, "--out", str(tmp / "policy_hf")),
        "compare-lora": ("compare-lora", *TINY, "--task", "sentiment", "--ranks", "1", "--num-phases", "2",
                         "--groups-per-phase", "2", "--eval-samples", "8", *QUIET),
        "compare-reasoning": ("compare-reasoning", *TINY, "--eval-problems", "8", "--eval-samples", "2",
                              "--pass-samples", "2", "--held-out-samples", "2", "--hack-phases", "1",
                              "--hack-groups", "2", "--num-phases", "1", "--groups-per-phase", "2", *QUIET),
        "bench-memory": ("bench-memory", "--n-layers", "2", "--d-vocab", "2000", "--modes", "chunked"),
        "bench-trl grpo": ("bench-trl", "--algo", "grpo", "--smoke", "--seeds", "0"),
        "bench-trl dpo": ("bench-trl", "--algo", "dpo", "--smoke", "--seeds", "0"),
        "scale-trl": ("scale-trl", *TINY, "--num-processes", "2", "--algo", "grpo", "--smoke"),
        "probes": ("probes",),
        "train-agent": ("train-agent", *TINY, "--num-phases", "1", "--problems-per-difficulty", "2", "--group-size", "2",
                        "--eval-problems", "2", "--eval-samples", "1", *QUIET),
    }


#: Commands that take ``--device`` but report another device by design, with the reason (each still has to
#: run to its summary on the GPU machine and say so).
OTHER_DEVICE = {
    "bench-trl dpo": ("cpu", "the DPO race keeps both sides on the CPU on every machine: its pairs, reference "
                             "and evaluations live there, and memory is counted alike on both sides"),
}

SKIPPED = {
    "build-tiny": "rebuilds the tiny world from its seed with its own settings (CPU-pinned config), minutes",
    "build-arith": "rebuilds chapter 07's world from its seed (CPU-pinned config), minutes",
    "build-calc": "rebuilds chapter 09's calculator world from its seed (CPU-pinned config), minutes",
    "build-tuned": "the full-length RLHF build of the shipped tuned policy",
    "build-stand-in-hub": "run by make test-gpu itself (on the CPU) before the GPT-2-world suite",
    "bench-trl ppo": "needs TRL 1.12 beside the environment (make trl-ppo)",
    "build-notebooks": "touches no model",
    "record-figures": "re-runs the quoted runs at full length",
    "fetch-gpt2-bpe": "touches no model (a registry download)",
    "timings": "touches no model (reads progress files)",
    "mutate": "the checkers' mutation test forks a child per batch of mutants: on the CPU by design (CUDA does not survive a fork)",
}


def run_one(argv: tuple[str, ...], device: str, timeout: float, expected: str | None = None) -> dict:
    """``python -m rlhf_tutorial *argv --device device``: ok when it exits 0 with a summary that reports
    ``expected`` (default ``device``; ``cuda:0`` counts as ``cuda``)."""
    expected = expected or device
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "rlhf_tutorial", *argv, "--device", device],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": round(time.perf_counter() - start, 1), "ok": False, "error": f"timed out after {timeout} s"}
    out = {"seconds": round(time.perf_counter() - start, 1)}
    lines = done.stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        summary = {}
    reported = str(summary.get("device", ""))
    if done.returncode == 0 and "error" not in summary and reported.split(":")[0] == expected.split(":")[0]:
        out.update(ok=True, device=reported)
    else:
        out.update(ok=False, exit=done.returncode, device=reported,
                   error=(summary.get("error") or done.stderr or done.stdout)[-800:])
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--jobs", type=int, default=4, help="commands run at a time")
    p.add_argument("--only", nargs="*", help="run only these commands")
    p.add_argument("--timeout", type=float, default=900, help="seconds a command may take")
    ns = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        todo = {k: v for k, v in commands(Path(tmp)).items() if not ns.only or k in ns.only}
        with ThreadPoolExecutor(ns.jobs) as pool:
            futures = {name: pool.submit(run_one, cmd, ns.device, ns.timeout,
                                              OTHER_DEVICE.get(name, (None,))[0]) for name, cmd in todo.items()}
            results = {}
            for name, future in futures.items():
                results[name] = future.result()
                print(f"[gpu-cli] {name}: {'ok' if results[name]['ok'] else 'FAILED'} "
                      f"({results[name]['seconds']} s)", file=sys.stderr, flush=True)
    passed = sum(r["ok"] for r in results.values())
    return {"device": ns.device, "passed": passed, "failed": len(results) - passed, "commands": results,
            "skipped": SKIPPED, "other_device": {k: f"{d}: {why}" for k, (d, why) in OTHER_DEVICE.items()}}


if __name__ == "__main__":
    summary = main()
    print(json.dumps(summary))
    sys.exit(0 if summary["failed"] == 0 else 1)
