"""Learning-rate multipliers (``LambdaLR`` factors) of the trainers that are not an exercise.

Chapter 03's ``rlhf.lr_schedule`` (an exercise: warm-up ``step / warmup``, then linear to
``final_scale``) is the third schedule of the course; it stays with its chapter.
"""

from __future__ import annotations

import math


def warmup_then_linear_to_zero(step: int, total_steps: int, warmup_steps: int, decay: bool = True) -> float:
    """The reward model's schedule: ``(step + 1) / warmup_steps`` during the warm-up, then (with
    ``decay``) linear from 1 to 0 at ``total_steps``, else constant 1::

        max(0, (total_steps - step) / max(1, total_steps - warmup_steps))
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if not decay:
        return 1.0
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def warmup_then_cosine(step: int, total_steps: int, warmup_steps: int, final_scale: float = 0.1) -> float:
    """The tiny world's pretraining schedule: ``(step + 1) / warmup_steps`` during the warm-up, then
    a cosine from 1 down to ``final_scale`` at ``total_steps``::

        final_scale + (1 - final_scale) * (1 + cos(pi * progress)) / 2,   progress = (step - warmup) / (total - warmup)
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return final_scale + (1 - final_scale) * 0.5 * (1 + math.cos(math.pi * progress))
