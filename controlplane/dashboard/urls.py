from django.urls import path

from controlplane.dashboard import audit_views, usage_views, views

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("topology/", views.topology, name="topology"),
    path("fleet/", views.fleet, name="fleet"),
    path("utilization/", views.utilization, name="utilization"),
    path("deployments/", views.deployments, name="deployments"),
    path("deployments/<int:pk>/plan/", views.plan_editor, name="plan-editor"),
    path("deployments/traces/", views.traces, name="traces"),
    path("nodes/", views.nodes, name="nodes"),
    path("models/", views.models, name="models"),
    path("usage/", usage_views.usage, name="usage"),
    path("audit/", audit_views.audit, name="audit"),
    path("dashboard/telemetry/", views.telemetry_series, name="telemetry-series"),
    path("dashboard/topology.json", views.topology_json, name="topology-json"),
]
