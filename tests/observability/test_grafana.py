"""deploy/grafana/: the dashboard is valid JSON whose every PromQL expression names only metrics that
``/metrics`` exports (scraped here after real gateway requests, a stored telemetry sample and a READY
deployment), and the Prometheus scrape example is valid YAML that scrapes /metrics with the token."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml
from django.test import AsyncClient

from controlplane.deployments.models import DeploymentStage
from tests.gateway.fakes import Script
from tests.observability.conftest import parse
from tests.observability.test_metrics import gpu, keep, stage_entry
from tests.support.processes import REPO_ROOT

GRAFANA = REPO_ROOT / "deploy" / "grafana"
# PromQL words that are not metric names (functions are told apart by the "(" after them).
KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
            "offset", "inf", "nan", "Inf", "NaN"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords,
    label names (in braces, by/without/on/ignoring/group_* lists), durations, numbers or variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    expr = re.sub(r"\$\{[^}]*\}|\$\w+", "", expr)  # Grafana variables ($__rate_interval, ${node})
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery selectors
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\boffset\s+-?\w+", "", expr)
    expr = re.sub(r"(?<![\w:.])\d+(\.\d*)?([eE][-+]?\d+)?|(?<![\w:])\.\d+", "", expr)  # numbers
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if match.group() in KEYWORDS or expr[match.end():].lstrip().startswith("("):
            continue
        names.add(match.group())
    return names


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets (rows' panels too) and the metric part
    of the variables' ``label_values(metric, label)`` queries."""
    exprs = []

    def panels(items):
        for panel in items:
            exprs.extend(t["expr"] for t in panel.get("targets", ()) if t.get("expr"))
            panels(panel.get("panels", ()))

    panels(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"\s*label_values\((.+),\s*\w+\)\s*", query)
            assert match, f"variable {variable['name']}: only label_values(metric, label) is read: {query}"
            exprs.append(match.group(1))
    return exprs


def test_the_tokenizer_finds_metric_names_and_nothing_else():
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(x_bucket{model_name=~"$m"}[5m])))') == {
        "x_bucket"}
    assert metric_names("a / on(node, gpu) group_left(reason) b offset 5m + 1e-9 > bool 0.5") == {"a", "b"}
    assert metric_names('vllm:kv_cache_usage_perc{replica="r0"} * 100') == {"vllm:kv_cache_usage_perc"}
    assert metric_names("sum(rate(nope_total[$__rate_interval])) by (kind)") == {"nope_total"}
    assert metric_names("max without (instance) (up)") == {"up"}


def test_the_dashboard_is_grafana_json_with_three_sections():
    dashboard = json.loads((GRAFANA / "motley.json").read_text())
    assert dashboard["uid"] and dashboard["schemaVersion"] >= 36
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Fleet", "Pipeline (per deployment)", "Gateway"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
    names = set().union(*map(metric_names, dashboard_queries(dashboard)))
    # What the issue asks to chart: vLLM's serving metrics and motley's own.
    for wanted in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                   "vllm:e2e_request_latency_seconds_bucket", "vllm:generation_tokens_total",
                   "vllm:prompt_tokens_total", "motley_stage_step_seconds",
                   "motley_stage_step_predicted_seconds", "motley_stage_bubble_ratio",
                   "motley_stage_hop_transfer_seconds", "motley_gpu_utilization_ratio",
                   "motley_gpu_memory_used_bytes", "motley_gpu_temperature_celsius", "motley_gpu_power_watts",
                   "motley_gpu_throttled", "motley_gpu_pcie_throughput_bytes_per_second",
                   "motley_gpu_nvlink_throughput_bytes_per_second", "motley_node_status",
                   "motley_deployment_status", "motley_rebalance_decisions_total",
                   "motley_router_decisions_total", "vllm:prefix_cache_hits_total",
                   "vllm:gpu_prefix_cache_hit_rate", "motley_stage_prefix_cache_blocks"):
        assert wanted in names, wanted


@pytest.mark.django_db(transaction=True)
async def test_every_metric_the_dashboard_reads_is_exported(running_deployment, fake_pipeline, api_key,
                                                             demo_model):
    from asgiref.sync import sync_to_async

    @sync_to_async
    def telemetry():
        stage = DeploymentStage.objects.select_related("device__node").filter(
            deployment=running_deployment).first()
        node = stage.device.node
        busy = gpu(stage.device.index, throttle_reasons=["sw_thermal"], nvlink_tx_bytes_per_s=1e9,
                   nvlink_rx_bytes_per_s=1e9)
        stats = {"step_ms": 10.0, "compute_ms": 8.0, "transfer_ms": 2.0, "decode_ms": 7.0,
                 "bubble_fraction": 0.1, "tokens_per_s": 100.0, "batch_size": 2.0, "queue_depth": 0,
                 "kv_tokens_used": 10, "kv_tokens_free": 90, "prefix_queried_tokens": 40,
                 "prefix_hit_tokens": 30, "prefix_cached_blocks": 4, "prefix_host_blocks": 1}
        keep(node.name, node.pk, [busy], [stage_entry(stage, **stats)], received_at=time.time())

    await telemetry()
    fake_pipeline({"r0": Script(tokens=[5, 6, 7, 8])})
    for _ in range(2):
        response = await AsyncClient().post(
            "/v1/completions", json.dumps({"model": "demo", "prompt": "x", "max_tokens": 4}),
            content_type="application/json", headers={"Authorization": f"Bearer {api_key}"})
        assert response.status_code == 200
    scrape = parse((await AsyncClient().get("/metrics")).content.decode())

    dashboard = json.loads((GRAFANA / "motley.json").read_text())
    for expr in dashboard_queries(dashboard):
        missing = metric_names(expr) - scrape.names
        assert not missing, f"{expr!r} reads {sorted(missing)}, which /metrics does not export"


def test_the_prometheus_example_scrapes_metrics_with_the_token():
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "motley")
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
    assert job["static_configs"][0]["targets"]
