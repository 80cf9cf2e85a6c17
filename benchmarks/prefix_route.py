"""Prefix caching, part (b): routing by prefix over two replicas (``prefix_bench.py route``).

`make run`'s system (``manage.py run_local``, SmolLM2-135M-Instruct on the demo fleet) and the official
``openai`` client; many concurrent conversations (``--clients`` threads, each running conversations of
``--turns`` turns back to back, resending the history, under one of ``--prompts`` shared ~1,260-token
system prompts), caching on throughout, three times: one replica alone (`make run`'s own plan, one
pipeline over the demo's four cards: the hit-rate reference), then two replicas routed by
``cost_aware_prefix_blind`` (the cost router blind to cached prefixes), then by ``cost_aware`` (a PATCH
of ``routing_strategy`` between). The two replicas are the planner's plan for ``{"batch": 4, "context":
2048, "replicas": 2}`` on the demo fleet (``POST /api/v1/plans/``), applied through ``POST
/api/v1/deployments/<pk>/apply/``: the four cards split as the planner chooses (the A100 alone and a T4
then the RTX 3090, or a T4 then the A100 and the other T4 then the RTX 3090; the demo's own 16 sequences
of 2048 tokens do not fit twice on its cards, 4 do). Each window has system prompts of its own, so none
reuses what an earlier one cached; ``--warmup-s`` unmeasured (each prompt's first prefill), then
``--window-s`` measured: the times to first token of the turns started in it, and the hit rate, the
heads' ``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total`` in ``/metrics``, their
increase summed over the replicas. Goals: p99 time to first token of ``cost_aware`` at most 0.6x of the
blind router's, and its hit rate at least 80 % of one replica's. The stages' and the gateway's peer
timeouts are raised (``--peer-timeout-s``; benchmarks/demo_system.py says why).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.demo_system import demo_system  # noqa: E402
from benchmarks.gpu_check_serve import REPO  # noqa: E402
from benchmarks.prefix_chat import QUESTIONS, TOPICS, Load, chat_turn, set_caching, system_prompt  # noqa: E402
from benchmarks.replacement_bench import Api, serving_alone  # noqa: E402

TWO_REPLICAS = {"batch": 4, "context": 2048, "replicas": 2}
PREFIX_COUNTER = re.compile(r'^vllm:prefix_cache_(hits|queries)_total\{[^}]*replica="([^"]+)"[^}]*\} (\S+)$')


def counters_of(metrics: str) -> dict[str, float]:
    """The heads' prefix-cache counters in a ``/metrics`` text, summed over the replicas."""
    totals = {"hits": 0.0, "queries": 0.0}
    for line in metrics.splitlines():
        if match := PREFIX_COUNTER.match(line):
            totals[match.group(1)] += float(match.group(3))
    return totals


def prefix_counters(api: Api) -> dict[str, float]:
    """``counters_of`` the system's ``/metrics``, asked without the API's token: ``/metrics`` answers
    loopback without a header, and 401 to a wrong one."""
    response = httpx.get(f"{api.client.base_url}/metrics", timeout=60)
    response.raise_for_status()
    return counters_of(response.text)


def apply_two_replicas(api: Api, deployment: dict) -> None:
    """Plan two replicas with the planner (``POST /api/v1/plans/``) and apply that plan; wait until it
    serves alone."""
    pk = deployment["id"]
    plan = api.post("/api/v1/plans/", {"model": deployment["model"], **TWO_REPLICAS, "deployment": pk})
    plan.pop("deploy_blockers", None)
    applied = api.post(f"/api/v1/deployments/{pk}/apply/",
                       {"plan": plan, "request": TWO_REPLICAS, "source": "planner"})
    serving_alone(api, pk, applied["revision_number"])
    for replica in plan["replicas"]:
        print("  replica:", " -> ".join(f"{s['device']} {s['layers']}" for s in replica["stages"]))


def set_strategy(api: Api, pk: int, model: str, strategy: str, replicas: int) -> None:
    """PATCH the deployment's routing strategy and wait until the gateway routes by it over
    ``replicas`` healthy replicas (``GET /api/v1/gateway/router/``)."""
    api.client.patch(f"/api/v1/deployments/{pk}/", json={"routing_strategy": strategy}).raise_for_status()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        served = api.get("/api/v1/gateway/router/")["models"].get(model, {})
        healthy = [r for r in served.get("replicas", {}).values() if r["router"]["healthy"]]
        if served.get("strategy") == strategy and len(healthy) == replicas:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the gateway did not route by {strategy} over {replicas} replicas in time")


