"""What an agent measures and pushes with each heartbeat (docs/contracts.md §3 and §4).

``GpuMetrics`` is one sample of one GPU (NVML or an emulated device). The telemetry hub keeps as
history the GPU fields named in ``GPU_FIELDS`` (each a ``GpuMetrics`` field) and the stage
statistics named in ``STAGE_FIELDS`` (each a key of ``worker_runtime.stats.StageStats.snapshot``,
which an agent passes on as its stages' ``stats``); tests/dashboard/test_hub.py holds both lists to
their sources, so a renamed or dropped figure cannot leave the dashboard charting nothing.
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
    # The clock the card runs at unthrottled (NVML's max SM clock; an emulated card's modeled one):
    # sm_clock_mhz / sm_clock_max_mhz is how much of its speed a throttled card has left.
    sm_clock_max_mhz: int | None = None
    # Summed over the card's active NVLinks; None where the card has no NVLink (nothing to chart).
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    # Health counters, None where the card does not report them (no ECC, no NVML event support):
    ecc_errors: int | None = None  # volatile uncorrected ECC errors (since the driver loaded / last reset)
    xid_errors: int | None = None  # critical XID events since the agent started
    retired_pages: int | None = None  # memory pages retired or rows remapped (permanent)


# The GpuMetrics fields kept per GPU as history and rollups (numbers only; throttle_reasons is shown
# live, power_limit_w and the clocks are not charted; the health counters feed Device.health). A
# field a device does not report (NVLink on a PCIe-only card) stays absent from its series.
GPU_FIELDS = (
    "utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c", "power_w",
    "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s",
)
# The throttle reasons that mean a card runs slower than it could for a reason other than its power
# budget (contracts §3): sustained, they make its observed health DEGRADED. ``power_cap`` is left
# out: a busy card at its power limit is working as designed.
SLOWDOWN_REASONS = ("hw_slowdown", "sw_thermal", "hw_thermal", "power_brake")
# Prefix caching's statistics (contracts §4) that the dashboard charts: prompt tokens looked up and
# reused since the stage started (their ratio is its hit rate), and the KV blocks it keeps named for
# reuse on its device and in host memory. A stage reports them only while it caches prefixes, so they
# stay absent from its series until then.
PREFIX_FIELDS = ("prefix_queried_tokens", "prefix_hit_tokens", "prefix_cached_blocks", "prefix_host_blocks")
# Speculative decoding's statistics (contracts §4), the head's (stage 0's) alone: counters since it
# started of the sequence-steps that carried proposals, the tokens proposed and those accepted (their
# ratio is the acceptance rate; (accepted + drafts) / drafts the tokens per step). A head reports them
# only while its pipeline speculates, so they stay absent from its series until then.
SPEC_FIELDS = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")
# The stage statistics (contracts §4) kept per stage as history and rollups.
STAGE_FIELDS = (
    "step_ms", "compute_ms", "transfer_ms", "tokens_per_s", "batch_size", "queue_depth",
    "kv_tokens_used", "kv_tokens_free", "bubble_fraction", *PREFIX_FIELDS, *SPEC_FIELDS,
)
