"""rlhf-tutorial: implement PPO, RLHF and GRPO yourself on a TransformerLens HookedTransformer.

The names a learner needs are importable from here: the world loaders and the checks. Heavy modules
(torch, transformer_lens) load on first use, so ``import rlhf_tutorial`` stays fast.
"""

from __future__ import annotations

import os
from typing import Any

__version__ = "0.1.0"

if os.environ.get("RLHF_TUTORIAL_DEVICE", "").startswith("simgpu"):  # the simulated GPU (a test tool)
    from rlhf_tutorial import simgpu as _simgpu

    _simgpu.install()

_LAZY = {
    "check": "rlhf_tutorial.checks",
    "hint": "rlhf_tutorial.checks",
    "progress": "rlhf_tutorial.checks",
    "reset_progress": "rlhf_tutorial.checks",
    "run_check": "rlhf_tutorial.checks",
    "load_policy": "rlhf_tutorial.worlds",
    "load_sentiment_classifier": "rlhf_tutorial.worlds",
    "load_preference_pairs": "rlhf_tutorial.worlds",
    "resolve_world": "rlhf_tutorial.worlds",
    "is_tiny": "rlhf_tutorial.worlds",
    "default_prompt": "rlhf_tutorial.worlds",
    "load_tokenizer": "rlhf_tutorial.worlds",
    "tiny_metadata": "rlhf_tutorial.worlds",
    "WorldUnavailable": "rlhf_tutorial.worlds",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rlhf_tutorial' has no attribute {name!r}")
