"""Where the tiny world's tuned policy lives: chapter 03's RLHF run towards negative reviews, shipped for
chapter 05 in ``tiny/artifacts/tuned_neg/`` (policy and value head, safetensors, in the manifest).

``python -m rlhf_tutorial build-tuned --world tiny`` (``trainers.interp_report.build_tuned_main``)
trains and writes it; chapter 05 loads it with ``trainers.interp_report.load_pair``, so it never depends
on another notebook having been run.
"""

from __future__ import annotations

from pathlib import Path

TUNED_NAME = "tuned_neg"


def tuned_dir() -> Path:
    """The shipped tuned checkpoint of the tiny world (``$RLHF_TUTORIAL_TINY_DIR`` is honoured)."""
    from rlhf_tutorial.worlds import WorldUnavailable, tiny_dir

    folder = tiny_dir() / TUNED_NAME
    if not (folder / "policy.safetensors").exists():
        raise WorldUnavailable(f"The tiny world's tuned policy is missing from {folder}. Rebuild it with "
                               "`python -m rlhf_tutorial build-tuned --world tiny` (about a minute).")
    return folder