def shared_conversations(
    make_client, model: str, args: argparse.Namespace, label: str, counters: Callable[[], dict[str, float]]
) -> tuple[Load, list[str], dict[str, float]]:
    """``--clients`` threads, each running conversations back to back under one of ``--prompts``
    system prompts of this window (``label`` makes them its own); each conversation asks its questions
    in an order of its own, so histories differ past the system prompt. ``--warmup-s`` first (each
    prompt's first prefill, the clients falling out of step), then ``--window-s`` measured: the turns
    that start in it, and the increase of ``counters()`` from its start until its last turn ended."""
    import openai

    load, lock, stop, measuring = Load(args.clients), threading.Lock(), threading.Event(), threading.Event()
    failed: list[str] = []
    prompts = [system_prompt(f"{TOPICS[i % len(TOPICS)]} ({label} {i})", args.prompt_sentences)
               for i in range(args.prompts)]

    def client_loop(index: int) -> None:
        client, n = make_client(), 0
        while not stop.is_set():
            messages = [{"role": "system", "content": prompts[(index + n) % len(prompts)]}]
            for i in range(args.turns):
                question = QUESTIONS[(index + n + i) % len(QUESTIONS)]
                messages.append({"role": "user", "content": f"{question} (conversation {index}.{n})"})
                counted = measuring.is_set()
                try:
                    turn = chat_turn(client, model, messages, args.max_tokens)
                except openai.APIError as error:  # counted; the client backs off, then starts over
                    if counted:
                        with lock:
                            failed.append(f"{type(error).__name__}: {str(error)[:160]}")
                    time.sleep(1.0)
                    break
                messages.append({"role": "assistant", "content": turn.text})
                if counted:
                    with lock:
                        load.turns += 1
                        load.ttfts.append(turn.ttft_s)
                if stop.is_set():
                    return
            n += 1

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    time.sleep(args.warmup_s)
    before = counters()
    measuring.set()
    started = time.monotonic()
    time.sleep(args.window_s)
    stop.set()
    load.seconds = time.monotonic() - started
    for thread in threads:
        thread.join(300)
    after = counters()
    return load, failed, {k: after[k] - before[k] for k in before}


def measured_window(api: Api, make_client, model: str, args: argparse.Namespace, label: str) -> dict:
    """One window of shared conversations: its times to first token and the heads' hit rate in it."""
    load, failed, prefix = shared_conversations(make_client, model, args, label, lambda: prefix_counters(api))
    hits, queries = prefix["hits"], prefix["queries"]
    figures = {"label": label, "turns": load.turns, "rate": load.rate, "p99": load.p99,
               "median": statistics.median(load.ttfts) if load.ttfts else float("inf"),
               "hits": hits, "queries": queries, "hit_rate": hits / queries if queries else 0.0,
               "failed": len(failed), "failures": sorted(set(failed))[:5], "ttfts": load.ttfts}
    print(f"  {label}: {load.turns} turns, TTFT median {figures['median']:.2f} s p99 {load.p99:.2f} s, "
          f"hit rate {figures['hit_rate']:.1%}, {len(failed)} failed {figures['failures']}", flush=True)
    return figures


def route_table(one: dict, blind: dict, aware: dict) -> dict:
    """Print the Markdown table of (b) and the two goals; the ratios."""
    print("| routing | replicas | turns | failed | turns/s | TTFT median (s) | TTFT p99 (s) "
          "| prefix hit rate |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, replicas, f in (("one replica alone (reference)", 1, one),
                              ("`cost_aware_prefix_blind`", 2, blind), ("`cost_aware`", 2, aware)):
        print(f"| {name} | {replicas} | {f['turns']} | {f['failed']} | {f['rate']:.2f} | {f['median']:.2f} "
              f"| {f['p99']:.2f} | {f['hit_rate']:.1%} |")
    p99_ratio = aware["p99"] / blind["p99"]
    hit_share = aware["hit_rate"] / one["hit_rate"] if one["hit_rate"] else 0.0
    print(f"p99 TTFT, cost_aware against prefix-blind: {p99_ratio:.2f}x (goal <= 0.6x); median "
          f"{aware['median'] / blind['median']:.2f}x")
    print(f"hit rate, cost_aware against one replica: {hit_share:.0%} (goal >= 80 %); prefix-blind: "
          f"{blind['hit_rate'] / one['hit_rate'] if one['hit_rate'] else 0.0:.0%}")
    return {"p99_ratio": p99_ratio, "hit_share": hit_share}


def run_route(args: argparse.Namespace) -> dict:
    import openai

    with demo_system(args.work, peer_timeout_s=args.peer_timeout_s, calibrate=args.calibrate) as system:
        api, pk, model = system.api, system.pk, system.model
        set_caching(api, pk, True)

        def make_client():
            return openai.OpenAI(base_url=f"{system.base}/v1", api_key=system.key, timeout=600, max_retries=0)

        set_strategy(api, pk, model, "cost_aware", 1)
        one = measured_window(api, make_client, model, args, "one replica")
        apply_two_replicas(api, api.deployment())
        windows = {}
        for strategy in ("cost_aware_prefix_blind", "cost_aware"):
            set_strategy(api, pk, model, strategy, 2)
            windows[strategy] = measured_window(api, make_client, model, args, strategy)
        blind, aware = windows["cost_aware_prefix_blind"], windows["cost_aware"]
        return {"one": one, "blind": blind, "aware": aware, **route_table(one, blind, aware)}


def route_bench(args: argparse.Namespace) -> None:
    result = run_route(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "prefix-route")
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-sentences", type=int, default=44,
                        help="of each system prompt: 44 make ~1,260 tokens (prefix_chat.system_prompt)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--window-s", type=float, default=90.0)
    parser.add_argument("--warmup-s", type=float, default=30.0)
    parser.add_argument("--peer-timeout-s", type=float, default=30.0)
    parser.add_argument("--calibrate", action="store_true", help="the gateway measures each replica's costs")
    parser.add_argument("--json", type=Path)
