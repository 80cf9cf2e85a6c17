"""``/metrics``: the fleet and pipeline gauges computed at scrape time from a stored telemetry sample
and the database, and who may read them (a token, or an allowed address)."""

from __future__ import annotations

import time

import pytest

from controlplane.deployments.models import DeploymentStage
from controlplane.telemetry.services import telemetry_keep, telemetry_sample
from tests.observability.conftest import parse

pytestmark = pytest.mark.django_db


def scrape(client, **extra):
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


def gpu(index: int, **figures) -> dict:
    return {"index": index, "utilization_pct": 10.0, "memory_used_bytes": 1, "memory_total_bytes": 2,
            "temperature_c": 40.0, "power_w": 50.0, "power_limit_w": 300.0, "sm_clock_mhz": 1410,
            "sm_clock_max_mhz": 1410, "throttle_reasons": [], "pcie_tx_bytes_per_s": 0.0,
            "pcie_rx_bytes_per_s": 0.0, "emulated": True, **figures}


def keep(node_name: str, node_id: int, devices: list[dict], stages: list[dict], received_at: float) -> None:
    heartbeat = {"sent_at": received_at, "devices": devices, "stages": stages}
    telemetry_keep(telemetry_sample(node_id=node_id, node_name=node_name, heartbeat=heartbeat,
                                    received_at=received_at))


def stage_entry(stage: DeploymentStage, **stats) -> dict:
    return {"stage_key": stage.stage_key, "deployment_id": stage.deployment_id, "replica": stage.pipeline,
            "stage_index": stage.stage_index, "state": "ready", "pid": 1, "exit_code": None, "restarts": 0,
            "message": "", "stats": stats}


