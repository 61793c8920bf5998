"""Race our DPO trainer (chapter 06) against TRL's ``DPOTrainer`` on the same pairs, model and settings.

``python -m rlhf_tutorial bench-trl --algo dpo`` exports the tiny world's base policy to a transformers
folder (``trainers.export.export_hf``: the same logits). For each seed it draws the preference pairs
*once*, with our trainer's own code (``trainers.dpo.pairs_from_samples``: G samples per prompt from the
base policy, scored by the sentiment classifier, best and worst of each group), then trains on those
same pairs, one side after the other (alternating, so both see the same machine load):

- ours: ``trainers.dpo.train`` offline on the pairs (``to_batch`` computes the reference log-probs
  first, timed as the "prepare" phase);
- TRL: ``DPOTrainer`` on the exported folder, its dataset the pairs as strings (columns "prompt",
  "chosen", "rejected"); its constructor tokenizes them and, with ``precompute_ref_log_probs`` (ours
  computes the reference log-probs once too), runs the reference over them ("prepare" phase).

Both read the same token ids (``token_mismatches`` checks every pair: the tokenizer puts BOS before
the prompt as ``prepend_bos=True`` does; TRL appends EOS to every completion, ours has EOS only on the
completions that stopped, so ``max_length`` = prompt + ``max_new_tokens`` tokens cuts the extra EOS off
the ones that ran to the limit; the rare pair whose text does not tokenize back to its ids is dropped
for both, ``text_round_trips``). The settings map one to one (``trl_config``): beta, learning rate
(constant, no warmup, no weight decay), batch size, passes over the pairs, gradient clipping, the
sigmoid loss. The export's LayerNorms are the identity (our policy's are folded, ``LNPre``, with no
parameters) and are frozen on TRL's side, so both sides train the same parameters.

Both trained policies are measured the same way: TRL's weights are read back into a copy of our
``HookedTransformer`` (``tl_from_hf``, exact) and both are evaluated with ``policy_eval.evaluate_policy``
(the same seed: the same random stream) after every pass over the pairs (``eval_samples_per_round``
samples; this time is left out of the training time) and at the end (``eval_samples``). The summary
gives, per side: seconds per optimizer step and per pass, the prepare / train split, the training
wall time, the peak memory, the pair accuracy and implicit reward margin over all pairs at the end
(our ``sequence_logprobs`` on both policies), the final sampled reward and KL, and the training
seconds until a pass ends with sampled reward >= 0.9, with the ratios ours / TRL (medians over seeds).
Offline DPO on the tiny world levels off near 0.8, below 0.9, so the summary also gives the time to a
*common target* that both reach: per seed, the lower of the two sides' last-pass rewards
(``seconds_to_common_target``, labelled as such). What TRL cannot express goes into
``TRL_DPO_DIFFERENCES``.

Both sides run the same math, so they can report the same numbers. Each side writes the weights it is
measured on to a file, and the summary compares them (``trained_weights``, per seed: the largest absolute
difference between the two trained policies, ``max_abs_weight_diff_ours_trl``, and each one's largest change
from the starting policy; ``weight_gaps``). The first pass over the pairs goes in the same order on both
sides: TRL's sampler (accelerate's ``SeedableRandomSampler``) draws ``torch.randperm`` from a generator seeded
with ``seed + pass``, ours from one seeded with ``seed`` once. With the same loss, clipping and fused AdamW
step on the same batches, after one pass the two policies differ by float rounding only (far less than
either moved from the start). Then the pair accuracy and margin (functions of the weights) agree, and so do
the sampled reward and KL: the evaluations, drawn with the same seed from nearly the same distributions,
sample the same tokens. That is the one-pass ``--size gpt2`` race's case (the same four numbers per seed on
both sides), not a measuring fault. From the second pass on the orders differ (ours goes on with the same
generator), and so do the weights and the numbers.

At ``--size gpt2`` (random weights: the rewards mean nothing) each side runs in a fresh process of its own
(``bench_trl.isolated``; memory counted as ``bench_trl``'s docstring says: from the loaded policy on, and
the process's whole peak), and the policies are evaluated only after training, outside the measured
block: converting TRL's weights for an evaluation after every pass would put a ``HookedTransformer``
template, an evaluation reference and a converted copy in TRL's process that TRL itself never needs.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer

from rlhf_tutorial import dpo as dpo_fns
from rlhf_tutorial.speed import REWARD_TARGET
from rlhf_tutorial.trainers import dpo
from rlhf_tutorial.trainers.bench_trl import (
    GPT2_SIZES,
    MEMORY_COUNTED,
    MEMORY_KEYS,
    _loadavg,
    _median,
    _ratio,
    common_flags,
    load_race_policy,
    make_resident,
    memory_fields,
    per_process,
    policy_shape,
    race_policy,
    resolve_common,
    run_side,
)
from rlhf_tutorial.trainers.export import freeze_layernorms, tl_from_hf
from rlhf_tutorial.trainers.policy_eval import evaluate_policy
from rlhf_tutorial.trainers.runtime import PeakMemory

#: Where TRL's DPOTrainer differs from ours with the settings mapped as closely as it allows.
TRL_DPO_DIFFERENCES = [
    "pair order: both shuffle with torch.randperm; TRL's sampler reseeds its generator with seed + pass, ours "
    "seeds its generator with seed once: the same order in the first pass, a different one in the later passes "
    "(so after one pass both policies agree to float rounding: trained_weights)",
    "optimizer: TRL's default for TrainingArguments (reported as trl_optim); ours torch.optim.AdamW, both "
    "betas (0.9, 0.999), eps 1e-8, no weight decay, constant learning rate, no warmup",
    "parameters: the export's LayerNorm weights and biases (the identity; ours are folded into the next "
    "linear maps and have no parameters) are frozen on TRL's side, so both train the same parameters",
    "EOS: TRL appends EOS to every completion; ours has it only where sampling stopped. max_length = prompt + "
    "max_new_tokens tokens cuts it off again (exact for prompts of the longest length; token_mismatches counts "
    "the pairs whose token ids differ)",
    "padding: TRL pads a batch to its longest row, ours to prompt + max_new_tokens (masked: no effect on the loss)",
    "label_smoothing: TRL's 'sigmoid' loss ignores it (its 'robust' loss is a different correction); "
    "0 in the preset",
    "rounds x epochs: offline, ours makes rounds * epochs passes over the same pairs; TRL num_train_epochs = "
    "rounds * epochs (the same passes)",
    "tokens: TRL's dataset is strings; a sampled pair whose text does not tokenize back to its ids (a token "
    "that is part of a multi-byte character decodes to U+FFFD) cannot be given to it, so such pairs (about 1 in "
    "1000) are dropped for both sides (pairs_dropped_per_seed)",
    "online DPO, pairs='preferences', min_reward_gap and the pair drawing itself have no DPOConfig field: both "
    "sides train on the pairs drawn once by ours",
]


# ----------------------------------------------------------------------------------------------------
# Settings and data for TRL
# ----------------------------------------------------------------------------------------------------


def prompt_lengths(policy: HookedTransformer, args: dpo.DPOArgs) -> dict[str, int]:
    """Tokens of each prompt as our trainer feeds it (BOS included with ``prepend_bos``)."""
    return {p: policy.to_tokens(p, prepend_bos=args.prepend_bos).shape[1] for p in args.prompts}


def trl_config(args: dpo.DPOArgs, seed: int, out: str, max_prompt_tokens: int, num_processes: int = 1,
               use_cpu: bool | None = None):
    """``args`` as a TRL ``DPOConfig`` (float32, no checkpoints, no logging to services), on the course's
    device unless ``use_cpu`` says otherwise (the race runs both sides on the CPU). With ``num_processes``
    data-parallel processes (``scale-trl``) an optimizer step keeps its ``batch_size`` pairs: each process
    takes ``batch_size / num_processes`` of them."""
    from trl import DPOConfig

    from rlhf_tutorial.devices import course_device

    use_cpu = course_device().type != "cuda" if use_cpu is None else use_cpu
    return DPOConfig(
        output_dir=out, seed=seed, data_seed=seed, use_cpu=use_cpu, bf16=False, fp16=False,
        gradient_checkpointing=False, report_to=[], save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, dataloader_num_workers=0, dataloader_drop_last=False,
        per_device_train_batch_size=per_process(args.batch_size, num_processes, "a batch (batch_size)"),
        gradient_accumulation_steps=1,
        num_train_epochs=args.rounds * args.epochs, max_steps=-1,
        learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=args.max_grad_norm,
        beta=args.beta, loss_type=[args.loss_type], label_smoothing=args.label_smoothing,
        max_length=max_prompt_tokens + args.max_new_tokens, truncation_mode="keep_start",
        precompute_ref_log_probs=True, precompute_ref_batch_size=64, disable_dropout=True,
    )


def prompt_of(text: str, prompts: tuple[str, ...]) -> str:
    """The (longest) prompt ``text`` starts with: the texts of our pairs are prompt + completion."""
    return max((p for p in prompts if text.startswith(p)), key=len)


def trl_dataset_rows(pairs: list[tuple], prompts: tuple[str, ...]) -> dict[str, list[str]]:
    """Our pairs as TRL's string columns. The prompt goes without BOS (the tokenizer adds it) and the
    completions without EOS (TRL appends it)."""
    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    for pair in pairs:
        chosen_text, rejected_text = pair[4], pair[5]
        prompt = prompt_of(chosen_text, prompts)
        rows["prompt"].append(prompt)
        rows["chosen"].append(chosen_text[len(prompt):])
        rows["rejected"].append(rejected_text[len(prompt):])
    return rows


def our_ids(tokens: torch.Tensor, mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """A pair row as our loss reads it: (the ids up to the last completion token, completion mask)."""
    end = int(mask.nonzero().max()) + 1
    return tokens[:end].tolist(), mask[:end].long().tolist()


def token_mismatches(pairs: list[tuple], trainer) -> int:
    """How many pairs TRL's trainer reads with token ids (or completion masks) other than ours."""
    bad = 0
    for k, pair in enumerate(pairs):
        batch = trainer.data_collator([trainer.train_dataset[k]])
        theirs = []
        for row in range(2):  # chosen, rejected
            n = int(batch["attention_mask"][row].sum())
            theirs.append((batch["input_ids"][row, :n].tolist(), batch["completion_mask"][row, :n].tolist()))
        bad += theirs != [our_ids(pair[0], pair[1]), our_ids(pair[2], pair[3])]
    return bad


