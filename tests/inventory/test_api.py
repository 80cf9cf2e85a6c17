import pytest

from contracts.hardware import GIB
from controlplane.inventory.models import Device, Link, Node
from tests.api.factories import make_device, make_link, make_node
from tests.api.mixins import APIResourceTests, assert_error


class TestNodeAPI(APIResourceTests):
    url = "/api/v1/nodes/"

    def make_rows(self, n):
        nodes = [make_node() for _ in range(n)]
        for node in nodes:
            make_device(node)
        return nodes

    def create_data(self):
        return {"name": "node-x", "address": "10.0.0.5", "labels": {"rack": "r1"}, "network_gbps": 100.0}

    def update_data(self):
        return {"address": "10.0.0.9", "labels": {"rack": "r2"}}

    def test_device_count_and_read_only_agent_fields(self, api):
        node = self.make_rows(1)[0]
        body = api.patch(f"{self.url}{node.pk}/", {"incarnation": 7}, format="json").json()
        assert body["device_count"] == 1 and body["incarnation"] == 0
        assert body["status"] == "declared" and body["registered"] is False  # no agent has registered it
        assert body["intent"] == "schedulable" and body["schedulable"] is True

    def test_status_is_declared_until_an_agent_registers_the_node(self, api):
        """The planner refuses a node no agent has registered; the API says so rather than "ready"."""
        declared, registered = make_node(name="declared"), make_node(name="registered", incarnation=1)
        listed = api.get(self.url).json()["results"]
        shown = {item["name"]: (item["status"], item["registered"]) for item in listed}
        assert shown == {"declared": ("declared", False), "registered": ("ready", True)}
        # A GET's body PUT back is no write, whichever status it shows.
        for node in (declared, registered):
            body = api.get(f"{self.url}{node.pk}/").json()
            kept = {k: body[k] for k in ("name", "address", "labels", "network_gbps", "status", "intent")}
            assert api.put(f"{self.url}{node.pk}/", kept, format="json").status_code == 200
        assert_error(api.patch(f"{self.url}{registered.pk}/", {"status": "declared"}, format="json"), 400,
                     "status: status is observed")

    def test_status_and_intent_are_not_written_through_the_api(self, api):
        """status is liveness's, intent the node actions'; a write is told which action to use."""
        node = make_node(status="lost", intent="cordoned", incarnation=1)
        url = f"{self.url}{node.pk}/"
        refused = api.patch(url, {"status": "ready"}, format="json")
        assert_error(refused, 400, "status: status is observed", "/cordon/", "/drain/", "/undrain/")
        assert_error(api.patch(url, {"status": "draining"}, format="json"), 400, "status:")
        assert_error(api.patch(url, {"intent": "schedulable"}, format="json"), 400, "intent:", "/uncordon/")
        assert_error(api.put(url, {"name": node.name, "intent": "draining"}, format="json"), 400, "intent:")
        assert_error(api.post(self.url, {"name": "n", "intent": "cordoned"}, format="json"), 400, "intent:")
        node.refresh_from_db()
        assert ((node.status, node.intent) == ("lost", "cordoned")
                and not Node.objects.filter(name="n").exists())
        # Sending them back unchanged (a GET's body PUT back) is no write and passes.
        body = api.get(url).json()
        kept = {k: body[k] for k in ("name", "address", "labels", "network_gbps", "status", "intent")}
        assert api.put(url, {**kept, "address": "10.1.1.1"}, format="json").status_code == 200
        node.refresh_from_db()
        assert (node.status, node.intent, node.address) == ("lost", "cordoned", "10.1.1.1")

    def test_invalid_node_is_refused_with_the_field(self, api):
        make_node(name="taken")
        assert_error(api.post(self.url, {"name": "taken"}, format="json"), 400, "name:")
        assert_error(api.post(self.url, {"name": "a/b"}, format="json"), 400, "name: a node name must not")
        assert_error(api.post(self.url, {"name": "n", "labels": {"a": 1}}, format="json"), 400, "labels:")
        assert_error(api.post(self.url, {"name": "n", "network_gbps": 0}, format="json"), 400, "network_gbps")
        assert_error(api.post(self.url, {"name": "n", "status": "gone"}, format="json"), 400, "status:")
        assert not Node.objects.filter(name="n").exists()

    def test_filters(self, api):
        make_node(name="alpha", status="ready", labels={"rack": "r1", "zone": "z"}, address="10.0.0.1",
                  incarnation=1)
        make_node(name="beta", status="lost", labels={"rack": "r2"}, fleet="lab", incarnation=2)
        make_node(name="gamma", status="suspect", intent="draining", labels={"rack": "r1"}, incarnation=1)
        make_node(name="delta", intent="cordoned")  # declared: no agent has registered it

        def names(**params):
            return [item["name"] for item in api.get(self.url, params).json()["results"]]

        assert names(status=["lost", "suspect"]) == ["beta", "gamma"]
        assert names(intent=["cordoned", "draining"]) == ["gamma", "delta"]
        assert names(intent="schedulable", status="ready") == ["alpha"]
        assert names(status="ready") == ["alpha"] and names(status="declared") == ["delta"]
        assert names(status=["declared", "lost"]) == ["beta", "delta"]
        assert_error(api.get(self.url, {"status": "draining"}), 400, "status")
        assert names(label="rack:r1") == ["alpha", "gamma"]
        assert names(label="rack:r1,zone:z") == ["alpha"]
        assert names(fleet="lab") == ["beta"]
        assert names(q="10.0.0") == ["alpha"]
        assert names(name="BETA") == ["beta"]
        assert names(ordering="-name") == ["gamma", "delta", "beta", "alpha"]
        assert_error(api.get(self.url, {"label": "rack"}), 400, "label: expected key:value")