def test_gpu_and_stage_gauges_are_the_stored_sample(client, running_deployment):
    stages = list(DeploymentStage.objects.filter(deployment=running_deployment, pipeline=0)
                  .select_related("device__node").order_by("stage_index"))
    first = stages[0]
    node, index = first.device.node, first.device.index
    now = time.time()
    hot = gpu(index, utilization_pct=42.0, memory_used_bytes=30 * 2**30, memory_total_bytes=80 * 2**30,
              temperature_c=87.0, power_w=312.5, sm_clock_mhz=705, throttle_reasons=["sw_thermal"],
              pcie_tx_bytes_per_s=1.5e9, pcie_rx_bytes_per_s=2.5e9, nvlink_tx_bytes_per_s=7e10,
              nvlink_rx_bytes_per_s=6e10, ecc_errors=0)
    cool = gpu(index + 1 if index == 0 else 0)  # a PCIe-only figure set: no NVLink series
    stats = {"step_ms": 12.5, "compute_ms": 10.0, "transfer_ms": 2.5, "decode_ms": 9.0,
             "bubble_fraction": 0.25, "tokens_per_s": 310.0, "batch_size": 3.0, "queue_depth": 2,
             "kv_tokens_used": 300, "kv_tokens_free": 700}
    keep(node.name, node.pk, [hot, cool], [stage_entry(first, **stats)], received_at=now - 1.5)

    s = scrape(client)
    device = first.device.name
    g = {"device": device}
    assert s.value("motley_gpu_utilization_ratio", **g) == pytest.approx(0.42)
    assert s.value("motley_gpu_memory_used_bytes", **g) == 30 * 2**30
    assert s.value("motley_gpu_memory_total_bytes", **g) == 80 * 2**30
    assert s.value("motley_gpu_temperature_celsius", **g) == 87.0
    assert s.value("motley_gpu_power_watts", **g) == 312.5
    assert s.value("motley_gpu_sm_clock_hertz", **g) == 705e6
    assert s.value("motley_gpu_sm_clock_max_hertz", **g) == 1410e6
    assert s.value("motley_gpu_throttled", **g) == 1.0
    assert s.value("motley_gpu_throttle_reason", reason="sw_thermal", **g) == 1.0
    assert s.value("motley_gpu_pcie_throughput_bytes_per_second", direction="rx", **g) == 2.5e9
    assert s.value("motley_gpu_nvlink_throughput_bytes_per_second", direction="tx", **g) == 7e10
    assert s.value("motley_gpu_ecc_errors", **g) == 0.0
    labels = s.find("motley_gpu_temperature_celsius", **g)[0].labels
    assert labels == {"node": node.name, "gpu": str(index), "device": device,
                      "gpu_model": first.device.model_name, "emulated": "true"}
    other = f"{node.name}/gpu{cool['index']}"
    assert s.value("motley_gpu_throttled", device=other) == 0.0
    assert not s.find("motley_gpu_nvlink_throughput_bytes_per_second", device=other)
    assert 1.5 <= s.value("motley_node_telemetry_age_seconds", node=node.name) < 30

    model = running_deployment.model.name
    replica = f"d{running_deployment.pk}-r0"
    st = {"deployment": running_deployment.name, "replica": replica, "stage": "0", "model_name": model,
          "device": device}
    assert s.value("motley_stage_step_seconds", **st) == pytest.approx(0.0125)
    assert s.value("motley_stage_hop_transfer_seconds", **st) == pytest.approx(0.0025)
    assert s.value("motley_stage_decode_step_seconds", **st) == pytest.approx(0.009)
    assert s.value("motley_stage_bubble_ratio", **st) == 0.25
    assert s.value("motley_stage_tokens_per_second", **st) == 310.0
    assert s.value("motley_stage_kv_tokens", state="used", **st) == 300
    assert s.value("vllm:kv_cache_usage_perc", model_name=model, replica=replica) == pytest.approx(0.3)
    # Predicted: the applied plan's figures, for every wanted stage (measured or not).
    planned = running_deployment.revision.plan["replicas"][0]["stages"]
    for stage in stages:
        labels = {**st, "stage": str(stage.stage_index), "device": stage.device.name}
        predicted = planned[stage.stage_index]["predicted"]
        assert s.value("motley_stage_step_predicted_seconds", **labels) == pytest.approx(
            predicted["step_ms"] / 1e3)
        assert s.value("motley_stage_hop_transfer_predicted_seconds", **labels) == pytest.approx(
            predicted["transfer_ms"] / 1e3)
    if len(stages) > 1:  # a stage with no sample has predicted figures and no measured ones
        assert not s.find("motley_stage_step_seconds", stage="1", replica=replica)


def test_prefix_caching_per_replica_from_its_head_and_blocks_per_stage(client, running_deployment):
    head = DeploymentStage.objects.select_related("device__node").get(
        deployment=running_deployment, pipeline=0, stage_index=0)
    relay = DeploymentStage(deployment=running_deployment, pipeline=0, stage_index=1)  # as a relay reports
    cache = {"prefix_queried_tokens": 4000, "prefix_hit_tokens": 3000, "prefix_cached_blocks": 40,
             "prefix_evicted_blocks": 7}
    relay_stats = {**cache, "prefix_queried_tokens": 9999}
    keep(head.node.name, head.node.pk, [], [stage_entry(head, **cache, prefix_host_blocks=12),
                                            stage_entry(relay, **relay_stats)], time.time())

    s = scrape(client)
    replica = {"model_name": running_deployment.model.name, "replica": f"d{running_deployment.pk}-r0"}
    assert s.value("vllm:prefix_cache_queries_total", **replica) == 4000  # the head's, not a relay's
    assert s.value("vllm:prefix_cache_hits_total", **replica) == 3000
    assert s.value("vllm:gpu_prefix_cache_hit_rate", **replica) == pytest.approx(0.75)
    assert s.families["vllm:prefix_cache_queries"].type == "counter"
    assert s.families["vllm:gpu_prefix_cache_hit_rate"].type == "gauge"
    at = {**replica, "deployment": running_deployment.name}
    assert s.value("motley_stage_prefix_cache_blocks", stage="0", tier="device", **at) == 40
    assert s.value("motley_stage_prefix_cache_blocks", stage="0", tier="host", **at) == 12
    assert s.value("motley_stage_prefix_cache_blocks", stage="1", tier="device", **at) == 40
    assert not s.find("motley_stage_prefix_cache_blocks", stage="1", tier="host")  # no host tier there
    assert s.value("motley_stage_prefix_cache_evicted_blocks_total", stage="1", **at) == 7


