"""Fleet files: a YAML or JSON declaration of nodes, GPUs (by catalog name) and links.

A fleet file lets a machine without GPUs run an emulated heterogeneous fleet, and lets an operator
plan for hardware they describe rather than discover. The format is documented in
docs/fleet-file.md. Parsing is strict: an unknown key, model or type is refused with the path of
the field at fault (``nodes[1] (node-b).gpus[0].count: ...``), because a typo silently ignored would
plan a fleet that does not exist. Pure Python: the planner CLI loads fleet files without Django.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from contracts import gpu_catalog
from contracts.hardware import (
    GIB,
    NETWORK_LATENCY_US,
    NVLINK_LATENCY_US,
    PCIE_LATENCY_US,
    DeviceSpec,
    FleetSpec,
    LinkSpec,
    NodeSpec,
)
from contracts.names import device_name


class FleetFileError(ValueError):
    """A fleet file that cannot be loaded; ``field`` is the path of the part at fault."""

    def __init__(self, source: str, field: str, problem: str):
        self.source = source
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {field}: {problem}" if field else f"{source}: {problem}")


FLEET_KEYS = {"name", "emulated", "nodes", "links"}
NODE_KEYS = {"name", "address", "network_gbps", "labels", "gpus"}
GPU_KEYS = {"model", "count", "nvlink", "numa_node", "overrides", "speed_factor"}
LINK_KEYS = {"between", "kind", "bandwidth_gbps", "bandwidth_gbs", "latency_us"}
# Override keys and the DeviceSpec field each sets; memory in GiB (what people write) or bytes.
OVERRIDE_KEYS = {
    "memory_gib": float,
    "memory_bytes": int,
    "memory_bandwidth_gbs": float,
    "fp16_tflops": float,
    "bf16_tflops": float,
    "int8_tops": float,
    "pcie_gen": int,
    "pcie_lanes": int,
    "nvlink_bandwidth_gbs": float,
}
LINK_LATENCY_US = {"nvlink": NVLINK_LATENCY_US, "pcie": PCIE_LATENCY_US, "network": NETWORK_LATENCY_US}


def load_fleet_file(path: str | Path) -> FleetSpec:
    """Read and validate a fleet file (.json as JSON, anything else as YAML, which JSON also is)."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise FleetFileError(source, "", f"cannot read the file ({exc.strerror})") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "YAML"
        raise FleetFileError(source, "", f"not valid {kind}: {exc}") from None
    return parse_fleet(data, source)


def parse_fleet(data: Any, source: str = "<fleet>") -> FleetSpec:
    """Validate an already-decoded fleet document and build the FleetSpec it declares."""
    return _Parser(source).fleet(data)