# ----------------------------------------------------------------------------------------------------
# The trained weights
# ----------------------------------------------------------------------------------------------------


def save_trained(policy: HookedTransformer, path: str | Path) -> None:
    """``policy``'s parameters (float32, CPU) to a safetensors file: a side's weights as it is measured."""
    from safetensors.torch import save_file

    save_file({name: p.detach().float().cpu().contiguous() for name, p in policy.named_parameters()}, str(path))


def weight_gaps(base: HookedTransformer, ours: str | Path, trl: str | Path) -> dict[str, float]:
    """max |w_ours - w_trl| over every parameter of the two trained policies (read from the files their sides
    wrote, ``save_trained``), and each side's max |w - w_start| from ``base``; read one tensor at a time."""
    from safetensors import safe_open

    start = {name: p.detach().float().cpu() for name, p in base.named_parameters()}
    gaps = {"max_abs_weight_diff_ours_trl": 0.0, "max_abs_weight_change_ours": 0.0, "max_abs_weight_change_trl": 0.0}
    with safe_open(str(ours), "pt") as a, safe_open(str(trl), "pt") as b:
        if set(a.keys()) != set(start) or set(b.keys()) != set(start):
            raise RuntimeError(f"the trained weights ({ours}, {trl}) do not have the starting policy's parameters")
        for name, w0 in start.items():
            w_ours, w_trl = a.get_tensor(name), b.get_tensor(name)
            for key, gap in (("max_abs_weight_diff_ours_trl", w_ours - w_trl),
                             ("max_abs_weight_change_ours", w_ours - w0), ("max_abs_weight_change_trl", w_trl - w0)):
                gaps[key] = max(gaps[key], gap.abs().max().item())
    return {k: float(f"{v:.3g}") for k, v in gaps.items()}