def test_a_stage_without_prefix_figures_has_no_prefix_series(client, running_deployment):
    head = DeploymentStage.objects.select_related("device__node").get(
        deployment=running_deployment, pipeline=0, stage_index=0)
    keep(head.node.name, head.node.pk, [], [stage_entry(head, step_ms=1.0, prefix_queried_tokens=0,
                                                         prefix_hit_tokens=0)], time.time())
    s = scrape(client)
    assert s.value("vllm:prefix_cache_queries_total", replica=f"d{running_deployment.pk}-r0") == 0
    assert not s.find("vllm:gpu_prefix_cache_hit_rate")  # nothing looked up: no rate
    assert not s.find("motley_stage_prefix_cache_blocks")


def test_spec_decode_counters_per_replica_from_its_head(client, running_deployment):
    head = DeploymentStage.objects.select_related("device__node").get(
        deployment=running_deployment, pipeline=0, stage_index=0)
    relay = DeploymentStage(deployment=running_deployment, pipeline=0, stage_index=1)
    figures = {"spec_drafts": 100, "spec_draft_tokens": 400, "spec_accepted_tokens": 250}
    keep(head.node.name, head.node.pk, [], [stage_entry(head, **figures),
                                            stage_entry(relay, spec_drafts=9999)], time.time())
    s = scrape(client)
    replica = {"model_name": running_deployment.model.name, "replica": f"d{running_deployment.pk}-r0"}
    assert s.value("vllm:spec_decode_num_drafts_total", **replica) == 100  # the head's, not a relay's
    assert s.value("vllm:spec_decode_num_draft_tokens_total", **replica) == 400
    assert s.value("vllm:spec_decode_num_accepted_tokens_total", **replica) == 250
    assert s.families["vllm:spec_decode_num_drafts"].type == "counter"


def test_a_head_without_spec_figures_has_no_spec_decode_series(client, running_deployment):
    head = DeploymentStage.objects.select_related("device__node").get(
        deployment=running_deployment, pipeline=0, stage_index=0)
    keep(head.node.name, head.node.pk, [], [stage_entry(head, step_ms=1.0, prefix_queried_tokens=0)],
         time.time())
    s = scrape(client)
    assert not any(s.find(f"vllm:spec_decode_num_{name}_total")
                   for name in ("drafts", "draft_tokens", "accepted_tokens"))


def test_statuses_and_rebalance_decisions_come_from_the_database(client, running_deployment):
    from controlplane.deployments.events import event_record
    from controlplane.inventory.models import Node

    event_record(kind="replanned", deployment=running_deployment, message="re-planned")
    event_record(kind="replanned", deployment=running_deployment, message="re-planned again")
    Node.objects.update(incarnation=1)  # every node registered by an agent: its status is observed
    Node.objects.filter(name="node-c").update(status=Node.Status.LOST)
    s = scrape(client)
    name = running_deployment.name
    assert s.value("motley_rebalance_decisions_total", deployment=name, kind="applied") == 1
    assert s.value("motley_rebalance_decisions_total", deployment=name, kind="replanned") == 2
    assert not s.find("motley_rebalance_decisions_total", kind="ready")  # a status, not a decision
    assert s.families["motley_rebalance_decisions"].type == "counter"
    assert s.value("motley_deployment_status", deployment=name, status="ready") == 1
    assert s.value("motley_deployment_status", deployment=name, status="failed") == 0
    assert s.value("motley_node_status", node="node-c", status="lost") == 1
    assert s.value("motley_node_status", node="node-a", status="lost") == 0
    assert s.value("motley_node_status", node="node-a", status="ready") == 1
    assert s.value("motley_gpu_health", device="node-a/gpu0", health="healthy") == 1


