"""Migration inventory.0004: a node's DRAINING status becomes its intent, and back."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)
BEFORE = [("inventory", "0003_devicecalibration")]
AFTER = [("inventory", "0004_node_intent")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_draining_nodes_become_draining_intent_with_ready_status_and_back():
    try:
        old = migrate(BEFORE).get_model("inventory", "Node")
        for name, status in [("drained", "draining"), ("lost", "lost"), ("fine", "ready")]:
            old.objects.create(name=name, status=status)
        new = migrate(AFTER).get_model("inventory", "Node")
        assert {n.name: (n.status, n.intent) for n in new.objects.all()} == {
            "drained": ("ready", "draining"), "lost": ("lost", "schedulable"),
            "fine": ("ready", "schedulable")}
        new.objects.filter(name="fine").update(intent="cordoned")
        back = migrate(BEFORE).get_model("inventory", "Node")
        assert dict(back.objects.values_list("name", "status")) == {
            "drained": "draining", "lost": "lost", "fine": "draining"}
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
