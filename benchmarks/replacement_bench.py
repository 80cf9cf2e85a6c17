"""Live re-placement under load: what clients see while the placement changes.

    python benchmarks/replacement_bench.py --work var/bench/replacement [--room in-place beside]
        [--demo-model smollm2|generated] [--clients 4] [--interval 1.0] [--steady-s 20]

For each room setting, `make run`'s system (``manage.py run_local`` on the embedded default, its demo
model planned and deployed by itself) on the demo fleet; once it serves, a spare node joins (an agent
with a join token of its own), so the demo's plan leaves it free for the changes:

- ``in-place``: ``examples/fleets/demo.yaml`` as `make run` uses it, memory scaled down so the new
  stages cannot start beside the old ones: the controller hands each replica over in place;
- ``beside``: the same cards at their catalog memory: the new stages start beside the old (make
  before break).

Clients of the official ``openai`` library stream seeded chat requests at a steady pace
(``steady_clients.py``) while, in turn: nothing (the steady state, the baseline measured in the same
run), a boundary move (the first boundary by one layer), a stage moved to the spare device, a drain of
the spare node, and (once the spare is back and carries a stage again, not measured) a SIGKILL of the
spare's agent, whose stage the demo's own cards can take back. Each change's window runs from the
change until the new plan serves alone plus ``--settle-s``. Printed per change: requests ok
and failed, the longest time without a completed request, p50/p99 latency against the steady state,
and the time until the new plan serves. Goals: 0 failed; gap under 2 s in place and under 0.5 s
beside; p99 at most 3x the steady state.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_check_serve import REPO, Launcher, embedded_env, free_port, wait_ready  # noqa: E402
from benchmarks.steady_clients import PROMPTS, SteadyClients, Window, mismatches  # noqa: E402

DEMO_FLEET = REPO / "examples" / "fleets" / "demo.yaml"
SPARE = ("name: spare\nnodes:\n  - name: demo-spare\n    network_gbps: 25\n    gpus:\n"
         "      - model: RTX-3090\n{overrides}")
GOAL_GAP_S = {"in-place": 2.0, "beside": 0.5}


def fleet_texts(room: str) -> tuple[str, str]:
    """The demo fleet and a spare node's; ``beside`` drops the memory overrides (catalog memory)."""
    text = DEMO_FLEET.read_text()
    if room == "beside":
        text = "\n".join(line for line in text.splitlines() if "overrides:" not in line) + "\n"
    overrides = "        overrides: {memory_gib: 0.7}\n" if room == "in-place" else ""
    return text, SPARE.format(overrides=overrides)


