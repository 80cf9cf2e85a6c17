"""A delay line: TCP relays that hold every chunk of bytes a fixed time before passing it on.

The kernel here has no ``netem`` (tests/support/netns.py), so a link's latency is added in user space:
each relay listens on an address of its own and forwards each connection to its target, both ways,
every chunk ``delay_ms`` after it arrived, in order. Bandwidth is not limited (the namespaces' ``tbf``
does that); a relay thread sleeps until each chunk is due, so the delay is accurate to the sleep's
wake-up: a fraction of a millisecond, the relay running at a real-time priority where it may (root) so
that a busy machine's stages do not make the wires late.

    python -m tests.support.delay_line 5 10.213.7.254:5601=10.213.7.2:5601 [...]

prints ``ready`` once every relay listens, and relays until killed.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time

CHUNK = 1 << 16


def _pump(source: socket.socket, sink: socket.socket, delay_s: float) -> None:
    """Read ``source`` and hand each chunk, stamped with when it is due, to a writer into ``sink``."""
    due: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def write() -> None:
        while True:
            when, data = due.get()
            wait = when - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:  # the source closed: close the sink's sending side, as late as the data
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return

    threading.Thread(target=write, daemon=True).start()
    while True:
        try:
            data = source.recv(CHUNK)
        except OSError:
            data = b""
        due.put((time.monotonic() + delay_s, data))
        if not data:
            return


def _accept(server: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    while True:
        near, _ = server.accept()
        try:
            far = socket.create_connection(target)
        except OSError:
            near.close()
            continue
        for sock in (near, far):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_pump, args=(near, far, delay_s), daemon=True).start()
        threading.Thread(target=_pump, args=(far, near, delay_s), daemon=True).start()


def _address(text: str) -> tuple[str, int]:
    host, port = text.rsplit(":", 1)
    return host, int(port)


def serve(delay_ms: float, routes: list[tuple[str, str]]) -> list[threading.Thread]:
    """Start one relay per ``(listen, target)`` pair of ``host:port`` addresses."""
    threads = []
    for listen, target in routes:
        server = socket.create_server(_address(listen), reuse_port=False)
        args = (server, _address(target), delay_ms / 1e3)
        thread = threading.Thread(target=_accept, args=args, daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def main() -> None:
    delay_ms, routes = float(sys.argv[1]), [tuple(arg.split("=", 1)) for arg in sys.argv[2:]]
    try:  # before any thread starts: they inherit it
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (AttributeError, PermissionError):
        pass
    serve(delay_ms, routes)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
