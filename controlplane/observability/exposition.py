"""The registry one scrape reads: the gateway's request metrics, then the gauges computed now.

**One process** (``PROMETHEUS_MULTIPROC_DIR`` unset): the request metrics are this process's objects.

**Several** (ASGI processes, Celery workers: ``PROMETHEUS_MULTIPROC_DIR`` names a directory they all
write): prometheus_client reads the variable when it is imported and then keeps every process's
values in files there; a scrape, answered by any one process, merges them (``MultiProcessCollector``:
counters and histograms summed over every process that wrote, ``livesum`` gauges over the live
ones). The directory must be emptied before the processes start (``run_local`` does; a service
manager must too), or a restart would count again what the previous run counted. A process that
exits cleanly removes its live gauges (``atexit``); one that is killed leaves them until the next
start wipes the directory.

The ``motley_*`` fleet and pipeline gauges are not written by anyone: ``FleetCollector`` and
``PipelineCollector`` compute them at each scrape from the shared telemetry and the database, the
same in every process.
"""

from __future__ import annotations

from functools import cache

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.multiprocess import MultiProcessCollector

from controlplane.observability.fleet import FleetCollector
from controlplane.observability.multiproc import multiproc_dir
from controlplane.observability.pipeline import PipelineCollector
from controlplane.observability.serving import SERVING_METRICS


@cache
def _single_process_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    for metric in SERVING_METRICS:
        registry.register(metric)
    registry.register(FleetCollector())
    registry.register(PipelineCollector())
    return registry


def scrape_registry() -> CollectorRegistry:
    """What ``/metrics`` renders: request metrics (this process's, or every process's files) and the
    gauges computed at scrape time."""
    path = multiproc_dir()
    if path is None:
        return _single_process_registry()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    registry.register(FleetCollector())
    registry.register(PipelineCollector())
    return registry


def metrics_render(*, accept: str = "") -> tuple[bytes, str]:
    """The exposition (Prometheus text, or OpenMetrics when ``accept`` asks for it) and its content type."""
    encoder, content_type = choose_encoder(accept)
    return encoder(scrape_registry()), content_type
