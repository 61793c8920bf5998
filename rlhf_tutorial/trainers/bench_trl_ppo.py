"""Race our PPO-RLHF trainer against TRL's ``PPOTrainer`` (TRL 1.12.0, pinned: ``trl.experimental`` since 1.10,
removed in a later release) on the same model, reward and settings.

``python -m rlhf_tutorial bench-trl --algo ppo`` exports the tiny world's base policy to a transformers
folder (``trainers.export.export_hf``: the same logits), then for each seed runs our ``RLHFTrainer``
(chapter 03, the tiny preset, with the harness speed-ups on: ``RLHFArgs.fast``, our own sampler and a
hook-free forward; the exercise code is the same) and TRL's ``PPOTrainer`` one after the other (alternating, so both see
the same machine load), and prints a JSON summary shaped like the GRPO race's (``bench_trl``): per
phase seconds split into sampling, scoring, old log-probs (the rollout's policy/value forwards),
reference log-probs and optimisation, the time and phases until a sampled batch has mean reward >= 0.9,
the final reward (mean of the last ``final_window`` phases) and the peak memory, with the ratios ours /
TRL (medians over the seeds). Times count from the start of training; building the trainer is reported
apart (``setup_seconds``), its memory is in the peak. TRL's split: ``generate`` is sampling, the reward
shim's calls scoring, the critic's forwards without gradients (the rollout's values) old log-probs, the
reference model's forwards reference log-probs, and the rest of the phase (advantages, the minibatch
forwards and backwards, the steps, TRL's per-phase ``gc.collect``, also reported alone as
``gc_collect_seconds_per_phase``) optimisation.

TRL dropped PPO after 1.12 (1.16, the ``trl`` extra of the GRPO race, has none), and 1.12 cannot share
the virtual environment's ``trl`` package, so it lives beside it: ``pip install --no-deps --target
.venv/trl-1.12 trl==1.12.0`` (``make trl-ppo``; its requirements are already met by the pinned stack).
The TRL side runs in a subprocess whose ``PYTHONPATH`` puts that folder first (``python -m
rlhf_tutorial.trainers.bench_trl_ppo --trl-side ...``); it prints its side's dict as JSON on its last
line. Both sides wrap the same reward (the tiny world's sentiment classifier, ``sentiment_reward_fn``)
in ``bench_trl.RewardRecorder``; on the TRL side a small ``nn.Module`` (``RewardShim``) stands in for
a reward model: it decodes the query + response ids with the policy's tokenizer and calls the recorder,
shaped the way TRL's ``get_reward`` calls a reward model.

The settings map as closely as ``PPOConfig`` allows (``trl_ppo_config``, plus an optimizer and
schedule passed to the trainer: ``trl_optimizer``): the same rollout size, completion length,
temperature, minibatches, PPO epochs, learning rates (the value head at ``head_lr``) and schedule, KL
coefficient with the k1 per-token KL in the rewards, clip range, value coefficient, gamma, lambda,
reward whitening, no stop token and no missing-EOS penalty. What TRL cannot express, or does
differently, is listed in ``TRL_PPO_DIFFERENCES`` and goes into the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from rlhf_tutorial.devices import course_device
from rlhf_tutorial.speed import SECTIONS, PhaseClock
from rlhf_tutorial.trainers.bench_trl import (
    GPT2_SIZES,
    RewardRecorder,
    _peak,
    _side,
    alternate,
    common_flags,
    load_race_policy,
    make_resident,
    policy_shape,
    race_policy,
    race_summary,
    resolve_common,
    run_side,
)
from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer

#: The TRL release the course pins for PPO (its PPOTrainer is under trl.experimental, removed in a later
#: release), and where ``make trl-ppo`` installs it (beside the venv's own packages).
TRL_PPO_VERSION = "1.12.0"
TRL_PPO_DIR = Path(sys.prefix) / "trl-1.12"
INSTALL_HINT = (
    f"TRL {TRL_PPO_VERSION} (with trl.experimental.ppo) is not installed beside the venv: run `make trl-ppo` "
    f"(or: {sys.executable} -m pip install --no-deps --target {TRL_PPO_DIR} trl=={TRL_PPO_VERSION})"
)

#: Where TRL's PPOTrainer differs from ours with the settings mapped as closely as it allows.
TRL_PPO_DIFFERENCES = [
    "value model: TRL's critic is a separate copy of the policy's trunk with the value head on top "
    "(PolicyAndValueWrapper: two trunks, both trained, one extra forward per rollout chunk and per minibatch); "
    "ours is the same value head (same architecture and initial weights) on the policy's own trunk",
    "gradient clipping: TRL's PPO loop never clips gradients (max_grad_norm is unused); ours clips the global "
    "norm to max_grad_norm",
    "entropy bonus: TRL's loss has none (pg_loss + vf_coef * vf_loss); ours adds ent_coef * entropy",
    "early stopping: TRL has none; ours stops after `patience` phases with rollout KL above kl_threshold",
    "reward whitening: TRL whitens the per-token rewards (KL penalties + score) over the rollout, mean kept "
    "(shift_mean=False); ours whitens the scores of the rollout (zero mean, unit variance) before adding the "
    "KL penalties",
    "advantage whitening: TRL whitens the advantages over the whole rollout; ours normalises them per "
    "minibatch inside the clipped surrogate",
    "value clipping: TRL always clips the value loss (cliprange_value); ours does not (cliprange_value None), "
    "so TRL gets a clip range too large to bind (1e9)",
    "rollout chunks: TRL's local_rollout_forward_batch_size sets both the generation and the forward chunk "
    "(batch_size here: one generate call, as ours); ours runs the rollout forwards in chunks of minibatch_size",
    "old log-probs: TRL takes them from generate's scores; ours runs a policy+value forward (for the values "
    "too; TRL runs its critic's forward for those)",
    "sampling: TRL samples with transformers' generate (temperature + 1e-7); ours with speed.fast_sample "
    "(RLHFArgs.fast: the same distribution as TransformerLens' generate, which ours uses by default)",
    "forward passes: ours with RLHFArgs.fast runs the policy + value head without TransformerLens' hook "
    "points (speed.fast_residual: the same numbers to float rounding); the reference model runs its own forward",
    "pad token: the tiny tokenizer pads with its BOS/EOS token (id 0), which TRL would mask as padding (the "
    "prompt's BOS, and any sampled EOS would end a response); the TRL side's tokenizer gets a pad token of its "
    "own, outside the vocabulary, which never reaches the model (no row is padded: fixed-length completions)",
    "optimizer and schedule: passed to TRL's trainer (its `optimizers` argument) as ours: AdamW, no weight "
    "decay, the trunks at learning_rate and the value head at head_lr, warmup then linear decay to "
    "final_scale, stepped once a phase; PPOConfig alone could give one learning rate and decay to 0",
    "minibatch order: TRL draws permutations with numpy's global RNG; ours with a torch generator seeded by seed",
    "repetition_coef/repetition_n (0: off), top_k (None), kl_estimator ('full': unused with GAE, whose "
    "per-token KL is k1 = TRL's kl_estimator 'k1'), adaptive_kl (off) have no PPOConfig field or are left off",
]


def tiny_args(smoke: bool = False, num_phases: int | None = None) -> RLHFArgs:
    """The tiny world's RLHF preset (smoke-sized when asked)."""
    overrides: dict[str, Any] = {}
    if smoke:
        overrides = dict(num_phases=2, batch_size=16, gen_len=8, num_minibatches=2)
    if num_phases is not None:
        overrides["num_phases"] = num_phases
    return RLHFArgs.preset("tiny", **overrides)


