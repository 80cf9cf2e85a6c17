"""Row locks on PostgreSQL: the services' locks do not block the rows other services insert.

SQLite (the embedded default) serializes writers and has no row locks: these tests run in service
mode, as CI runs the suite.
"""

from __future__ import annotations

import threading

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from controlplane.deployments import liveness
from controlplane.deployments.liveness import HeartbeatSeen, node_heartbeats_flush
from controlplane.deployments.node_actions import node_drain
from controlplane.deployments.selectors import desired_stages
from tests.deployments.test_node_actions import deploy_ready

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks exist on PostgreSQL only"),
]


def test_a_drain_places_stages_on_nodes_a_heartbeat_flush_holds(nodes, revision, sent, monkeypatch):
    """The agents' socket flushes heartbeats every half second, holding every reporting node's row until
    it commits; a drain holding the drained node inserts stage rows naming the others. Under FOR UPDATE
    the insert waited for the flush while the flush waited for the drained node: a deadlock, and a 500
    for the operator's drain."""
    deployment = deploy_ready(revision)
    holding, release = threading.Event(), threading.Event()
    others = [n for n in nodes if n.name != "n1"]

    def stage_reports_held(**_):
        holding.set()
        release.wait(30)

    monkeypatch.setattr(liveness, "stage_reports_record_news", stage_reports_held)

    def flush():
        try:
            seen = [HeartbeatSeen(n.pk, n.incarnation, timezone.now(), []) for n in others]
            node_heartbeats_flush(seen=seen)
        finally:
            connection.close()

    flusher = threading.Thread(target=flush)
    flusher.start()
    try:
        assert holding.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '3s'")
        try:
            result = node_drain(node=nodes[1])
        except OperationalError as exc:
            pytest.fail(f"the drain waited for the flush's node locks: {exc}")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    finally:
        release.set()
        flusher.join(30)
    assert result.changed and "n1" not in {s.node.name for s in desired_stages(deployment=deployment)}
