"""Card assignment across models: the joint assignment of free cards against first come, first served.

    .venv/bin/python benchmarks/card_shares_bench.py [--cases 40] [--seed 7] [--markdown]

Three deployments on the emulated cluster-64 fleet (examples/fleets/cluster-64.yaml) want more cards
at once, with different quality budgets (8 sequences of 2048 tokens per replica):

- ``chat``: Qwen2.5-32B held at 16 bits, priority 2;
- ``assist``: Llama-3-8B with the default budget (16/8/4 bits, at most half the layers below 16),
  priority 1;
- ``batch``: Qwen2.5-7B allowed int4 on every layer, priority 0.

Each case frees a random subset of the cluster's cards (4 to 16) and gives each deployment a need
drawn between a fifth of and all the free cards' worth to it spread over the three (so supply is
short in most cases). Each card's worth to each deployment is ``planning.card_worth`` (what the policy
pass prices); ``greedy`` (by priority, each takes the cards worth most to it) and the policy's
``assign_whole`` give the cards out. Reported per priority: the need met (the sum of
``min(need, worth received)``) summed over the cases, by the estimate and by the planner (each
deployment's ``plan`` on exactly the cards it was given, replicas auto: the tokens/s it would really
gain, 0 where its cards hold no replica), then the cards used and the assignment's time.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contracts.fleet_file import load_fleet_file  # noqa: E402
from contracts.model_config import ModelConfig  # noqa: E402
from contracts.profiler import profile_model  # noqa: E402
from controlplane.planning import PlanningError, PlanRequest, Workload, plan  # noqa: E402
from controlplane.planning.card_shares import Claimant, greedy  # noqa: E402
from controlplane.planning.card_worth import CardWorth, assign_whole, card_worth  # noqa: E402
from controlplane.planning.cost_model import CostModel  # noqa: E402


@dataclass(frozen=True)
class Deployment:
    name: str
    model: str
    priority: int
    bits: tuple[int, ...]
    max_quantized: float


DEPLOYMENTS = (Deployment("chat", "Qwen2.5-32B", 2, (16,), 0.0),
               Deployment("assist", "Llama-3-8B", 1, (16, 8, 4), 0.5),
               Deployment("batch", "Qwen2.5-7B", 0, (16, 8, 4), 1.0))
WORKLOAD = Workload(batch=8, context=2048)


def requests(fleet) -> dict[str, PlanRequest]:
    found = {}
    for d in DEPLOYMENTS:
        profile = profile_model(ModelConfig.from_file(ROOT / "examples" / "models" / d.model / "config.json"),
                                d.model)
        found[d.name] = PlanRequest(fleet=fleet, model=profile, workload=WORKLOAD, bits=d.bits,
                                    max_quantized=d.max_quantized)
    return found


def worths(fleet, asked: dict[str, PlanRequest]) -> dict[str, dict[str, CardWorth]]:
    """Deployment -> card -> its worth (``card_worth``), priced once per card model."""
    table = {}
    for name, request in asked.items():
        cost, by_model = CostModel(request), {}
        for device in fleet.devices:
            if device.model not in by_model:
                by_model[device.model] = card_worth(request, device, cost)
        table[name] = {device.name: replace(by_model[device.model], device=device.name)
                       for device in fleet.devices}
    return table


def planned(request: PlanRequest, cards: list[str], memo: dict) -> float:
    """The planner's decode tokens/s on exactly ``cards`` (0: they hold no replica)."""
    if not cards:
        return 0.0
    key = (request.model.name, tuple(sorted(request.fleet.device(c).model for c in cards)))
    if key not in memo:
        others = tuple(d.name for d in request.fleet.devices if d.name not in cards)
        try:
            memo[key] = plan(replace(request, exclude_devices=others)).predicted.decode_tokens_per_s
        except PlanningError:
            memo[key] = 0.0
    return memo[key]


def run(cases: int, seed: int) -> dict:
    fleet = load_fleet_file(ROOT / "examples" / "fleets" / "cluster-64.yaml")
    asked = requests(fleet)
    table = worths(fleet, asked)
    rng, memo = random.Random(seed), {}
    names = [d.name for d in DEPLOYMENTS]
    totals = {how: {"need": dict.fromkeys(names, 0.0), "estimate": dict.fromkeys(names, 0.0),
                    "planned": dict.fromkeys(names, 0.0), "cards": 0, "better": 0, "worse": 0}
              for how in ("greedy", "joint")}
    seconds = []
    for _ in range(cases):
        free = sorted(rng.sample([d.name for d in fleet.devices], rng.randint(4, 16)))
        claimants = []
        for d in DEPLOYMENTS:
            supply = sum(table[d.name][c].tokens_per_s for c in free)
            need = int(rng.uniform(0.2, 1.0) * supply / len(DEPLOYMENTS) * 2)
            claimants.append(Claimant(d.name, d.priority, max(1, need),
                                      {c: int(table[d.name][c].tokens_per_s) for c in free}))
        started = time.process_time()
        joint = assign_whole(claimants, free, table)
        seconds.append(time.process_time() - started)
        scored = {}
        for how, assignment in (("greedy", greedy(claimants, free)), ("joint", joint)):
            met = []
            for claimant in claimants:
                cards = [c for c, who in assignment.items() if who == claimant.name]
                received = sum(claimant.worth[c] for c in cards)
                real = planned(asked[claimant.name], cards, memo)
                totals[how]["need"][claimant.name] += claimant.need
                totals[how]["estimate"][claimant.name] += min(claimant.need, received)
                totals[how]["planned"][claimant.name] += min(claimant.need, real)
                met.append(min(claimant.need, real))
            totals[how]["cards"] += len(assignment)
            scored[how] = tuple(met)  # priority order: chat, assist, batch
        if scored["joint"] != scored["greedy"]:
            better = scored["joint"] > scored["greedy"]
            totals["joint"]["better" if better else "worse"] += 1
    return {"totals": totals, "seconds": seconds, "cases": cases}


def report(result: dict, markdown: bool) -> str:
    greedy_, joint = result["totals"]["greedy"], result["totals"]["joint"]
    row = ("| {} | {} | {} | {} | {} | {} | {} |" if markdown
           else "{:<20} {:>8} {:>14} {:>14} {:>14} {:>14} {:>7}")
    lines = [row.format("deployment", "need", "greedy (est.)", "joint (est.)", "greedy (plan)",
                        "joint (plan)", "ratio")]
    if markdown:
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for d in DEPLOYMENTS:
        g, j = greedy_["planned"][d.name], joint["planned"][d.name]
        lines.append(row.format(f"{d.name} (priority {d.priority})", f"{greedy_['need'][d.name]:.0f}",
                                f"{greedy_['estimate'][d.name]:.0f}", f"{joint['estimate'][d.name]:.0f}",
                                f"{g:.0f}", f"{j:.0f}", f"{j / g:.3f}x" if g else "-"))
    seconds = result["seconds"]
    lines += ["", f"{result['cases']} cases. Need met (planned), compared in priority order, joint against "
                  f"greedy: better in {joint['better']}, worse in {joint['worse']}, equal in the rest.",
              f"Cards used: greedy {greedy_['cards']}, joint {joint['cards']}. assign_whole CPU time: mean "
              f"{1000 * sum(seconds) / len(seconds):.0f} ms, max {1000 * max(seconds):.0f} ms."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    print(report(run(args.cases, args.seed), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