# ----------------------------------------------------------------------------------------------------
# The settings mapping
# ----------------------------------------------------------------------------------------------------


def trl_ppo_config(args: RLHFArgs, seed: int, out: str):
    """``args`` as a TRL 1.12 ``PPOConfig`` (CPU, float32, no checkpoints, logging or sample generations).

    One phase = one PPO "batch": ``per_device_train_batch_size * gradient_accumulation_steps =
    batch_size`` rollouts, ``num_mini_batches`` optimizer steps per pass, ``num_ppo_epochs`` passes;
    ``total_episodes = num_phases * batch_size``."""
    from trl.experimental.ppo import PPOConfig

    return PPOConfig(
        output_dir=out, seed=seed, use_cpu=course_device().type != "cuda", bf16=False, fp16=False,
        gradient_checkpointing=False, report_to=[], save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, dataloader_num_workers=0, num_sample_generations=0, push_to_hub=False,
        per_device_train_batch_size=args.batch_size, gradient_accumulation_steps=1,
        local_rollout_forward_batch_size=args.batch_size,
        num_mini_batches=args.num_minibatches, num_ppo_epochs=args.update_epochs,
        total_episodes=args.num_phases * args.batch_size,
        response_length=args.gen_len, temperature=args.temperature,
        stop_token=None, stop_token_id=None, missing_eos_penalty=None,
        learning_rate=args.learning_rate, max_grad_norm=args.max_grad_norm,  # (the rate: see trl_optimizer)
        kl_coef=args.kl_coef, kl_estimator="k1", cliprange=args.clip_coef,
        cliprange_value=1e9 if args.cliprange_value is None else args.cliprange_value,
        vf_coef=args.vf_coef, gamma=args.gamma, lam=args.gae_lambda, whiten_rewards=args.whiten_rewards,
    )


