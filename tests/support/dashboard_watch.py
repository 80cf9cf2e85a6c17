"""A dashboard's websocket as the page keeps it (frontend/static/dashboard/live.js): connected through a
balancer with a session cookie, acknowledging each frame, and, when the connection drops, opening a new
one after the page's first retry delay. Records when each connection dropped and when its successor's
first frame came, for tests of losing a web process."""

from __future__ import annotations

import json
import threading
import time

from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

from tests.support.processes import manage_shell

PAGE_RETRY_S = 0.25  # live.js's first reconnect delay
SESSION = """
from django.contrib.auth.models import User
from django.test import Client
client = Client()
client.force_login(User.objects.get(username="alice"))
print("SESSION=" + client.cookies["sessionid"].value)
"""


def dashboard_session(env: dict) -> str:
    """A logged-in session of the install ``env``'s user alice (tests.support.processes.create_keys)."""
    return manage_shell(env, SESSION).split("SESSION=", 1)[1].strip()


class DashboardWatch:
    def __init__(self, root: str, session: str) -> None:
        self.url = root.replace("http://", "ws://") + "/ws/dashboard/"
        self.origin, self.session = root, session
        self.drops: list[float] = []  # when a connection ended
        self.frames: list[float] = []  # when each frame arrived, on any connection
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> DashboardWatch:
        """Connected, its first frame in: the next connection a balancer places sees this one's."""
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.frames:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no frame on {self.url} within 30 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def recovered_within(self) -> list[float]:
        """For each dropped connection, the seconds from the drop to the next frame."""
        return [min((f for f in self.frames if f > drop), default=float("inf")) - drop for drop in self.drops]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with connect(self.url, origin=self.origin, open_timeout=5,
                             additional_headers={"Cookie": f"sessionid={self.session}"}) as socket:
                    while not self._stop.is_set():
                        try:
                            frame = json.loads(socket.recv(timeout=0.2))
                        except TimeoutError:
                            continue
                        self.frames.append(time.monotonic())
                        socket.send(json.dumps({"ack": frame["version"]}))
            except (ConnectionClosed, InvalidHandshake, OSError):
                pass
            if not self._stop.is_set():
                self.drops.append(time.monotonic())
                time.sleep(PAGE_RETRY_S)
