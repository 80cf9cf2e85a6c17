"""One node agent: discovery, registration, supervisor, queue consumer and telemetry, wired together.

Start order matters: the supervisor starts first (its pid-file sweep kills what a previous agent left
behind before any new work arrives), then registration (which makes the control plane queue a
``sync`` and the wanted ``start_stage`` tasks), then the queue consumer and the telemetry. Shutdown
runs the other way: no new tasks, every stage stopped (their exits reported), the socket closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import types
from dataclasses import asdict

from agents.admission import Admission
from agents.config import AgentConfig
from agents.discovery.emulated import EmulatedMetrics, emulated_devices
from agents.discovery.nvml import NvmlMetrics, discover_devices, nvml_available
from agents.queue_consumer import QueueConsumer, build_app
from agents.registration import Registration, RegistrationRefused, local_address, register_until_done
from agents.supervisor import Supervisor
from agents.telemetry import Snapshot, Telemetry, websocket_url
from agents.throttle import Throttles
from contracts.fleet_file import FleetFileError
from contracts.hardware import DeviceSpec

log = logging.getLogger(__name__)

EXIT_CONFIG = 2  # the operator must act: bad fleet file, no GPU, join token refused


def discover(
    config: AgentConfig, nvml: types.ModuleType | None = None
) -> tuple[list[DeviceSpec], EmulatedMetrics | NvmlMetrics]:
    """The node's devices and their per-second metrics source: the fleet file, else NVML
    (``nvml``: a stand-in for tests; the real pynvml by default)."""
    if config.emulate is not None:
        devices = emulated_devices(config.emulate, config.node or config.name, config.name)
        return devices, EmulatedMetrics(devices)
    if not nvml_available(nvml):
        raise ValueError("no NVIDIA GPU found through NVML; "
                         "to emulate one, use --emulate FLEET_FILE --node NODE")
    return discover_devices(config.name, nvml), NvmlMetrics(nvml)


class Agent:
    def __init__(self, config: AgentConfig):
        self.config = config
        self.registration: Registration | None = None
        self._halt = threading.Event()  # the asyncio stop, for the threads that wait on the network
        self._exit_code = 0

    async def run(self) -> int:
        stop = asyncio.Event()

        def halt(code: int = 0) -> None:
            self._exit_code = self._exit_code or code
            stop.set()
            self._halt.set()

        self._halt_agent = halt
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, halt)
        try:
            self._devices, self._metrics = discover(self.config)
        except (ValueError, FleetFileError) as exc:
            log.error("%s", exc)
            return EXIT_CONFIG
        telemetry = Telemetry(websocket_url(self.config.server), lambda: self.registration, self._snapshot,
                              self._reregister)
        self._throttles = Throttles(self.config.state_dir / "throttle", self._devices)
        if isinstance(self._metrics, EmulatedMetrics):
            self._metrics.throttles = self._throttles
        admission = Admission(self._devices, self.config.time_scale, self._throttles)
        self._supervisor = Supervisor(self.config.state_dir, admission, telemetry.stage_event,
                                      command=self.config.stage_command)
        self._consumer: QueueConsumer | None = None
        telemetry_stop = asyncio.Event()
        telemetry_task: asyncio.Task | None = None
        try:
            self.registration = await self._register()
            if self.registration is None:
                return self._exit_code
            self._consumer = await asyncio.to_thread(self._start_consumer, self.registration)
            telemetry_task = asyncio.create_task(telemetry.run(telemetry_stop))
            log.info("agent %s up: node %s, incarnation %s, %d %sdevice(s)", self.config.name,
                     self.registration.node_id, self.registration.incarnation, len(self._devices),
                     "emulated " if self.config.emulate else "")
            while not stop.is_set():
                await self._watch_consumer(stop)
        finally:
            if self._consumer is not None:
                await asyncio.to_thread(self._consumer.stop)
            await asyncio.to_thread(self._supervisor.close)
            telemetry_stop.set()
            if telemetry_task is not None:
                try:
                    await asyncio.wait_for(telemetry_task, timeout=5)
                except TimeoutError:
                    log.warning("telemetry did not close in time")
            self._metrics.close()
        return self._exit_code

    async def _register(self) -> Registration | None:
        address = self.config.address or local_address(self.config.server)
        try:
            return await asyncio.to_thread(
                register_until_done, self._halt, server=self.config.server, join_token=self.config.join_token,
                name=self.config.name, address=address, devices=self._devices,
            )
        except RegistrationRefused as exc:
            log.error("registration refused: %s", exc)
            self._halt_agent(EXIT_CONFIG)
            return None

    async def _reregister(self) -> None:
        """A new credential and incarnation; a new queue or broker gets a new consumer."""
        previous = self.registration
        registration = await self._register()
        if registration is None:
            return
        self.registration = registration
        assert previous is not None
        if (registration.queue, registration.broker_url) != (previous.queue, previous.broker_url):
            if self._consumer is not None:
                await asyncio.to_thread(self._consumer.stop)
            self._consumer = await asyncio.to_thread(self._start_consumer, registration)

    async def _watch_consumer(self, stop: asyncio.Event, interval_s: float = 2.0) -> None:
        """A consumer that died (Celery's "Unrecoverable error") is started again: without it the
        node would look healthy in its heartbeats while taking no work."""
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
            return
        except TimeoutError:
            pass
        if self._consumer is not None and not self._consumer.alive and self.registration is not None:
            log.error("the queue consumer stopped unexpectedly; starting it again")
            self._consumer = await asyncio.to_thread(self._start_consumer, self.registration)

    def _start_consumer(self, registration: Registration) -> QueueConsumer:
        app = build_app(registration.broker_url, registration.broker_transport_options, registration.queue,
                        self._supervisor, self._throttles, incarnation=lambda: self.registration.incarnation)
        hostname = f"agent-{self.config.name}@{socket.gethostname()}"
        consumer = QueueConsumer(app, registration.queue, hostname=hostname)
        consumer.start()
        return consumer

    def _snapshot(self) -> Snapshot:
        pairs = self._supervisor.snapshot()
        devices = [asdict(sample) for sample in self._metrics.sample([usage for _, usage in pairs])]
        return devices, [status.to_json() for status, _ in pairs]
