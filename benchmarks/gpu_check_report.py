"""The GPU check's report: one line per step, the summary in Markdown (docs/benchmarks.md's GPU
section), the GPU goals judged on the figures, and the work folder's logs in one archive.
Standard library only: it reads the steps' JSON, never torch."""

from __future__ import annotations

import tarfile
from pathlib import Path

GIB = 1024**3
PARITY_GOAL = "CUDA parity tests within their bounds"
INT8_GOAL, INT8_MIN = "int8 decode at batch 1 vs the 16-bit engine", 1.6
READ_GOAL, READ_MIN = "16-bit weight-read at batch 1, of the measured copy bandwidth", 0.6
KEPT = (".log", ".json", ".jsonl", ".xml", ".yaml")


def step_detail(name: str, result: dict) -> str:
    if not result:
        return "no result file"
    if name == "nvml":
        return nvml_line(result)
    if name == "bench":
        return bench_line(result)
    if name == "tp":
        return tp_line(result)
    if name == "serve":
        chat = result.get("chat", {})
        telemetry = result.get("telemetry", {})
        models = sorted(
            {f"{d['model_name']}{' (emulated)' if d['emulated'] else ''}" for d in result["devices"]}
        )
        return (
            f"READY after {result.get('ready_after_s')} s; chat {chat.get('status')} in "
            f"{chat.get('seconds')} s ({(chat.get('usage') or {}).get('completion_tokens')} tokens); "
            f"devices {', '.join(models)}; telemetry: {len(telemetry.get('device', {}))} device, "
            f"{len(telemetry.get('stage', {}))} stage series" + api_sample(result.get("api_telemetry") or {})
        )
    return ""


def tp_line(result: dict) -> str:
    """The tensor-parallel step in one line: the group's steps against one device's, and the error."""
    one, two = result["one_process"], result["two_processes"]
    shares = ", ".join(f"{s['kv_heads']} kv heads + {s['columns']} columns" for s in result["shares"])
    return (
        f"{result['device']} {result['dtype']}, layers {result['layers']}, shares {shares}: decode "
        f"{two['decode_ms']:.2f} ms vs {one['decode_ms']:.2f} ms on one "
        f"({two['decode_ms'] / one['decode_ms']:.2f}x), prefill {result['prompt']} tokens "
        f"{two['prefill_ms']:.2f} vs {one['prefill_ms']:.2f} ms; max |diff| {result['max_abs_error']:.1e} "
        f"({result['error_over_std']:.1e} of the std)"
    )


def api_sample(api: dict) -> str:
    """The first device of the first node in ``GET /api/v1/telemetry/``, in a few words."""
    nodes = [n for n in api.get("nodes", []) if n.get("devices")]
    if not nodes:
        return f"; /api/v1/telemetry/: {api.get('status', 'not read')}, no sample"
    d = nodes[0]["devices"][0]
    return (
        f"; /api/v1/telemetry/ {nodes[0]['node']}: {d['utilization_pct']} % util, "
        f"{d['memory_used_bytes'] / GIB:.1f}/{d['memory_total_bytes'] / GIB:.0f} GiB, "
        f"{d['temperature_c']} C, {d['power_w']} W, throttle {d['throttle_reasons']}, "
        f"emulated {d['emulated']}"
    )


def nvml_line(result: dict) -> str:
    devices = result.get("devices", [])
    if not devices:
        return "no device"
    d, m = devices[0], (result.get("metrics") or [{}])[0]
    return (
        f"{len(devices)} device(s){' (stand-in NVML)' if result.get('fake') else ''}; gpu0 {d['model']} "
        f"{d['memory_bytes'] / GIB:.0f} GiB, PCIe gen{d['pcie_gen']} x{d['pcie_lanes']} (now gen"
        f"{d['pcie_current_gen']} x{d['pcie_current_width']}), NVLink island {d['nvlink_island']} "
        f"({len(d['nvlinks'])} links), NUMA {d['numa_node']}; sample {m.get('utilization_pct')} % util, "
        f"{m.get('temperature_c')} C, {m.get('power_w')}/{m.get('power_limit_w')} W, "
        f"{m.get('sm_clock_mhz')} MHz, "
        f"throttle {list(m.get('throttle_reasons', []))} (bits {m.get('throttle_bits')})"
    )


def bench_line(bench: dict) -> str:
    engines, base = bench["engines"], bench["engines"][bench["base"]]
    int8 = engines.get("motley int8", {})
    first = f"b{bench['batches'][0]}"
    return (
        f"{bench['device_name']}: copy {bench['bandwidth_gb_s']:.0f} GB/s; {bench['base']} {first} "
        f"{base[first]:.1f} tok/s, weight-read {base['weight_read_gb_s']:.1f} GB/s "
        f"({base['bandwidth_fraction']:.1%}); int8 {first} {int8.get(first, 0) / base[first]:.2f}x"
    )


def bench_table(bench: dict) -> list[str]:
    batches = [f"b{b}" for b in bench["batches"]]
    lines = [
        f"{bench['device_name']} ({bench['device']}), torch {bench['torch']}, measured copy bandwidth "
        f"(read + write) {bench['bandwidth_gb_s']:.1f} GB/s, model `{Path(bench['model']).name}`:",
        "",
        (
            "| engine | weights MB | "
            + " | ".join(f"decode {b} tok/s" for b in batches)
            + " | prefill tok/s | weight GB/s at "
            + batches[0]
            + " | of bandwidth |"
        ),
        "|---|" + "---:|" * (len(batches) + 4),
    ]
    for name, e in bench["engines"].items():
        lines.append(
            f"| {name} | {e['weight_mb']:.0f} | "
            + " | ".join(f"{e[b]:.1f}" for b in batches)
            + f" | {e['prefill']:.0f} | {e['weight_read_gb_s']:.1f} | {e['bandwidth_fraction']:.1%} |"
        )
    lines += [f"- left out: {name}: {why}" for name, why in bench.get("left_out", {}).items()]
    return lines


