"""What NVML reports beyond one instant's gauges: NVLink throughput, XID events, ECC and retired pages.

NVLink throughput is a pair of cumulative counters per link (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX``
and ``_RX``, KiB of payload, read with ``nvmlDeviceGetFieldValues`` scoped to each link): a rate
needs two readings, so ``NvlinkCounters`` keeps the last one per GPU and sums the card's active links.
A card with no active NVLink (or a driver without these fields) reports ``None``: nothing to chart.

XID errors arrive as NVML events; ``XidWatch`` registers every GPU for critical XID events and counts,
per GPU, those since the agent started, leaving out the XIDs an application causes on a healthy card
(``APPLICATION_XIDS``). ECC (volatile uncorrected) and retired pages (rows remapped on Ampere and
later, pages retired before) are read as NVML keeps them. Every call is optional: what the card or
driver does not support is ``None``, never an error.

The NVML module is a parameter, as everywhere in discovery, so tests hand in a stand-in.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

# XIDs a faulty or killed application raises on a healthy card (graphics engine exception, MMU fault,
# GPU stopped processing on a context's request, preemptive cleanup, video processor exception):
# they say nothing of the card's health. Every other critical XID counts.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
_FIELD_VALUE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def max_sm_clock(nvml: types.ModuleType, handle) -> int | None:
    """The card's maximum SM clock, MHz (what it runs at unthrottled, boost included)."""
    try:
        return int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
    except Exception:  # NotSupported
        return None


def ecc_errors(nvml: types.ModuleType, handle) -> int | None:
    """Uncorrected ECC errors since the driver loaded (or the card was reset); None without ECC."""
    try:
        return int(nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                    nvml.NVML_VOLATILE_ECC))
    except Exception:  # ECC disabled or not supported (consumer cards)
        return None


def retired_pages(nvml: types.ModuleType, handle) -> int | None:
    """Rows remapped (Ampere and later) or pages retired (earlier cards) for memory errors, ever."""
    try:
        corrected, uncorrected, _pending, _failure = nvml.nvmlDeviceGetRemappedRows(handle)
        return int(corrected) + int(uncorrected)
    except Exception:  # no row remapping on this card: page retirement, if any
        pass
    try:
        return sum(len(nvml.nvmlDeviceGetRetiredPages(handle, cause)) for cause in (
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
    except Exception:
        return None


class NvlinkCounters:
    """NVLink tx/rx bytes per second of each GPU, from the cumulative per-link counters."""

    def __init__(self, nvml: types.ModuleType, clock: Callable[[], float] = time.monotonic):
        self._nvml = nvml
        self._clock = clock
        self._links: dict[int, list[int]] = {}  # active links per GPU index, found on first use
        self._last: dict[int, tuple[float, float, float]] = {}  # index -> (t, tx KiB, rx KiB)

    def rates(self, index: int, handle) -> tuple[float | None, float | None]:
        """Bytes/s sent and received over the card's active NVLinks since the last call; (None, None)
        for a card without NVLink, and on the first call (no rate yet)."""
        if index not in self._links:
            self._links[index] = self._active_links(handle)
        links = self._links[index]
        if not links:
            return None, None
        now = self._clock()
        totals = self._read(handle, links)
        if totals is None:
            return None, None
        previous = self._last.get(index)
        self._last[index] = (now, *totals)
        if previous is None or now <= previous[0]:
            return None, None
        elapsed = now - previous[0]
        # A counter that went backwards was reset (driver reload): no rate for this interval.
        tx, rx = (max(0.0, totals[k] - previous[k + 1]) * 1024.0 / elapsed for k in (0, 1))
        return tx, rx

    def _active_links(self, handle) -> list[int]:
        nvml, links = self._nvml, []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                    links.append(link)
            except Exception:  # no such link on this card
                continue
        return links

    def _read(self, handle, links: Sequence[int]) -> tuple[float, float] | None:
        nvml = self._nvml
        ids = [(field, link) for field in (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                           nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) for link in links]
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, ids)
        except Exception:  # a driver without the call
            return None
        if any(int(v.nvmlReturn) != nvml.NVML_SUCCESS for v in values):
            return None  # the fields are not supported on this card or driver
        numbers = [float(getattr(v.value, _FIELD_VALUE.get(int(v.valueType), "ullVal"))) for v in values]
        return sum(numbers[: len(links)]), sum(numbers[len(links):])


class XidWatch:
    """Critical XID events per GPU index since this watch started (None where NVML cannot watch)."""

    def __init__(self, nvml: types.ModuleType, handles: Sequence):
        self._nvml = nvml
        self._counts: dict[int, int] = {}
        try:
            self._events = nvml.nvmlEventSetCreate()
        except Exception:
            log.warning("NVML cannot create an event set: XID errors are not reported", exc_info=True)
            self._events = None
            return
        for index, handle in enumerate(handles):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
            except Exception:  # not supported on this card (or not permitted)
                log.info("GPU %d: XID events not supported; its XID errors are not reported", index)
                continue
            self._counts[index] = 0

    def drain(self) -> None:
        """Count the events waiting, without blocking."""
        if self._events is None:
            return
        nvml = self._nvml
        for _ in range(10_000):  # bounded: a storm of events must not stall the heartbeat
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVMLError_Timeout: nothing more waiting
                return
            if int(event.eventData) in APPLICATION_XIDS:
                continue
            try:
                index = int(nvml.nvmlDeviceGetIndex(event.device))
            except Exception:
                continue
            if index in self._counts:
                self._counts[index] += 1
                log.warning("GPU %d: XID %d", index, int(event.eventData))

    def count(self, index: int) -> int | None:
        return self._counts.get(index)

    def close(self) -> None:
        if self._events is not None:
            try:
                self._nvml.nvmlEventSetFree(self._events)
            except Exception:
                pass
            self._events = None