@dataclass
class _Parser:
    source: str

    def fail(self, field: str, problem: str) -> FleetFileError:
        return FleetFileError(self.source, field, problem)

    def mapping(self, value: Any, field: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"expected a mapping, got {_describe(value)}")
        for key in value:
            if key not in allowed:
                allowed_keys = ", ".join(sorted(allowed))
                raise self.fail(_join(field, str(key)), f"unknown key (allowed: {allowed_keys})")
        for key in sorted(required):
            if key not in value:
                raise self.fail(_join(field, key), "required")
        return value

    def name(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(field, f"expected a non-empty string, got {_describe(value)}")
        if "/" in value or value != value.strip():
            raise self.fail(field, f"{value!r} must not contain '/' or surrounding spaces")
        return value

    def positive_int(self, value: Any, field: str, allow_zero: bool = False) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if allow_zero else 1):
            kind = "a non-negative" if allow_zero else "a positive"
            raise self.fail(field, f"expected {kind} integer, got {_describe(value)}")
        return value

    def positive_number(self, value: Any, field: str, allow_zero: bool = False) -> float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or value < 0 or (value == 0 and not allow_zero):
            kind = "a non-negative" if allow_zero else "a positive"
            raise self.fail(field, f"expected {kind} number, got {_describe(value)}")
        return float(value)

    def boolean(self, value: Any, field: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(field, f"expected true or false, got {_describe(value)}")
        return value

    def list_of(self, value: Any, field: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(field, f"expected a list, got {_describe(value)}")
        return value

    def fleet(self, data: Any) -> FleetSpec:
        data = self.mapping(data, "", FLEET_KEYS, {"name", "nodes"})
        name = self.name(data["name"], "name")
        emulated = self.boolean(data.get("emulated", True), "emulated")
        raw_nodes = self.list_of(data["nodes"], "nodes")
        if not raw_nodes:
            raise self.fail("nodes", "declare at least one node")
        nodes: list[NodeSpec] = []
        for i, raw in enumerate(raw_nodes):
            node = self.node(raw, f"nodes[{i}]", emulated)
            if any(other.name == node.name for other in nodes):
                raise self.fail(f"nodes[{i}] ({node.name}).name", f"node {node.name!r} is declared twice")
            nodes.append(node)
        fleet = FleetSpec(name=name, nodes=tuple(nodes))
        raw_links = self.list_of(data.get("links", []), "links")
        links = tuple(self.link(raw, f"links[{i}]", fleet) for i, raw in enumerate(raw_links))
        seen: set[frozenset[str]] = set()
        for i, link in enumerate(links):
            if frozenset((link.a, link.b)) in seen:
                problem = f"a link between {link.a} and {link.b} is declared twice"
                raise self.fail(f"links[{i}].between", problem)
            seen.add(frozenset((link.a, link.b)))
        return FleetSpec(name=name, nodes=fleet.nodes, links=links)

    def node(self, raw: Any, field: str, emulated: bool) -> NodeSpec:
        # Name first, so that every later message can say which node it is about.
        if isinstance(raw, dict) and "name" in raw:
            name = self.name(raw["name"], _join(field, "name"))
            field = f"{field} ({name})"
        raw = self.mapping(raw, field, NODE_KEYS, {"name"})
        address = raw.get("address", "")
        if not isinstance(address, str):
            raise self.fail(_join(field, "address"), f"expected a string, got {_describe(address)}")
        labels = raw.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in [*labels, *labels.values()]):
            problem = f"expected a mapping of strings to strings, got {_describe(labels)}"
            raise self.fail(_join(field, "labels"), problem)
        network_gbps = self.positive_number(
            raw.get("network_gbps", NodeSpec.network_gbps), _join(field, "network_gbps")
        )
        devices: list[DeviceSpec] = []
        for g, group in enumerate(self.list_of(raw.get("gpus", []), _join(field, "gpus"))):
            devices += self.gpu_group(group, f"{field}.gpus[{g}]", name, g, len(devices), emulated)
        return NodeSpec(
            name=name, devices=tuple(devices), network_gbps=network_gbps, address=address, labels=labels
        )

    def gpu_group(
        self, raw: Any, field: str, node: str, group: int, first_index: int, emulated: bool
    ) -> list[DeviceSpec]:
        raw = self.mapping(raw, field, GPU_KEYS, {"model"})
        if not isinstance(raw["model"], str):
            problem = f"expected a catalog name, got {_describe(raw['model'])}"
            raise self.fail(_join(field, "model"), problem)
        try:
            model = gpu_catalog.lookup(raw["model"])
        except gpu_catalog.UnknownGpuModel as exc:
            raise self.fail(_join(field, "model"), str(exc)) from None
        count = self.positive_int(raw.get("count", 1), _join(field, "count"))
        numa_node = raw.get("numa_node")
        if numa_node is not None:
            numa_node = self.positive_int(numa_node, _join(field, "numa_node"), allow_zero=True)
        values: dict[str, Any] = {
            "memory_bytes": model.memory_bytes,
            "memory_bandwidth_gbs": model.memory_bandwidth_gbs,
            "fp16_tflops": model.fp16_tflops,
            "bf16_tflops": model.bf16_tflops,
            "int8_tops": model.int8_tops,
            "pcie_gen": model.pcie_gen,
            "pcie_lanes": model.pcie_lanes,
            "nvlink_bandwidth_gbs": model.nvlink_gbs,
        }
        values.update(self.overrides(raw.get("overrides", {}), _join(field, "overrides")))
        nvlink = self.boolean(raw.get("nvlink", False), _join(field, "nvlink"))
        if nvlink and values["nvlink_bandwidth_gbs"] <= 0:
            raise self.fail(
                _join(field, "nvlink"),
                f"{model.name} has no NVLink in the catalog; declare the bridge's speed with "
                "overrides: {nvlink_bandwidth_gbs: ...}",
            )
        island = f"{node}/nvlink{group}" if nvlink else None
        speed_factor = 1.0
        if "speed_factor" in raw:
            if not emulated:
                raise self.fail(_join(field, "speed_factor"), "applies to emulated devices only "
                                "(a fleet with emulated: false describes real cards)")
            speed_factor = self.positive_number(raw["speed_factor"], _join(field, "speed_factor"))
        if not nvlink:
            values["nvlink_bandwidth_gbs"] = 0.0
        return [
            DeviceSpec(
                name=device_name(node, index),
                node=node,
                index=index,
                model=model.name,
                vendor=model.vendor,
                numa_node=numa_node,
                nvlink_island=island,
                emulated=emulated,
                speed_factor=speed_factor,
                **values,
            )
            for index in range(first_index, first_index + count)
        ]

    def overrides(self, raw: Any, field: str) -> dict[str, Any]:
        raw = self.mapping(raw, field, set(OVERRIDE_KEYS), set())
        if "memory_gib" in raw and "memory_bytes" in raw:
            raise self.fail(_join(field, "memory_gib"), "give memory_gib or memory_bytes, not both")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            path = _join(field, key)
            if OVERRIDE_KEYS[key] is int:
                values[key] = self.positive_int(value, path)
            else:
                # A throughput of 0 is meaningful (bf16 unsupported); a memory of 0 is not.
                values[key] = self.positive_number(value, path, allow_zero=key != "memory_gib")
        if "memory_gib" in values:
            values["memory_bytes"] = int(values.pop("memory_gib") * GIB)
        return values

    def link(self, raw: Any, field: str, fleet: FleetSpec) -> LinkSpec:
        raw = self.mapping(raw, field, LINK_KEYS, {"between"})
        between = raw["between"]
        if not (isinstance(between, list) and len(between) == 2 and all(isinstance(e, str) for e in between)):
            problem = f"expected two node or device names, got {_describe(between)}"
            raise self.fail(_join(field, "between"), problem)
        a, b = between
        if a == b:
            raise self.fail(_join(field, "between"), f"a link joins two different endpoints, got {a!r} twice")
        node_names = {node.name for node in fleet.nodes}
        device_nodes = {device.name: device.node for device in fleet.devices}
        for endpoint in (a, b):
            if endpoint not in node_names and endpoint not in device_nodes:
                problem = f"{endpoint!r} is neither a declared node nor a device (<node>/gpu<i>)"
                raise self.fail(_join(field, "between"), problem)
        if (a in node_names) != (b in node_names):
            raise self.fail(_join(field, "between"), "a link joins two nodes or two devices, not one of each")
        same_node = a in device_nodes and device_nodes[a] == device_nodes[b]
        kind = raw.get("kind", "pcie" if same_node else "network")
        if kind not in LINK_LATENCY_US:
            raise self.fail(_join(field, "kind"), f"expected nvlink, pcie or network, got {_describe(kind)}")
        if kind in ("nvlink", "pcie") and not same_node:
            raise self.fail(_join(field, "kind"), f"{kind} joins two devices of the same node")
        if ("bandwidth_gbps" in raw) == ("bandwidth_gbs" in raw):
            raise self.fail(field, "give exactly one of bandwidth_gbps (Gbit/s) or bandwidth_gbs (GB/s)")
        if "bandwidth_gbs" in raw:
            bandwidth = self.positive_number(raw["bandwidth_gbs"], _join(field, "bandwidth_gbs"))
        else:
            bandwidth = self.positive_number(raw["bandwidth_gbps"], _join(field, "bandwidth_gbps")) / 8.0
        latency = self.positive_number(
            raw.get("latency_us", LINK_LATENCY_US[kind]), _join(field, "latency_us"), allow_zero=True
        )
        return LinkSpec(a=a, b=b, kind=kind, bandwidth_gbs=bandwidth, latency_us=latency)


def _join(field: str, key: str) -> str:
    return f"{field}.{key}" if field else key


def _describe(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__}"
    return repr(value)
