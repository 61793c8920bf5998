"""Saving and loading chapter 03's tuned policy (the policy with its value head): safetensors for the
weights (no code runs on load), JSON for the run's arguments and world, so it can be rebuilt, and, in
the GPT-2 world on a stand-in hub cache, which stand-in it was trained on (its tokenizer and vocabulary:
weights trained with one tokenizer mean nothing under another, :func:`stand_in_mismatch`).

Apart from the trainer (``trainers.rlhf``) so that what only loads a checkpoint (``export``,
``interp_report``, ``tiny.tuned``) does not import the trainer.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf_tutorial.rlhf import TransformerWithValueHead

if TYPE_CHECKING:
    from rlhf_tutorial.trainers.rlhf import RLHFArgs

WEIGHTS_FILE, CONFIG_FILE = "policy.safetensors", "rlhf_config.json"


def save_tuned_policy(model: TransformerWithValueHead, path: str | Path, args: RLHFArgs, **extra: Any) -> Path:
    """Write the policy and its value head to ``path/policy.safetensors`` and the run's arguments
    (with the world, so it can be rebuilt, and ``stand_in``: the stand-in policy it was trained on,
    :func:`rlhf_tutorial.worlds.policy_stand_in`, None for the tiny world and a real GPT-2) to
    ``path/rlhf_config.json``. Returns the folder."""
    from safetensors.torch import save_model

    from rlhf_tutorial.worlds import policy_stand_in, resolve_world

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / WEIGHTS_FILE))
    world = resolve_world(args.world)
    config = {"world": world, "args": asdict(args), "stand_in": policy_stand_in(world), **extra}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str))
    return folder


def stand_in_mismatch(path: str | Path) -> str | None:
    """Why the tuned policy saved in ``path`` does not belong to the world's policy as it is here, or
    None when it does: a GPT-2-world run records the stand-in it was trained on (``stand_in`` in its
    config: the tokenizer, "real" GPT-2 BPE or "trained" fallback, and the vocabulary size), and the
    stand-in hub cache here may hold the other one (``build-stand-in-hub --gpt2-tokenizer``). A run that
    records nothing (saved before runs recorded it) cannot be vouched for when the cache holds a
    stand-in. Tiny-world runs always belong (one shipped tokenizer)."""
    from rlhf_tutorial.worlds import describe_stand_in, policy_stand_in

    folder = Path(path)
    if not (folder / CONFIG_FILE).exists():
        return f"{folder} has no {CONFIG_FILE} (expected from `train-rlhf --save`)"
    config = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("world") != "gpt2":
        return None
    current = policy_stand_in("gpt2")
    if "stand_in" not in config:
        if current is None:
            return None  # a run of the real GPT-2 saved before runs recorded it: the weights' shapes tell
        return (f"{folder} does not record which GPT-2 it was trained on (saved before runs recorded it), and "
                f"this machine's Hugging Face cache holds {describe_stand_in(current)}")
    recorded = config["stand_in"]
    if recorded == current:
        return None
    return (f"{folder} was trained on {describe_stand_in(recorded)}, but this machine's Hugging Face cache holds "
            f"{describe_stand_in(current)}: its weights belong to another tokenizer")


def load_tuned_policy(path: str | Path, device: Any = None) -> TransformerWithValueHead:
    """Rebuild the world's policy on ``device`` (default: the course's device, as ``load_policy``), wrap
    it with a value head (on the same device), and load the saved weights into it (safetensors: no
    code runs on load). Returns the model in eval mode.

    Refuses (``WorldUnavailable``, with what to do) a run recorded on another stand-in GPT-2 than the
    one cached here (:func:`stand_in_mismatch`), and weights that do not fit the policy."""
    from safetensors.torch import load_model

    from rlhf_tutorial.worlds import WorldUnavailable, load_policy

    folder = Path(path)
    config = json.loads((folder / CONFIG_FILE).read_text())
    problem = stand_in_mismatch(folder)
    retrain = ("Train it again here: `python -m rlhf_tutorial train-rlhf --world gpt2 --save DIR` (chapter 05 "
               "retrains its own run when it sees this).")
    if problem and "stand_in" in config:
        raise WorldUnavailable(f"Cannot use this tuned policy: {problem}. {retrain}")
    model = TransformerWithValueHead(load_policy(config["world"], device=device))
    try:
        load_model(model, str(folder / WEIGHTS_FILE))
    except RuntimeError as err:  # shapes that differ: another model size or vocabulary
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        why = f" ({problem})" if problem else ""
        raise WorldUnavailable(f"The weights in {folder} do not fit the {config['world']} world's policy here"
                               f"{why}: {first}. {retrain}") from None
    return model.eval()
