"""What the trainers measure and control about the machine: peak memory and torch's CPU threads."""

from __future__ import annotations

import re
import resource
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _on_cuda(device: Any) -> bool:
    """Whether memory on ``device`` (default: the course's device) is CUDA memory."""
    from rlhf_tutorial.devices import resolve

    return resolve(device).type == "cuda"


def peak_memory_mb(device: Any = None) -> float:
    """Peak memory of this process on ``device`` (default: the course's device): CUDA's max allocated
    on a GPU, else the peak resident set (``ru_maxrss``, which cannot be reset: it covers the whole
    process so far)."""
    if _on_cuda(device):
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class PeakMemory:
    """Peak memory used while a ``with`` block runs on ``device`` (default: the course's device), above
    what was in use when it started, in MB.

    On a GPU: ``torch.cuda.max_memory_allocated`` (reset on entry). On Linux CPUs: the process's
    peak resident set (VmHWM), reset on entry by writing 5 to ``/proc/self/clear_refs``; where that
    is not allowed, a thread samples the resident set every 20 ms. Measured this way, two trainers
    run one after the other in the same process can be compared (``ru_maxrss`` cannot be reset), with
    a caveat: memory that the first freed and the allocator kept is reused by the second without
    raising the resident set, so the second can read low. Fresh processes (``bench_trl.isolated``)
    avoid that.

    Besides ``peak_mb`` it records ``start_mb``, what was in use on entry (the resident set on a CPU,
    allocated CUDA memory on a GPU), and ``process_peak_mb``, the whole process's peak up to the exit
    (``peak_memory_mb``: ``ru_maxrss`` on a CPU, everything since the process started; on a GPU the
    peak allocated since the entry's reset).
    """

    def __init__(self, device: Any = None) -> None:
        self.device = device
        self.peak_mb = self.start_mb = self.process_peak_mb = float("nan")
        self._thread: threading.Thread | None = None

    @staticmethod
    def _rss_kb(field: str = "VmRSS") -> int:
        with open("/proc/self/status") as f:
            match = re.search(rf"{field}:\s+(\d+)", f.read())
        return int(match.group(1)) if match else 0

    def __enter__(self) -> PeakMemory:
        self.cuda = _on_cuda(self.device)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.start_mb = self.base / 2**20
            return self
        self.base = self._rss_kb()
        self.start_mb = self.base / 1024
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.mode = "hwm"
            # the reset sets the high-water mark to the resident set of that instant, which may be below
            # the one read above (memory freed in between): measure from the mark itself, which only rises
            self.base = self._rss_kb("VmHWM")
        except OSError:
            self.mode = "poll"
            self._max, self._stop = self.base, threading.Event()

            def poll() -> None:
                while not self._stop.wait(0.02):
                    self._max = max(self._max, self._rss_kb())

            self._thread = threading.Thread(target=poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.process_peak_mb = peak_memory_mb(self.device)
        if self.cuda:
            self.peak_mb = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        elif self.mode == "hwm":
            # the kernel's resident-set counters are batched per CPU and thread, so they are exact only to
            # a few hundred KiB: a block that allocates nothing can read slightly below its start (CI saw
            # -0.08 and -0.22 MB). That is no memory at all, not a negative amount
            self.peak_mb = max(0.0, (self._rss_kb("VmHWM") - self.base) / 1024)
        else:
            self._stop.set()
            self._thread.join()
            self.peak_mb = (max(self._max, self._rss_kb()) - self.base) / 1024


def default_threads(world: str) -> int:
    """torch CPU threads for a run in ``world``: 1 in the tiny world (its small matrices gain nothing
    from more on a shared CPU, and one thread makes runs reproducible across machines), torch's
    default otherwise."""
    return 1 if world == "tiny" else torch.get_num_threads()


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(threads)`` (None or 0: leave torch's setting), and
    restore the previous setting afterwards."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
