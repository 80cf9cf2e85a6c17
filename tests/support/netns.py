"""Several hosts on one machine: Linux network namespaces joined by a bridge, links shaped with tbf.

Each node is a namespace ``motley-<id>-n<K>`` with one interface, ``eth0`` at ``<subnet>.<K+1>/24``,
a veth whose other end is a port of a bridge in a namespace of the run's own (``motley-<id>-sw``,
the switch). The root namespace reaches the switch through one more veth, ``mt<id>h`` at
``<subnet>.254``: the test and the control plane live there, so what they contact is only ever an
address of this network. Nothing else of the host is touched.

Each node's link is shaped in both directions (``tbf`` on its ``eth0`` and on its switch port) to
its fleet file's ``network_gbps`` divided by ``SCALE``, so a hop between two nodes runs at the
slower of the two, as ``FleetSpec.link_between`` prices it, and transfers of a CPU box's small
activations take measurable time. The kernel here has no ``netem``, so links add no latency of their
own; :meth:`Network.delay_line` adds it in user space (tests/support/delay_line.py): relays in the
root namespace that hold every byte a fixed time on its way to a node's address.

``<id>`` is this process's pid in hex and a count of its runs: :func:`sweep` removes what runs of
dead processes left.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SCALE = 1000  # fleet Gbit/s -> shaped Mbit/s: 25 Gbit/s becomes 25 Mbit/s
PREFIX = "motley-"
BURST_BYTES = 16_000  # tbf's bucket: two jumbo-free packets' worth beyond one timer tick at 10 Mbit/s
QUEUE_LIMIT_BYTES = 4_000_000  # deep enough that TCP is paced, not dropped
_runs = itertools.count()


def available() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed"
    probe = f"{PREFIX}probe-{os.getpid():x}"
    try:
        _run("ip", "netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` fails here: {exc.stderr.strip()}"
    _run("ip", "netns", "delete", probe)
    return None


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def shaped_bits_per_s(network_gbps: float) -> int:
    return int(network_gbps * 1e9 / SCALE)


@dataclass
class Network:
    """Namespaces of one run; ``gbps[k]`` is node k's fleet-file ``network_gbps``."""

    run_id: str
    subnet: str  # first three octets, e.g. "10.213.7"
    gbps: list[float]

    def namespace(self, k: int) -> str:
        return f"{PREFIX}{self.run_id}-n{k}"

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.run_id}-sw"

    @property
    def host_link(self) -> str:
        return f"mt{self.run_id}h"

    def address(self, k: int) -> str:
        return f"{self.subnet}.{k + 1}"

    @property
    def host_address(self) -> str:
        """The root namespace's address on this network (the control plane and the test)."""
        return f"{self.subnet}.254"

    def exec_argv(self, k: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node k's namespace (``ip netns exec`` replaces itself: same pid)."""
        return ["ip", "netns", "exec", self.namespace(k), *argv]

    def in_switch(self, *argv: str) -> str:
        return _run("ip", "netns", "exec", self.switch, *argv)

    def create(self) -> None:
        _run("ip", "netns", "add", self.switch)
        self.in_switch("ip", "link", "set", "lo", "up")
        self.in_switch("ip", "link", "add", "br0", "type", "bridge")
        self.in_switch("ip", "link", "set", "br0", "up")
        for k, gbps in enumerate(self.gbps):
            ns, port = self.namespace(k), f"p{k}"
            _run("ip", "netns", "add", ns)
            self.in_switch("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.in_switch("ip", "link", "set", port, "master", "br0", "up")
            node = ["ip", "netns", "exec", ns]
            _run(*node, "ip", "link", "set", "lo", "up")
            _run(*node, "ip", "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            _run(*node, "ip", "link", "set", "eth0", "up")
            _run(*node, *_tbf("eth0", gbps))
            self.in_switch(*_tbf(port, gbps))
        _run("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", "host", "netns",
             self.switch)
        self.in_switch("ip", "link", "set", "host", "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.host_address}/24", "dev", self.host_link)
        _run("ip", "link", "set", self.host_link, "up")

    def destroy(self) -> None:
        remove_run(self.run_id)

    @contextmanager
    def delay_line(self, delay_ms: float, targets: list[str]) -> Iterator[list[str]]:
        """Relays that reach each ``tcp://host:port`` of ``targets`` ``delay_ms`` later (each way), from
        addresses of the root namespace on this network: yields those addresses, in the same order."""
        relayed, routes = [], []
        for target in targets:
            with socket.socket() as sock:
                sock.bind((self.host_address, 0))
                listen = f"{self.host_address}:{sock.getsockname()[1]}"
            routes.append(f"{listen}={target.removeprefix('tcp://')}")
            relayed.append(f"tcp://{listen}")
        relay = subprocess.Popen([sys.executable, "-m", "tests.support.delay_line", str(delay_ms), *routes],
                                 cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True)
        try:
            if relay.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the delay line did not start (exit {relay.poll()})")
            yield relayed
        finally:
            relay.kill()
            relay.wait()


def _tbf(device: str, gbps: float) -> list[str]:
    return ["tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{shaped_bits_per_s(gbps)}bit",
            "burst", str(BURST_BYTES), "limit", str(QUEUE_LIMIT_BYTES)]


def remove_run(run_id: str) -> None:
    """Kill what runs in the run's namespaces and delete them (and so every veth of the run)."""
    names = [n for n in _namespaces() if n.startswith(f"{PREFIX}{run_id}-")]
    for name in names:
        for pid in _run("ip", "netns", "pids", name).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    for name in names:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    subprocess.run(["ip", "link", "delete", f"mt{run_id}h"], capture_output=True)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def sweep() -> None:
    """Remove what earlier runs left behind when their process died before cleaning up."""
    for name in _namespaces():
        match = re.fullmatch(rf"{PREFIX}(([0-9a-f]+)-\d+)-(?:n\d+|sw)", name)
        if match and not _alive(int(match.group(2), 16)):
            remove_run(match.group(1))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_subnet() -> str:
    """A /24 under 10.213/16 that no route of this host uses yet."""
    routes = _run("ip", "route")
    for third in [os.getpid() % 250, *range(250)]:
        subnet = f"10.213.{third}"
        if f"{subnet}." not in routes:
            return subnet
    raise RuntimeError("no free /24 under 10.213.0.0/16")


@contextmanager
def network(gbps: list[float]) -> Iterator[Network]:
    """One namespace per entry of ``gbps`` (each node's fleet ``network_gbps``), removed at the end."""
    sweep()
    net = Network(run_id=f"{os.getpid():x}-{next(_runs)}", subnet=_free_subnet(), gbps=gbps)
    try:
        net.create()
        yield net
    finally:
        net.destroy()
