"""Which of a conversation's earlier messages a model reads. Messages are dropped from the oldest
in blocks, not one per turn, so that a turn's prompt starts with the whole of the previous
turn's until the next block goes: the worker that answered that turn still holds it in its
prefix cache (scheduler affinity), and it computes only what is new."""

from __future__ import annotations

from django.conf import settings


def window_start(message_count: int) -> int:
    """The first of a conversation's `message_count` earlier messages that a turn reads: at
    most CHAT_HISTORY_MESSAGES of them, the start moving on by half of that at a time."""
    overflow = message_count - settings.CHAT_HISTORY_MESSAGES
    if overflow <= 0:
        return 0
    step = max(1, settings.CHAT_HISTORY_MESSAGES // 2)
    return -(-overflow // step) * step


def kept(history: list[dict[str, str]], *, room: int) -> list[dict[str, str]]:
    """The most recent messages of `history` (oldest first) within `room` characters. Replayed
    as the conversation grew: whenever the kept messages overflowed `room`, the oldest were
    dropped until they filled half of it. So the next turn, one question and answer longer,
    keeps the same start unless it overflows in turn."""
    start, used = 0, 0
    for end, turn in enumerate(history, start=1):
        used += len(turn["content"])
        if used > room:
            while start < end and used > room // 2:
                used -= len(history[start]["content"])
                start += 1
    return history[start:]
