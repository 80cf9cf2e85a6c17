"""GPU check, step 1: NVML discovery through the agent's own code (agents/discovery/nvml.py).

    python benchmarks/gpu_check_nvml.py [--fake] [--json OUT]

Prints every field of each ``DeviceSpec`` the inventory stores, the PCIe link (the maximum the
inventory keeps, and the current one), the active NVLinks with their peers and the island discovery
made of them, and one ``GpuMetrics`` sample (the agent's ``NvmlMetrics`` source) with its throttle
reasons and the raw reason bits. When the agent's code raises, every NVML call it makes is tried
one by one, so the log names the call this machine's driver refuses. ``--fake`` runs the same code
against the stand-in NVML of the tests (two NVLinked H200s and a throttled T4): the dry run.
Exit 0 when discovery and sampling worked, 1 when they failed, and 0 with ``GPU-CHECK-SKIP:`` when
there is no NVIDIA driver or GPU here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.discovery.nvml import NvmlMetrics, discover_devices, nvml_available  # noqa: E402

GIB = 1024**3


def fake_node():
    import pynvml

    from tests.agents.fake_nvml import FakeGpu, fake_nvml

    pair = ["00000000:1b:00.0", "00000000:43:00.0"]
    return fake_nvml(
        [
            FakeGpu(
                "NVIDIA H200", pair[0], 141 * GIB, used_bytes=GIB, nvlink_peers=[pair[1]] * 4, utilization=35
            ),
            FakeGpu("NVIDIA H200", pair[1], 141 * GIB, nvlink_peers=[pair[0]] * 4, numa=1),
            FakeGpu(
                "Tesla T4",
                "00000000:c1:00.0",
                15 * GIB,
                temperature=91,
                numa=1,
                throttle_bits=pynvml.nvmlClocksThrottleReasonHwThermalSlowdown,
            ),
        ]
    )


def real_nvml():
    import pynvml

    return pynvml


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # NVML raises NotSupported, NoPermission, ...: reported, not fatal here
        return f"error: {type(exc).__name__}: {exc}"


def system_info(nvml) -> dict:
    calls = {
        "driver": "nvmlSystemGetDriverVersion",
        "nvml": "nvmlSystemGetNVMLVersion",
        "cuda_driver": "nvmlSystemGetCudaDriverVersion",
    }
    return {
        key: _text(_try(getattr(nvml, name))) if hasattr(nvml, name) else "n/a" for key, name in calls.items()
    }


def links(nvml, index: int) -> dict:
    """The current PCIe link and the active NVLinks (link number -> peer bus id), read directly."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    out = {
        "pcie_current_gen": _try(
            getattr(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", lambda h: "n/a"), handle
        ),
        "pcie_current_width": _try(getattr(nvml, "nvmlDeviceGetCurrPcieLinkWidth", lambda h: "n/a"), handle),
        "nvlinks": {},
    }
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                out["nvlinks"][link] = _text(
                    nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
                ).lower()
        except Exception:  # not a link of this card
            continue
    return out


def each_call(nvml) -> list[str]:
    """Every NVML call discovery and sampling make, one by one: which one this machine refuses."""
    nvml.nvmlInit()
    lines = []
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        calls = [
            ("nvmlDeviceGetName", ()),
            ("nvmlDeviceGetUUID", ()),
            ("nvmlDeviceGetPciInfo", ()),
            ("nvmlDeviceGetMemoryInfo", ()),
            ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
            ("nvmlDeviceGetMaxPcieLinkWidth", ()),
            ("nvmlDeviceGetNumaNodeId", ()),
            ("nvmlDeviceGetNvLinkState", (0,)),
            ("nvmlDeviceGetUtilizationRates", ()),
            ("nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,)),
            ("nvmlDeviceGetPowerUsage", ()),
            ("nvmlDeviceGetEnforcedPowerLimit", ()),
            ("nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_SM,)),
            ("nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
            ("nvmlDeviceGetPcieThroughput", (nvml.NVML_PCIE_UTIL_TX_BYTES,)),
        ]
        for name, args in calls:
            fn = getattr(nvml, name, None)
            lines.append(f"  {name}: {'absent' if fn is None else repr(_try(fn, handle, *args))[:160]}")
    finally:
        nvml.nvmlShutdown()
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="the tests' stand-in NVML instead of the driver")
    parser.add_argument("--json", type=Path, help="write what was found to this file")
    args = parser.parse_args()
    nvml = fake_node() if args.fake else real_nvml()
    if not nvml_available(nvml):
        print("GPU-CHECK-SKIP: no NVIDIA driver or GPU visible to NVML here")
        return 0
    node = socket.gethostname().split(".")[0]
    result: dict = {"fake": args.fake, "node": node, "system": {}, "devices": [], "metrics": []}
    try:
        devices = discover_devices(node, nvml)  # the agent's code: it initialises and shuts NVML down itself
        metrics_source = NvmlMetrics(nvml)  # what the agent samples every heartbeat
        try:
            result["system"] = system_info(nvml)
            for device in devices:
                result["devices"].append({**dataclasses.asdict(device), **links(nvml, device.index)})
            samples = metrics_source.sample()
            for sample in samples:
                handle = nvml.nvmlDeviceGetHandleByIndex(sample.index)
                getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                raw = _try(getter, handle) if getter else "n/a"
                result["metrics"].append({**dataclasses.asdict(sample), "throttle_bits": raw})
        finally:
            metrics_source.close()
    except Exception:
        traceback.print_exc()
        print("The agent's NVML code failed; each call it makes, on GPU 0:")
        lines = _try(each_call, nvml)
        print("\n".join(lines) if isinstance(lines, list) else lines)
        return 1
    print(f"system: {json.dumps(result['system'])}")
    for device in result["devices"]:
        print(f"\n{device['name']} ({device['model']}, uuid {device['uuid']}):")
        for key, value in device.items():
            print(f"  {key}: {value}")
        print(
            f"  PCIe: max gen {device['pcie_gen']} x{device['pcie_lanes']}, current gen "
            f"{device['pcie_current_gen']} x{device['pcie_current_width']}; NVLink island "
            f"{device['nvlink_island']}, {len(device['nvlinks'])} active links to "
            f"{sorted(set(device['nvlinks'].values()))}"
        )
    for sample in result["metrics"]:
        print(f"\nsample gpu{sample['index']}: " + ", ".join(f"{k}={v}" for k, v in sample.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