def trl_optimizer(args: RLHFArgs, policy: nn.Module, value_model: nn.Module):
    """Our optimizer and schedule for TRL's trainer (its ``optimizers`` argument): AdamW without weight
    decay, both trunks at ``learning_rate`` and the value head at ``head_lr``; ``rlhf.lr_schedule``
    stepped once a phase (TRL steps its scheduler once per PPO batch)."""
    from rlhf_tutorial import rlhf

    optimizer = torch.optim.AdamW([
        {"params": [*policy.parameters(), *value_model.transformer.parameters()], "lr": args.learning_rate},
        {"params": value_model.score.parameters(), "lr": args.head_lr},
    ], weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rlhf.lr_schedule(step, args.warmup_steps, args.num_phases, args.final_scale))
    return optimizer, scheduler


def value_head(d_model: int, seed: int) -> nn.Sequential:
    """Chapter 03's value head with the initial weights ours gets for ``seed`` (``RLHFTrainer`` seeds,
    then builds ``TransformerWithValueHead``, whose constructor makes the head first)."""
    from rlhf_tutorial import rlhf

    torch.manual_seed(seed)
    stub = SimpleNamespace(cfg=SimpleNamespace(d_model=d_model))  # all the constructor reads of the policy
    return rlhf.TransformerWithValueHead(stub).value_head


class ValueModel(nn.Module):
    """What TRL's PPO wants of a value model: a trunk at ``base_model_prefix`` (a copy of the policy's,
    returning hidden states) and ``score`` mapping the last hidden state (after ``ln_f``: what our value
    head reads) to one value per position."""

    base_model_prefix = "transformer"

    def __init__(self, policy: nn.Module, head: nn.Sequential):
        import copy

        super().__init__()
        self.transformer = copy.deepcopy(policy.transformer)
        self.score = head


class RewardShim(nn.Module):
    """A reward "model" for TRL's ``get_reward``: called as ``getattr(model, base_model_prefix)(input_ids=...,
    attention_mask=..., ...)`` then ``model.score(hidden_states[-1])`` read at each row's last token, it
    decodes the ids with the tokenizer (special tokens dropped, as our sampler's texts) and scores them with
    ``reward_fn`` (one call per rollout chunk), the score broadcast over the positions."""

    base_model_prefix = "backbone"

    def __init__(self, tokenizer, reward_fn):
        super().__init__()
        shim = self

        class Backbone(nn.Module):
            def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
                texts = shim.tokenizer.batch_decode(input_ids, skip_special_tokens=True)
                scores = shim.reward_fn(texts).float().to(input_ids.device)  # [b]
                values = scores[:, None, None].expand(-1, input_ids.shape[1], 1)  # [b s 1]
                return SimpleNamespace(hidden_states=(values,))

        self.tokenizer, self.reward_fn = tokenizer, reward_fn
        self.backbone = Backbone()
        self.score = nn.Identity()


# ----------------------------------------------------------------------------------------------------
# The two sides
# ----------------------------------------------------------------------------------------------------


