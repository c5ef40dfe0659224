"""The race after a Compare replays the two recorded sessions at their measured times."""

from __future__ import annotations

from specdeck.app.replay import ReplayDialog, timeline
from specdeck.engine.events import RoundEvent, TokenEvent, TokenState
from specdeck.engine.export import SessionRecord
from specdeck.engine.stats import SessionStats


def _record(mode: str, seconds_per_round: float, tokens_per_round: int, rounds: int) -> SessionRecord:
    """A finished session: `rounds` rounds keeping `tokens_per_round` tokens each, evenly timed."""
    record = SessionRecord(1 if mode == "speculative" else 2, mode)
    stats = SessionStats()
    state = TokenState.PLAIN if mode == "plain" else TokenState.BONUS
    pos = 0
    for r in range(1, rounds + 1):
        events = [
            TokenEvent(TokenState.ACCEPTED if i < tokens_per_round - 1 else state, 1, "x", pos + i, r, 0.9, None)
            for i in range(tokens_per_round)
        ]
        pos += tokens_per_round
        events.append(RoundEvent(r, tokens_per_round - 1, tokens_per_round - 1, 0.1, 1.0, pos, r * seconds_per_round))
        for event in events:
            stats.add(event)
            record.add(event)
    record.add(stats.summary("x" * pos, "max_new_tokens"))
    return record


def test_lanes_follow_the_recorded_times(qtbot):
    """At each moment a lane shows exactly the rounds that had ended by then in its recording; the
    faster session finishes first and says its measured rate."""
    speculative = _record("speculative", 0.10, 3, 4)  # 12 tokens in 0.4 s
    plain = _record("plain", 0.05, 1, 12)  # 12 tokens in 0.6 s
    dialog = ReplayDialog(speculative, plain)
    qtbot.addWidget(dialog)
    dialog._timer.stop()  # the test moves the clock
    for lane in dialog.lanes:
        lane.restart()
    for t in (0.0, 0.05, 0.12, 0.25, 0.4, 0.5, 0.6):
        dialog.advance_to(t)
        for lane, record in zip(dialog.lanes, (speculative, plain)):
            ended = [r for r in record.rounds if r.elapsed_s <= t]
            assert lane.progress.value() == (ended[-1].new_tokens if ended else 0), (lane.view.title.text(), t)
            assert len(lane.view.tokens) == sum(1 for e in record.tokens if e.round <= len(ended))
    spec_lane, plain_lane = dialog.lanes
    dialog.advance_to(0.45)
    assert spec_lane.finished and not plain_lane.finished
    assert "30.0 tokens/s" in spec_lane.rate.text()
    dialog.advance_to(0.61)
    assert plain_lane.finished and "20.0 tokens/s" in plain_lane.rate.text()
    assert not dialog._timer.isActive()


def test_a_short_race_is_slowed_to_be_watched_at_one_pace_for_both_sides(qtbot):
    """By default a race of 0.6 s plays over 10 s, both sides at the same pace, so the faster side
    still finishes first by as much; the measured pace and slower ones are offered too."""
    from specdeck.app.replay import SPEEDS, WATCHABLE_S

    dialog = ReplayDialog(_record("speculative", 0.10, 3, 4), _record("plain", 0.05, 1, 12))
    qtbot.addWidget(dialog)
    assert abs(dialog.pace - 0.6 / WATCHABLE_S) < 1e-9
    assert min(speed for speed in SPEEDS.values() if speed) <= 0.02
    dialog.speed.setCurrentText("1x (measured pace)")
    assert dialog.pace == 1.0
    dialog._timer.stop()


def test_timeline_is_the_rounds_in_order_with_their_tokens():
    """Each step is one round: its tokens, then its round event, at the round's recorded end."""
    record = _record("speculative", 0.1, 2, 3)
    steps = timeline(record)
    assert [t for t, _ in steps] == [r.elapsed_s for r in record.rounds]
    assert [len(events) for _, events in steps] == [3, 3, 3]


def test_compare_offers_the_replay(qtbot, window):
    """After a Compare the replay is offered (Ctrl+R) and plays both recorded sessions' texts to the end."""
    assert not window.menus.replay_action.isEnabled()
    window.compare_button.click()
    qtbot.waitUntil(lambda: window.idle, timeout=60_000)
    assert window.menus.replay_action.isEnabled() and window.replay_button.isVisible()
    window.menus.replay_action.trigger()
    dialog = window.replay
    dialog._timer.stop()
    dialog.advance_to(max(lane.end_s for lane in dialog.lanes))
    speculative, plain = window.session_model.records
    assert [lane.view.kept_text() for lane in dialog.lanes] == [speculative.summary.text, plain.summary.text]
