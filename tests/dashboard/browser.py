"""Helpers of the browser tests: a real server process on a seeded database, simulated agents
over real websockets, and Debian's chromium through Playwright (never a downloaded browser)."""

from __future__ import annotations

import json
import math
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from websockets.sync.client import connect

from tests.support.processes import (
    REPO_ROOT,
    database_migrate,
    embedded_env,
    free_port,
    manage_argv,
    stop_process,
    wait_for_http,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
LOGIN = "/accounts/login/"


VIEWPORT = (1400, 900)
# How long a page's wait lasts: the suite's workers load two cores, and a page's first live frame then
# takes seconds behind the server's and chromium's share of them.
WAIT_MS = 30_000
TOPOLOGY = "**/topology/"  # where a login lands


@contextmanager
def chromium_page(base_url: str, *, viewport: tuple[int, int] = VIEWPORT,
                  timeout_ms: int = WAIT_MS) -> Iterator:
    """A page of Debian's chromium (headless, through Playwright) on ``base_url``, closed after the
    block; SCREENSHOTS exists."""
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            width, height = viewport
            page = chromium.new_page(viewport={"width": width, "height": height}, base_url=base_url)
            page.set_default_timeout(timeout_ms)
            yield page
        finally:
            chromium.close()


@contextmanager
def own_context(page, url: str) -> Iterator:
    """A new page on ``url`` in a context of its own (no session) of ``page``'s chromium."""
    context = page.context.browser.new_context(base_url=url, viewport=page.viewport_size)
    try:
        fresh = context.new_page()
        fresh.set_default_timeout(WAIT_MS)
        yield fresh
    finally:
        context.close()


def log_in(page, credentials: tuple[str, str], *, start: str | None = LOGIN,
           landing: str | None = TOPOLOGY) -> None:
    """Open ``start`` (the login form, or a page that sends there; None: the page shows the form
    already), submit ``credentials`` (username, password), then wait for the ``landing`` URL (a glob;
    None: do not wait)."""
    if start is not None:
        page.goto(start)
    page.fill("input[name=username]", credentials[0])
    page.fill("input[name=password]", credentials[1])
    page.click("button[type=submit]")
    if landing is not None:
        page.wait_for_url(landing)


@contextmanager
def logged_in_page(base_url: str, credentials: tuple[str, str], *, viewport: tuple[int, int] = VIEWPORT,
                   timeout_ms: int = WAIT_MS, start: str | None = LOGIN,
                   landing: str | None = TOPOLOGY) -> Iterator:
    """``chromium_page`` on ``base_url``, logged in with ``credentials`` by ``log_in``."""
    with chromium_page(base_url, viewport=viewport, timeout_ms=timeout_ms) as page:
        log_in(page, credentials, start=start, landing=landing)
        yield page


class SeededServer:
    """``manage.py migrate``, a seed function's output, then daphne serving controlplane.asgi."""

    def __init__(self, var_dir: Path, seed: str):
        self.env = embedded_env(var_dir)
        database_migrate(self.env)
        script = (f"import json; from tests.dashboard.seed import {seed}; "
                  f"print('SEED=' + json.dumps({seed}()))")
        out = subprocess.run(manage_argv("shell", "-c", script), env=self.env, cwd=REPO_ROOT, check=True,
                             capture_output=True, text=True).stdout
        self.seed = json.loads(out.split("SEED=", 1)[1])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = var_dir / "server.log"  # a file, not a pipe nobody reads: the server never blocks on it
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [*manage_argv()[:1], "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                 "controlplane.asgi:application"],
                env=self.env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
            )
        try:
            wait_for_http(f"{self.url}/accounts/login/", timeout_s=30)
        except Exception:
            self.stop()
            raise

    def stop(self) -> None:
        stop_process(self.process)


class SimulatedAgents:
    """One thread per node sending contracts §3 heartbeats every ``interval_s`` on /ws/agents/.

    Utilization follows a slow sine per GPU so a chart visibly moves; the cards an agent's
    ``throttled`` lists (indices) report a thermal slowdown; stages on the node report
    ``ready`` with per-stage statistics (§4), prefix caching's among them (``prefix_cache_stats``).
    """

    def __init__(self, server_url: str, agents: list[dict], stages: list[dict], interval_s: float = 0.5):
        self.url = server_url.replace("http://", "ws://") + "/ws/agents/"
        self.agents, self.stages, self.interval_s = agents, stages, interval_s
        self.stop_event = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(a,), daemon=True) for a in agents]
        for thread in self.threads:
            thread.start()

    def _run(self, agent: dict) -> None:
        headers = {"Authorization": f"Node {agent['node_id']}:{agent['credential']}"}
        stages = [s for s in self.stages if s["node"] == agent["node"]]
        try:
            with connect(self.url, additional_headers=headers, open_timeout=10) as socket:
                seq = 0
                while not self.stop_event.is_set():
                    seq += 1
                    socket.send(json.dumps(heartbeat(agent, stages, seq)))
                    self.stop_event.wait(self.interval_s)
        except BaseException as exc:  # reported by stop(), not lost in a thread
            self.errors.append(exc)

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=5)
        assert not self.errors, self.errors


