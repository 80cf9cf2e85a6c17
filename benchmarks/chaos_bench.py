"""Chaos under load: what clients see while the system's processes are killed one by one.

    python benchmarks/chaos_bench.py [--work var/bench/chaos] [--demo-model generated|smollm2|PATH]
        [--clients 3] [--interval 0.5] [--faults stage agent celery beat asgi] [--restart-services] [--json F]

Service mode: PostgreSQL (a database of its own, dropped at the end) and Redis (db 5 as the broker, db 4
as the channel layer: ``--redis-db``), the ASGI server, the Celery worker and beat started as separate
processes, as systemd units or compose services run them, and one agent per emulated node. Nothing in
motley restarts a killed control-plane process or agent in this mode, so this script plays the process
supervisor (systemd ``Restart=always``, compose ``restart: unless-stopped``): ``SupervisedSystem`` starts
whatever exited again after ``--restart-delay`` seconds. A stage process is restarted by its agent; a
killed agent's stages die with it (PR_SET_PDEATHSIG, docs/agents.md).

While clients of the official ``openai`` library stream seeded chat requests at a steady pace
(``steady_clients.py``), in turn: SIGKILL of a stage process, an agent (one carrying a stage), the Celery
worker, beat and the ASGI server, and with ``--restart-services`` a restart of Redis (``redis-cli shutdown
nosave`` and .ci/run's start command) and PostgreSQL (``pg_ctlcluster restart``): those servers are shared
by everything on the machine, so never by default. For each fault: requests failed, the longest time
without a completed request, the time until the deployment is READY with every stage serving and a fresh
request is answered, stage processes whose agent is gone (orphans), and the database rows: one deployment,
revisions numbered 1..n without gaps or repeats, and the usage rows equal to what the clients were
answered (requests, completion tokens, errors).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.steady_clients import PROMPTS, Outcome, SteadyClients  # noqa: E402
from tests.e2e.harness import TIMING, System, stage_processes, wait_until  # noqa: E402
from tests.support.processes import (  # noqa: E402
    REPO_ROOT,
    free_port,
    read_credentials,
    stage_ports,
    wait_for_http,
)

CELERY = [sys.executable, "-m", "celery", "-A", "controlplane.celery"]
CONTROL_PLANE = ("asgi", "celery", "beat")
REQUEST = {"batch": 4, "context": 256, "replicas": 1}
NODES = ["n0", "n1", "n2", "n3"]
REDIS_START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
               "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
               "--logfile", "/var/log/redis/ci.log"]  # as .ci/run starts it
DATABASE_URL = "postgres://postgres@127.0.0.1:5432/motley"
USAGE = ("from django.db.models import Sum; from controlplane.gateway.models import UsageBucket;"
         "from controlplane.deployments.models import Deployment, PlanRevision as R;"
         "u = UsageBucket.objects.aggregate(r=Sum('requests'), c=Sum('completion_tokens'), e=Sum('errors'));"
         "import json; print(json.dumps({'deployments': Deployment.objects.count(),"
         "'revisions': sorted(R.objects.filter(deployment__isnull=False).values_list('number', flat=True)),"
         "'requests': u['r'] or 0,"
         "'completion_tokens': u['c'] or 0, 'errors': u['e'] or 0}))")


@dataclass
class SupervisedSystem(System):
    """The control plane as three processes plus agents, each started again ``restart_delay_s`` after it
    exits, whoever killed it (what a process supervisor does); ``restarts`` counts them by name."""

    restart_delay_s: float = 1.0
    restarts: dict[str, int] = field(default_factory=dict)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _argv: dict[str, tuple[list[str], dict[str, str] | None]] = field(default_factory=dict)

    def start(self) -> None:
        self.manage("migrate", "--noinput", "-v0")
        self.manage("ensure_admin")
        self.port = free_port()
        schedule = str(Path(self.env["MOTLEY_VAR_DIR"]) / "celerybeat-schedule")
        self._spawn("asgi", [sys.executable, "-m", "daphne", "-b", self.host, "-p", str(self.port),
                             "controlplane.asgi:application"])
        self._spawn("celery", [*CELERY, "worker", "--loglevel", "WARNING", "--concurrency", "2", "--queues",
                               "control"])
        self._spawn("beat", [*CELERY, "beat", "--loglevel", "WARNING", "--schedule", schedule])
        wait_for_http(f"{self.url}/api/schema/", timeout_s=90)
        self.api_token = read_credentials(Path(self.env["MOTLEY_VAR_DIR"]))["api_token"]
        self.join_token = self.manage("create_join_token", "--ttl", "1h").strip()
        threading.Thread(target=self._supervise, daemon=True, name="supervisor").start()

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self._argv[name] = (argv, env)
        super()._spawn(name, argv, env)

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            for name, process in list(self.processes.items()):
                if process.poll() is not None and not self._stopping.wait(self.restart_delay_s):
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    log = self.workdir / f"{name}.log"  # kept: the restarted process starts a new one
                    log.rename(log.with_suffix(f".{self.restarts[name]}.log"))
                    super()._spawn(name, *self._argv[name])
            self._stopping.wait(0.2)

    def stop(self) -> None:
        self._stopping.set()
        time.sleep(0.5)  # the supervisor's loop ends
        super().stop()

    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def rows(self) -> dict:
        return json.loads(self.manage("shell", "-c", USAGE).strip().splitlines()[-1])


@contextmanager
def service_env(workdir: Path, database_url: str, redis_db: int,
                redis_address: str = "127.0.0.1:6379") -> Iterator[dict[str, str]]:
    """The environment of a service-mode system: a PostgreSQL database of its own (dropped afterwards)
    and db ``redis_db`` (flushed) of the Redis at ``redis_address`` as the broker, ``redis_db - 1`` as
    the channel layer."""
    import psycopg
    import redis

    name = f"motley_chaos_{uuid.uuid4().hex[:8]}"
    admin = urlunsplit(urlsplit(database_url)._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    broker = f"redis://{redis_address}/{redis_db}"
    redis.Redis.from_url(broker).flushdb()
    env = {**os.environ, **TIMING, "MOTLEY_VAR_DIR": str(workdir / "var"),
           "MOTLEY_STAGE_PORTS": stage_ports(),
           "PROMETHEUS_MULTIPROC_DIR": str(workdir / "prometheus"),
           "DATABASE_URL": urlunsplit(urlsplit(database_url)._replace(path=f"/{name}")),
           "CELERY_BROKER_URL": broker, "CHANNEL_REDIS_URL": f"redis://{redis_address}/{redis_db - 1}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    (workdir / "prometheus").mkdir(parents=True, exist_ok=True)
    try:
        yield env
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DATABASE_URL),
                        help="PostgreSQL server (a database of the run's own is created there)")
    parser.add_argument("--redis-db", type=int, default=5,
                        help="the broker's Redis db; the channel layer uses the one below")


def model_path(system: SupervisedSystem, choice: str, generated: Path) -> Path:
    """The checkpoint of run_local's ``--demo-model`` choice (generated at ``generated`` when needed)."""
    script = (f"from pathlib import Path; from controlplane.ops import demo; print(demo.demo_model_ensure("
              f"choice={choice!r}, generated_path=Path({str(generated)!r})).model.path)")
    return Path(system.manage("shell", "-c", script).strip().splitlines()[-1])


