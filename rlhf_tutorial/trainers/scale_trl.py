"""Chapter 04's GRPO run (or chapter 06's DPO run) on TRL, with N data-parallel processes (accelerate).

What it does:

``python -m rlhf_tutorial scale-trl --world tiny --num-processes 2 --algo grpo`` (or ``--algo dpo``)

1. exports the world's base policy to a transformers folder (``export.export_hf``: the same logits);
   for DPO it also draws the preference pairs once, with chapter 06's own code
   (``bench_trl_dpo.draw_pairs``);
2. runs ``accelerate launch --multi_gpu --num_processes N -m rlhf_tutorial.trainers.scale_trl SPEC``
   (``launch_command``). On a machine without a GPU, ``use_cpu=True`` in the TRL config makes each of
   the N processes a CPU process and the group talks over gloo; on a machine with N GPUs the same
   command runs one process per GPU (nccl); with fewer GPUs than processes they run on the CPU, and
   the summary's ``device_note`` says so (:func:`processes_device`). Each process (:func:`worker`)
   builds TRL's ``GRPOTrainer`` or ``DPOTrainer`` with the course's settings mapped as ``bench-trl`` maps them
   (``bench_trl.trl_config`` / ``bench_trl_dpo.trl_config`` with ``num_processes``: a phase keeps its
   ``p * G`` completions and an optimizer step its rows, each process taking ``1 / N`` of them) and the
   course's reward, trains, and writes its final weights and what it saw;
3. reads the N processes' weights back and compares them tensor by tensor: data-parallel training
   all-reduces (averages) the gradients, so processes that sampled and trained on *different* rows
   (``data_sha256_per_process``) still hold identical weights (``identical_weights``);
4. loads the trained weights back into a ``HookedTransformer`` (``export.tl_from_hf``: the
   export in reverse, exact; the export's LayerNorms, the identity, stay frozen as in the DPO race)
   and measures the base policy and the trained one the same way (``policy_eval.evaluate_policy``,
   the same seed), on the course's device.

The summary (last line) gives ``num_processes``, the backend and ``processes_device`` (``cpu`` or
``cuda``), the samples per phase (counted: all processes together and per process), the reward before and after, each process's peak memory
(``PeakMemory`` from building TRL's trainer to the end of training: on a CPU the resident set above
what the process held before, on a GPU CUDA's peak allocation; and the whole process's peak resident
set) and training time, and the
identical-weights evidence (``weights_sha256_per_process``, ``max_abs_weight_diff_across_processes``).
TRL and accelerate are the ``trl`` extra (``pip install 'rlhf-tutorial[trl]'``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from rlhf_tutorial.trainers.args import add_flags, arg, documented

ALGOS = ("grpo", "dpo")
#: What a "phase" is for each algorithm (the summary says it beside ``samples_per_phase``).
PHASE = {"grpo": "a rollout + learning phase: completions sampled and scored",
         "dpo": "a pass over the preference pairs: pairs trained on"}
#: A smoke-sized run: a few tiny phases (tests).
SMOKE = {
    "grpo": dict(num_phases=2, groups_per_phase=2, group_size=4, max_new_tokens=8, num_minibatches=2,
                 eval_samples=16),
    "dpo": dict(num_pairs=16, group_size=4, max_new_tokens=8, rounds=2, batch_size=4, eval_samples=16),
}
SPEC_FILE, TRAINED_DIR = "spec.json", "trained"


@documented
@dataclass
class ScaleTRLArgs:
    """The knobs of ``scale-trl``. The run's own settings are the world's ``GRPOArgs`` / ``DPOArgs``
    preset (the ones ``train-grpo`` / ``train-dpo`` and ``bench-trl`` use), with these overrides."""

    algo: str = arg("grpo", "'grpo' (chapter 04 on TRL's GRPOTrainer) or 'dpo' (chapter 06 on DPOTrainer)")
    world: str | None = arg("tiny", "'tiny' or 'gpt2': whose base policy is exported and trained")
    num_processes: int = arg(2, "data-parallel processes accelerate launches (CPU: gloo; one per GPU on a GPU machine)")
    seed: int = arg(0, "seeds TRL (GRPO samples with seed + rank in each process), the pairs and the evaluations")
    num_phases: int | None = arg(None, "GRPO: rollout + learning phases (None: the preset's)")
    rounds: int | None = arg(None, "DPO: passes over the pairs (None: the preset's)")
    num_pairs: int | None = arg(None, "DPO: groups sampled for pairs (None: the preset's)")
    eval_samples: int | None = arg(None, "samples drawn before and after training to measure the reward (None: the preset's)")
    threads: int = arg(1, "torch CPU threads of each process")
    smoke: bool = arg(False, "a smoke-sized run (a few tiny phases), for tests")
    out: str | None = arg(None, "folder to keep the run in (export, per-process weights, trained policy); None: a temporary one")


def run_args(ns: ScaleTRLArgs, world: str):
    """The ``GRPOArgs`` / ``DPOArgs`` of the run: the world's preset, the smoke sizes, the overrides."""
    from rlhf_tutorial.trainers import dpo, grpo

    overrides: dict[str, Any] = dict(SMOKE[ns.algo]) if ns.smoke else {}
    names = ("num_phases",) if ns.algo == "grpo" else ("rounds", "num_pairs")
    overrides.update({k: getattr(ns, k) for k in (*names, "eval_samples") if getattr(ns, k) is not None})
    cls = grpo.GRPOArgs if ns.algo == "grpo" else dpo.DPOArgs
    return cls.preset(world, **{**overrides, "seed": ns.seed})


