"""A session decodes on the cores other programs leave free, so a busy desktop slows it by the
share of the machine it lost rather than stalling threads that wait on a busy core."""

import subprocess
import sys

import pytest
import torch

from specdeck.engine import cores
from specdeck.engine.errors import SpecDeckError


def test_a_core_another_program_keeps_busy_is_left_to_it():
    """One busy core of two leaves one thread; a core barely used counts as free; a session never
    takes more than torch's own count, nor fewer than one thread."""
    assert cores.threads_beside(busy=1.0, most=2, cores=2) == 1
    assert cores.threads_beside(busy=0.1, most=2, cores=2) == 2
    assert cores.threads_beside(busy=0.6, most=2, cores=2) == 1
    assert cores.threads_beside(busy=3.0, most=2, cores=2) == 1
    assert cores.threads_beside(busy=2.0, most=8, cores=16) == 8
    assert cores.threads_beside(busy=10.0, most=8, cores=16) == 6


@pytest.mark.serial
def test_a_spinning_program_is_counted():
    """A process spinning on a core shows as at least most of one busy core."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert cores.busy_cores(0.3) >= 0.6
    finally:
        spinner.kill()
        spinner.wait()


def test_this_process_and_niced_work_count_as_free(monkeypatch):
    """Over a window where the machine's two cores ran 100 ticks, 60 of them busy at normal priority
    and 50 of those this process's own, others kept 0.2 cores busy; niced work is not counted."""
    machine = iter([(1000, 5000), (1060, 5100)])
    own = iter([300, 350])
    monkeypatch.setattr(cores, "_machine_ticks", lambda: next(machine))
    monkeypatch.setattr(cores, "_own_ticks", lambda: next(own))
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 2)
    assert cores.busy_cores(0.0) == pytest.approx(0.2)
    # user, nice, system, idle, iowait, irq, softirq, steal (then guest times, inside user's)
    assert cores.ticks_of("cpu  100 50 20 800 5 1 2 3 7 0") == (123, 981)


def test_a_pinned_count_stands_whatever_the_load(monkeypatch):
    """`--threads` (`pin_threads`) and SPECDECK_THREADS fix the count; unpinned, the count follows
    the load measured at the session's start."""
    before = torch.get_num_threads()
    monkeypatch.setattr(cores, "_PINNED", [])
    monkeypatch.setattr(cores, "_MOST", [2])
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cores, "busy_cores", lambda: 1.0)
    try:
        monkeypatch.setenv("SPECDECK_THREADS", "2")
        assert cores.fit_threads() == 2 and torch.get_num_threads() == 2
        monkeypatch.delenv("SPECDECK_THREADS")
        assert cores.fit_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.setattr(cores, "busy_cores", lambda: 0.0)
        assert cores.fit_threads() == 2
        monkeypatch.setattr(cores, "busy_cores", lambda: None)  # no /proc/stat: torch's own count
        assert cores.fit_threads() == 2
        cores.pin_threads(1)
        monkeypatch.setattr(cores, "busy_cores", lambda: 0.0)
        assert cores.fit_threads() == 1
        for wrong in (0, 3):  # this (patched) machine has two cores
            with pytest.raises(SpecDeckError, match=r"--threads must be from 1 to 2, this machine's cores"):
                cores.pin_threads(wrong)
        cores._PINNED.clear()
        monkeypatch.setenv("SPECDECK_THREADS", "64")  # more than there are cores: as many as there are
        assert cores.pinned() == 2
    finally:
        torch.set_num_threads(before)