def prefix_cache_stats(stage_index: int, seq: int) -> dict:
    """A caching stage's prefix figures: 3 of every 4 prompt tokens reused (a 75 % hit rate), 10 + its
    index blocks cached on the device, and a host tier on the heads only."""
    stats = {"prefix_queried_tokens": 400 * seq, "prefix_hit_tokens": 300 * seq,
             "prefix_cached_blocks": 10 + stage_index, "prefix_evicted_blocks": 0}
    return {**stats, "prefix_host_blocks": 5} if stage_index == 0 else stats


def spec_stats(stage_index: int, seq: int) -> dict:
    """A speculating head's figures: 4 proposals per draft, 3 of them accepted (75 %, 4 tokens per
    step); the other stages report none."""
    return ({"spec_drafts": 100 * seq, "spec_draft_tokens": 400 * seq, "spec_accepted_tokens": 300 * seq}
            if stage_index == 0 else {})


def heartbeat(agent: dict, stages: list[dict], seq: int) -> dict:
    now = time.time()
    devices = []
    for i in range(agent["gpus"]):
        util = 50 + 45 * math.sin(now / 4 + i)
        devices.append({"index": i, "utilization_pct": util, "memory_used_bytes": int((8 + i) * 2**30),
                        "memory_total_bytes": 24 * 2**30, "temperature_c": 40 + util * 0.4,
                        "power_w": 80 + util * 2,
                        "power_limit_w": 300.0, "sm_clock_mhz": 1400,
                        "throttle_reasons": ["sw_thermal"] if i in agent.get("throttled", ()) else [],
                        "pcie_tx_bytes_per_s": util * 1e8, "pcie_rx_bytes_per_s": util * 5e7})
    statuses = [{**{k: s[k] for k in ("stage_key", "deployment_id", "replica", "stage_index")},
                 "state": "ready",
                 "pid": 1000 + s["stage_index"], "exit_code": None, "restarts": 0, "message": "",
                 "stats": {"step_ms": 20.0 + 5 * s["stage_index"], "compute_ms": 14.0 + 5 * s["stage_index"],
                           "transfer_ms": 3.0, "tokens_per_s": 40 + 10 * math.sin(now / 3), "batch_size": 4,
                           "queue_depth": seq % 3, "kv_tokens_used": 2000 + 50 * (seq % 40),
                           "kv_tokens_free": 6000,
                           "bytes_sent": 0, "bytes_received": 0, "bubble_fraction": 0.15, "steps": seq,
                           **prefix_cache_stats(s["stage_index"], seq), **spec_stats(s["stage_index"], seq)}}
                for s in stages]
    return {"type": "heartbeat", "incarnation": agent["incarnation"], "seq": seq, "sent_at": now,
            "devices": devices, "stages": statuses}


# What the page's own layout says is wrong with a drawing (an SVG, or the heat map's grid): elements
# of it outside it (its frame, the parent, scrolls to all of it, nothing beyond), the frame wider than
# the page, and pairs of text labels whose boxes intersect. Elements with no box (hidden) are skipped.
DRAWING_PROBLEMS = """([svgSelector, labelSelector]) => {
  const svg = document.querySelector(svgSelector), frame = svg.parentElement;
  const box = svg.getBoundingClientRect(), problems = [];
  const pageWidth = document.documentElement.clientWidth;
  if (frame.getBoundingClientRect().right > pageWidth + 1) problems.push('frame past the page');
  if (frame.scrollWidth + 1 < box.width) problems.push('frame scrolls less than the drawing');
  const name = (e) => `${e.tagName} ${e.getAttribute('class') || ''} ${e.textContent.slice(0, 40)}`;
  for (const e of svg.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (!r.width && !r.height) continue;
    if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
      problems.push(`outside: ${name(e)}`);
  }
  const labels = [...document.querySelectorAll(labelSelector)].map((e) => [e, e.getBoundingClientRect()])
    .filter(([, r]) => r.width > 0 && r.height > 0);
  for (let i = 0; i < labels.length; i += 1) for (let j = i + 1; j < labels.length; j += 1) {
    const [a, ra] = labels[i], [b, rb] = labels[j];
    if (ra.left < rb.right && rb.left < ra.right && ra.top < rb.bottom && rb.top < ra.bottom)
      problems.push(`overlap: ${name(a)} / ${name(b)}`);
  }
  return problems;
}"""


def drawing_problems(page, svg: str = "svg#topology", labels: str = "svg#topology text") -> list[str]:
    """``DRAWING_PROBLEMS`` of the drawing ``svg`` (its frame: the parent element) and the ``labels``."""
    return page.evaluate(DRAWING_PROBLEMS, [svg, labels])