# ----------------------------------------------------------------------------------------------------
# The two sides
# ----------------------------------------------------------------------------------------------------


class EvalClock:
    """Evaluates a policy after every pass, notes (training seconds so far, reward); the seconds spent
    evaluating are left out of the training time."""

    def __init__(self, reference: HookedTransformer, reward_fn, args: dpo.DPOArgs, seed: int):
        self.reference, self.reward_fn, self.args, self.seed = reference, reward_fn, args, seed
        self.curve: list[tuple[float, float]] = []
        self.eval_seconds = 0.0
        self.t0 = time.perf_counter()

    def start(self) -> None:
        self.curve, self.eval_seconds, self.t0 = [], 0.0, time.perf_counter()

    def train_seconds(self) -> float:
        return time.perf_counter() - self.t0 - self.eval_seconds

    def evaluate(self, policy: HookedTransformer, n: int) -> dict[str, Any]:
        a = self.args
        return evaluate_policy(policy, self.reference, self.reward_fn, a.prompts, n, a.max_new_tokens,
                               seed=self.seed + 1, temperature=a.temperature, prepend_bos=a.prepend_bos)

    def after_pass(self, policy: HookedTransformer) -> None:
        trained = self.train_seconds()
        begin = time.perf_counter()
        result = self.evaluate(policy, self.args.eval_samples_per_round)
        self.eval_seconds += time.perf_counter() - begin
        self.curve.append((trained, result["reward"]))


