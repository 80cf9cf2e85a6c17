"""Size and rate limits of the messages a websocket client sends (the agents' and the browsers').

A message over the size limit closes the socket with 1009 (message too big), a client sending faster
than its rate closes it with 1008 (policy violation); the close reason says which limit and its
setting. The rate is a token bucket: ``per_s`` a second, with bursts of up to ``BURST_S`` seconds'
worth (an agent reporting many stage events at once stays under it).
"""

from __future__ import annotations

import time

CLOSE_TOO_BIG, CLOSE_POLICY = 1009, 1008
BURST_S = 2.0


class MessageLimits:
    def __init__(self, *, max_bytes: int, per_s: float, setting: str) -> None:
        self.max_bytes, self.per_s, self.setting = max_bytes, per_s, setting
        self.tokens, self.at = per_s * BURST_S, time.monotonic()

    def refusal(self, text_data: str | None, bytes_data: bytes | None) -> tuple[int, str] | None:
        """``(close code, reason)`` when this message breaks a limit, else None (and it is counted)."""
        size = len(text_data.encode()) if text_data is not None else len(bytes_data or b"")
        if size > self.max_bytes:
            limit = f"{self.setting}_MAX_MESSAGE_BYTES"
            return CLOSE_TOO_BIG, f"message of {size} bytes over {self.max_bytes} ({limit})"
        now = time.monotonic()
        self.tokens = min(self.per_s * BURST_S, self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens < 1:
            return CLOSE_POLICY, f"over {self.per_s:g} messages a second ({self.setting}_MESSAGES_PER_S)"
        self.tokens -= 1
        return None