def run_ours(args: RLHFArgs, seed: int, reward_fn, final_window: int, base=None, size: str = "tiny",
             smoke: bool = False) -> dict[str, Any]:
    """Our ``RLHFTrainer`` on the exported folder's TransformerLens original: a copy of ``base``, or (``base``
    None: in a process of its own) the race's policy loaded here (``bench_trl.load_race_policy``). The
    reference is copied from it inside the measured block (TRL's side loads its reference there too)."""
    import copy

    args = RLHFArgs(**{**asdict(args), "seed": seed, "fast": True})  # with the harness speed-ups (RLHFArgs.fast)
    policy = copy.deepcopy(base) if base is not None else load_race_policy(size, smoke)
    recorder = RewardRecorder(reward_fn)
    with _peak() as memory:
        setup = time.perf_counter()
        ref = copy.deepcopy(policy)
        trainer = RLHFTrainer(args, model=policy, ref_model=ref, reward_fn=recorder)
        setup = time.perf_counter() - setup
        recorder.start()
        history = trainer.train(progress=False)
    wall = time.perf_counter() - recorder.t0
    split = {s: statistics.fmean(r.get(f"seconds_{s}", 0.0) for r in history) for s in SECTIONS}
    side = _side(recorder, final_window, wall, len(history), split, memory)
    side["setup_seconds"] = round(setup, 3)
    side["early_stopped"] = bool(history and history[-1].get("early_stopped", False))
    return side