def layer_count(checkpoint: Path) -> int:
    return json.loads((checkpoint / "config.json").read_text())["num_hidden_layers"]


def plan(devices: list[str], bounds: tuple[int, ...], layers: int) -> dict:
    edges = [0, *bounds, layers]
    return {"replicas": [{"stages": [{"device": f"{d}/gpu0", "layers": [edges[i], edges[i + 1]], "bits": 16}
                                     for i, d in enumerate(devices)]}]}


def deploy(system: SupervisedSystem, model_path: Path, layers: int) -> tuple[int, str]:
    """The model on three of the four nodes (one spare to move to); its id and an API key's secret."""
    system.manage("register_model", str(model_path), "--name", "chaos")
    model = system.get("/api/v1/models/?name=chaos")["results"][0]["id"]
    system.start_agents(NODES)
    third = layers // 3
    body = {"name": "chaos", "model": model, "plan": plan(NODES[:3], (third, 2 * third), layers),
            "request": REQUEST, "source": "edited"}
    response = system.post("/api/v1/deployments/", body)
    assert response.status_code == 201, response.text
    pk = response.json()["id"]
    system.wait_status(pk, "ready", 180)
    key = system.manage("create_api_key", "admin", "--name", "chaos").strip().split()[-1]
    return pk, key