def args_from_dict(cls: type, values: dict[str, Any]):
    """A ``*Args`` from its ``asdict`` (read back from JSON: its tuples came back as lists)."""
    tuples = {f.name for f in fields(cls) if str(f.type).startswith("tuple")}
    return cls(**{k: tuple(v) if k in tuples and v is not None else v for k, v in values.items()})


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor of ``state`` (names in sorted order, each name, dtype, shape and bytes)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def free_port() -> int:
    """A TCP port nothing listens on now (the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(spec: Path, num_processes: int, port: int) -> list[str]:
    """``accelerate launch`` of :func:`worker` with ``num_processes`` processes on this machine.
    ``--multi_gpu`` is accelerate's torchrun launcher: one process per GPU, or per CPU share when the
    config says ``use_cpu`` (then ``PartialState`` picks ``MULTI_CPU`` with gloo)."""
    spread = ["--multi_gpu", "--main_process_port", str(port)] if num_processes > 1 else []
    return [sys.executable, "-m", "accelerate.commands.launch", *spread, "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "-m", "rlhf_tutorial.trainers.scale_trl", str(spec)]


def shown(cmd: list[str]) -> str:
    """``cmd`` as a person would type it (``accelerate launch ...``)."""
    return "accelerate launch " + " ".join(cmd[cmd.index("accelerate.commands.launch") + 1:])


def launch(cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``cmd``, echoing its output to stderr (progress); return the exit code and the output's tail."""
    tail: deque[str] = deque(maxlen=60)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            print(line, end="", file=sys.stderr, flush=True)
    return proc.returncode, "".join(tail)


# ----------------------------------------------------------------------------------------------------
# One process (run by accelerate launch)
# ----------------------------------------------------------------------------------------------------