class TestDeviceAPI(APIResourceTests):
    url = "/api/v1/devices/"

    def make_rows(self, n):
        return [make_device() for _ in range(n)]

    def create_data(self):
        return {
            "node": make_node(name="host").pk, "index": 3, "model_name": "L4", "memory_bytes": 24 * GIB,
            "memory_bandwidth_gbs": 300.0, "fp16_tflops": 121.0, "bf16_tflops": 121.0, "int8_tops": 242.0,
            "emulated": True,
        }

    def check_created(self, body, data):
        super().check_created(body, data)
        assert body["name"] == "host/gpu3" and body["node_name"] == "host"

    def update_data(self):
        return {"health_override": "unhealthy", "memory_bytes": 15 * GIB}

    def test_duplicate_index_and_bad_figures_are_refused(self, api):
        device = make_device()
        data = {**self.create_data(), "node": device.node_id, "index": device.index}
        assert_error(api.post(self.url, data, format="json"), 400, "index")
        zero = {**data, "index": 9, "memory_bytes": 0}
        assert_error(api.post(self.url, zero, format="json"), 400, "memory_bytes: must be greater than 0")
        assert Device.objects.count() == 1

    def test_filters(self, api):
        a, b = make_node(name="a"), make_node(name="b")
        make_device(a, model_name="T4", memory_bytes=16 * GIB, emulated=True)
        make_device(a, model_name="A100-80GB-SXM", memory_bytes=80 * GIB, health_override="unhealthy")
        make_device(b, model_name="t4", memory_bytes=15 * GIB, emulated=True)

        def names(**params):
            return [item["name"] for item in api.get(self.url, params).json()["results"]]

        assert names(node=a.pk) == ["a/gpu0", "a/gpu1"]
        assert names(node_name="B") == ["b/gpu0"]
        assert names(model_name="T4") == ["a/gpu0", "b/gpu0"]
        assert names(emulated="true") == ["a/gpu0", "b/gpu0"]
        assert names(health="unhealthy") == ["a/gpu1"]
        # Neither node has an agent: the cards nobody overrode show "unknown", and filter so.
        assert names(health="unknown") == ["a/gpu0", "b/gpu0"] and names(health="healthy") == []
        b.incarnation = 1
        b.save()
        assert names(health="healthy") == ["b/gpu0"]
        assert names(health=["unknown", "unhealthy"]) == ["a/gpu0", "a/gpu1"]
        shown = {item["name"]: item["health"] for item in api.get(self.url).json()["results"]}
        assert shown == {"a/gpu0": "unknown", "a/gpu1": "unhealthy", "b/gpu0": "healthy"}
        assert names(memory_bytes__gte=16 * GIB) == ["a/gpu0", "a/gpu1"]
        assert names(ordering="-memory_bytes") == ["a/gpu1", "a/gpu0", "b/gpu0"]


