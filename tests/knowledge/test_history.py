"""Which earlier messages a turn's model reads: all that fit, dropped from the oldest in blocks
so that consecutive turns start alike."""

from knowledge.history import kept, window_start


def _conversation(turns: int, size: int) -> list[dict[str, str]]:
    history = []
    for n in range(turns):
        history += [
            {"role": "user", "content": f"q{n}".ljust(size)},
            {"role": "assistant", "content": f"a{n}".ljust(size)},
        ]
    return history


def test_a_history_that_fits_is_read_whole():
    history = _conversation(3, 100)
    assert kept(history, room=600) == history


def test_an_overflowing_history_drops_its_oldest_messages_to_half_the_room_then_keeps_its_start():
    history = _conversation(8, 100)
    starts = [history.index(kept(history[: 2 * n], room=600)[0]) for n in range(1, 9)]
    # Full at three turns; the fourth overflows and drops the oldest four messages (what is
    # left fills half the room), and the next turn keeps that start until it overflows again.
    assert starts == [0, 0, 0, 4, 4, 8, 8, 12]
    assert all(len(kept(history[: 2 * n], room=600)) * 100 <= 600 for n in range(1, 9))


def test_a_message_longer_than_the_room_is_not_read():
    history = [{"role": "user", "content": "x" * 1000}, {"role": "assistant", "content": "short"}]
    assert kept(history, room=600) == [{"role": "assistant", "content": "short"}]


def test_the_messages_read_from_a_long_conversation_start_at_block_boundaries(settings):
    settings.CHAT_HISTORY_MESSAGES = 12
    assert [window_start(count) for count in (0, 12, 13, 18, 19, 24, 25)] == [0, 0, 6, 6, 12, 12, 18]