def goals(summary: dict) -> list[str]:
    steps = {s["name"]: s for s in summary["steps"]}
    tests, bench = steps.get("cuda-tests", {}), steps.get("bench", {}).get("result") or {}
    parity = summary.get("parity", [])
    if tests.get("status") == "passed" and parity:
        judged = f"met ({len(parity)} parity cases within their bounds)"
    elif tests.get("status") == "failed":
        judged = f"NOT met ({tests.get('detail')})"
    else:
        judged = f"unknown ({tests.get('status', 'not run')}: {tests.get('detail', '')}; no parity case ran)"
    lines = [f"- {PARITY_GOAL}: {judged}"]
    if not bench.get("engines"):
        return lines + [
            f"- {INT8_GOAL} >= {INT8_MIN}x: unknown (no bench figures)",
            f"- {READ_GOAL} >= {READ_MIN:.0%}: unknown (no bench figures)",
        ]
    base, first = bench["engines"][bench["base"]], f"b{bench['batches'][0]}"
    ratio = bench["engines"].get("motley int8", {}).get(first, 0.0) / base[first]
    fraction = base["bandwidth_fraction"]
    where = f" ({bench['base']} on {bench['device_name']})"
    return lines + [
        f"- {INT8_GOAL} >= {INT8_MIN}x: {ratio:.2f}x, {'met' if ratio >= INT8_MIN else 'NOT met'}{where}",
        f"- {READ_GOAL} >= {READ_MIN:.0%}: {fraction:.1%}, "
        f"{'met' if fraction >= READ_MIN else 'NOT met'}{where}",
    ]


def summary_markdown(summary: dict) -> str:
    steps = {s["name"]: s for s in summary["steps"]}
    env = steps.get("env", {})
    kind = (
        "dry run on CPU (plumbing only: stand-in NVML, tiny model, emulated device)"
        if summary["dry_run"]
        else "GPU run"
    )
    lines = [
        f"#### GPU check of {summary['started']} on `{summary['host']}`: {kind}",
        "",
        f"Environment ({env.get('seconds')} s): {env.get('detail')}",
        "",
    ]
    if smi := (env.get("result") or {}).get("nvidia_smi"):
        lines += ["```", smi, "```", ""]
    lines += ["| step | status | seconds | detail |", "|---|---|---:|---|"]
    lines += [
        f"| {s['name']} | {s['status']} | {s['seconds']} | {s['detail'].replace('|', '/')} |"
        for s in summary["steps"]
    ]
    lines += ["", "Goals:", *goals(summary), ""]
    if parity := summary.get("parity"):
        lines += [
            (
                "Parity with transformers on the same GPU (error over the std of transformers' logits, "
                "next-token agreement; 16 prompts x 32 tokens + 8 decode steps):"
            ),
            "",
            "| case | reference | max | mean | agreement | decode max | bounds (max, mean, agreement) |",
            "|---|---|---:|---:|---:|---:|---|",
        ]
        lines += [
            f"| {p['case']} | {p['reference']} | {p['max']:.4f} | {p['mean']:.4f} | {p['agreement']:.3f} | "
            f"{p['decode_max']:.4f} | {tuple(p['bounds'])} |"
            for p in parity
        ]
        lines.append("")
    if (bench := steps.get("bench", {}).get("result")) and bench.get("engines"):
        lines += ["Stage engine, `benchmarks/runtime_bench.py`:", "", *bench_table(bench), ""]
    smollm2 = summary.get("smollm2") or {}
    lines += (
        ["SmolLM2:", "", *bench_table(smollm2), ""]
        if smollm2.get("engines")
        else [f"SmolLM2: skipped: {smollm2.get('skipped', 'not run')}", ""]
    )
    if nvml := steps.get("nvml", {}).get("result"):
        lines += ["NVML discovery (agent code), per device:", ""]
        for d in nvml.get("devices", []):
            lines.append(f"- `{d['name']}`: " + ", ".join(f"{k}={v}" for k, v in d.items() if k != "name"))
        for m in nvml.get("metrics", []):
            lines.append(
                f"- sample gpu{m['index']}: " + ", ".join(f"{k}={v}" for k, v in m.items() if k != "index")
            )
        lines.append("")
    return "\n".join(lines)


def write_details(work: Path, archive: Path) -> None:
    """The work folder's logs and result files (no checkpoints, no databases) as one archive."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if (
                path.is_file()
                and path.suffix in KEPT
                and path.stat().st_size < 8 * 2**20
                and "site" not in path.parts
            ):
                tar.add(path, arcname=str(path.relative_to(work)))


def fill_docs(summary_md: Path, docs: Path, markers: tuple[str, str]) -> int:
    """Replace the text between the two markers in ``docs`` with a run's summary.md."""
    text, (begin, end) = docs.read_text(), markers
    if begin not in text or end not in text:
        print(f"{docs} has no {begin} ... {end} section")
        return 2
    head, rest = text.split(begin, 1)
    docs.write_text(head + begin + "\n" + summary_md.read_text().strip() + "\n" + end + rest.split(end, 1)[1])
    print(f"{docs}: GPU section filled from {summary_md}")
    return 0
