"""The model thread: superseded sessions' events never reach the window; every error is reported."""

from __future__ import annotations

import threading

from specdeck.app.model_host import ModelHost
from specdeck.app.worker import LoadRequest, ModelWorker, error_message
from specdeck.engine.config import DecodeConfig
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import RoundEvent, SessionStarted, TokenEvent, TokenState
from specdeck.engine.pair import PairSpec
from specdeck.engine.stats import SessionStats


def _slow_session(pair, prompt, config, chat=True, plain=False, cancel: threading.Event | None = None):
    """A fake session: one plain token per round until cancelled or max_new_tokens."""
    stats = SessionStats()
    yield SessionStarted("plain", "", 1, 0.0)
    n = 0
    while n < config.max_new_tokens and not cancel.is_set():
        cancel.wait(0.002)
        token = TokenEvent(TokenState.PLAIN, 1, prompt, n, n + 1, 1.0, None)
        n += 1
        rnd = RoundEvent(n, 0, 0, 0.0, 1.0, n, n * 0.002)
        for event in (token, rnd):
            stats.add(event)
            yield event
    yield stats.summary(prompt * n, "cancelled" if cancel.is_set() else "max_new_tokens")


def _host(session_fn=_slow_session) -> ModelHost:
    return ModelHost(session_fn=session_fn, load_fn=lambda *args, **kwargs: _FakePair())


class _FakePair:
    description = "fake pair"
    drafter_kind = None
    drafter_model = None
    vocabulary = None
    layer_choice = None
    note = ""

    class target:
        name = "fake"
        device = "cpu"
        dtype = "torch.float32"
        backend = "torch"
        runs = "float32"


def test_superseded_session_events_are_ignored(qtbot, loop):
    """Starting B while A runs: A stops, and only B's events are delivered, all of them."""
    host = _host()
    seen: list[tuple[int, str]] = []
    host.events.connect(lambda sid, batch: seen.extend((sid, e.text) for e in batch if isinstance(e, TokenEvent)))
    loaded = host.load(PairSpec())
    qtbot.waitUntil(loaded.done)
    first, _ = host.run("a", DecodeConfig(max_new_tokens=100_000))
    qtbot.waitUntil(lambda: len(seen) > 3)
    second, finished = host.run("b", DecodeConfig(max_new_tokens=200))
    qtbot.waitUntil(finished.done, timeout=30_000)
    late = [text for sid, text in seen if sid == second]
    assert all(text == "a" for sid, text in seen if sid == first)
    assert late == ["b"] * 200 and finished.result().new_tokens == 200
    assert [sid for sid, _ in seen] == sorted(sid for sid, _ in seen)
    host.shutdown()
    assert not host.thread_running


def test_session_exception_becomes_a_message(qtbot, loop):
    """An error inside a session reaches the GUI as a message; the thread keeps serving."""

    def broken(*args, **kwargs):
        yield SessionStarted("plain", "", 1, 0.0)
        raise RuntimeError("boom")

    host = _host(session_fn=broken)
    loaded = host.load(PairSpec())
    qtbot.waitUntil(loaded.done)
    _, finished = host.run("x", DecodeConfig())
    qtbot.waitUntil(finished.done)
    assert isinstance(finished.exception(), SpecDeckError)
    assert str(finished.exception()) == "Unexpected error: RuntimeError: boom"
    _, again = host.run("x", DecodeConfig())
    qtbot.waitUntil(again.done)
    assert again.exception() is not None and host.thread_running
    host.shutdown()


def test_specdeck_errors_are_shown_as_they_are():
    """A SpecDeckError's message is for the user: it is passed on unchanged."""
    assert error_message(SpecDeckError("No model at /x.")) == "No model at /x."


def test_cancelled_load_reports_cancelled(qtbot, loop):
    """Cancelling a load resolves it as cancelled at once; the thread then serves the next load."""
    release = threading.Event()

    def slow_load(*args, progress=None, **kwargs):
        release.wait(5)
        progress("Loading weights")
        return _FakePair()

    host = ModelHost(session_fn=_slow_session, load_fn=slow_load)
    first = host.load(PairSpec())
    host.cancel_load()
    release.set()
    assert first.done() and "cancelled" in str(first.exception())
    second = host.load(PairSpec())
    qtbot.waitUntil(second.done, timeout=10_000)
    assert second.result().description == "fake pair"
    host.shutdown()


def test_a_first_load_leaves_what_was_frozen_before_it_alone():
    """The collection after a first load scans only what came since the last freeze (not the
    imports again: a third of a second before the first session); a later load frees the
    replaced pair's reference cycles and frozen garbage with them."""
    import gc
    import weakref

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    garbage = Cycle()
    frozen_garbage = weakref.ref(garbage)
    gc.freeze()
    del garbage
    pairs = [_FakePair(), _FakePair()]
    for pair in pairs:
        pair.me = pair  # a pair's modules refer to each other
    first = weakref.ref(pairs[0])
    worker = ModelWorker(load_fn=lambda *args, **kwargs: pairs.pop(0))
    worker.handle(LoadRequest(PairSpec(target="first")))
    assert frozen_garbage() is not None and first() is not None
    worker.handle(LoadRequest(PairSpec(target="second")))
    assert frozen_garbage() is None and first() is None
