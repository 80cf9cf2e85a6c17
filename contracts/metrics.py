"""What an agent measures and pushes with each heartbeat (docs/contracts.md §3 and §4).

``GpuMetrics`` is one sample of one GPU (NVML or an emulated device); the telemetry hub keeps the
fields named in ``GPU_FIELDS`` and the stage statistics named in ``STAGE_FIELDS`` as history.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuMetrics:
    """One sample of one GPU, as pushed with each heartbeat."""

    index: int
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float
    power_w: float
    power_limit_w: float
    sm_clock_mhz: int
    throttle_reasons: tuple[str, ...]
    pcie_tx_bytes_per_s: float
    pcie_rx_bytes_per_s: float
    emulated: bool = False  # modeled figures of an emulated device (agents/discovery/emulated.py)