class TestLinkAPI(APIResourceTests):
    url = "/api/v1/links/"

    def make_rows(self, n):
        return [make_link() for _ in range(n)]

    def create_data(self):
        node = make_node(name="host")
        a, b = make_device(node), make_device(node)
        return {"kind": "pcie", "device_a": a.pk, "device_b": b.pk, "bandwidth_gbs": 25.0, "latency_us": 3.0}

    def check_created(self, body, data):
        super().check_created(body, data)
        assert body["endpoints"] == ["host/gpu0", "host/gpu1"]

    def update_data(self):
        return {"bandwidth_gbs": 50.0}

    @pytest.mark.parametrize(
        "change, message",
        [
            (lambda d, other: {"device_b": d["device_a"]}, "two different endpoints"),
            (lambda d, other: {"device_b": None}, "a link joins two devices (device_a, device_b) or two"),
            (lambda d, other: {"node_a": other.node_id, "device_b": other.pk}, "a link joins two devices"),
            (lambda d, other: {"device_b": other.pk}, "kind: pcie joins two devices of the same node"),
            (lambda d, other: {"device_a": d["device_b"], "device_b": d["device_a"]}, "already exists"),
            (lambda d, other: {"bandwidth_gbs": 0}, "bandwidth_gbs: must be greater than 0"),
            (lambda d, other: {"device_a": other.pk, "latency_us": -1}, "latency_us:"),
        ],
    )
    def test_invalid_links_are_refused(self, api, change, message):
        data = self.create_data()
        other = make_device()
        assert api.post(self.url, data, format="json").status_code == 201
        assert_error(api.post(self.url, {**data, **change(data, other)}, format="json"), 400, message)
        assert Link.objects.count() == 1

    def test_node_links_are_network_links(self, api):
        a, b = make_node(), make_node()
        data = {"kind": "nvlink", "node_a": a.pk, "node_b": b.pk, "bandwidth_gbs": 12.5, "latency_us": 30}
        response = api.post(self.url, data, format="json")
        assert_error(response, 400, "kind: a link between two nodes is a network link")

    def test_filters(self, api):
        network = make_link(kind="network")
        node = make_node()
        pcie = make_link(kind="pcie", device_a=make_device(node), device_b=make_device(node))

        def ids(**params):
            return [item["id"] for item in api.get(self.url, params).json()["results"]]

        assert ids(kind="pcie") == [pcie.pk]
        assert ids(node=network.node_b_id) == [network.pk]
        assert ids(node=node.pk) == [pcie.pk]
        assert ids(device=pcie.device_b_id) == [pcie.pk]

    @pytest.mark.parametrize("url, param", [
        ("/api/v1/links/", "node"), ("/api/v1/links/", "device"), ("/api/v1/devices/", "memory_bytes__gte"),
    ])
    def test_a_number_past_what_the_database_holds_is_a_400(self, api, url, param):
        response = api.get(url, {param: 2**63})  # SQLite's driver raised OverflowError (a 500)
        assert_error(response, 400, param)
        assert api.get(url, {param: 2**63 - 1}).status_code == 200


def test_gpu_catalog_endpoint(api, anonymous):
    assert anonymous.get("/api/v1/gpu-models/").status_code in (401, 403)
    models = api.get("/api/v1/gpu-models/").json()
    assert {"T4", "H100-SXM", "RTX-4090"} <= {m["name"] for m in models}
    t4 = api.get("/api/v1/gpu-models/Tesla T4/").json()
    assert (t4["name"], t4["bf16_tflops"], t4["memory_gib"]) == ("T4", 0.0, 16.0)
    assert_error(api.get("/api/v1/gpu-models/A100-80G/"), 404, "did you mean A100-80GB-SXM")


def test_session_login_works_for_the_browser(client, user):
    assert client.get("/api/v1/nodes/").status_code in (401, 403)
    client.force_login(user)  # a session cookie, as after the login page
    assert client.get("/api/v1/nodes/").status_code == 200