def worker(spec_path: str) -> None:
    """One of the N processes: TRL's trainer on the exported policy with the course's settings and
    reward; writes ``rank{R}.safetensors`` (its final weights), ``rank{R}.json`` (what it saw and
    measured) and, on rank 0, the trained policy as a transformers folder."""
    spec = json.loads(Path(spec_path).read_text())
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    if spec["use_cpu"]:
        os.environ["RLHF_TUTORIAL_DEVICE"] = "cpu"  # the reward model goes where this process computes
    else:
        os.environ["RLHF_TUTORIAL_DEVICE"] = f"cuda:{local_rank}"
    torch.set_num_threads(spec["threads"])

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import rlhf_tutorial.trainers.export  # noqa: F401  (registers the biased-head GPT-2 with the Auto classes)
    from rlhf_tutorial.trainers.export import freeze_layernorms
    from rlhf_tutorial.trainers.runtime import PeakMemory

    folder, out = spec["policy"], Path(spec["out"])
    model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True)
    frozen = freeze_layernorms(model)  # the identity; our policy has no LayerNorm parameters to train
    initial = weights_sha256(model.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    build = build_grpo if spec["algo"] == "grpo" else build_dpo
    device = "cpu" if spec["use_cpu"] else f"cuda:{local_rank}"
    with tempfile.TemporaryDirectory() as tmp:
        with PeakMemory(device) as memory:  # the trainer's set-up (reference model, data) and its training
            trainer, seen = build(spec, model, tokenizer, tmp)
            start = time.perf_counter()
            trainer.train()
            seconds = time.perf_counter() - start
        trained = trainer.accelerator.unwrap_model(trainer.model)
        state = {k: v.detach().float().cpu().contiguous() for k, v in trained.state_dict().items()}
        save_file(state, str(out / f"rank{rank}.safetensors"))
        if rank == 0:
            trained.save_pretrained(out / TRAINED_DIR)
            tokenizer.save_pretrained(out / TRAINED_DIR)
        import torch.distributed as dist

        report = {
            "rank": rank,
            "world_size": trainer.accelerator.num_processes,
            "distributed_type": str(trainer.accelerator.distributed_type).split(".")[-1],
            "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
            "device": str(trainer.accelerator.device),
            "optimizer_steps": trainer.state.global_step,
            "train_seconds": round(seconds, 2),
            "peak_memory_mb": round(memory.peak_mb, 1),
            "process_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "frozen_layernorm_tensors": frozen,
            "initial_weights_sha256": initial,
            "weights_sha256": weights_sha256(state),
            **seen.report(),
        }
        (out / f"rank{rank}.json").write_text(json.dumps(report))
        trainer.accelerator.wait_for_everyone()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class Seen:
    """What one process trained on: rows per phase, mean reward per phase (GRPO), and a sha256 of the
    data itself (the texts it scored, or the token ids of its batches)."""

    def __init__(self) -> None:
        self.rows_per_phase: list[int] = []
        self.reward_per_phase: list[float] = []
        self.digest = hashlib.sha256()

    def report(self) -> dict[str, Any]:
        return {"rows_per_phase": self.rows_per_phase, "reward_per_phase": self.reward_per_phase,
                "data_sha256": self.digest.hexdigest()}


def build_grpo(spec: dict, model, tokenizer, tmp: str):
    """TRL's GRPOTrainer with chapter 04's settings (``bench_trl.trl_config``) and reward."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from rlhf_tutorial.trainers import grpo
    from rlhf_tutorial.trainers.bench_trl import RewardRecorder, trl_config

    args = args_from_dict(grpo.GRPOArgs, spec["args"])
    recorder, seen = RewardRecorder(grpo.make_reward_fn(args)), Seen()

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        texts = [p + c for p, c in zip(prompts, completions)]
        seen.rows_per_phase.append(len(texts))
        seen.digest.update("\x00".join(texts).encode())
        rewards = recorder(texts)
        seen.reward_per_phase.append(round(rewards.mean().item(), 4))
        return rewards.tolist()

    rows = args.groups_per_phase * args.num_phases
    dataset = Dataset.from_dict({"prompt": [args.prompts[k % len(args.prompts)] for k in range(rows)]})
    config = trl_config(args, spec["seed"], tmp, num_processes=spec["num_processes"])
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    return trainer, seen


def build_dpo(spec: dict, model, tokenizer, tmp: str):
    """TRL's DPOTrainer with chapter 06's settings (``bench_trl_dpo.trl_config``) on the pairs drawn by
    the launching process."""
    from datasets import load_from_disk
    from transformers import TrainerCallback
    from trl import DPOTrainer

    from rlhf_tutorial.trainers import dpo
    from rlhf_tutorial.trainers.bench_trl_dpo import trl_config

    args = args_from_dict(dpo.DPOArgs, spec["args"])
    config = trl_config(args, spec["seed"], tmp, spec["max_prompt_tokens"], num_processes=spec["num_processes"])
    seen = Seen()

    class NewPass(TrainerCallback):
        def on_epoch_begin(self, *_: Any, **__: Any) -> None:
            seen.rows_per_phase.append(0)

    trainer = DPOTrainer(model=model, args=config, train_dataset=load_from_disk(spec["pairs"]), processing_class=tokenizer,
                         callbacks=[NewPass()])
    step = trainer.training_step

    def training_step(model_arg, inputs, *more, **kw):  # notes the rows of every batch this process trains on
        ids = inputs["input_ids"]
        seen.rows_per_phase[-1] += ids.shape[0] // 2  # a batch stacks the chosen rows, then the rejected ones
        seen.digest.update(ids.cpu().numpy().tobytes())
        return step(model_arg, inputs, *more, **kw)

    trainer.training_step = training_step
    return trainer, seen


# ----------------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial scale-trl", description=__doc__.split("\n")[0])
    add_flags(p, ScaleTRLArgs, from_preset=False)
    return p


def main(argv: list[str]) -> dict:
    """``scale-trl``: launch, compare the processes' weights, load the result back, evaluate."""
    ns = ScaleTRLArgs(**vars(_parser().parse_args(argv)))
    if ns.algo not in ALGOS:
        return {"error": f"--algo must be one of {', '.join(ALGOS)}, got {ns.algo!r}"}
    if ns.num_processes < 1:
        return {"error": f"--num-processes must be at least 1, got {ns.num_processes}"}
    missing = [name for name in ("trl", "accelerate") if not _importable(name)]
    if missing:
        return {"error": f"{' and '.join(missing)} not installed: pip install 'rlhf-tutorial[trl]' "
                         "(or make test, which installs it)"}
    if ns.out is None:
        with tempfile.TemporaryDirectory() as tmp:
            return run(ns, Path(tmp))
    return run(ns, Path(ns.out))


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def run(ns: ScaleTRLArgs, work: Path) -> dict[str, Any]:
    """Export, launch, compare, load back, evaluate; the summary."""
    import accelerate
    import trl

    from rlhf_tutorial.devices import course_device
    from rlhf_tutorial.worlds import load_policy, resolve_world

    world = resolve_world(ns.world)
    args = run_args(ns, world)
    device = course_device()
    use_cpu, device_note = processes_device(device, ns.num_processes,
                                            torch.cuda.device_count() if device.type == "cuda" else 0)
    torch.set_num_threads(ns.threads)
    work.mkdir(parents=True, exist_ok=True)
    for old in [*work.glob("rank*.json"), *work.glob("rank*.safetensors")]:
        old.unlink()  # a rerun into the same folder must not read the last run's processes
    for old in (work / TRAINED_DIR, work / "pairs"):
        shutil.rmtree(old, ignore_errors=True)

    from rlhf_tutorial.trainers.export import export_hf

    base = load_policy(world, device="cpu").eval()
    folder = export_hf(base, work / "policy")
    spec: dict[str, Any] = {"algo": ns.algo, "args": asdict(args), "seed": ns.seed, "policy": str(folder),
                            "out": str(work), "num_processes": ns.num_processes, "threads": ns.threads,
                            "use_cpu": use_cpu}
    if ns.algo == "grpo":
        from rlhf_tutorial.trainers.grpo import make_reward_fn

        reward_fn = make_reward_fn(args)
    else:
        from rlhf_tutorial.rewards import sentiment_reward_fn
        from rlhf_tutorial.trainers.bench_trl_dpo import draw_pairs, prompt_lengths, trl_dataset_rows

        reward_fn = sentiment_reward_fn(world, args.direction)
        pairs, pair_stats = draw_pairs(args, base, reward_fn, ns.seed)
        from datasets import Dataset

        # on disk: the processes' tokenizing maps then share one cache beside it (rank 0 writes, the others read)
        Dataset.from_dict(trl_dataset_rows(pairs, args.prompts)).save_to_disk(str(work / "pairs"))
        spec.update(pairs=str(work / "pairs"), max_prompt_tokens=max(prompt_lengths(base, args).values()))
    spec_path = work / SPEC_FILE
    spec_path.write_text(json.dumps(spec))

    package_root = str(Path(__file__).resolve().parents[2])  # this checkout's package in every process
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(ns.threads)}
    # The processes compute on the CPU or on their GPU, never on the simulated one (simgpu is installed when
    # the package is imported, so it is set here); TRL's config asks for the CPU when torch sees no GPU.
    env["RLHF_TUTORIAL_DEVICE"] = "cpu" if use_cpu else "cuda"
    if use_cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = launch_command(spec_path, ns.num_processes, free_port())
    start = time.perf_counter()
    code, tail = launch(cmd, env)
    wall = time.perf_counter() - start
    reports = [work / f"rank{r}.json" for r in range(ns.num_processes)]
    if code != 0 or not all(r.exists() for r in reports):
        return {"error": f"accelerate launch exited with {code}; its last output:\n{tail[-3000:]}",
                "launch_command": shown(cmd)}
    ranks = [json.loads(r.read_text()) for r in reports]

    comparison = compare_processes(work, ns.num_processes)
    trained_policy, round_trip = load_back(work / TRAINED_DIR, base)
    before, after = evaluate_pair(base, trained_policy, reward_fn, args, device)
    samples = [r["rows_per_phase"] for r in ranks]
    totals = [sum(col) for col in zip(*samples)]  # rows of each phase, all processes together
    if not totals:
        return {"error": "the processes trained on nothing (no phase was recorded)", "ranks": ranks}
    summary: dict[str, Any] = {
        "algo": ns.algo,
        "world": world,
        "num_processes": ns.num_processes,
        "distributed_type": ranks[0]["distributed_type"],
        "backend": ranks[0]["backend"],
        "processes_device": "cpu" if use_cpu else "cuda",
        "trl_version": trl.__version__,
        "accelerate_version": accelerate.__version__,
        "launch_command": shown(cmd),
        "smoke": ns.smoke,
        "seed": ns.seed,
        "phase": PHASE[ns.algo],
        "phases": len(samples[0]),
        "samples_per_phase": totals[0],
        "samples_per_phase_per_process": [s[0] for s in samples],
        "samples_total": sum(totals),
        "optimizer_steps": ranks[0]["optimizer_steps"],
        "reward_before": round(before["reward"], 4),
        "reward_after": round(after["reward"], 4),
        "reward_se_after": round(after["reward_se"], 4),
        "kl_after": round(after["kl"], 4),
        "eval_samples": args.eval_samples,
        "peak_memory_mb_per_process": [r["peak_memory_mb"] for r in ranks],
        "process_peak_rss_mb_per_process": [r["process_peak_rss_mb"] for r in ranks],
        "train_seconds_per_process": [r["train_seconds"] for r in ranks],
        "train_seconds_per_phase": round(max(r["train_seconds"] for r in ranks) / len(totals), 4),
        "wall_seconds": round(wall, 1),
        **comparison,
        "weights_changed": ranks[0]["weights_sha256"] != ranks[0]["initial_weights_sha256"],
        "data_sha256_per_process": [r["data_sha256"] for r in ranks],
        "different_data_per_process": len({r["data_sha256"] for r in ranks}) == len(ranks),
        "round_trip_max_abs_logit_diff": round_trip,
        "frozen_layernorm_tensors": ranks[0]["frozen_layernorm_tensors"],
        "torch_threads_per_process": ns.threads,
        "settings": {k: v for k, v in asdict(args).items() if k != "world"},
    }
    if ns.algo == "grpo":  # the sampled batches' mean reward per phase, all processes together
        per_phase = [sum(r["reward_per_phase"][k] * r["rows_per_phase"][k] for r in ranks) / total
                     for k, total in enumerate(totals)]
        summary["sampled_reward_per_phase"] = [round(r, 4) for r in per_phase]
    else:
        summary.update(pairs=pair_stats["pairs_kept"] - pair_stats["pairs_dropped"],
                       pairs_dropped=pair_stats["pairs_dropped"])
    if device_note:
        summary["device_note"] = device_note
    if ns.out is not None:
        summary["out"] = str(work)
    return summary


