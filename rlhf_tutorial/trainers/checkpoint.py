"""Saving and loading chapter 03's tuned policy (the policy with its value head): safetensors for the
weights (no code runs on load), JSON for the run's arguments and world, so it can be rebuilt.

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
    (with the world, so it can be rebuilt) to ``path/rlhf_config.json``. Returns the folder."""
    from safetensors.torch import save_model

    from rlhf_tutorial.worlds import resolve_world

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / WEIGHTS_FILE))
    config = {"world": resolve_world(args.world), "args": asdict(args), **extra}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2, default=str))
    return folder


def load_tuned_policy(path: str | Path, device: Any = None) -> TransformerWithValueHead:
    """Rebuild the world's policy on ``device`` (default: the course's device, as ``load_policy``), wrap
    it with a value head (on the same device), and load the saved weights into it (safetensors: no
    code runs on load). Returns the model in eval mode."""
    from safetensors.torch import load_model

    from rlhf_tutorial.worlds import load_policy

    folder = Path(path)
    config = json.loads((folder / CONFIG_FILE).read_text())
    model = TransformerWithValueHead(load_policy(config["world"], device=device))
    load_model(model, str(folder / WEIGHTS_FILE))
    return model.eval()
