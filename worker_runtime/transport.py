"""Moving frames between the processes of a pipeline, behind an interface a GPU transport can also fill.

Each stage has one inbound endpoint (``listen``: activations from the previous stage; on stage 0 also
client requests, returned tokens and heartbeats) and up to two outbound links: to the next stage and
to the head. :class:`ZmqTransport` maps these onto a ROUTER socket and DEALER sockets. Outbound links
are ``IMMEDIATE``: nothing is queued for a peer that is not connected, so a restarted stage never
receives activations meant for its previous life, and a dead peer is reported at once
(:class:`PeerUnavailable`) instead of filling a queue. A torch.distributed/NCCL transport for the
activations can implement the same four methods.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from .frames import Frame, FrameCodec, FrameError

log = logging.getLogger(__name__)
RECONNECT_MS = 50  # how often an outbound link to a peer that is not there tries again


class PeerUnavailable(ConnectionError):
    """The outbound peer is not connected (dead, restarting) or not keeping up; nothing was sent."""


@dataclass
class Incoming:
    frame: Frame
    peer: bytes  # who sent it, to address a reply


class Transport(ABC):
    """Frames in from ``listen``, frames out to the next stage, the head, or a peer that wrote to us.

    Implementations count ``bytes_sent``, ``bytes_received`` and ``rejected`` (frames dropped as
    unauthenticated or malformed) for the statistics.
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    rejected: int = 0

    @abstractmethod
    def send_next(self, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> int:
        """Send to the next stage; returns the bytes sent or raises :class:`PeerUnavailable`."""

    @abstractmethod
    def send_head(self, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> int:
        """Send to the head (stage 0); returns the bytes sent or raises :class:`PeerUnavailable`."""

    @abstractmethod
    def next_linked(self) -> bool:
        """Whether a frame for the next stage would leave now (True for the last stage)."""

    @abstractmethod
    def reply(self, peer: bytes, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> int:
        """Send to a peer that wrote to our ``listen`` endpoint (a client); dropped if it is gone."""

    @abstractmethod
    def receive(self, timeout_s: float) -> list[Incoming]:
        """Whatever valid frames arrived, waiting up to ``timeout_s`` for the first; bad ones are dropped."""

    @abstractmethod
    def relink(self, next_address: str | None, head: str | None) -> None:
        """Point the outbound links at these peers (a stage given a new spec in place); a link whose
        address is unchanged stays as it is, up or not."""

    @abstractmethod
    def close(self) -> None: ...


class ZmqTransport(Transport):
    """The TCP (or ipc://) transport on pyzmq: ROUTER in, DEALER out, zero-copy for large tensors."""

    MAX_BATCH = 256  # frames taken per receive() so the caller gets back to its own work

    def __init__(self, codec: FrameCodec, listen: str | None, next_address: str | None, head: str | None):
        self.codec = codec
        self._context = zmq.Context(io_threads=1)
        self._listen = self._socket(zmq.ROUTER)
        if listen is not None:
            self._listen.bind(listen)
        self._addresses = (next_address, head)
        self._next = self._outbound(next_address)
        self._head = self._outbound(head)
        self._poller = zmq.Poller()
        self._poller.register(self._listen, zmq.POLLIN)

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    def _outbound(self, address: str | None) -> zmq.Socket | None:
        if address is None:
            return None
        sock = self._socket(zmq.DEALER)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        # Retry every RECONNECT_MS, never backing off: a peer restarted in place (a handover) binds
        # again within a second or two, and with zmq's doubling backoff (up to 1 s) the link came
        # up as much as half a second after it did, all of it part of the handover's pause. A
        # failed connect to a dead peer every 50 ms costs nothing worth saving.
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_MS)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MS)
        sock.connect(address)
        return sock

    def _send(self, sock: zmq.Socket | None, parts: list[Any], what: str) -> int:
        if sock is None:
            raise PeerUnavailable(f"this stage has no {what} link")
        try:
            sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again as exc:
            raise PeerUnavailable(f"{what} is not connected or not keeping up") from exc
        sent = sum(memoryview(p).nbytes for p in parts)
        self.bytes_sent += sent
        return sent

    def send_next(self, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> int:
        return self._send(self._next, self.codec.encode(header, tensors), "next stage")

    def send_head(self, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> int:
        return self._send(self._head, self.codec.encode(header, tensors), "head")

    def next_linked(self) -> bool:
        # IMMEDIATE: the socket is writable only once a connected next stage has room.
        return self._next is None or bool(self._next.poll(0, zmq.POLLOUT))

    def reply(self, peer: bytes, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> int:
        try:
            return self._send(self._listen, [peer, *self.codec.encode(header, tensors)], "client")
        except PeerUnavailable:
            return 0

    def receive(self, timeout_s: float) -> list[Incoming]:
        out: list[Incoming] = []
        if not self._poller.poll(max(0, int(timeout_s * 1000))):
            return out
        while len(out) < self.MAX_BATCH:
            try:
                parts = self._listen.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.bytes_received += sum(len(p) for p in parts)
            try:
                out.append(Incoming(self.codec.decode(parts[1:]), parts[0].bytes))
            except FrameError as exc:
                self.rejected += 1
                log.warning("rejected a frame on %s: %s", self.codec.pipeline_id, exc)
        return out

    def relink(self, next_address: str | None, head: str | None) -> None:
        if next_address != self._addresses[0]:
            if self._next is not None:
                self._next.close()
            self._next = self._outbound(next_address)
        if head != self._addresses[1]:
            if self._head is not None:
                self._head.close()
            self._head = self._outbound(head)
        self._addresses = (next_address, head)

    def close(self) -> None:
        """Give frames still queued (a stopping head's errors, a replaced relay's ``leaving``) up to
        0.2 s to go out; a dead peer must not hold the process longer."""
        self._context.destroy(linger=200)