def spare_agent(base: str, fleet: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """The spare node joins once the demo serves (so the demo's plan leaves it free), as any new
    node does: an agent with a join token of its own."""
    token = subprocess.run([sys.executable, str(REPO / "manage.py"), "create_join_token", "--ttl", "1h"],
                           env=env, cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()
    return subprocess.Popen([sys.executable, "-m", "agents", "run", "--server", base, "--emulate", str(fleet),
                             "--node", "demo-spare"], env={**env, "MOTLEY_JOIN_TOKEN": token}, cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


class Refused(RuntimeError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Api:
    def __init__(self, base: str, token: str) -> None:
        self.client = httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=60)

    def get(self, path: str) -> Any:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict | None = None) -> dict:
        response = self.client.post(path, json=body or {})
        if response.status_code >= 400:
            raise Refused(f"POST {path}: {response.status_code} {response.text[:500]}", response.status_code)
        return response.json()

    def deployment(self) -> dict:
        return self.get("/api/v1/deployments/")["results"][0]

    def applied(self, pk: int) -> dict:
        return next(r for r in self.get(f"/api/v1/deployments/{pk}/revisions/") if r["status"] == "applied")

    def node_id(self, name: str) -> int:
        return next(n["id"] for n in self.get("/api/v1/nodes/")["results"] if n["name"] == name)


def serving_alone(api: Api, pk: int, revision: int, timeout_s: float = 180) -> float:
    """Block until ``revision`` is READY with every stage wanted and ready; monotonic time it was seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        d = api.get(f"/api/v1/deployments/{pk}/")
        if (d["status"] == "ready" and d["revision_number"] == revision
                and all(s["wanted"] and s["state"] == "ready" for s in d["stages"])
                and all(p["phase"] == "serving" for p in d["pipelines"])):
            return time.monotonic()
        time.sleep(0.2)
    raise RuntimeError(f"revision {revision} did not serve alone within {timeout_s:.0f}s")


def handover_timeline(api: Api, pk: int, since: str) -> str:
    """The handover's steps since ``since`` (ISO time) as the controller recorded them, seconds after
    the apply, to read beside a window's longest gap: where the switch, the drain and the end fell."""
    events = api.get(f"/api/v1/events/?{urlencode({'deployment': pk, 'since': since, 'limit': 50})}")
    steps = []
    for event in reversed(events.get("results", events) if isinstance(events, dict) else events):
        if event["kind"].startswith("handover_"):
            detail = event.get("detail") or {}
            at = detail.get("since_apply_s", detail.get("total_s"))
            pause = f" pause {detail['pause_s']} s" if detail.get("pause_s") else ""
            steps.append(f"{event['kind'].removeprefix('handover_')}"
                         f"{f' +{at} s' if at is not None else ''}{pause}")
    return ", ".join(steps) or "no handover events"


def with_layers(stage: dict, start: int, end: int) -> dict:
    """``stage`` holding [start, end), its precisions kept per layer: a ``low_from`` no longer strictly
    inside the range either makes the whole stage ``low_bits`` (at or before ``start``) or goes."""
    moved = {**stage, "layers": [start, end]}
    low_bits, low_from = moved.pop("low_bits", None), moved.pop("low_from", None)
    if low_bits is not None and low_from <= start:
        moved["bits"] = low_bits
    elif low_bits is not None and low_from < end:
        moved.update(low_bits=low_bits, low_from=low_from)
    return moved


def boundary_moves(plan: dict) -> list[dict]:
    """The plan with one boundary moved by one layer: the first boundary each way, toward the larger
    side first, then the next boundary likewise. A move can be refused (the layer joins a stage whose
    precision or memory it does not fit: a low-bit tail past the plan's quality budget, a card too
    small): the next one is tried, so that every run moves a boundary whatever plan the planner chose
    (the calibration of the moment decides it)."""
    stages = plan["replicas"][0]["stages"]
    moves = []
    for i in range(len(stages) - 1):
        (start, boundary), (_, end) = stages[i]["layers"], stages[i + 1]["layers"]
        for step in (1, -1) if end - boundary > boundary - start else (-1, 1):
            if not start < boundary + step < end:
                continue
            moved = copy.deepcopy(plan)
            moved["replicas"][0]["stages"][i:i + 2] = [with_layers(stages[i], start, boundary + step),
                                                       with_layers(stages[i + 1], boundary + step, end)]
            moves.append(moved)
    return moves


def two_stages(plan: dict, devices: list[str]) -> dict:
    """A one-stage plan split in halves, the second on another device (a boundary to move), with two
    micro-batches in flight as the planner gives a two-stage pipeline (one would leave each stage idle
    while the other works: the plan's explanation names that bottleneck)."""
    (stage,) = plan["replicas"][0]["stages"]
    start, end = stage["layers"]
    middle = (start + end) // 2
    other = next(d for d in devices if d != stage["device"])
    plan["replicas"][0]["stages"] = [with_layers(stage, start, middle),
                                     {**with_layers(stage, middle, end), "device": other}]
    plan["replicas"][0]["micro_batches"] = 2
    return plan


def stage_moved(plan: dict, devices: list[str]) -> dict:
    """The plan with its last stage on the first of ``devices`` it does not use."""
    used = {s["device"] for r in plan["replicas"] for s in r["stages"]}
    plan["replicas"][0]["stages"][-1]["device"] = next(d for d in devices if d not in used)
    return plan


def run_room(args: argparse.Namespace, room: str) -> dict:
    work = args.work / room
    var = work / "var"
    var.mkdir(parents=True, exist_ok=True)
    fleet, spare_fleet = work / "fleet.yaml", work / "spare.yaml"
    for path, text in zip((fleet, spare_fleet), fleet_texts(room)):
        path.write_text(text)
    env = embedded_env(var)
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], env=env, cwd=REPO, check=True, timeout=300)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    launcher = Launcher([*manage, "run_local", "--port", str(port), "--demo-model", args.demo_model,
                         "--demo-fleet", str(fleet)], env, work / "run_local.log")
    result: dict = {"room": room, "changes": []}
    spare = None
    try:
        key = wait_ready(launcher, var / "demo-api-key.txt", time.monotonic() + 600)
        lines = (var / "admin-credentials.txt").read_text().splitlines()
        credentials = dict(line.split(": ", 1) for line in lines)
        api = Api(base, credentials["api_token"])
        deployment = api.deployment()
        pk, model = deployment["id"], deployment["model_name"]
        serving_alone(api, pk, deployment["revision_number"])

        def apply(plan: dict) -> None:
            api.post(f"/api/v1/deployments/{pk}/apply/", {"plan": plan, "request": api.applied(pk)["request"],
                                                          "source": "edited"})

        def apply_first(plans: list[dict]) -> None:
            """The first of ``plans`` the deployment takes (a 400 names why one is not)."""
            for plan in plans[:-1]:
                try:
                    return apply(plan)
                except Refused as refused:
                    if refused.status != 400:
                        raise
                    print(f"    not applied: {refused}", flush=True)
            apply(plans[-1])

        if len(api.applied(pk)["plan"]["replicas"][0]["stages"]) < 2:  # the planner fit it on one card
            devices = [d["name"] for d in api.get("/api/v1/devices/")["results"] if "spare" not in d["name"]]
            apply(two_stages(api.applied(pk)["plan"], devices))
            serving_alone(api, pk, deployment["revision_number"] + 1)

        spare = spare_agent(base, spare_fleet, env, work / "spare-agent.log")
        while "demo-spare" not in {n["name"] for n in api.get("/api/v1/nodes/")["results"]
                                   if n["status"] == "ready"}:
            time.sleep(0.5)
        clients = SteadyClients(base_url=base, api_key=key, model=model, clients=args.clients,
                                interval_s=args.interval, max_tokens=args.max_tokens)
        expected = {p: clients.one(p).text for p in range(len(PROMPTS))}
        clients.start()
        time.sleep(2)
        steady_start = time.monotonic()
        time.sleep(args.steady_s)
        steady = clients.window(steady_start, time.monotonic())
        result["steady"] = steady.__dict__
        print(f"[{room}] steady state: {steady.line()}", flush=True)

        def move() -> None:
            devices = [d["name"] for d in api.get("/api/v1/devices/")["results"]]
            apply(stage_moved(api.applied(pk)["plan"], ["demo-spare/gpu0", *devices]))  # the spare, if free

        def drain() -> None:  # the node the last stage was moved to
            last = max((s for s in api.get(f"/api/v1/deployments/{pk}/")["stages"] if s["wanted"]),
                       key=lambda s: s["stage_index"])
            api.post(f"/api/v1/nodes/{api.node_id(last['node_name'])}/drain/")

        def spare_carries_a_stage_again() -> None:  # not measured: sets up the kill
            api.post(f"/api/v1/nodes/{api.node_id('demo-spare')}/undrain/")
            revision = api.deployment()["revision_number"]
            move()
            serving_alone(api, pk, revision + 1)

        def kill() -> None:  # the spare's agent: the demo's own cards can take its stage back
            spare.send_signal(signal.SIGKILL)

        changes: list[tuple[str, Callable[[], None] | None, Callable[[], None]]] = [
            ("boundary move", None, lambda: apply_first(boundary_moves(api.applied(pk)["plan"]))),
            ("stage to another device", None, move),
            ("drain a node", None, drain),
            ("kill -9 an agent", spare_carries_a_stage_again, kill),
        ]
        for name, prepare, change in changes:
            if prepare is not None:
                prepare()
                time.sleep(args.settle_s)  # as after each measured change: its requests end before the window
            revision = api.deployment()["revision_number"]
            started, started_at = time.monotonic(), datetime.now(timezone.utc).isoformat()
            try:
                change()
                change_s = time.monotonic() - started
            except Refused as refused:  # the plan the planner chose leaves no room for this edit
                print(f"[{room}] {name}: not done, the deployment refused it: {refused}", flush=True)
                result.setdefault("not_done", []).append(name)
                continue
            served = serving_alone(api, pk, revision + 1)
            time.sleep(args.settle_s)
            window = clients.window(started, time.monotonic())
            entry = {"change": name, **window.__dict__, "serves_after_s": round(served - started, 2),
                     "window": (started, time.monotonic()),
                     "p99_vs_steady": window.p99_s / steady.p99_s if window.p99_s and steady.p99_s else None}
            result["changes"].append(entry)
            print(f"[{room}] {name}: {window.line()}, serves after {served - started:.1f} s", flush=True)
            print(f"    handover: {handover_timeline(api, pk, started_at)} (applied {started_at[11:23]} UTC, "
                  f"the API calls of the change took {change_s:.2f} s)", flush=True)
            for error in sorted(set(window.errors)):
                print(f"    failed: {error[:300]}", flush=True)
            # The router's inputs and recent decisions (refusals included, with each replica's figures),
            # to explain failures and where a gap's requests waited or ran.
            saved = work / f"router-{name.replace(' ', '-')}.json"
            saved.write_text(json.dumps(api.get("/api/v1/gateway/router/"), indent=1))
            if window.errors:
                print(f"    the router's view then: {saved}", flush=True)
        outcomes = clients.stop()
        result["mismatches"] = mismatches(outcomes, expected)
        for entry in result["changes"]:  # which change's requests they were
            start, end = entry.pop("window")
            entry["mismatches"] = len(mismatches([o for o in outcomes if start <= o.ended <= end], expected))
        result["requests"] = len(outcomes)
    finally:
        if spare is not None:
            spare.terminate()
            spare.wait(timeout=30)
        result["left_running"] = launcher.stop()
    return result


