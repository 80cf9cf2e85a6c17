"""An outbound link to a peer restarting in place comes up soon after the peer binds again, however
long it was away: with zmq's doubling reconnect backoff (up to 1 s) a head started before its next
stage linked to it up to half a second late, and that was part of every in-place handover's pause."""

from __future__ import annotations

import socket
import time

from worker_runtime.frames import FrameCodec
from worker_runtime.transport import ZmqTransport


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def test_a_link_comes_up_well_before_a_backed_off_retry_after_a_late_bind():
    """50 ms retries link within ~0.05 s of the bind; zmq's doubling backoff would have waited until ~2.5 s,
    0.9 s after it. The bound leaves room for a loaded machine and still tells the two apart."""
    codec = FrameCodec("p0", "secret")
    address = free_address()
    head = ZmqTransport(codec, None, address, None)
    try:
        time.sleep(1.6)  # the next stage is still loading: with the backoff, retries drift ~0.8 s apart
        assert not head.next_linked()
        relay = ZmqTransport(codec, address, None, None)
        bound = time.monotonic()
        try:
            while not head.next_linked() and time.monotonic() - bound < 2.0:
                time.sleep(0.005)
            assert time.monotonic() - bound < 0.5
        finally:
            relay.close()
    finally:
        head.close()