@torch.no_grad()
def pair_stats(policy: HookedTransformer, batch: dpo.PairBatch, beta: float) -> dict[str, float]:
    """Accuracy and mean implicit reward margin of ``policy`` over all pairs (our log-probs, both sides)."""
    def logps(tokens, mask):
        return torch.cat([dpo_fns.sequence_logprobs(policy(t), t, m)
                          for t, m in zip(tokens.split(64), mask.split(64))])

    margin = (dpo_fns.implicit_reward(logps(batch.chosen, batch.chosen_mask), batch.ref_chosen_logps, beta)
              - dpo_fns.implicit_reward(logps(batch.rejected, batch.rejected_mask), batch.ref_rejected_logps, beta))
    return {"pair_accuracy": round((margin > 0).float().mean().item(), 4), "reward_margin": round(margin.mean().item(), 4)}


def _side(clock: EvalClock, policy: HookedTransformer, batch: dpo.PairBatch, prepare: float, train: float,
          steps: int, passes: int, memory, weights_out: str | None = None) -> dict[str, Any]:
    if weights_out is not None:  # the weights measured below, for the summary's trained_weights
        save_trained(policy, weights_out)
    final = clock.evaluate(policy, clock.args.eval_samples)
    if not clock.curve:  # evaluated only after training (--size gpt2): the final evaluation ends the curve
        clock.curve = [(train, final["reward"])]
    first = next((k for k, (_, r) in enumerate(clock.curve) if r >= REWARD_TARGET), None)
    return {
        "steps": steps,
        "passes": passes,
        "prepare_seconds": round(prepare, 3),
        "train_seconds": round(train, 3),
        "wall_seconds": round(prepare + train, 3),
        "seconds_per_step": round(train / steps, 5),
        "seconds_per_pass": round(train / passes, 4),
        **memory_fields(memory),
        **pair_stats(policy, batch, clock.args.beta),
        "final_reward": round(final["reward"], 4),
        "final_reward_se": round(final["reward_se"], 4),
        "final_kl": round(final["kl"], 4),
        "reward_per_pass": [round(r, 4) for _, r in clock.curve],
        "train_seconds_per_pass": [round(t, 3) for t, _ in clock.curve],
        "passes_to_target": None if first is None else first + 1,
        "seconds_to_target": None if first is None else round(clock.curve[first][0], 3),
        "eval_seconds_left_out": round(clock.eval_seconds, 2),
    }


