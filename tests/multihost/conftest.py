"""Fixtures of the multi-host tests: a control plane in the root namespace, one namespace per node."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.e2e.conftest import demo_model  # noqa: F401  (the same demo checkpoint)
from tests.e2e.harness import NODE, System, embedded_system_at, running
from tests.support import netns
from tests.support.netns import Network

GBPS = [10.0, 25.0, 5.0]  # the nodes' fleet network_gbps; shaped to Mbit/s (netns.SCALE)


@dataclass
class NetnsSystem(System):
    """A System whose node ``nK`` runs its agent (and so its stages) in namespace K, at its address."""

    network: Network = field(default=None)

    def index(self, name: str) -> int:
        return int(name.removeprefix("n"))

    def fleet_node(self, name: str, overrides: str, count: int = 1) -> str:
        k = self.index(name)
        return NODE.format(name=name, overrides=overrides, count=count).replace(
            "address: 127.0.0.1",
            f"address: {self.network.address(k)}\n    network_gbps: {self.network.gbps[k]}")

    def launcher(self, name: str) -> list[str]:
        return self.network.exec_argv(self.index(name), [])

    def node_address(self, name: str) -> str:
        return self.network.address(self.index(name))


@pytest.fixture
def network() -> Iterator[Network]:
    if reason := netns.available():
        pytest.skip(reason)
    with netns.network(GBPS) as net:
        yield net


@pytest.fixture
def netns_system(tmp_path, network) -> Iterator[NetnsSystem]:
    """The embedded default (SQLite, filesystem broker) served on the network's root address."""
    base = embedded_system_at(tmp_path, MOTLEY_ALLOWED_HOSTS=network.host_address)
    system = NetnsSystem(workdir=base.workdir, env=base.env, host=network.host_address, network=network)
    with running(system) as started:
        yield started
