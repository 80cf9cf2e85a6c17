"""The deployments at scrape time: status, every stage's predicted and measured figures, KV use,
prefix caching (``prefix_cache.py``), speculative decoding (``speculation.py``) and the placement
decisions taken.

Computed when Prometheus scrapes from what every process shares: the database (deployments, their
applied plan revision, wanted stages, events) and each stage's latest statistics in the telemetry
(``controlplane.telemetry.selectors.stage_samples``: contracts §4, averages over the stage's last
second). Predicted figures are the applied plan's (docs/planner.md, "JSON schema": each stage's
``predicted.step_ms`` and ``transfer_ms``, calibrated when the plan was made).

Stage series carry ``model_name``, ``deployment``, ``replica`` (the pipeline id, as the vLLM
metrics name it), ``stage`` (its index) and ``device`` (``<node>/gpu<i>``).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from contracts.names import parse_stage_key, pipeline_id
from controlplane.deployments.models import Deployment, DeploymentEvent, DeploymentStage
from controlplane.observability.fleet import as_number, enum_gauge
from controlplane.observability.prefix_cache import PrefixCacheFamilies
from controlplane.observability.speculation import SpecDecodeFamilies
from controlplane.planning import Plan, StagePlan
from controlplane.telemetry.selectors import stage_samples

STAGE_LABELS = ("model_name", "deployment", "replica", "stage", "device")

# Stage statistic (contracts §4) -> (metric, help, scale to base units)
STAGE_GAUGES: dict[str, tuple[str, str, float]] = {
    "step_ms": ("motley_stage_step_seconds", "Measured step time (compute + hand-off), mean over the last "
                "second.", 1e-3),
    "compute_ms": ("motley_stage_compute_seconds", "Measured compute time of a step.", 1e-3),
    "transfer_ms": ("motley_stage_hop_transfer_seconds", "Measured time to hand a step's output to the next "
                    "stage (encode and send).", 1e-3),
    "decode_ms": ("motley_stage_decode_step_seconds", "Measured compute time of a decode step (what "
                  "calibration compares with the planner's).", 1e-3),
    "bubble_fraction": ("motley_stage_bubble_ratio", "Share of the last second the stage waited with "
                        "nothing to compute: the pipeline bubble at this stage.", 1.0),
    "tokens_per_s": ("motley_stage_tokens_per_second", "Tokens through the stage per second.", 1.0),
    "batch_size": ("motley_stage_batch_size", "Mean sequences per step.", 1.0),
    "queue_depth": ("motley_stage_queue_depth", "Requests waiting at the stage.", 1.0),
}
PLAN_GAUGES: dict[str, tuple[str, str]] = {
    "step_ms": ("motley_stage_step_predicted_seconds", "The applied plan's predicted step time."),
    "transfer_ms": ("motley_stage_hop_transfer_predicted_seconds", "The applied plan's predicted hand-off "
                    "time to the next stage."),
}
# Events that are decisions about placement (docs/deployments.md, "Events").
REBALANCE_KINDS = ("applied", "replanned", "drained", "replan_failed", "policy")


class PipelineCollector(Collector):
    """``motley_deployment_*``, ``motley_stage_*``, ``vllm:kv_cache_usage_perc``, ``vllm:prefix_cache_*``,
    ``vllm:spec_decode_*`` and rebalance decisions."""

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        deployments = {d.pk: d for d in Deployment.objects.select_related("model", "revision")}
        wanted = {s.stage_key: s for s in DeploymentStage.objects.filter(wanted=True).select_related(
            "device__node")}
        yield enum_gauge(
            "motley_deployment_status", "The deployment's status as the controller observes it.",
            ["deployment", "model_name"], [([d.name, d.model.name], d.status) for d in deployments.values()],
            "status", Deployment.Status.values,
        )
        yield from self._predicted(deployments, wanted)
        yield from self._measured(deployments, wanted)
        yield self._rebalance()

    @staticmethod
    def _labels(deployment: Deployment, key: str, wanted: dict[str, DeploymentStage],
                node: str = "") -> list[str]:
        parts = parse_stage_key(key)
        stage = wanted.get(key)
        device = stage.device.name if stage is not None and stage.device is not None else node
        return [deployment.model.name, deployment.name, pipeline_id(parts.deployment_id, parts.pipeline),
                str(parts.stage_index), device]

    def _predicted(self, deployments: dict[int, Deployment], wanted: dict[str, DeploymentStage]):
        gauges = {k: GaugeMetricFamily(name, doc, labels=STAGE_LABELS)
                  for k, (name, doc) in PLAN_GAUGES.items()}
        plans = {pk: d.revision.priced if d.revision else None for pk, d in deployments.items()}
        for key, stage in sorted(wanted.items()):
            deployment = deployments[stage.deployment_id]
            planned = _plan_stage(plans[stage.deployment_id], stage.plan_replica, stage.stage_index)
            for field, family in gauges.items() if planned is not None else ():
                if (value := as_number(getattr(planned, field))) is not None:
                    family.add_metric(self._labels(deployment, key, wanted), value * 1e-3)
        yield from gauges.values()

    def _measured(self, deployments: dict[int, Deployment], wanted: dict[str, DeploymentStage]):
        gauges = {k: GaugeMetricFamily(name, doc, labels=STAGE_LABELS)
                  for k, (name, doc, _) in STAGE_GAUGES.items()}
        kv = GaugeMetricFamily("motley_stage_kv_tokens", "KV-cache tokens of the stage, used and free.",
                               labels=[*STAGE_LABELS, "state"])
        usage: dict[tuple[str, str], float] = {}  # (model, replica) -> the fullest stage's share
        prefix, spec = PrefixCacheFamilies(STAGE_LABELS), SpecDecodeFamilies()
        for key, latest in sorted(stage_samples().items()):
            parts = parse_stage_key(key)
            deployment = deployments.get(parts.deployment_id) if parts else None
            stats = latest.value.get("stats")
            if deployment is None or not isinstance(stats, dict):
                continue
            labels = self._labels(deployment, key, wanted, latest.node)
            for field, (_, _, scale) in STAGE_GAUGES.items():
                if (value := as_number(stats.get(field))) is not None:
                    gauges[field].add_metric(labels, value * scale)
            used, free = as_number(stats.get("kv_tokens_used")), as_number(stats.get("kv_tokens_free"))
            if used is not None and free is not None:
                kv.add_metric([*labels, "used"], used)
                kv.add_metric([*labels, "free"], free)
                share = used / (used + free) if used + free > 0 else 0.0
                replica = (labels[0], labels[2])
                usage[replica] = max(usage.get(replica, 0.0), share)
            prefix.add(labels, stats, head=parts.stage_index == 0)
            spec.add(labels, stats, head=parts.stage_index == 0)
        yield from gauges.values()
        yield kv
        yield from prefix.families()
        yield from spec.families()
        perc = GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage (the "
                                 "replica's fullest stage).", labels=["model_name", "replica"])
        for (model, replica), share in sorted(usage.items()):
            perc.add_metric([model, replica], share)
        yield perc

    @staticmethod
    def _rebalance() -> CounterMetricFamily:
        family = CounterMetricFamily(
            "motley_rebalance_decisions", "Placement decisions recorded as events, by kind: applied (created "
            "or an operator's apply), replanned (after a lost node), drained, replan_failed, policy.",
            labels=["deployment", "kind"],
        )
        counts = (DeploymentEvent.objects.filter(kind__in=REBALANCE_KINDS, deployment__isnull=False)
                  .values("deployment__name", "kind").annotate(n=Count("pk"))
                  .order_by("deployment__name", "kind"))
        for row in counts:
            family.add_metric([row["deployment__name"], row["kind"]], float(row["n"]))
        return family


def _plan_stage(plan: Plan | None, plan_replica: int, stage_index: int) -> StagePlan | None:
    """The stage of the applied plan a stage row runs (None: the plan has no figures, or no such stage)."""
    if plan is None or not 0 <= plan_replica < len(plan.replicas):
        return None
    stages = plan.replicas[plan_replica].stages
    return stages[stage_index] if 0 <= stage_index < len(stages) else None