def test_a_node_no_agent_registered_is_declared_and_its_gpus_health_unknown(client, running_deployment):
    """As the Nodes page and the API show it (``Node.liveness``, ``Device.shown_health``), not the
    status field's default (ready) nobody observed."""
    from controlplane.inventory.models import Node

    Node.objects.filter(name="node-a").update(incarnation=1)
    s = scrape(client)
    declared = Node.objects.get(name="node-b")
    assert declared.liveness == "declared"  # the API's status field, the Nodes page's column
    assert s.value("motley_node_status", node="node-b", status="declared") == 1
    assert s.value("motley_node_status", node="node-b", status="ready") == 0
    assert s.value("motley_node_status", node="node-a", status="declared") == 0
    assert s.value("motley_node_status", node="node-a", status="ready") == 1
    assert s.value("motley_gpu_health", device="node-b/gpu0", health="unknown") == 1
    assert s.value("motley_gpu_health", device="node-b/gpu0", health="healthy") == 0
    assert s.value("motley_gpu_health", device="node-a/gpu0", health="healthy") == 1


def test_a_scrape_costs_a_fixed_number_of_queries(client, running_deployment, django_assert_num_queries):
    # nodes, devices, deployments, wanted stages, events: one each, whatever the fleet's size
    with django_assert_num_queries(5):
        scrape(client)


# ---- who may read them


@pytest.mark.parametrize(("token", "allow", "remote", "header", "status"), [
    ("", ("127.0.0.1/8", "::1/128"), "127.0.0.1", None, 200),  # the default: loopback only
    ("", ("127.0.0.1/8", "::1/128"), "10.1.2.3", None, 403),  # no token to ask for: forbidden
    ("s3cret", ("127.0.0.1/8",), "10.1.2.3", None, 401),  # a token would do
    ("s3cret", ("127.0.0.1/8",), "10.1.2.3", "Bearer s3cret", 200),
    ("s3cret", ("127.0.0.1/8",), "127.0.0.1", "Bearer wrong", 401),  # a wrong token is refused anywhere
    ("", ("127.0.0.1/8",), "127.0.0.1", "Bearer anything", 401),  # no token is set: none is right
    ("", ("10.0.0.0/8",), "10.1.2.3", None, 200),
    ("", ("10.0.0.0/8",), "127.0.0.1", None, 403),
    ("", (), "127.0.0.1", None, 403),  # an empty list allows no address
    ("", ("127.0.0.1/8",), "::ffff:127.0.0.1", None, 200),  # IPv4-mapped IPv6
    ("", ("::1/128",), "::1", None, 200),
])
def test_access_takes_the_token_or_an_allowed_address(client, settings, token, allow, remote, header, status):
    settings.MOTLEY_METRICS_TOKEN, settings.MOTLEY_METRICS_ALLOW = token, allow
    extra = {"REMOTE_ADDR": remote}
    if header is not None:
        extra["HTTP_AUTHORIZATION"] = header
    response = client.get("/metrics", **extra)
    assert response.status_code == status, response.content
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")
    if status == 200:
        parse(response.content.decode())


def test_a_malformed_allow_list_says_which_entry(client, settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.MOTLEY_METRICS_ALLOW = ("10.0.0.0/33",)
    with pytest.raises(ImproperlyConfigured, match="MOTLEY_METRICS_ALLOW"):
        client.get("/metrics", REMOTE_ADDR="10.1.2.3")


def test_openmetrics_when_asked(client):
    response = client.get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().endswith("# EOF\n")