def serving(system: SupervisedSystem, pk: int) -> dict | None:
    """The deployment if it is READY with every wanted stage ready and none retiring, else None."""
    try:
        d = system.deployment(pk)
    except Exception:  # the API is down (the ASGI server was killed): not serving yet
        return None
    stages = d["stages"]
    ok = d["status"] == "ready" and stages and all(s["wanted"] and s["state"] == "ready" for s in stages)
    return d if ok else None


def orphans(system: SupervisedSystem) -> list[int]:
    """Stage processes of this system whose parent is no agent (their agent is gone)."""
    found = []
    for process in stage_processes(system.workdir):
        try:
            parent = process.parent()
            if parent is None or not any(a == "agents" for a in parent.cmdline()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


# --- faults: each does its harm and returns a predicate that holds once what it killed runs again ---

def serving_stages(system: SupervisedSystem) -> list[int]:
    """Pids of the stages the agents run (their pid records; ``_fork_server`` excluded)."""
    pids = []
    for path in system.workdir.glob("agents/*/stages/[!_]*/pid.json"):
        try:
            pids.append(json.loads(path.read_text())["pid"])
        except (OSError, ValueError):  # removed or being written while read: the stage is changing
            continue
    return sorted(pids)


def kill_stage(system: SupervisedSystem, pk: int):
    before = serving_stages(system)
    os.kill(before[0], signal.SIGKILL)
    return lambda: before[0] not in (now := serving_stages(system)) and len(now) >= len(before)


def kill_agent(system: SupervisedSystem, pk: int):
    used = sorted({s["node_name"] for s in system.deployment(pk)["stages"]} - {"n0"})
    name = f"agent-{used[0]}"
    old = system.pid(name)
    os.kill(old, signal.SIGKILL)
    return lambda: system.pid(name) != old


def kill_control(name: str):
    def fault(system: SupervisedSystem, pk: int):
        old = system.pid(name)
        os.kill(old, signal.SIGKILL)
        return lambda: system.pid(name) != old and system.processes[name].poll() is None
    return fault


def restart_redis(system: SupervisedSystem, pk: int):
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "shutdown", "nosave"], check=False, timeout=30)
    subprocess.run(REDIS_START, check=True, timeout=30)
    return lambda: True


def restart_postgres(system: SupervisedSystem, pk: int):
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], check=True,
                   timeout=120)
    return lambda: True


FAULTS = {"stage": ("SIGKILL a stage process", kill_stage), "agent": ("SIGKILL an agent", kill_agent),
          "celery": ("SIGKILL the Celery worker", kill_control("celery")),
          "beat": ("SIGKILL Celery beat", kill_control("beat")),
          "asgi": ("SIGKILL the ASGI server", kill_control("asgi")),
          "redis": ("restart Redis", restart_redis), "postgres": ("restart PostgreSQL", restart_postgres)}


def inject(system: SupervisedSystem, pk: int, clients: SteadyClients, fault: str, probes: list[Outcome],
           settle_s: float = 2.0, timeout_s: float = 180.0) -> dict:
    """One fault under load, then wait until it is healed, READY, and a fresh request is answered."""
    label, action = FAULTS[fault]
    started, probes_before = time.monotonic(), len(probes)
    healed = action(system, pk)
    wait_until(healed, timeout_s, f"{label}: healed", poll_s=0.2)
    time.sleep(1.0)  # let the control plane notice what went

    def answered() -> bool:
        if serving(system, pk) is None:
            return False
        probe = clients.one(len(probes) % len(PROMPTS))
        probes.append(probe)
        return probe.ok
    wait_until(answered, timeout_s, f"{label}: READY and answering", poll_s=0.5)
    recovered = time.monotonic()
    time.sleep(settle_s)
    # The window closes once the clients' own requests are answered again too (requests in flight
    # through the fault may end seconds after a fresh probe: their stall is the window's longest gap).
    wait_until(lambda: any(o.ok and o.ended > recovered for o in list(clients.outcomes)), timeout_s,
               f"{label}: the clients answered again", poll_s=0.2)
    window = clients.window(started, time.monotonic())
    broken = sum(not o.ok and o.started < started <= o.ended for o in list(clients.outcomes))
    # A probe is a client request too: one refused once the deployment said READY is a failure.
    refused = [o.error for o in probes[probes_before:] if not o.ok]
    return {"fault": label, "ok": window.ok, "failed": window.failed + len(refused),
            "broken_in_flight": broken,
            "errors": sorted(set(window.errors) | set(refused))[:5],
            "longest_gap_s": round(window.longest_gap_s, 2), "recover_s": round(recovered - started, 2),
            "orphans": len(orphans(system)), "p99_s": window.p99_s}


