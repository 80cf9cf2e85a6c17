"""The roofline a stage is priced by: the fractions of spec-sheet figures real kernels reach, a
device's bandwidth, peak and slowdown, and a stage's footprint against its device's memory.
``cost_model`` prices one card's stages with them, ``tensor_parallel`` each rank of a group.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.footprint import StageFootprint
from contracts.hardware import DeviceSpec

# Fractions of the spec sheet that real kernels reach. Calibration corrects them per device.
BANDWIDTH_EFFICIENCY = 0.80
DECODE_COMPUTE_EFFICIENCY = 0.50
PREFILL_COMPUTE_EFFICIENCY = 0.60
LAYER_OVERHEAD_S = 20e-6  # kernel launches and synchronisation per layer per step


@dataclass(frozen=True)
class StageFit:
    """A stage's footprint (``contracts.footprint``) against the memory its device lets stages fill:
    the planner gives the stage's KV pool whatever its weights and workspace leave."""

    footprint: StageFootprint  # without a KV pool
    capacity_bytes: int

    @property
    def weights_bytes(self) -> int:
        return self.footprint.weights_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token of context costs on this stage."""
        return self.footprint.kv_bytes_per_token

    @property
    def workspace_bytes(self) -> int:
        return self.footprint.workspace_bytes

    def holding(self, kv_tokens: int) -> int:
        """Bytes the stage needs with a KV cache of ``kv_tokens`` tokens."""
        return self.footprint.holding(kv_tokens)

    @property
    def free_for_kv(self) -> int:
        return self.capacity_bytes - self.weights_bytes - self.workspace_bytes

    @property
    def kv_tokens(self) -> int:
        """Tokens of context (summed over sequences) this stage can cache."""
        return self.footprint.kv_tokens_within(self.capacity_bytes)


def slowdown(device: DeviceSpec, bits: int = 16) -> float:
    """What every time of a stage on this device is multiplied by: the device's calibration at the
    precision of the stage's last layer (``StagePrecision.last_bits``, which its head shares), over
    its throttling.

    A stage that runs its last layers at a lower precision takes that precision's factor whatever
    the number of them, so the split search counts low-bit layers under one factor
    (``split_prices.py``); the calibration fit files such a stage's measurements under the same
    precision (controlplane/telemetry/calibration.py).
    """
    return device.calibration_at(bits) / max(device.throttle_factor, 1e-3)


def device_key(device: DeviceSpec) -> tuple:
    """Everything about a device that changes its prices (not its name or place)."""
    return (device.memory_bytes, device.memory_used_bytes, device.memory_bandwidth_gbs, device.fp16_tflops,
            device.bf16_tflops, device.calibration, device.calibration_by_bits, device.throttle_factor)


def bandwidth(device: DeviceSpec) -> float:
    """Bytes per second real kernels read from this device's memory."""
    return device.memory_bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY


def _peak(device: DeviceSpec) -> float:
    return max(device.fp16_tflops, device.bf16_tflops) * 1e12
