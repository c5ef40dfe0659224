"""How many threads a session decodes on: the cores other programs leave free.

The products and attention split each call between a team of OpenMP threads that wait for each
other at the end of the call. Where another program keeps one of the cores busy, the thread that
shares its core runs only part of the time and every call waits for it: two threads beside one
busy core decode several times slower than one thread alone. So each session counts, over a short
window of /proc/stat, the CPU time that other programs took, and decodes on the cores left.

Work at a lower priority (a niced job) counts as free: the scheduler gives way to the session.
`pin_threads` (the `--threads` options, `SPECDECK_THREADS`) fixes the count instead. Where
/proc/stat cannot be read (not Linux), torch's own count stands.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from specdeck.engine.errors import SpecDeckError

log = logging.getLogger(__name__)

SAMPLE_S = 0.05  # long enough for the scheduler's ticks to count a busy core, short beside a load
FREE_SHARE = 0.75  # a core counts as free when others use at most a quarter of it

_PINNED: list[int] = []  # the count `pin_threads` fixed, if any
_MOST: list[int] = []  # torch's own count before the first change: the most a session takes


def pin_threads(threads: int) -> None:
    """Decode on `threads` threads from now on, whatever else runs on the machine."""
    cores = os.cpu_count() or 1
    if not 1 <= threads <= cores:
        raise SpecDeckError(f"--threads must be from 1 to {cores}, this machine's cores (got {threads}).")
    _PINNED[:] = [threads]
    torch.set_num_threads(threads)


def pinned() -> int | None:
    """The count `pin_threads` or `SPECDECK_THREADS` fixed; None where sessions choose their own."""
    if _PINNED:
        return _PINNED[0]
    named = os.environ.get("SPECDECK_THREADS", "").strip()
    return min(int(named), os.cpu_count() or 1) if named.isdigit() and int(named) > 0 else None


def fit_threads() -> int:
    """Set torch's threads to the cores other programs leave free now (at least one, at most torch's
    own count), or to the pinned count; returns the count."""
    fixed = pinned()
    if fixed is not None:
        if torch.get_num_threads() != fixed:
            torch.set_num_threads(fixed)
        return fixed
    if not _MOST:
        _MOST.append(torch.get_num_threads())
    busy = busy_cores()
    threads = _MOST[0] if busy is None else threads_beside(busy, _MOST[0], os.cpu_count() or 1)
    if threads != torch.get_num_threads():
        log.info("other programs keep %.2f cores busy: decoding on %d threads", busy or 0.0, threads)
        torch.set_num_threads(threads)
    return threads


def threads_beside(busy: float, most: int, cores: int) -> int:
    """The threads to decode on where other programs keep `busy` of the machine's `cores` busy."""
    free = int(cores - busy + (1 - FREE_SHARE))
    return max(1, min(most, free))


def busy_cores(sample_s: float = SAMPLE_S) -> float | None:
    """The cores other programs kept busy over the next `sample_s` seconds (this process's own time
    and niced work left out); None where /proc/stat cannot be read."""
    try:
        before, own_before = _machine_ticks(), _own_ticks()
        time.sleep(sample_s)
        after, own_after = _machine_ticks(), _own_ticks()
    except (OSError, ValueError, IndexError):
        return None
    busy = (after[0] - before[0]) - (own_after - own_before)
    elapsed = after[1] - before[1]
    if elapsed <= 0:
        return None
    return max(0.0, busy / elapsed * (os.cpu_count() or 1))


def _machine_ticks() -> tuple[int, int]:
    with open("/proc/stat") as stat:
        return ticks_of(stat.readline())


def ticks_of(cpu_line: str) -> tuple[int, int]:
    """(ticks busy at normal priority, all ticks) of every core, from /proc/stat's `cpu` line: niced
    time counts as idle, since the scheduler gives way to a session at normal priority."""
    fields = [int(f) for f in cpu_line.split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + system + irq + softirq, user + nice + system + idle + iowait + irq + softirq + steal


def _own_ticks() -> int:
    """This process's user and system ticks (all its threads), from /proc/self/stat."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
