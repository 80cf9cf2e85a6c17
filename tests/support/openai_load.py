"""Steady load from the official ``openai`` client: some threads streaming chat completions, some
asking without a stream, each one request after another until stopped, every request recorded
(when it started and ended, whether it succeeded, the error it ended with). For the web failover
test and benchmarks/ha_bench.py, which kill a web process under it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class Outcome:
    streamed: bool
    started: float  # time.monotonic()
    ended: float
    tokens: int
    error: str = ""  # empty: succeeded

    @property
    def ok(self) -> bool:
        return not self.error


class Load:
    """``streams`` streaming and ``plain`` non-streamed clients against ``base_url`` (an OpenAI
    ``/v1``). The non-streamed client retries as the openai client does by default (2 retries on a
    connection error or a 5xx); a stream is never retried once it has started, as none can be."""

    def __init__(self, base_url: str, key: str, *, streams: int, plain: int, stream_tokens: int,
                 plain_tokens: int):
        import openai

        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._max_tokens = {True: stream_tokens, False: plain_tokens}
        client = openai.OpenAI(base_url=base_url, api_key=key, timeout=60)
        self._threads = [threading.Thread(target=self._run, args=(client, streamed), daemon=True)
                         for streamed in [True] * streams + [False] * plain]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self, client, streamed: bool) -> None:
        while not self._stop.is_set():
            started, tokens, error = time.monotonic(), 0, ""
            try:
                tokens = self._stream(client) if streamed else self._plain(client)
            except Exception as exc:  # every failure is an outcome to count, with what the client saw
                error = f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.outcomes.append(Outcome(streamed, started, time.monotonic(), tokens, error))

    def _request(self, streamed: bool) -> dict:
        return {"model": "demo", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": self._max_tokens[streamed]}

    def _stream(self, client) -> int:
        tokens, finished = 0, None
        for chunk in client.chat.completions.create(**self._request(True), stream=True):
            for choice in chunk.choices:
                tokens += 1 if choice.delta.content is not None else 0
                finished = choice.finish_reason or finished
        if finished is None:
            raise RuntimeError("the stream ended without a finish_reason")
        return tokens

    def _plain(self, client) -> int:
        return client.chat.completions.create(**self._request(False)).usage.completion_tokens

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)
