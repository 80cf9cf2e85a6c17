from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from contracts.fleet_file import load_fleet_file, parse_fleet
from contracts.hardware import GIB
from controlplane.inventory.models import Device, Link, Node
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.inventory.services import fleet_import

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleets"
NODE_A = "name: x\nnodes:\n  - name: a\n"
pytestmark = pytest.mark.django_db


def import_file(path) -> str:
    out = StringIO()
    call_command("import_fleet", str(path), stdout=out)
    return out.getvalue()


def test_import_creates_everything_the_file_declares():
    output = import_file(EXAMPLES / "lab-3node.yaml")
    assert "nodes 3 created" in output and "devices 13 created" in output and "links 2 created" in output
    assert Node.objects.filter(fleet="lab").count() == 3
    a100 = Device.objects.get(node__name="node-a", index=0)
    assert (a100.model_name, a100.memory_bytes, a100.emulated) == ("A100-80GB-SXM", 80 * GIB, True)
    assert a100.nvlink_island == "node-a/nvlink0" and a100.nvlink_bandwidth_gbs == 300
    assert Device.objects.get(node__name="node-b", index=2).numa_node == 1
    assert Link.objects.filter(kind="pcie", device_a__node__name="node-b").count() == 1


def test_reimport_updates_and_never_duplicates():
    import_file(EXAMPLES / "lab-3node.yaml")
    ids = set(Device.objects.values_list("id", flat=True))
    output = import_file(EXAMPLES / "lab-3node.yaml")
    assert "nodes 0 created, 3 updated" in output and "devices 0 created, 13 updated, 0 removed" in output
    assert "links 0 created, 2 updated" in output
    assert set(Device.objects.values_list("id", flat=True)) == ids
    assert (Node.objects.count(), Link.objects.count()) == (3, 2)


def test_reimport_applies_changes_and_removes_undeclared_devices():
    fleet_import(fleet=load_fleet_file(EXAMPLES / "lab-3node.yaml"))
    Node.objects.create(name="discovered")  # not in the file: left alone
    changed = parse_fleet({
        "name": "lab",
        "nodes": [
            {"name": "node-a", "network_gbps": 200, "gpus": [{"model": "H100-SXM", "count": 2}]}
        ],
        "links": [],
    })
    result = fleet_import(fleet=changed)
    assert (result.devices_updated, result.devices_removed) == (2, 4)
    models = Device.objects.filter(node__name="node-a").values_list("model_name", flat=True)
    assert list(models) == ["H100-SXM"] * 2
    assert Node.objects.get(name="node-a").network_gbps == 200
    assert Node.objects.filter(name__in=["node-b", "node-c", "discovered"]).count() == 3


def test_reimported_link_declared_the_other_way_round_is_the_same_link():
    doc = {"name": "f", "nodes": [{"name": "a"}, {"name": "b"}],
           "links": [{"between": ["a", "b"], "bandwidth_gbs": 10}]}
    fleet_import(fleet=parse_fleet(doc))
    doc["links"] = [{"between": ["b", "a"], "bandwidth_gbs": 20}]
    assert fleet_import(fleet=parse_fleet(doc)).links_updated == 1
    assert list(Link.objects.values_list("bandwidth_gbs", flat=True)) == [20]


@pytest.mark.parametrize(
    "text, message",
    [
        (NODE_A + "    gpus: [{model: K80}]\n", "nodes[1] (a).gpus[0].model: unknown GPU model 'K80'"),
        (NODE_A + "    gpus: [{model: T4, count: 0}]\n", "nodes[1] (a).gpus[0].count: expected a positive"),
        (NODE_A + "    gpu: []\n", "nodes[1] (a).gpu: unknown key"),
        ("name: x\nnodes: {a: 1}\n", "nodes: expected a list"),
    ],
)
def test_malformed_file_is_refused_and_nothing_is_written(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    # A valid first node: a parser that wrote as it went would leave it behind.
    path.write_text(text.replace("nodes:\n", "nodes:\n  - name: ok\n    gpus: [{model: T4}]\n", 1))
    with pytest.raises(CommandError) as error:
        import_file(path)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)
    assert not Node.objects.exists() and not Device.objects.exists()


def test_failed_import_rolls_back(monkeypatch):
    from controlplane.inventory import services

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(services, "_link_upsert", boom)
    with pytest.raises(RuntimeError):
        fleet_import(fleet=load_fleet_file(EXAMPLES / "lab-3node.yaml"))
    assert not Node.objects.exists()


def test_inventory_round_trips_to_the_fleet_spec_with_health():
    declared = load_fleet_file(EXAMPLES / "lab-3node.yaml")
    fleet_import(fleet=declared)
    stored = fleet_spec_from_inventory(name="lab")
    assert stored.nodes == declared.nodes
    assert set(stored.links) == set(declared.links)

    Node.objects.filter(name="node-c").update(intent=Node.Intent.DRAINING)
    Device.objects.filter(node__name="node-a", index=5).update(health=Device.Health.UNHEALTHY)
    Node.objects.filter(name="node-b").update(status=Node.Status.SUSPECT)
    Device.objects.filter(node__name="node-a", index=4).update(health=Device.Health.DEGRADED)
    down = {d.name for d in fleet_spec_from_inventory().devices if d.down}
    assert down == {"node-a/gpu5", "node-c/gpu0", "node-c/gpu1", "node-c/gpu2"}
    # Cordoned is down as draining is (no new stage), and so is lost; each whatever the other field says.
    Node.objects.filter(name="node-c").update(intent=Node.Intent.CORDONED)
    Node.objects.filter(name="node-b").update(status=Node.Status.LOST)
    down = {d.name for d in fleet_spec_from_inventory().devices if d.down}
    node_b = {f"node-b/gpu{i}" for i in range(Device.objects.filter(node__name="node-b").count())}
    assert down == {"node-a/gpu5", "node-c/gpu0", "node-c/gpu1", "node-c/gpu2"} | node_b
    Node.objects.update(status=Node.Status.READY, intent=Node.Intent.SCHEDULABLE)
    assert {d.name for d in fleet_spec_from_inventory().devices if d.down} == {"node-a/gpu5"}


def test_selector_takes_a_subset_of_nodes_in_four_queries():
    """Nodes, their devices, links, and the stored calibration."""
    fleet_import(fleet=load_fleet_file(EXAMPLES / "cluster-64.yaml"))
    fleet_import(fleet=load_fleet_file(EXAMPLES / "lab-3node.yaml"))
    ids = list(Node.objects.filter(name__in=["node-a", "node-b"]).values_list("id", flat=True))
    with CaptureQueriesContext(connection) as queries:
        subset = fleet_spec_from_inventory(node_ids=ids)
    assert len(queries) == 4
    assert [n.name for n in subset.nodes] == ["node-a", "node-b"]
    pairs = [(link.a, link.b) for link in subset.links]
    assert pairs == [("node-a", "node-b"), ("node-b/gpu0", "node-b/gpu1")]
    assert len(fleet_spec_from_inventory().devices) == 64 + 13
