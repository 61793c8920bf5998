"""Race our GRPO trainer against TRL's ``GRPOTrainer`` on the same model, reward and settings.

``python -m rlhf_tutorial bench-trl --algo grpo`` exports the tiny world's base policy to a
transformers folder (``trainers.export.export_hf``: the same logits), then for each seed runs our ``grpo.train``
and TRL's ``GRPOTrainer`` one after the other (alternating, so both see the same machine load), and
prints a JSON summary: per phase seconds (split into sampling, scoring, old and reference log-probs,
optimisation), the time and phases until a sampled batch has mean reward >= 0.9, the final reward,
and the peak memory, for both, with the ratios ours / TRL (median over seeds).

Both sides are measured the same way: the reward function is wrapped by one recorder that notes, for
every batch scored, the seconds since the trainer started and the batch's mean reward. "Time to
0.9" is the time at which the first batch with mean reward >= 0.9 has been scored; the final reward
is the mean over the last ``final_window`` phases' batches.

The settings map one to one (``trl_config``): p * G = 64 completions a phase (``num_generations =
G``, ``per_device_train_batch_size * steps_per_generation = p * G``), ``num_minibatches`` optimizer
steps of ``p * G / num_minibatches`` completions per pass, ``update_epochs`` passes
(``num_iterations``), the same learning rate (constant), gradient clipping, clip range, beta, loss
aggregation, advantage scaling, temperature and completion length. What TRL cannot express, or does
differently (``TRL_DIFFERENCES``), goes into the summary.

``--size gpt2`` runs the same races (``--algo grpo``, ``ppo``, ``dpo``) on a policy of GPT-2 small's shape
(12 layers, d_model 768, 12 heads, GPT-2's vocabulary of 50,257 tokens: ``bench.gpt2_sized_policy``, random
weights, a word-level tokenizer) with a stand-in reward (``bench.even_word_share``), the short sizes of
``GPT2_SIZES``, 2 torch threads and seeds 0 and 1 by default: seconds per phase (per step for DPO) with the
split, and peak memory, ours against TRL. Random weights change nothing about time and memory; the rewards
and "time to 0.9" mean nothing there.

Memory. At ``--size gpt2`` every side of every race runs in a fresh Python process of its own (``isolated``),
which imports what that side needs, loads the policy (ours: the ``HookedTransformer``; TRL: the exported
folder with transformers, its memory-mapped weights read once: ``make_resident``), then builds its trainer
and trains. Each side reports, counted the same way:

- ``peak_memory_mb``: the peak resident set while the trainer is built and trains, above the resident set
  once the policy is loaded (``runtime.PeakMemory``): the reference model, gradients, optimizer states,
  activations, caches and allocator slack; ``loaded_memory_mb`` is that starting resident set;
- ``process_peak_mb``: the process's whole peak resident set (``ru_maxrss``) at the end of training:
  the interpreter, the libraries, the policy and the above.

The tiny races keep both sides in one process (``PeakMemory`` around each): there memory that one side
freed and the allocator kept can make the side after it read low, so their memory ratios are rough.

TRL is an optional extra (``pip install rlhf-tutorial[trl]``); nothing else in the course needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from rlhf_tutorial.devices import course_device
from rlhf_tutorial.speed import REWARD_TARGET, SECTIONS, PhaseClock
from rlhf_tutorial.trainers import grpo
from rlhf_tutorial.trainers.runtime import PeakMemory

#: Where TRL's GRPOTrainer differs from ours with the settings mapped as closely as it allows.
TRL_DIFFERENCES = [
    "minibatches: TRL shuffles the completions of a phase (rows of different groups mix) and reuses the same "
    "split for every pass (num_iterations); ours draws whole groups, a new order each pass",
    "sampling: TRL samples with transformers' generate; ours with speed.fast_sample (same distribution)",
    "old log-probs: TRL runs a forward pass at rollout time; ours keeps the sampler's (the same numbers)",
    "optimizer: TRL's default for TrainingArguments (reported as trl_optim); ours AdamW (fused), both "
    "betas (0.9, 0.999), eps 1e-8, no weight decay, constant learning rate",
    "loss scale: TRL's 'grpo' loss divides by the number of gradient-accumulation steps (1 here: no effect)",
    "dynamic_sampling, max_sampling_rounds and ref_refresh_every have no GRPOConfig field (left off); "
    "our adv_eps (1e-4) is TRL's fixed epsilon",
]


class RewardRecorder:
    """Wraps a reward function ``texts -> rewards``; notes (seconds since ``start()``, mean reward,
    seconds spent scoring) for every batch it scores."""

    def __init__(self, reward_fn: Callable[[list[str]], torch.Tensor]):
        self.reward_fn = reward_fn
        self.batches: list[tuple[float, float, float]] = []
        self.t0 = time.perf_counter()

    def start(self) -> None:
        self.batches, self.t0 = [], time.perf_counter()

    def __call__(self, texts: list[str]) -> torch.Tensor:
        begin = time.perf_counter()
        rewards = self.reward_fn(texts).float().cpu()
        end = time.perf_counter()
        self.batches.append((end - self.t0, rewards.mean().item(), end - begin))
        return rewards

    def summary(self, final_window: int) -> dict[str, Any]:
        """Time and batches until the first batch with mean reward >= the target; final reward."""
        first = next((k for k, (_, r, _) in enumerate(self.batches) if r >= REWARD_TARGET), None)
        rewards = [r for _, r, _ in self.batches]
        return {
            "phases_to_target": None if first is None else first + 1,
            "seconds_to_target": None if first is None else round(self.batches[first][0], 2),
            "final_reward": round(statistics.fmean(rewards[-final_window:]), 4),
            "reward_per_phase": [round(r, 4) for r in rewards],
        }


def trl_config(args: grpo.GRPOArgs, seed: int, out: str, num_processes: int = 1):
    """``args`` as a TRL ``GRPOConfig`` (on the course's device, float32, no checkpoints, no logging to services).

    With ``num_processes`` data-parallel processes (``scale-trl``) a phase keeps its p * G completions
    and an optimizer step its ``p * G / num_minibatches``: each process samples and trains on its share,
    ``per_device_train_batch_size = p * G / (num_minibatches * num_processes)``."""
    from trl import GRPOConfig

    rows = args.groups_per_phase * args.group_size
    minibatch = per_process(rows // args.num_minibatches, num_processes, "a minibatch (p * G / num_minibatches)")
    return GRPOConfig(
        output_dir=out, seed=seed, use_cpu=course_device().type != "cuda", bf16=False, fp16=False,
        gradient_checkpointing=False, report_to=[], save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, dataloader_num_workers=0,
        num_generations=args.group_size, per_device_train_batch_size=minibatch,
        steps_per_generation=args.num_minibatches, gradient_accumulation_steps=1,
        num_iterations=args.update_epochs,
        max_steps=args.num_phases * args.num_minibatches * args.update_epochs,
        max_completion_length=args.max_new_tokens, temperature=args.temperature,
        top_k=args.top_k or 0, top_p=1.0,
        learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=args.max_grad_norm,
        beta=args.kl_coef, epsilon=args.clip_coef, epsilon_high=args.clip_coef_high or args.clip_coef,
        loss_type=args.loss_type, scale_rewards=args.scale,
    )


def per_process(rows: int, num_processes: int, what: str) -> int:
    """``rows / num_processes``: one process's share of a batch that all processes together make."""
    share, rest = divmod(rows, num_processes)
    if rest or share == 0:
        raise ValueError(f"{what} has {rows} rows, which {num_processes} processes cannot share evenly")
    return share


def _peak():
    return PeakMemory()


def isolated(side: Callable[..., dict], threads: int, **kwargs: Any) -> dict:
    """``side(**kwargs)`` in a fresh Python process (``torch.set_num_threads(threads)``), so that the memory it
    reports is its own: nothing another side allocated, or freed into the allocator, is counted or reused.
    ``side`` and ``kwargs`` travel pickled (a module-level function; arguments that pickle); the child prints
    the side's dict as JSON on its last stdout line (``python -m rlhf_tutorial.trainers.bench_trl --isolated``)."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "side.pkl"
        job.write_bytes(pickle.dumps((side, kwargs)))
        done = subprocess.run([sys.executable, "-m", "rlhf_tutorial.trainers.bench_trl", "--isolated", str(job),
                               "--threads", str(threads)], env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{side.__name__} failed in its process (exit {done.returncode}): {done.stdout[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_side(ns: argparse.Namespace, side: Callable[..., dict], **kwargs: Any) -> dict:
    """One side of a race, ``side(**kwargs)``: at ``--size gpt2`` in a process of its own (``isolated``, memory
    counted alike on both sides; a side given ``base=None`` loads the race's policy there), else in this one."""
    return isolated(side, ns.threads, **kwargs) if ns.size == "gpt2" else side(**kwargs)


def _isolated_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description="one side of a race, in a process of its own (bench_trl.isolated)")
    p.add_argument("--isolated", required=True, help="the pickled (side, kwargs)")
    p.add_argument("--threads", type=int, required=True)
    ns = p.parse_args(argv)
    torch.set_num_threads(ns.threads)
    side, kwargs = pickle.loads(Path(ns.isolated).read_bytes())
    result = side(**kwargs)
    sys.stdout.flush()
    print(json.dumps(result))


def load_race_policy(size: str, smoke: bool = False):
    """The race's starting policy (CPU) by itself, as ``race_policy`` makes it (the GPT-2-size one is seeded:
    the same weights in every process)."""
    with tempfile.TemporaryDirectory() as tmp:
        return race_policy(size, Path(tmp) / "tokenizer", smoke)[0]


def make_resident(model: torch.nn.Module, device: Any = None) -> torch.nn.Module:
    """``model`` on ``device`` (default the course's) with every parameter read once; returns it. transformers
    maps a safetensors file into memory and its weights become resident only when first read; on a GPU the
    trainer would move them there only inside the measured block. Either way, made resident at load, TRL's
    loaded state holds its policy as ours holds our ``HookedTransformer`` (on the race's device from the
    start), and the training peak above it does not count the policy on one side only."""
    model = model.to(course_device() if device is None else device)
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    return model


def memory_fields(memory: PeakMemory) -> dict[str, float]:
    """A side's memory figures (module docstring): the peak above the loaded state, that state, the process's peak."""
    return {"peak_memory_mb": round(memory.peak_mb, 1), "loaded_memory_mb": round(memory.start_mb, 1),
            "process_peak_mb": round(memory.process_peak_mb, 1)}


def run_ours(args: grpo.GRPOArgs, folder: Path, seed: int, reward_fn, final_window: int, base=None,
             size: str = "tiny", smoke: bool = False) -> dict[str, Any]:
    """Our trainer on the exported policy's TransformerLens original (the same weights): a copy of ``base``,
    or (``base`` None: in a process of its own) the race's policy loaded here (``load_race_policy``).
    ``grpo.train`` copies its reference inside the measured block (TRL loads its own there too)."""
    import copy

    torch.manual_seed(seed)
    policy = copy.deepcopy(base) if base is not None else load_race_policy(size, smoke)
    policy = policy.to(course_device())  # TRL's side runs on the same device (trl_config's use_cpu)
    recorder = RewardRecorder(reward_fn)
    recorder.start()
    with _peak() as memory:
        result = grpo.train(grpo.GRPOArgs(**{**asdict(args), "seed": seed}), policy=policy,
                            reward_fn=recorder, evaluate_before_after=False, progress=False)
    wall = time.perf_counter() - recorder.t0
    split = {s: statistics.fmean(r.get(f"seconds_{s}", 0.0) for r in result.history) for s in SECTIONS}
    return _side(recorder, final_window, wall, len(result.history), split, memory)


def run_trl(args: grpo.GRPOArgs, folder: Path, seed: int, reward_fn, final_window: int) -> dict[str, Any]:
    """TRL's GRPOTrainer on the exported folder (the policy loaded from it before the measured block, as
    ours is; TRL loads its reference from the same path and the tokenizer too, as in chapter 04's last
    section), with the same reward."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    import rlhf_tutorial.trainers.export  # noqa: F401  (registers the biased-head GPT-2 with the Auto classes)

    recorder = RewardRecorder(reward_fn)

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return recorder([p + c for p, c in zip(prompts, completions)]).tolist()

    rows = args.groups_per_phase * args.num_phases
    dataset = Dataset.from_dict({"prompt": [args.prompts[k % len(args.prompts)] for k in range(rows)]})
    policy = make_resident(AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True))
    with tempfile.TemporaryDirectory() as out, _peak() as memory:
        trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=trl_config(args, seed, out),
                              train_dataset=dataset)
        model = trainer.model
        assert type(model).__name__ == "GPT2WithUnembedBias", type(model)
        clock = PhaseClock()

        def logprobs_of(model_arg, *_, **__) -> str | None:  # the log-prob forwards without gradients
            if model_arg is trainer.ref_model:
                return "ref_logprobs"
            return None if torch.is_grad_enabled() else "old_logprobs"

        recorder.start()
        with clock.method(model, "generate", "sampling"), \
                clock.method(trainer, "_get_per_token_logps_and_entropies", logprobs_of):
            trainer.train()
        wall = time.perf_counter() - recorder.t0
        optim = str(trainer.args.optim)
        seconds = clock.take()
    phases = len(recorder.batches)
    split = {s: seconds.get(f"seconds_{s}", 0.0) / phases for s in SECTIONS}
    split["scoring"] = sum(b[2] for b in recorder.batches) / phases
    split["optimisation"] = wall / phases - sum(split.values())  # the rest: forward, backward, step
    side = _side(recorder, final_window, wall, phases, split, memory)
    side["trl_optim"] = optim
    return side


def _side(recorder: RewardRecorder, final_window: int, wall: float, phases: int, split: dict,
          memory: PeakMemory) -> dict:
    return {
        **recorder.summary(final_window),
        "phases": phases,
        "wall_seconds": round(wall, 2),
        "seconds_per_phase": round(wall / phases, 4),
        "seconds_per_phase_split": {k: round(v, 4) for k, v in split.items()},
        **memory_fields(memory),
    }


#: A side's memory figures (``memory_fields``), and what they count at each size (the summary's ``memory_counted``).
MEMORY_KEYS = ("peak_memory_mb", "loaded_memory_mb", "process_peak_mb")
MEMORY_COUNTED = {
    "gpt2": "each side in a fresh process of its own; peak_memory_mb: peak resident set while the trainer is built "
            "and trains, above the resident set once the policy is loaded (loaded_memory_mb); process_peak_mb: "
            "the process's whole peak resident set (ru_maxrss: interpreter, libraries, policy, training)",
    "tiny": "both sides in one process; peak_memory_mb: peak resident set while the trainer is built and trains, "
            "above the resident set once the policy is loaded (memory one side freed can make the next read low); "
            "process_peak_mb is the shared process's and compares nothing",
}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b not in (None, 0) else None


#: The races other than GRPO's, each in its own module ``rlhf_tutorial.trainers.bench_trl_<algo>`` with a
#: ``main(argv) -> dict`` taking the same common flags (``common_flags``).
OTHER_RACES = ("ppo", "dpo")


def common_flags(p: argparse.ArgumentParser) -> None:
    """The flags every race takes (besides its own). With ``--size gpt2`` the seeds default to one and the
    threads to 2."""
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 3 (tiny), 0 1 (gpt2)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (both sides; default 1 tiny, 2 gpt2)")
    p.add_argument("--smoke", action="store_true", help="a smoke-sized race (a few tiny phases)")
    p.add_argument("--size", default="tiny", choices=SIZES,
                   help="'tiny': the tiny world's policy and classifier; 'gpt2': a GPT-2-small-shaped policy (12 "
                   "layers, d_model 768, 12 heads, 50,257 tokens; random weights, bench.gpt2_sized_policy) with a "
                   "stand-in reward (bench.even_word_share) and short fixed sizes (GPT2_SIZES): time and memory only")


#: The sizes of a race: the tiny world's, and GPT-2 small's shape (``--size gpt2``).
SIZES = ("tiny", "gpt2")

#: ``--size gpt2``: completions a phase and their length, phases; what each race overrides in its tiny preset.
#: Small, so that a few phases of each side fit in minutes on 2 CPU threads; the completion length is fixed
#: in practice (the random policy draws its EOS, one token in 50,257, about once in 3,000 completions).
GPT2_SIZES = {
    "grpo": dict(groups_per_phase=2, group_size=8, max_new_tokens=16, num_phases=3, num_minibatches=2),
    "ppo": dict(batch_size=16, gen_len=16, num_phases=3, num_minibatches=2, early_stopping=False),
    "dpo": dict(num_pairs=32, group_size=4, max_new_tokens=16, rounds=1, batch_size=8, min_reward_gap=0.0,
                eval_samples=8, eval_samples_per_round=8),
}

#: ``--size gpt2`` on a GPU (``--device cuda``): the GRPO race at the size of issue 23's GPU figure, 64
#: completions of 30 tokens a phase (8 groups of 8).
GPT2_GPU_SIZES = {"grpo": dict(groups_per_phase=8, group_size=8, max_new_tokens=30, num_phases=6, num_minibatches=2)}


def gpt2_sizes(algo: str) -> dict[str, Any]:
    """The ``--size gpt2`` overrides of race ``algo``: ``GPT2_GPU_SIZES`` on a GPU where it has them, else
    ``GPT2_SIZES``."""
    on_gpu = course_device().type == "cuda"
    return dict(GPT2_GPU_SIZES[algo] if on_gpu and algo in GPT2_GPU_SIZES else GPT2_SIZES[algo])


def policy_shape(policy) -> dict[str, int]:
    """The race policy's shape, for the summary: layers, width, heads, vocabulary, parameters."""
    cfg = policy.cfg
    return {"n_layers": cfg.n_layers, "d_model": cfg.d_model, "n_heads": cfg.n_heads, "d_vocab": cfg.d_vocab,
            "n_params": sum(p.numel() for p in policy.parameters())}


def resolve_common(ns: argparse.Namespace) -> argparse.Namespace:
    """Fill the size-dependent defaults of ``common_flags`` (seeds, threads) in place; returns ``ns``."""
    gpt2 = ns.size == "gpt2"
    if ns.seeds is None:
        ns.seeds = [0, 1] if gpt2 else [0, 1, 2, 3]
    if ns.threads is None:
        ns.threads = 2 if gpt2 else 1
    return ns


def race_policy(size: str, folder: Path, smoke: bool = False):
    """The race's starting policy (CPU) and reward: the tiny world's policy (the classifier is the race's own,
    None here), or a GPT-2-small-shaped random one (fewer layers when ``smoke``) with ``bench.even_word_share``."""
    if size == "tiny":
        from rlhf_tutorial.worlds import load_policy

        return load_policy("tiny", device="cpu"), None
    from rlhf_tutorial.trainers.bench import even_word_share, gpt2_sized_policy

    small = dict(n_layers=1, d_model=64, n_heads=2, d_head=32, d_mlp=128) if smoke else {}
    # LayerNorms without weights, as the tiny policy's: TRL's weights then read back exactly (export.tl_from_hf)
    return gpt2_sized_policy(str(folder), "cpu", normalization_type="LNPre", **small), even_word_share


def main(argv: list[str]) -> dict:
    algo = argparse.ArgumentParser(add_help=False)
    algo.add_argument("--algo", default="grpo", choices=["grpo", *OTHER_RACES])
    known, rest = algo.parse_known_args(argv)
    if known.algo != "grpo":
        import importlib

        return importlib.import_module(f"rlhf_tutorial.trainers.bench_trl_{known.algo}").main(rest)
    return race_grpo(rest)


def race_grpo(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial bench-trl --algo grpo", description=__doc__.split("\n")[0])
    common_flags(p)
    p.add_argument("--num-phases", type=int, default=None, help="default: the tiny GRPO preset's (40)")
    p.add_argument("--final-window", type=int, default=5, help="final reward: mean of the last this many phases")
    ns = resolve_common(p.parse_args(argv))
    try:
        import trl
    except ImportError:
        return {"error": "TRL is not installed: pip install 'rlhf-tutorial[trl]' (or make test, which installs it)"}
    torch.set_num_threads(ns.threads)
    overrides: dict[str, Any] = gpt2_sizes("grpo") if ns.size == "gpt2" else {}
    if ns.smoke:
        overrides = dict(num_phases=2, groups_per_phase=2, group_size=4, max_new_tokens=8, num_minibatches=2)
    if ns.num_phases is not None:
        overrides["num_phases"] = ns.num_phases
    args = grpo.GRPOArgs.preset("tiny", **overrides)

    from rlhf_tutorial.trainers.export import export_hf

    runs: dict[str, list[dict]] = {"ours": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        base, reward_fn = race_policy(ns.size, Path(tmp) / "tokenizer", ns.smoke)
        reward_fn = reward_fn or grpo.make_reward_fn(args)
        folder = export_hf(base, Path(tmp) / "policy")
        common = dict(args=args, folder=folder, reward_fn=reward_fn, final_window=ns.final_window)
        own_base = None if ns.size == "gpt2" else base  # in its own process, ours loads the race's policy itself
        runs = alternate(ns.seeds, "bench-trl", {
            "ours": lambda seed: run_side(ns, run_ours, seed=seed, base=own_base, size=ns.size, smoke=ns.smoke,
                                          **common),
            "trl": lambda seed: run_side(ns, run_trl, seed=seed, **common),
        })
    return {**race_summary("grpo", trl.__version__, runs, ns, args, TRL_DIFFERENCES), "policy": policy_shape(base)}


def alternate(seeds: list[int], tag: str, sides: dict[str, Callable[[int], dict]]) -> dict[str, list[dict]]:
    """Each side's run for every seed, alternating (ours, TRL, ours, TRL, ...) so that both see the
    same machine load; progress on stderr."""
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for seed in seeds:
        for name, run in sides.items():
            print(f"[{tag}] seed {seed}: {name}", file=sys.stderr)
            runs[name].append({"seed": seed, **run(seed)})
            print(f"[{tag}]   {runs[name][-1]['wall_seconds']} s, reward {runs[name][-1]['final_reward']}",
                  file=sys.stderr)
    return runs


def race_summary(algo: str, trl_version: str | None, runs: dict[str, list[dict]], ns: argparse.Namespace,
                 args: Any, differences: list[str]) -> dict[str, Any]:
    """The JSON summary of an RL race (GRPO, PPO): per side the medians over seeds of time and phases
    to the target, seconds per phase (and per section), final reward and peak memory; the ratios
    ours / TRL; every run; the settings and what TRL does differently."""
    medians = {name: {k: _median([r[k] for r in runs[name]])
                      for k in ("seconds_to_target", "phases_to_target", "seconds_per_phase", "final_reward",
                                *MEMORY_KEYS)} for name in runs}
    split_median = {name: {s: round(statistics.median(r["seconds_per_phase_split"][s] for r in runs[name]), 4)
                           for s in SECTIONS} for name in runs}
    return {
        "algo": algo,
        "trl_version": trl_version,
        "torch_threads": ns.threads,
        "size": ns.size,
        "device": str(course_device()),
        "seeds": ns.seeds,
        "smoke": ns.smoke,
        "reward_target": REWARD_TARGET,
        "median": medians,
        "median_seconds_per_phase_split": split_median,
        "ratio_ours_over_trl": {
            "seconds_to_target": _ratio(medians["ours"]["seconds_to_target"], medians["trl"]["seconds_to_target"]),
            "seconds_per_phase": _ratio(medians["ours"]["seconds_per_phase"], medians["trl"]["seconds_per_phase"]),
            "peak_memory_mb": _ratio(medians["ours"]["peak_memory_mb"], medians["trl"]["peak_memory_mb"]),
            "process_peak_mb": _ratio(medians["ours"]["process_peak_mb"], medians["trl"]["process_peak_mb"]),
        },
        "memory_counted": MEMORY_COUNTED[ns.size],
        "final_reward_difference": (None if medians["ours"]["final_reward"] is None else
                                    round(medians["ours"]["final_reward"] - medians["trl"]["final_reward"], 4)),
        "runs": runs,
        "settings": {k: v for k, v in asdict(args).items() if k not in ("world",)},
        "trl_differences": differences,
        "load": _loadavg(),
    }


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


if __name__ == "__main__":
    _isolated_main(sys.argv[1:])
