"""One pipeline hop between two network namespaces, measured and as the planner prices it.

The far side (``echo``, in the receiving node's namespace) answers each activation frame with an
empty one; the near side (``send``, in the sending node's namespace) sends ``[tokens, hidden]``
activation frames through the stages' own codec and transport and prints the time of each round
trip. The answer is a few bytes, so a round trip is the hop (a stage's send to the next stage)
plus one small-frame latency.

    python -m benchmarks.netns_hops echo tcp://10.213.7.2:5601
    python -m benchmarks.netns_hops send tcp://10.213.7.2:5601 2048 64 5

The prediction is the cost model's hop (``CostModel.hop_s``: bytes over the link's bandwidth plus
its latency) on ``FleetSpec.link_between`` of the two nodes, the bandwidth divided by the
namespaces' shaping factor (tests/support/netns.py ``SCALE``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import zmq

from contracts.fleet_file import parse_fleet
from tests.support.netns import SCALE, Network
from tests.support.processes import REPO_ROOT
from worker_runtime.frames import FrameCodec
from worker_runtime.transport import ZmqTransport

TOKEN = "netns-hop-token"
PORT = 5601


def echo(listen: str) -> None:
    transport = ZmqTransport(FrameCodec("hop", TOKEN), listen, None, None)
    print("ready", flush=True)
    while True:
        for message in transport.receive(0.01):
            if message.frame.type == "stop":
                return
            transport.reply(message.peer, {"type": "ack"}, [])


def send(address: str, tokens: int, hidden: int, repeats: int) -> list[float]:
    codec = FrameCodec("hop", TOKEN)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    activation = torch.randn(tokens, hidden)
    header = {"type": "batch", "epoch": 1, "mb": 1, "seq_ids": [1], "starts": [0], "lengths": [tokens]}
    seconds = []
    try:
        for i in range(repeats + 1):  # the first one also connects: not counted
            time.sleep(0.2)  # let tbf's bucket refill, as between two prefills
            started = time.perf_counter()
            sock.send_multipart(codec.encode(header, [activation]), copy=False)
            codec.decode(sock.recv_multipart(copy=False))
            if i:
                seconds.append(time.perf_counter() - started)
        sock.send_multipart(codec.encode({"type": "stop"}))
        time.sleep(0.1)
    finally:
        context.destroy(linger=0)
    return seconds


@dataclass
class Hop:
    src: int
    dst: int
    nbytes: int
    measured_s: float  # median
    predicted_s: float

    @property
    def error(self) -> float:
        return self.measured_s / self.predicted_s - 1

    def line(self) -> str:
        return (f"n{self.src} -> n{self.dst}: {self.nbytes / 1e3:.0f} kB in {self.measured_s * 1e3:.1f} ms "
                f"measured vs {self.predicted_s * 1e3:.1f} ms predicted ({self.error:+.0%})")


def predicted_hop_s(net: Network, src: int, dst: int, nbytes: int) -> float:
    fleet = parse_fleet({"name": "netns", "nodes": [
        {"name": f"n{k}", "network_gbps": gbps, "gpus": [{"model": "T4"}]}
        for k, gbps in enumerate(net.gbps)]})
    devices = {d.node: d for d in fleet.devices}
    link = fleet.link_between(devices[f"n{src}"], devices[f"n{dst}"])
    return nbytes / (link.bandwidth_gbs * 1e9 / SCALE) + link.latency_us * 1e-6


def measure_hop(net: Network, src: int, dst: int, tokens: int, hidden: int, repeats: int = 5) -> Hop:
    """A ``[tokens, hidden]`` fp32 activation from node ``src``'s namespace to node ``dst``'s."""
    address = f"tcp://{net.address(dst)}:{PORT}"
    module = [sys.executable, "-m", "benchmarks.netns_hops"]
    far = subprocess.Popen(net.exec_argv(dst, [*module, "echo", address]), cwd=REPO_ROOT, text=True,
                           stdout=subprocess.PIPE)
    try:
        assert far.stdout.readline().strip() == "ready", "the echo side did not start"
        near = subprocess.run(
            net.exec_argv(src, [*module, "send", address, str(tokens), str(hidden), str(repeats)]),
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert near.returncode == 0, near.stderr[-2000:]
        seconds = sorted(json.loads(near.stdout.splitlines()[-1]))
    finally:
        far.kill()
        far.wait()
    nbytes = tokens * hidden * 4
    return Hop(src, dst, nbytes, seconds[len(seconds) // 2], predicted_hop_s(net, src, dst, nbytes))


def main() -> None:
    if sys.argv[1] == "echo":
        echo(sys.argv[2])
    else:
        address, tokens, hidden, repeats = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(send(address, tokens, hidden, repeats)))


if __name__ == "__main__":
    main()
