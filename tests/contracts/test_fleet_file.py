import json
from pathlib import Path

import pytest
import yaml

from contracts.fleet_file import FleetFileError, load_fleet_file, parse_fleet
from contracts.hardware import GIB

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleets"


GPU = "nodes[0] (n).gpus[0]"


def gpu(**changes):
    return lambda d: d["nodes"][0]["gpus"][0].update(changes)


def link(between):
    return lambda d: d.update(links=[{"between": between, "bandwidth_gbs": 1}])


def fleet(**top):
    """A minimal valid document; tests change one part of it."""
    return {"name": "t", "nodes": [{"name": "n", "gpus": [{"model": "T4"}]}], **top}


def test_the_issue_example_parses():
    spec = parse_fleet(yaml.safe_load("""
name: lab
nodes:
  - name: node-a
    network_gbps: 100
    gpus:
      - model: A100-80GB-SXM
        count: 4
        nvlink: true
      - model: T4
        count: 2
        overrides: {memory_gib: 15, memory_bandwidth_gbs: 300, fp16_tflops: 65}
"""))
    names = [d.name for d in spec.devices]
    assert names == [f"node-a/gpu{i}" for i in range(6)]
    a100, t4 = spec.device("node-a/gpu0"), spec.device("node-a/gpu5")
    assert a100.model == "A100-80GB-SXM" and a100.memory_bytes == 80 * GIB and a100.emulated
    assert a100.nvlink_island == "node-a/nvlink0" and a100.nvlink_bandwidth_gbs == 300
    assert t4.memory_bytes == 15 * GIB and t4.nvlink_island is None and t4.index == 5
    assert spec.node("node-a").network_gbps == 100
    assert spec.link_between(a100, spec.device("node-a/gpu3")).kind == "nvlink"
    assert spec.link_between(a100, t4).kind == "pcie"


@pytest.mark.parametrize("path", sorted(EXAMPLES.iterdir()), ids=lambda p: p.name)
def test_every_example_loads(path):
    spec = load_fleet_file(path)
    assert spec.devices and all(d.emulated for d in spec.devices)


def test_example_sizes():
    assert len(load_fleet_file(EXAMPLES / "cluster-64.yaml").devices) == 64
    lab = load_fleet_file(EXAMPLES / "lab-3node.yaml")
    assert len(lab.nodes) == 3 and len({d.model for d in lab.devices}) >= 5
    declared = lab.link_between(lab.device("node-a/gpu0"), lab.device("node-b/gpu0"))
    assert (declared.kind, declared.bandwidth_gbs, declared.latency_us) == ("network", 12.5, 10)


def test_json_and_real_hardware(tmp_path):
    path = tmp_path / "real.json"
    path.write_text(json.dumps(fleet(emulated=False)))
    assert not load_fleet_file(path).devices[0].emulated


def test_links_between_nodes_and_devices():
    doc = fleet()
    doc["nodes"].append({"name": "m", "gpus": [{"model": "L4", "count": 2}]})
    doc["links"] = [
        {"between": ["n", "m"], "bandwidth_gbps": 200},
        {"between": ["m/gpu0", "m/gpu1"], "kind": "pcie", "bandwidth_gbs": 20, "latency_us": 1},
    ]
    spec = parse_fleet(doc)
    assert [(link.kind, link.bandwidth_gbs) for link in spec.links] == [("network", 25.0), ("pcie", 20.0)]
    assert spec.link_between(spec.device("m/gpu0"), spec.device("m/gpu1")).latency_us == 1


@pytest.mark.parametrize(
    "change, message",
    [
        (gpu(model="K80"), f"{GPU}.model: unknown GPU model 'K80'"),
        (gpu(count=-2), f"{GPU}.count: expected a positive integer, got -2"),
        (gpu(count="2"), f"{GPU}.count: expected a positive integer, got '2'"),
        (gpu(colour="red"), f"{GPU}.colour: unknown key"),
        (gpu(overrides={"memory": 1}), f"{GPU}.overrides.memory: unknown key"),
        (gpu(overrides={"fp16_tflops": -1}), f"{GPU}.overrides.fp16_tflops: expected a non-negative number"),
        (gpu(nvlink=True), f"{GPU}.nvlink: T4 has no NVLink"),
        (lambda d: d["nodes"][0].update(network_gbps="fast"), "nodes[0] (n).network_gbps: expected a"),
        (lambda d: d.update(nodes=[{"name": "n"}, {"name": "n"}]), "nodes[1] (n).name: node 'n' is declared"),
        (lambda d: d.update(nodes=[{"gpus": []}]), "nodes[0].name: required"),
        (lambda d: d.update(nodes=[]), "nodes: declare at least one node"),
        (lambda d: d.update(extra=1), "extra: unknown key"),
        (lambda d: d.update(emulated="yes"), "emulated: expected true or false"),
        (link(["n", "x"]), "links[0].between: 'x' is neither"),
        (link(["n", "n/gpu0"]), "links[0].between: a link joins two nodes or two devices, not one of each"),
        (link(["n/gpu0", "n/gpu1"]), "links[0].between: 'n/gpu1' is neither"),
        (link(["n", "n"]), "links[0].between: a link joins two different endpoints"),
    ],
)
def test_malformed_documents_name_the_field_at_fault(change, message):
    doc = fleet()
    change(doc)
    with pytest.raises(FleetFileError) as error:
        parse_fleet(doc, "lab.yaml")
    assert str(error.value).startswith("lab.yaml: ")
    assert message in str(error.value)


def test_link_needs_exactly_one_bandwidth():
    doc = fleet()
    doc["nodes"].append({"name": "m"})
    doc["links"] = [{"between": ["n", "m"]}]
    with pytest.raises(FleetFileError, match=r"links\[0\]: give exactly one of bandwidth_gbps"):
        parse_fleet(doc)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(FleetFileError, match="cannot read the file"):
        load_fleet_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(FleetFileError, match="not valid YAML"):
        load_fleet_file(bad)
    with pytest.raises(FleetFileError, match="expected a mapping, got a list"):
        parse_fleet([])