def run_trl(args: RLHFArgs, folder: Path, seed: int, final_window: int, threads: int,
            size: str = "tiny") -> dict[str, Any]:
    """TRL's side in a subprocess with the side install first on its path; its last stdout line."""
    if not (TRL_PPO_DIR / "trl").is_dir():
        raise RuntimeError(INSTALL_HINT)
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRL_PPO_DIR), str(repo)])}
    command = [sys.executable, "-m", "rlhf_tutorial.trainers.bench_trl_ppo", "--trl-side", "--folder", str(folder),
               "--seed", str(seed), "--final-window", str(final_window), "--threads", str(threads),
               "--size", size, "--args-json", json.dumps(asdict(args))]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the TRL side failed (exit {done.returncode}): {done.stdout[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def trl_side(args: RLHFArgs, folder: Path, seed: int, final_window: int, size: str = "tiny") -> dict[str, Any]:
    """TRL 1.12's PPOTrainer on the exported folder, with the same reward as ours (the tiny world's
    classifier; ``bench.even_word_share`` at ``size="gpt2"``); runs in the subprocess."""
    import gc

    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.ppo import PPOTrainer

    import rlhf_tutorial.trainers.export  # noqa: F401  (registers the biased-head GPT-2 with the Auto classes)
    from rlhf_tutorial.rewards import sentiment_reward_fn

    if size == "gpt2":
        from rlhf_tutorial.trainers.bench import even_word_share

        recorder = RewardRecorder(even_word_share)
    else:
        recorder = RewardRecorder(sentiment_reward_fn(args.world, args.direction))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.add_special_tokens({"pad_token": "<|ppo-race-pad|>"})  # an id past the vocabulary: never padded
    prompt_ids = tokenizer(args.prefix, add_special_tokens=False)["input_ids"]  # the BOS as ours: by the flag
    if args.prepend_bos:
        prompt_ids = [tokenizer.bos_token_id, *prompt_ids]
    dataset = Dataset.from_dict({"input_ids": [prompt_ids] * (args.batch_size * args.num_phases)})

    transformers.set_seed(seed)
    policy = make_resident(AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True))
    assert type(policy).__name__ == "GPT2WithUnembedBias", type(policy)
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    with tempfile.TemporaryDirectory() as out:
        with _peak() as memory:  # from the loaded policy on, as ours: the reference is loaded inside
            setup = time.perf_counter()
            ref = AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True)
            value_model = ValueModel(policy, value_head(policy.config.n_embd, seed))
            transformers.set_seed(seed)
            trainer = PPOTrainer(
                args=trl_ppo_config(args, seed, out), processing_class=tokenizer, model=policy, ref_model=ref,
                reward_model=RewardShim(tokenizer, recorder), train_dataset=dataset, value_model=value_model,
                optimizers=trl_optimizer(args, policy, value_model),
            )
            setup = time.perf_counter() - setup
            clock = PhaseClock()

            def rollout_forward(*_, **__) -> str | None:  # the critic's forward without gradients: the rollout's
                return None if torch.is_grad_enabled() else "old_logprobs"

            with clock.method(policy, "generate", "sampling"), clock.module(ref, "ref_logprobs"), \
                    clock.method(gc, "collect", "gc_collect"), \
                    clock.method(value_model.transformer, "forward", rollout_forward), \
                    contextlib.redirect_stdout(sys.stderr):  # TRL's printer callback logs every phase
                recorder.start()
                trainer.train()
        wall = time.perf_counter() - recorder.t0
        seconds = clock.take()
    phases = len(recorder.batches)  # one reward call per rollout (local_rollout_forward_batch_size = batch)
    split = {s: seconds.get(f"seconds_{s}", 0.0) / phases for s in SECTIONS}
    split["scoring"] = sum(b[2] for b in recorder.batches) / phases
    split["optimisation"] = wall / phases - sum(split.values())  # the rest: advantages, forward, backward, step
    side = _side(recorder, final_window, wall, phases, split, memory)
    side["setup_seconds"] = round(setup, 3)
    side["gc_collect_seconds_per_phase"] = round(seconds.get("seconds_gc_collect", 0.0) / phases, 4)  # in optimisation
    side["trl_version"] = trl.__version__
    return side


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial bench-trl --algo ppo", description=__doc__.split("\n")[0])
    common_flags(p)
    p.add_argument("--num-phases", type=int, default=None, help="default: the tiny RLHF preset's (50)")
    p.add_argument("--final-window", type=int, default=5, help="final reward: mean of the last this many phases")
    ns = resolve_common(p.parse_args(argv))
    if not (TRL_PPO_DIR / "trl").is_dir():
        return {"error": INSTALL_HINT}
    torch.set_num_threads(ns.threads)
    args = tiny_args(ns.smoke, ns.num_phases)
    if ns.size == "gpt2" and not ns.smoke:
        args = RLHFArgs(**{**asdict(args), **GPT2_SIZES["ppo"], **({"num_phases": ns.num_phases} if ns.num_phases else {})})

    from rlhf_tutorial.rewards import sentiment_reward_fn
    from rlhf_tutorial.trainers.export import export_hf

    with tempfile.TemporaryDirectory() as tmp:
        base, reward_fn = race_policy(ns.size, Path(tmp) / "tokenizer", ns.smoke)
        reward_fn = reward_fn or sentiment_reward_fn(args.world, args.direction)
        folder = export_hf(base, Path(tmp) / "policy")
        # at --size gpt2 ours runs in a process of its own too, as TRL's side always does (bench_trl: memory)
        own_base = None if ns.size == "gpt2" else base
        runs = alternate(ns.seeds, "bench-trl ppo", {
            "ours": lambda seed: run_side(ns, run_ours, args=args, seed=seed, reward_fn=reward_fn,
                                          final_window=ns.final_window, base=own_base, size=ns.size, smoke=ns.smoke),
            "trl": lambda seed: run_trl(args, folder, seed, ns.final_window, ns.threads, ns.size),
        })
    trl_version = runs["trl"][0]["trl_version"] if runs["trl"] else None
    return {**race_summary("ppo", trl_version, runs, ns, args, TRL_PPO_DIFFERENCES), "trl_install": str(TRL_PPO_DIR),
            "policy": policy_shape(base)}


def _trl_side_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description="the TRL side of the PPO race (run by main in a subprocess)")
    p.add_argument("--trl-side", action="store_true")
    p.add_argument("--folder", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--final-window", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--size", default="tiny")
    p.add_argument("--args-json", required=True)
    ns = p.parse_args(argv)
    torch.set_num_threads(ns.threads)
    side = trl_side(RLHFArgs(**json.loads(ns.args_json)), Path(ns.folder), ns.seed, ns.final_window, ns.size)
    print(json.dumps(side))


if __name__ == "__main__":
    if "--trl-side" in sys.argv[1:]:
        _trl_side_main(sys.argv[1:])
    else:
        print(json.dumps(main(sys.argv[1:])))