def run_ours(args: dpo.DPOArgs, base: HookedTransformer | None, pairs: list[tuple], reward_fn, seed: int,
             size: str = "tiny", smoke: bool = False, per_pass: bool = True, weights_out: str | None = None) -> tuple:
    """Our trainer, offline, on the drawn pairs (rounds x epochs passes as rounds of one epoch: the same
    sequence of shuffles), on a copy of ``base`` or (``base`` None: in a process of its own) the race's
    policy loaded here. ``per_pass``: evaluate after every pass; then the reference (the trainer's and the
    evaluations') is copied inside the measured block. Else only at the end: the reference log-probs come
    from the untrained policy and no reference is kept while training (as TRL's ``precompute_ref_log_probs``);
    the final evaluation's is loaded after the measured block. ``weights_out``: where to write the trained
    weights (``save_trained``)."""
    policy = copy.deepcopy(base) if base is not None else load_race_policy(size, smoke)
    passes = args.rounds * args.epochs
    run_args = dpo.DPOArgs(**{**asdict(args), "seed": seed, "rounds": passes, "epochs": 1})
    with PeakMemory("cpu") as memory:
        # evaluated after every pass: a reference for the evaluations' KL (the trainer's too). Else, as TRL's
        # precompute_ref_log_probs: the reference log-probs from the untrained policy itself, no copy kept
        reference = copy.deepcopy(policy).eval().requires_grad_(False) if per_pass else None
        clock = EvalClock(reference, reward_fn, args, seed)
        clock.start()
        with torch.no_grad():
            batch = dpo.to_batch(pairs, reference if per_pass else policy)
        prepare = clock.train_seconds()
        result = dpo.train(run_args, policy=policy, reference=reference, reward_fn=reward_fn, pairs=batch,
                           evaluate=False, progress=False,
                           callback=(lambda record: clock.after_pass(policy)) if per_pass else None)
        train = clock.train_seconds() - prepare
    if reference is None:  # the final evaluation's reference, after the measured block
        clock.reference = load_race_policy(size, smoke).eval().requires_grad_(False) if base is None else base
    steps = passes * -(-len(batch) // args.batch_size)
    clock.curve = [(t - prepare, r) for t, r in clock.curve]
    return _side(clock, result.policy.eval(), batch, prepare, train, steps, passes, memory, weights_out), batch


def run_ours_side(**kwargs: Any) -> dict[str, Any]:
    """``run_ours``'s side dict alone (what ``bench_trl.isolated`` sends back)."""
    return run_ours(**kwargs)[0]


def run_trl(args: dpo.DPOArgs, folder: Path, base: HookedTransformer | None, pairs: list[tuple], batch: dpo.PairBatch,
            reward_fn, seed: int, max_prompt: int, size: str = "tiny", smoke: bool = False,
            per_pass: bool = True, weights_out: str | None = None) -> dict[str, Any]:
    """TRL's DPOTrainer on the exported folder, its dataset the same pairs as strings. ``max_prompt``: the
    longest prompt's tokens (``prompt_lengths``). Its weights are evaluated in a copy of ``base`` (``base``
    None: the race's policy, loaded after training); ``per_pass``: after every pass (needs ``base``), else
    only at the end. ``weights_out``: where to write the read-back weights (``save_trained``)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOTrainer

    import rlhf_tutorial.trainers.export  # noqa: F401  (registers the biased-head GPT-2 with the Auto classes)

    reference = copy.deepcopy(base).eval().requires_grad_(False) if base is not None else None
    clock = EvalClock(reference, reward_fn, args, seed)
    model = make_resident(AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True), "cpu")
    assert type(model).__name__ == "GPT2WithUnembedBias", type(model)
    freeze_layernorms(model)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    dataset = Dataset.from_dict(trl_dataset_rows(pairs, args.prompts))

    class AfterPass(TrainerCallback):
        def on_epoch_end(self, _args, state, control, **kwargs):
            clock.after_pass(tl_from_hf(kwargs["model"], base))

    with tempfile.TemporaryDirectory() as out:
        clock.start()
        with PeakMemory("cpu") as memory:
            trainer = DPOTrainer(model=model, args=trl_config(args, seed, out, max_prompt, use_cpu=True), train_dataset=dataset,
                                 processing_class=tokenizer, callbacks=[AfterPass()] if per_pass else [])
            prepare = clock.train_seconds()
            trainer.train()
            train = clock.train_seconds() - prepare
        clock.curve = [(t - prepare, r) for t, r in clock.curve]
        mismatches = token_mismatches(pairs, trainer)
        optim, steps = str(trainer.args.optim), trainer.state.global_step
    if base is None:  # the evaluation's template and reference, after the measured block
        base = load_race_policy(size, smoke).eval()
        clock.reference = copy.deepcopy(base).eval().requires_grad_(False)
    side = _side(clock, tl_from_hf(trainer.model, base), batch, prepare, train, steps, args.rounds * args.epochs,
                 memory, weights_out)
    side.update(trl_optim=optim, token_mismatches=mismatches)
    return side


# ----------------------------------------------------------------------------------------------------
# The race
# ----------------------------------------------------------------------------------------------------

#: What the summary's ``trained_weights`` shows (module docstring).
TRAINED_WEIGHTS_NOTE = (
    "per seed, from the weights each side's metrics are measured on: the largest absolute difference between the "
    "two trained policies and each one's largest change from the start. The first pass goes in the same pair order "
    "on both sides (trl_differences): after one pass the policies differ by float rounding only, far less than "
    "they moved, and the sampled metrics agree (the same evaluation seed draws the same tokens)")

SMOKE = dict(num_pairs=16, group_size=4, max_new_tokens=8, rounds=2, batch_size=4, eval_samples=16,
             eval_samples_per_round=8)

KEYS = ("prepare_seconds", "train_seconds", "wall_seconds", "seconds_per_step", "seconds_per_pass",
        "seconds_to_target", "seconds_to_common_target", *MEMORY_KEYS, "final_reward", "final_kl",
        "pair_accuracy", "reward_margin")


def text_round_trips(pair: tuple, policy: HookedTransformer, args: dpo.DPOArgs) -> bool:
    """Whether both texts of ``pair`` tokenize back to the pair's token ids (an EOS after them aside).
    Not always so: a sampled token that is part of a multi-byte character decodes to U+FFFD, which
    encodes to other tokens; a string dataset (TRL's) cannot carry such a completion."""
    eos = policy.tokenizer.eos_token_id
    for tokens, mask, text in ((pair[0], pair[1], pair[4]), (pair[2], pair[3], pair[5])):
        ids, _ = our_ids(tokens, mask)
        again = policy.to_tokens(text, prepend_bos=args.prepend_bos)[0].tolist()
        if ids[: len(again)] != again or ids[len(again):] not in ([], [eos]):
            return False
    return True


def draw_pairs(args: dpo.DPOArgs, base: HookedTransformer, reward_fn, seed: int) -> tuple[list[tuple], dict]:
    """The pairs of one seed, drawn by our trainer's code from the base policy (as ``dpo.train`` does),
    less those whose texts do not tokenize back to their ids (``text_round_trips``: about 1 in 1000;
    counted as ``pairs_dropped``): both sides then train on the same token ids."""
    torch.manual_seed(seed)
    pairs, stats = dpo.pairs_from_samples(base.eval(), reward_fn, dpo.DPOArgs(**{**asdict(args), "seed": seed}))
    kept = [pair for pair in pairs if text_round_trips(pair, base, args)]
    return kept, {**stats, "pairs_dropped": len(pairs) - len(kept)}


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial bench-trl --algo dpo",
                                description=__doc__.split("\n")[0])
    common_flags(p)
    p.add_argument("--rounds", type=int, default=None, help="passes over the pairs (default: the tiny preset's, 5)")
    p.add_argument("--num-pairs", type=int, default=None, help="groups sampled for pairs (default: the preset's, 384)")
    ns = resolve_common(p.parse_args(argv))
    try:
        import trl
    except ImportError:
        return {"error": "TRL is not installed: pip install 'rlhf-tutorial[trl]' (or make test, which installs it)"}
    torch.set_num_threads(ns.threads)
    overrides: dict[str, Any] = dict(SMOKE) if ns.smoke else dict(GPT2_SIZES["dpo"]) if ns.size == "gpt2" else {}
    if ns.rounds is not None:
        overrides["rounds"] = ns.rounds
    if ns.num_pairs is not None:
        overrides["num_pairs"] = ns.num_pairs
    args = dpo.DPOArgs.preset("tiny", **overrides)

    from rlhf_tutorial.devices import course_device
    from rlhf_tutorial.rewards import sentiment_reward_fn
    from rlhf_tutorial.trainers.export import export_hf

    if course_device().type != "cpu":
        print(f"[bench-trl dpo] both sides run on the CPU, not {course_device()}: the race's pairs, reference and "
              "evaluations live there, and memory is counted alike on both sides", file=sys.stderr)
    runs: dict[str, list[dict]] = {"ours": [], "trl": []}
    pair_counts, dropped, trained = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        base, reward_fn = race_policy(ns.size, Path(tmp) / "tokenizer", ns.smoke)
        base, reward_fn = base.eval(), reward_fn or sentiment_reward_fn("tiny", args.direction)
        folder = export_hf(base, Path(tmp) / "policy")
        isolate = ns.size == "gpt2"
        max_prompt = max(prompt_lengths(base, args).values())
        for seed in ns.seeds:
            pairs, stats = draw_pairs(args, base, reward_fn, seed)
            pair_counts.append(len(pairs))
            dropped.append(stats["pairs_dropped"])
            print(f"[bench-trl dpo] seed {seed}: {len(pairs)} pairs (sample reward {stats['sample_reward']:.3f})",
                  file=sys.stderr)
            order = ("ours", "trl") if seed % 2 == 0 else ("trl", "ours")  # alternate who goes first
            batch = dpo.to_batch(pairs, base)  # for the pair statistics (the same numbers ours computes)
            # at --size gpt2 each side in a process of its own, evaluated only at the end (module docstring)
            common = dict(args=args, base=None if isolate else base, pairs=pairs, reward_fn=reward_fn, seed=seed,
                          size=ns.size, smoke=ns.smoke, per_pass=not isolate)
            weights = {name: str(Path(tmp) / f"{name}.safetensors") for name in order}  # each side's trained weights
            for name in order:
                if name == "ours":
                    side = run_side(ns, run_ours_side, weights_out=weights[name], **common)
                else:
                    side = run_side(ns, run_trl, folder=folder, batch=batch, max_prompt=max_prompt,
                                    weights_out=weights[name], **common)
                runs[name].append({"seed": seed, "pairs": len(pairs), **side})
                print(f"[bench-trl dpo]   {name}: train {side['train_seconds']} s, reward {side['final_reward']}",
                      file=sys.stderr)
            trained.append({"seed": seed, **weight_gaps(base, weights["ours"], weights["trl"])})
            for path in weights.values():  # the next seed's sides write their own (at --size gpt2, 650 MB each)
                Path(path).unlink()
            ours, theirs = runs["ours"][-1], runs["trl"][-1]
            common = min(ours["reward_per_pass"][-1], theirs["reward_per_pass"][-1])
            for run in (ours, theirs):
                k = next(k for k, r in enumerate(run["reward_per_pass"]) if r >= common)
                run["common_target"] = common
                run["seconds_to_common_target"] = run["train_seconds_per_pass"][k]

    medians = {name: {k: _median([r[k] for r in runs[name]]) for k in KEYS} for name in runs}
    ratio_keys = ("prepare_seconds", "train_seconds", "wall_seconds", "seconds_per_step", "seconds_per_pass",
                  "seconds_to_target", "seconds_to_common_target", "peak_memory_mb", "process_peak_mb")
    return {
        "algo": "dpo",
        "trl_version": trl.__version__,
        "torch_threads": ns.threads,
        "size": ns.size,
        "device": "cpu",  # both sides, on every machine: the race's pairs, reference and evaluation live there
        "policy": policy_shape(base),
        "seeds": ns.seeds,
        "smoke": ns.smoke,
        "reward_target": REWARD_TARGET,
        "common_target": "per seed, the lower of the two sides' last-pass rewards (both reach it): "
                         "seconds_to_common_target is the training time until a pass ends at or above it",
        "pairs_per_seed": pair_counts,
        "pairs_dropped_per_seed": dropped,
        "median": medians,
        "ratio_ours_over_trl": {k: _ratio(medians["ours"][k], medians["trl"][k]) for k in ratio_keys},
        "final_reward_difference": round(medians["ours"]["final_reward"] - medians["trl"]["final_reward"], 4),
        "token_mismatches": sum(r["token_mismatches"] for r in runs["trl"]),
        "trained_weights": trained,
        "trained_weights_note": TRAINED_WEIGHTS_NOTE,
        "runs": runs,
        "settings": {k: v for k, v in asdict(args).items() if k != "world"},
        "trl_differences": TRL_DPO_DIFFERENCES,
        "memory_counted": MEMORY_COUNTED[ns.size],
        "load": _loadavg(),
    }
