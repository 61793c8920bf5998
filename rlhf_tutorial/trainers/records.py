"""A phase's record: one dict per phase, one key per quantity.

A phase is measured twice: on the rollout (what the policy that sampled did: its reward, its KL to
the reference) and while it learns (the objective's own statistics, averaged over the minibatches).
Both name some quantities alike (``kl``: the rollout's k3 KL; the objective's ``kl``: the KL of the
*updating* policy that the loss penalised), so a plain ``dict.update`` would let the second overwrite
the first. ``add_stats`` keeps the first under its name and files a colliding one under a prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def add_stats(record: dict[str, Any], stats: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Add ``stats`` to ``record`` in place; a key the record already has goes in as ``prefix + key``.

    ``record["kl"]`` stays the rollout's KL after ``add_stats(record, {"kl": 0.3}, "update_")``, which
    adds ``record["update_kl"] = 0.3``. Raises ``KeyError`` if even the prefixed key is taken (two
    quantities would share one name). Returns ``record``.
    """
    for key, value in stats.items():
        name = key if key not in record else prefix + key
        if name in record:
            raise KeyError(f"the phase record already has {key!r} and {name!r}: two quantities would share a name")
        record[name] = value
    return record


def mean_stats(steps: list[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each statistic over the minibatch steps of a phase (every step has the same keys)."""
    return {key: sum(step[key] for step in steps) / len(steps) for key in steps[0]}
