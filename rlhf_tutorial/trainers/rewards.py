"""Running chapter 02's reward model: its arguments, the training loop and ``train-reward-model``.

The pieces a learner writes (``RewardModel``, ``bradley_terry_loss``, ``reward_model_train_step``)
live in ``rlhf_tutorial.rewards``; this module runs them.
``train_reward_model(args, model=..., **learner_functions(globals()))`` runs a notebook's versions in
place of the reference ones (see ``rlhf_tutorial.trainers.plug``).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from rlhf_tutorial import rewards
from rlhf_tutorial.devices import device_of, resolve
from rlhf_tutorial.rewards import PairBatch, RewardModel, evaluate_pairs, tokenize_pairs
from rlhf_tutorial.trainers.args import add_flags, arg, documented, given_flags, gpt2_size_presets
from rlhf_tutorial.trainers.plug import bind, learner_functions_for
from rlhf_tutorial.trainers.runtime import torch_threads
from rlhf_tutorial.trainers.schedules import warmup_then_linear_to_zero

# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------


@documented
@dataclass
class RewardModelArgs:
    """Every knob of :func:`train_reward_model` (and of ``python -m rlhf_tutorial train-reward-model``)."""

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds the head's initialisation and the order of the batches")
    pooling: str = arg("last", "how per-position features become one reward: 'last', 'mean_scores' or 'mean_hidden'")
    head_hidden: int | None = arg(None, "None: a linear head; an int: a ReLU MLP head with that many hidden units")
    epochs: int = arg(2, "passes over the training pairs")
    batch_size: int = arg(16, "pairs per optimizer step")
    learning_rate: float = arg(5e-4, "AdamW learning rate of the backbone")
    head_lr: float = arg(3e-3, "AdamW learning rate of the scalar head (new weights learn faster)")
    weight_decay: float = arg(0.0, "AdamW weight decay (all parameters)")
    warmup_steps: int = arg(10, "linear learning-rate warm-up from 0 over this many steps")
    decay: bool = arg(True, "after the warm-up, decay the learning rates linearly to 0 at the last step (else keep them)")
    max_len: int | None = arg(None, "keep at most this many tokens per text (BOS included); None: the model's context length")
    max_train_pairs: int | None = arg(None, "use only the first N training pairs (for quick runs)")
    max_test_pairs: int | None = arg(None, "evaluate on only the first N held-out pairs")
    bucket: bool = arg(True, "group pairs of similar length into batches (less padding; the batch order stays random)")
    eval_every: int = arg(50, "optimizer steps between two held-out evaluations (plus one before and one at the end)")
    eval_batch_size: int = arg(64, "pairs per forward pass during evaluation")
    device: str | None = arg(None, "where to train ('cpu', 'cuda'); None: wherever the model already is")
    threads: int | None = arg(1, "torch CPU threads while training (1: reproducible, fastest for the tiny model; "
                              "the previous setting is restored afterwards); None or 0 leaves torch's default")
    progress: bool = arg(True, "show a tqdm progress bar (on stderr)")

    @classmethod
    def preset(cls, world: str, **overrides: Any) -> RewardModelArgs:
        """The preset of ``world`` ('tiny' or 'gpt2'; in the GPT-2 world, of the chosen size:
        ``worlds.preset_key``) with ``overrides`` applied."""
        from rlhf_tutorial.worlds import preset_key

        return cls(**{**PRESETS[preset_key(world)], "world": world, **overrides})


#: Per-world settings. The tiny world's are the dataclass defaults (measured in the README). GPT-2's are
#: ours and untested on real weights (the seed blog trains no reward model): a pretrained backbone is
#: fine-tuned at the seed blog's GPT-2 base learning rates (1e-5 for the transformer, 1e-4 for the fresh
#: head, its "base" run), with a 20-step warm-up as its policy runs have; the larger sizes scale the
#: learning rates by ``trainers.args.GPT2_SCALING`` (square-root rule, sources there).
PRESETS: dict[str, dict[str, Any]] = {"tiny": {}, "gpt2": dict(learning_rate=1e-5, head_lr=1e-4, warmup_steps=20)}
PRESETS.update(gpt2_size_presets(PRESETS["gpt2"], dict(lr_scale=("learning_rate", "head_lr"))))


#: The functions ``train_reward_model`` lets you replace by keyword (your own version from the notebook).
PLUGGABLE = ("RewardModel", "bradley_terry_loss", "reward_model_train_step")

learner_functions = learner_functions_for(PLUGGABLE)


def epoch_batches(
    data: PairBatch, batch_size: int, generator: torch.Generator, bucket: bool = True
) -> list[Int[Tensor, "batch"]]:
    """One epoch of batch indices: a random permutation cut into batches.

    With ``bucket``, each window of 16 batches of the permutation is sorted by pair length (the longer
    side) before it is cut, and the batches are shuffled: batches hold texts of similar length, so
    trimming the padding saves most of the wasted computation, and the order stays random.
    """
    order = torch.randperm(len(data), generator=generator)
    if bucket:
        length = torch.maximum(data.chosen_mask.sum(1), data.rejected_mask.sum(1))  # [n]
        window = 16 * batch_size
        chunks = [order[i : i + window] for i in range(0, len(order), window)]
        order = torch.cat([c[length[c].argsort(stable=True)] for c in chunks])
    batches = list(order.split(batch_size))
    if bucket:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def train_reward_model(
    args: RewardModelArgs,
    model: RewardModel | None = None,
    train_pairs: Sequence[dict] | PairBatch | None = None,
    test_pairs: Sequence[dict] | PairBatch | None = None,
    on_eval: Callable[[dict], None] | None = None,
    **overrides: Any,
) -> tuple[RewardModel, dict[str, list]]:
    """Train a Bradley-Terry reward model; return it and its history.

    ``model`` defaults to ``RewardModel`` around the world's policy, the pairs to the world's train
    and test splits (dicts with prompt/chosen/rejected, or an already tokenized :class:`PairBatch`).
    Any name in ``PLUGGABLE`` can be replaced by keyword (``reward_model_train_step=your_step``).
    ``on_eval`` is called with the history after every evaluation (for a live plot).

    The history has ``n_train_pairs`` and ``n_test_pairs`` (one-element lists), per-step lists ``step``,
    ``loss``, ``accuracy``, ``margin`` and per-evaluation lists ``eval_step``, ``heldout_accuracy``,
    ``heldout_loss``, ``heldout_margin``.
    """
    fns = bind(rewards, PLUGGABLE, overrides)
    with torch_threads(args.threads):
        return _train_reward_model(args, model, train_pairs, test_pairs, fns, on_eval)


def _train_reward_model(args, model, train_pairs, test_pairs, fns, on_eval):
    torch.manual_seed(args.seed)
    if model is None or train_pairs is None or test_pairs is None:
        from rlhf_tutorial import worlds  # only when the world has to supply something

        if model is None:
            policy = worlds.load_policy(args.world)
            model = fns["RewardModel"](policy, pooling=args.pooling, head_hidden=args.head_hidden)
        if train_pairs is None:
            train_pairs = worlds.load_preference_pairs(args.world, split="train")
        if test_pairs is None:
            test_pairs = worlds.load_preference_pairs(args.world, split="test")
    if args.device is not None:
        model = model.to(resolve(args.device))
    device = device_of(model)  # the model's device; the tokenized pairs stay on the CPU, batches move there
    train_step = fns["reward_model_train_step"]

    def prepare(pairs: Sequence[dict] | PairBatch, limit: int | None) -> PairBatch:
        if isinstance(pairs, PairBatch):
            keep = torch.arange(len(pairs))[:limit]
            return PairBatch(*(getattr(pairs, f.name)[keep] for f in dataclasses.fields(pairs)))
        return tokenize_pairs(model.base_model, list(pairs)[:limit], args.max_len)

    train_data = prepare(train_pairs, args.max_train_pairs)
    test_data = prepare(test_pairs, args.max_test_pairs)

    head_params = list(model.head.parameters())
    head_ids = {id(p) for p in head_params}
    base_params = [p for p in model.parameters() if id(p) not in head_ids]
    optimizer = torch.optim.AdamW(
        [{"params": base_params, "lr": args.learning_rate}, {"params": head_params, "lr": args.head_lr}],
        weight_decay=args.weight_decay,
    )

    total = -(-len(train_data) // args.batch_size) * args.epochs

    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_then_linear_to_zero(step, total, args.warmup_steps, args.decay)
    )

    history: dict[str, list] = {"n_train_pairs": [len(train_data)], "n_test_pairs": [len(test_data)]}
    history.update({k: [] for k in ("step", "loss", "accuracy", "margin")})
    history.update({k: [] for k in ("eval_step", "heldout_accuracy", "heldout_loss", "heldout_margin")})

    def evaluate(step: int) -> None:
        model.eval()
        metrics = evaluate_pairs(model, test_data, args.eval_batch_size)
        model.train()
        history["eval_step"].append(step)
        for key in ("accuracy", "loss", "margin"):
            history[f"heldout_{key}"].append(metrics[key])
        if on_eval is not None:
            on_eval(history)

    generator = torch.Generator().manual_seed(args.seed)
    evaluate(0)
    step = 0
    bar = tqdm(total=total, desc="reward model", disable=not args.progress)
    for _ in range(args.epochs):
        for idx in epoch_batches(train_data, args.batch_size, generator, args.bucket):
            batch = train_data.select(idx, device)
            metrics = train_step(model, optimizer, *batch)
            scheduler.step()
            step += 1
            history["step"].append(step)
            for key in ("loss", "accuracy", "margin"):
                value = metrics[key]
                history[key].append(float(value.detach()) if isinstance(value, Tensor) else float(value))
            bar.update(1)
            bar.set_postfix(loss=f"{history['loss'][-1]:.3f}", acc=f"{history['heldout_accuracy'][-1]:.2f}")
            if step % args.eval_every == 0 and step < total:
                evaluate(step)
    bar.close()
    evaluate(step)
    model.eval()
    return model, history


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial train-reward-model",
        description="Train a Bradley-Terry reward model on preference pairs; print a JSON summary.",
    )
    add_flags(parser, RewardModelArgs, from_preset=True)
    return parser


def main(argv: list[str]) -> dict:
    """CLI: train the reward model and return a summary (printed as JSON by the CLI)."""
    from rlhf_tutorial import worlds

    given = given_flags(RewardModelArgs, _parser().parse_args(argv))
    world = worlds.resolve_world(given.pop("world", None))
    args = RewardModelArgs.preset(world, **given)
    start = time.perf_counter()
    train_pairs = worlds.load_preference_pairs(args.world, split="train")
    test_pairs = list(worlds.load_preference_pairs(args.world, split="test"))[: args.max_test_pairs]
    model, history = train_reward_model(args, train_pairs=train_pairs, test_pairs=test_pairs)
    by_kind = {}
    for kind in sorted({p.get("kind") for p in test_pairs} - {None}):
        subset = [p for p in test_pairs if p.get("kind") == kind]
        by_kind[kind] = round(evaluate_pairs(model, tokenize_pairs(model.base_model, subset, args.max_len))["accuracy"], 4)
    wall = time.perf_counter() - start
    steps_per_epoch = max(1, len(history["step"]) // max(1, args.epochs))
    last_epoch = history["accuracy"][-steps_per_epoch:]
    return {
        "command": "train-reward-model",
        "world": worlds.resolve_world(args.world),
        "seed": args.seed,
        "pooling": args.pooling,
        "epochs": args.epochs,
        "steps": len(history["step"]),
        "n_train_pairs": history["n_train_pairs"][0],
        "n_test_pairs": history["n_test_pairs"][0],
        "initial_heldout_accuracy": history["heldout_accuracy"][0],
        "heldout_accuracy": history["heldout_accuracy"][-1],
        "heldout_accuracy_by_kind": by_kind,
        "heldout_loss": history["heldout_loss"][-1],
        "heldout_margin": history["heldout_margin"][-1],
        "heldout_curve": [[s, round(a, 4)] for s, a in zip(history["eval_step"], history["heldout_accuracy"])],
        "train_accuracy_last_epoch": sum(last_epoch) / len(last_epoch),
        "final_train_loss": history["loss"][-1],
        "torch_threads": args.threads or torch.get_num_threads(),
        "wall_seconds": round(wall, 2),
        "args": dataclasses.asdict(args),
    }
