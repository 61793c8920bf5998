"""Root pytest configuration: the order in which ``make nbval``, ``nbval-gpt2`` and ``nbval-simgpu`` hand out
the solution notebooks.

nbval runs on pytest-xdist with ``--dist loadfile --no-loadscope-reorder``: a worker takes a whole notebook at
a time, in collection order. Alphabetical order leaves the longest notebook (chapter 09) for last, alone on one
worker while the others idle; this puts the slowest first (measured by ``make nbval`` with ``--durations``:
09 ~190 s of cells with the cached rollout, 06 ~180 s, 03 ~130 s, 07 ~90 s, 04 ~70 s, the rest under 45 s)."""

from __future__ import annotations

#: Notebooks (their stems) that start first, slowest first; the others follow in their usual order.
SLOWEST_FIRST = ("09_agents", "06_dpo_and_frontier", "03_rlhf_ppo", "07_reasoning", "04_grpo")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        path = item.path
        if path.suffix != ".ipynb" or path.stem not in SLOWEST_FIRST:
            return len(SLOWEST_FIRST)
        return SLOWEST_FIRST.index(path.stem)

    items.sort(key=rank)  # stable: each notebook's cells keep their order
