"""LoRA in the trainers: one mechanism, an args field, for GRPO, RLHF (PPO) and SFT.

A trainer whose args have ``lora_rank = r > 0`` calls :func:`apply_lora` once its reference model is
copied (a copy made after would carry the adapters' hooks): the policy's own parameters are frozen
(``requires_grad=False``), one ``LoRA`` per layer and target of ``lora.TARGETS`` is created (A drawn
from ``seed``, B zero: the policy still equals the reference) and attached through ``lora_hooks`` as
permanent hooks. The trainer gives its optimizer :func:`trainable` (the adapters' A and B, or the whole
policy at rank 0) and, before it saves or exports, takes :func:`merged` (the weights with the update
folded in, no hooks: what ``export-hf`` writes). ``lora_rank = 0`` (the default) is full fine-tuning
and changes nothing.

The LoRA pieces are pluggable like every exercise: ``apply_lora(..., **learner_functions(globals()))``
runs the learner's ``LoRA``, ``lora_hooks`` and ``merge_lora``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformer_lens import HookedTransformer

from rlhf_tutorial import lora
from rlhf_tutorial.trainers.plug import bind, learner_functions_for

#: The functions a LoRA run lets you replace by keyword.
PLUGGABLE = ("LoRA", "lora_hooks", "merge_lora")

learner_functions = learner_functions_for(PLUGGABLE)

#: Help strings of the two fields every trainer's args share (``trainers.args.arg``).
RANK_HELP = ("LoRA rank r: train rank-r adapters on every layer's W_Q, W_K, W_V, W_O, W_in, W_out through hooks, "
             "base weights frozen (chapter 08); 0: full fine-tuning")
ALPHA_HELP = "LoRA alpha: the adapters' update is scaled by lora_alpha / lora_rank"


def apply_lora(policy: HookedTransformer, rank: int, alpha: float, seed: int = 0,
               **overrides: Any) -> nn.ModuleDict | None:
    """Freeze ``policy`` and attach rank-``rank`` adapters to it (see the module docstring); returns the
    adapters, or None at rank 0 (nothing is done: full fine-tuning). Raises ValueError for a negative rank."""
    if rank < 0:
        raise ValueError(f"lora_rank must be 0 (full fine-tuning) or positive, got {rank}")
    if rank == 0:
        return None
    fns = bind(lora, PLUGGABLE, overrides)
    policy.requires_grad_(False)
    adapters = lora.make_adapters(policy, rank, alpha, seed=seed, lora_cls=fns["LoRA"])
    lora.attach_lora(policy, adapters, hooks_fn=fns["lora_hooks"])
    return adapters


def trainable(policy: nn.Module, adapters: nn.ModuleDict | None) -> Iterator[nn.Parameter]:
    """What the optimizer trains: the adapters' A and B under LoRA, else every parameter of the policy."""
    return iter(adapters.parameters()) if adapters is not None else iter(policy.parameters())


def merged(policy: HookedTransformer, adapters: nn.ModuleDict | None, **overrides: Any) -> HookedTransformer:
    """The policy to save or export: ``merge_lora``'s hook-free copy with the update in its weights (its
    parameters trainable again, as a loaded checkpoint's are), or the policy itself at rank 0."""
    if adapters is None:
        return policy
    fns = bind(lora, PLUGGABLE, overrides)
    out = fns["merge_lora"](policy, adapters)
    return out.requires_grad_(True)


def optimizer_state_mb(optimizer: torch.optim.Optimizer) -> float:
    """Megabytes held in the optimizer's state (AdamW: two moments per trained parameter, plus its step
    counters): the part of training memory that LoRA shrinks by the ratio of trained parameters."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
    return total / 2**20


def summary(policy: HookedTransformer, adapters: nn.ModuleDict | None, rank: int, alpha: float) -> dict[str, Any]:
    """The LoRA part of a trainer's JSON summary: rank, alpha and trained parameters (with the total of
    the policy's own, for the ratio)."""
    base = sum(p.numel() for p in policy.parameters())
    trained = base if adapters is None else sum(p.numel() for p in adapters.parameters())
    return {"lora_rank": rank, "lora_alpha": alpha, "trainable_parameters": trained, "policy_parameters": base}