def report(results: list[dict]) -> None:
    print("\n| fleet | change | ok | failed | longest gap | p50 | p99 | p99 vs steady | serves after |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        steady = Window(**result["steady"])
        print(f"| {result['room']} | steady state | {steady.ok} | {steady.failed} | "
              f"{steady.longest_gap_s:.2f} s | {steady.p50_s or 0:.2f} s | {steady.p99_s or 0:.2f} s "
              f"| 1.00x | - |")
        for c in result["changes"]:
            ratio = f"{c['p99_vs_steady']:.2f}x" if c["p99_vs_steady"] else "-"
            print(f"| {result['room']} | {c['change']} | {c['ok']} | {c['failed']} | "
                  f"{c['longest_gap_s']:.2f} s | {c['p50_s'] or 0:.2f} s | {c['p99_s'] or 0:.2f} s | {ratio} "
                  f"| {c['serves_after_s']:.1f} s |")
    print()
    for result in results:
        goal = GOAL_GAP_S[result["room"]]
        handovers = [c for c in result["changes"] if c["change"] != "kill -9 an agent"]
        failed = sum(c["failed"] for c in result["changes"])
        print(f"{result['room']}: failed {failed} (goal 0); longest handover gap "
              f"{max(c['longest_gap_s'] for c in handovers):.2f} s (goal < {goal} s); worst p99 vs steady "
              f"{max((c['p99_vs_steady'] or 0) for c in handovers):.2f}x (goal <= 3x); seeded answers that "
              f"differ: {len(result['mismatches'])} ("
              + ", ".join(f"{c['change']} {c['mismatches']}" for c in result["changes"])
              + f"); processes left: {len(result['left_running'])}"
              + "".join(f"; not done: {name}" for name in result.get("not_done", ())))
        if (note := headroom_note(Window(**result["steady"]), goal)) is not None:
            print(f"  {note}")


def headroom_note(steady: Window, goal_gap_s: float) -> str | None:
    """Why a handover's gap cannot be read against the goal at this load, when the clients already
    waited as long with nothing changing (the machine is slower than the load assumes)."""
    if steady.longest_gap_s < goal_gap_s:
        return None
    return (f"note: with nothing changing the clients already went {steady.longest_gap_s:.2f} s without "
            f"a completed request (p50 {steady.p50_s or 0:.2f} s), not under the {goal_gap_s} s goal: "
            f"this load leaves this machine no headroom; lower the load (--max-tokens, --clients) to "
            f"measure the handovers themselves")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "replacement")
    parser.add_argument("--room", nargs="+", choices=sorted(GOAL_GAP_S), default=["in-place", "beside"])
    parser.add_argument("--demo-model", default="smollm2", help="run_local's --demo-model")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--interval", type=float, default=1.0,
                        help="least seconds between the starts of a client's requests")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--steady-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [run_room(args, room) for room in args.room]
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