def rows_check(system: SupervisedSystem, outcomes: list[Outcome]) -> dict:
    """The database against what clients were answered: one deployment, revisions 1..n, and usage equal
    to the requests served and the tokens they carried (a failed request's usage is in ``errors`` when
    the gateway saw it fail; one whose ASGI process was killed mid-stream is not counted at all)."""
    rows = system.rows()
    numbers = rows["revisions"]
    served = [o for o in outcomes if o.ok]
    return {"deployments": rows["deployments"], "revisions": len(numbers),
            "revisions_lost_or_repeated": len(set(range(1, max(numbers) + 1)) ^ set(numbers))
            + len(numbers) - len(set(numbers)),
            "usage_requests": rows["requests"], "client_served": len(served),
            "usage_tokens": rows["completion_tokens"],
            "client_tokens": sum(o.completion_tokens or 0 for o in served),
            "usage_errors": rows["errors"], "client_failed": len(outcomes) - len(served)}


def run(args: argparse.Namespace) -> dict:
    args.work.mkdir(parents=True, exist_ok=True)
    with service_env(args.work, args.database_url, args.redis_db) as env:
        system = SupervisedSystem(workdir=args.work, env=env, restart_delay_s=args.restart_delay)
        model = args.work / "model"
        try:
            system.start()
            path = model_path(system, args.demo_model, model)
            pk, key = deploy(system, path, layer_count(path))
            clients = SteadyClients(base_url=system.url, api_key=key, model="chaos", clients=args.clients,
                                    interval_s=args.interval)
            probes: list[Outcome] = []
            clients.start()
            time.sleep(args.steady_s)
            results = []
            for fault in args.faults:
                results.append(inject(system, pk, clients, fault, probes))
                print(f"{results[-1]}", flush=True)
            outcomes = clients.stop() + probes
            time.sleep(1)
            return {"faults": results, "rows": rows_check(system, outcomes), "restarts": system.restarts,
                    "final_status": system.deployment(pk)["status"], "load": os.getloadavg()}
        finally:
            system.stop()
            for process in stage_processes(system.workdir):
                process.kill()


def report(result: dict) -> None:
    print("\n| fault | failed requests | longest gap | time to recover | orphans |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for f in result["faults"]:
        print(f"| {f['fault']} | {f['failed']} of {f['ok'] + f['failed']} ({f['broken_in_flight']} broken in "
              f"flight) | {f['longest_gap_s']:.2f} s "
              f"| {f['recover_s']:.1f} s | {f['orphans']} |")
    print(f"\nrows: {result['rows']}\nrestarted by the supervisor: {result['restarts']}; "
          f"final status {result['final_status']}; load average {result['load']}")


def emit(result: dict, show: Callable[[dict], None], path: Path | None) -> None:
    """Print ``result`` with ``show`` and write it as JSON to ``path`` when given."""
    show(result)
    if path:
        path.write_text(json.dumps(result, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "var" / "bench" / "chaos")
    service_arguments(parser)
    parser.add_argument("--demo-model", default="generated",
                        help="'generated', 'smollm2' or a checkpoint directory")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.5,
                        help="least seconds between a client's requests")
    parser.add_argument("--steady-s", type=float, default=5.0)
    parser.add_argument("--restart-delay", type=float, default=1.0,
                        help="the supervisor's delay before a restart")
    parser.add_argument("--faults", nargs="+", choices=sorted(FAULTS),
                        default=["stage", "agent", "celery", "beat", "asgi"])
    parser.add_argument("--restart-services", action="store_true",
                        help="also restart Redis and PostgreSQL (shared by everything on this machine)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.restart_services:
        args.faults += ["redis", "postgres"]
    emit(run(args), report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