def processes_device(device: torch.device, num_processes: int, gpus: int) -> tuple[bool, str | None]:
    """Whether the processes run on the CPU (gloo), and why when the course's device is a GPU: one process
    per GPU (nccl) when there are at least ``num_processes`` GPUs; with fewer (a learner's one GPU and the
    default 2 processes) every process runs on the CPU, as on a machine without a GPU, and the note says so.
    A simulated GPU (simgpu) computes on the CPU: the processes run there."""
    if device.type != "cuda":
        return True, None
    if gpus < num_processes:
        return True, (f"{num_processes} processes need {num_processes} GPUs and torch sees {gpus}: every process "
                      "ran on the CPU (gloo); the evaluation ran on the GPU")
    return False, None


def compare_processes(work: Path, num_processes: int) -> dict[str, Any]:
    """Every process's final weights against process 0's, tensor by tensor (read from the files they
    wrote, not from what they report)."""
    from safetensors.torch import load_file

    states = [load_file(str(work / f"rank{r}.safetensors")) for r in range(num_processes)]
    diff = 0.0
    for state in states[1:]:
        if state.keys() != states[0].keys():
            raise RuntimeError("the processes saved different parameter names")
        for name, value in state.items():
            diff = max(diff, (value - states[0][name]).abs().max().item())
    digests = [weights_sha256(s) for s in states]
    return {"weights_sha256_per_process": digests, "identical_weights": len(set(digests)) == 1,
            "max_abs_weight_diff_across_processes": diff}


