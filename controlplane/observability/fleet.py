"""The fleet at scrape time: every GPU's latest figures from the agents' telemetry, every node's status.

Computed when Prometheus scrapes, from the state every process shares: each node's latest heartbeat
sample (``controlplane.telemetry.selectors.latest_samples``, the shared cache) and the inventory in the
database. Any process answers the same, so nothing here is written per process.

GPU series carry ``node``, ``gpu`` (its index), ``device`` (``<node>/gpu<i>``, as plans and telemetry
name it), ``gpu_model`` and ``emulated`` (``true`` for the modeled figures of an emulated fleet). A
figure the device does not report (NVLink on a PCIe-only card, ECC on a card without it) has no
series. A node silent for ``MOTLEY_TELEMETRY_SAMPLE_TTL_S`` has no GPU series at all;
``motley_node_telemetry_age_seconds`` says how old each node's last sample is.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contracts.names import device_name
from controlplane.inventory.models import DECLARED, UNKNOWN_HEALTH, Device, Node
from controlplane.telemetry.selectors import latest_samples

GPU_LABELS = ("node", "gpu", "device", "gpu_model", "emulated")

# GpuMetrics field -> (metric, help, scale to base units)
GPU_GAUGES: dict[str, tuple[str, str, float]] = {
    "utilization_pct": ("motley_gpu_utilization_ratio", "GPU utilization, 0..1 (NVML's, or modeled).", 0.01),
    "memory_used_bytes": ("motley_gpu_memory_used_bytes", "GPU memory in use.", 1.0),
    "memory_total_bytes": ("motley_gpu_memory_total_bytes", "GPU memory in all.", 1.0),
    "temperature_c": ("motley_gpu_temperature_celsius", "GPU temperature.", 1.0),
    "power_w": ("motley_gpu_power_watts", "GPU power draw.", 1.0),
    "power_limit_w": ("motley_gpu_power_limit_watts", "GPU power limit.", 1.0),
    "sm_clock_mhz": ("motley_gpu_sm_clock_hertz", "SM clock now.", 1e6),
    "sm_clock_max_mhz": ("motley_gpu_sm_clock_max_hertz", "SM clock unthrottled.", 1e6),
    "ecc_errors": ("motley_gpu_ecc_errors", "Uncorrected ECC errors since the driver loaded or the last "
                   "reset.", 1.0),
    "xid_errors": ("motley_gpu_xid_errors", "Critical XID events since the agent started.", 1.0),
    "retired_pages": ("motley_gpu_retired_pages", "Memory pages retired or rows remapped.", 1.0),
}
# Throughput by link kind: GpuMetrics fields of each direction.
LINK_THROUGHPUT = {
    "pcie": ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"),
    "nvlink": ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"),
}


def as_number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def enum_gauge(name: str, documentation: str, labels: list[str], rows, key: str, values) -> GaugeMetricFamily:
    """One series per possible value of a state (1 for the current one, 0 for the others), as
    kube-state-metrics does, so ``== 1`` selects and a state absent from the fleet reads 0."""
    family = GaugeMetricFamily(name, documentation, labels=[*labels, key])
    for label_values, current in rows:
        for value in values:
            family.add_metric([*label_values, value], 1.0 if value == current else 0.0)
    return family


class FleetCollector(Collector):
    """``motley_gpu_*`` from the latest telemetry, ``motley_node_*`` from the inventory and telemetry."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = time.time()
        samples = latest_samples()
        devices = {d.name: d for d in Device.objects.select_related("node")}
        nodes = list(Node.objects.all())
        yield from self._gpus(samples, devices)
        yield from self._gpu_health(devices)
        yield from self._nodes(samples, nodes, now)

    def _gpus(self, samples: list[dict], devices: dict[str, Device]) -> Iterator[GaugeMetricFamily]:
        gauges = {field: GaugeMetricFamily(name, doc, labels=GPU_LABELS)
                  for field, (name, doc, _) in GPU_GAUGES.items()}
        throttled = GaugeMetricFamily("motley_gpu_throttled", "1 while the GPU reports a throttle reason.",
                                      labels=GPU_LABELS)
        reasons = GaugeMetricFamily("motley_gpu_throttle_reason", "1 for each throttle reason the GPU "
                                    "reports now (power_cap, hw_slowdown, sw_thermal, hw_thermal, "
                                    "power_brake).",
                                    labels=[*GPU_LABELS, "reason"])
        links = {
            kind: GaugeMetricFamily(f"motley_gpu_{kind}_throughput_bytes_per_second",
                                    f"{'PCIe' if kind == 'pcie' else 'NVLink'} throughput by direction "
                                    "(tx, rx), averaged between two samples.",
                                    labels=[*GPU_LABELS, "direction"])
            for kind in LINK_THROUGHPUT
        }
        for sample in samples:
            node = sample["node"]
            for metrics in sample.get("devices") or ():
                if not isinstance(metrics, dict) or "index" not in metrics:
                    continue
                name = device_name(node, metrics["index"])
                row = devices.get(name)
                labels = [node, str(metrics["index"]), name, row.model_name if row else "",
                          "true" if metrics.get("emulated") else "false"]
                for field, (_, _, scale) in GPU_GAUGES.items():
                    if (value := as_number(metrics.get(field))) is not None:
                        gauges[field].add_metric(labels, value * scale)
                active = [str(r) for r in metrics.get("throttle_reasons") or ()]
                throttled.add_metric(labels, 1.0 if active else 0.0)
                for reason in active:
                    reasons.add_metric([*labels, reason], 1.0)
                for kind, fields in LINK_THROUGHPUT.items():
                    for direction, field in zip(("tx", "rx"), fields, strict=True):
                        if (value := as_number(metrics.get(field))) is not None:
                            links[kind].add_metric([*labels, direction], value)
        yield from gauges.values()
        yield throttled
        yield reasons
        yield from links.values()

    def _gpu_health(self, devices: dict[str, Device]) -> Iterator[GaugeMetricFamily]:
        rows = [([d.node.name, str(d.index), name, d.model_name, "true" if d.emulated else "false"],
                 d.shown_health) for name, d in sorted(devices.items())]
        yield enum_gauge("motley_gpu_health", "The GPU's effective health (the operator's override, else "
                         "what its samples show; unknown on a node no agent registered).", list(GPU_LABELS),
                         rows, "health", [*Device.Health.values, UNKNOWN_HEALTH])

    def _nodes(self, samples: list[dict], nodes: list[Node], now: float) -> Iterator[GaugeMetricFamily]:
        # As the Nodes page and the API show it: "declared" until an agent registers the node.
        yield enum_gauge("motley_node_status", "The node's observed status (liveness from heartbeats; "
                         "declared: no agent registered it).", ["node"],
                         [([n.name], n.liveness) for n in nodes], "status", [DECLARED, *Node.Status.values])
        if hasattr(Node, "Intent"):  # what the operator wants of it, apart from what is seen
            yield enum_gauge("motley_node_intent", "What the operator wants of the node: schedulable, "
                             "cordoned or draining.", ["node"], [([n.name], n.intent) for n in nodes],
                             "intent", Node.Intent.values)
        heartbeat = GaugeMetricFamily("motley_node_last_heartbeat_timestamp_seconds",
                                      "When the node's agent last heartbeated (Unix time).", labels=["node"])
        for node in nodes:
            if node.last_heartbeat is not None:
                heartbeat.add_metric([node.name], node.last_heartbeat.timestamp())
        yield heartbeat
        age = GaugeMetricFamily("motley_node_telemetry_age_seconds",
                                "Age of the node's latest telemetry sample in the shared cache.",
                                labels=["node"])
        for sample in samples:
            age.add_metric([sample["node"]], max(0.0, now - float(sample.get("received_at") or now)))
        yield age