def load_back(folder: Path, base):
    """The trained transformers folder as a ``HookedTransformer`` (``tl_from_hf``: the export in reverse),
    and the largest logit difference between the two on sampled text (0 up to float rounding)."""
    from rlhf_tutorial.trainers.export import load_hf_policy, max_logit_diff, tl_from_hf
    from rlhf_tutorial.worlds import PROMPT

    model, _ = load_hf_policy(folder)
    policy = tl_from_hf(model, base)
    torch.manual_seed(0)
    with torch.no_grad():
        tokens = policy.generate(policy.to_tokens(PROMPT).expand(4, -1), max_new_tokens=16, verbose=False,
                                 stop_at_eos=False)
    return policy, max_logit_diff(policy, model, tokens)


def evaluate_pair(base, trained, reward_fn, args, device) -> tuple[dict, dict]:
    """The base policy and the trained one, measured the same way on the course's device."""
    from rlhf_tutorial.trainers.policy_eval import evaluate_policy

    base, trained = base.to(device), trained.to(device)
    kw = dict(prompts=args.prompts, n_samples=args.eval_samples, max_new_tokens=args.max_new_tokens,
              seed=args.seed + 1, temperature=args.temperature, prepend_bos=args.prepend_bos)
    return evaluate_policy(base, base, reward_fn, **kw), evaluate_policy(trained, base, reward_fn, **kw)


if __name__ == "__main__":  # one process of ``accelerate launch`` (see ``launch_command``)
    worker(sys.argv[1])
