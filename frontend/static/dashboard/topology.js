// Cluster topology as SVG: nodes as boxes, GPUs sized by VRAM and coloured by a live metric,
// links by kind and bandwidth, and every deployment's stages laid over the GPUs with the pipeline
// order as arrows and the bottleneck stage outlined. Emulated devices are dashed and labelled.
import { connectLive, heat } from "./live.js";
import { getJSON } from "./api.js";
import { precisionLabel } from "./precision.js";

const SVG = "http://www.w3.org/2000/svg";
const GPU_H = 64, NODE_PAD = 16, NODE_HEAD = 46, ROW_GAP = 70, BUS_Y = 28, MAX_W = 1240;
const METRICS = {
  utilization: { field: "utilization_pct", low: 0, high: 100, fmt: (v) => `${v.toFixed(0)} %` },
  temperature: { field: "temperature_c", low: 30, high: 90, fmt: (v) => `${v.toFixed(0)} °C` },
  memory: { field: "memory_pct", low: 0, high: 100, fmt: (v) => `${v.toFixed(0)} % mem` },
};
const LINK_STYLE = {
  nvlink: { color: "#2e9d4f", dash: "" },
  pcie: { color: "#3c6fd1", dash: "5 3" },
  network: { color: "#d9822b", dash: "" },
};

const el = (name, attrs = {}, text) => {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
};
const gpuWidth = (gib) => 72 + gib * 1.1;
const strokeFor = (gbs) => Math.max(1.5, Math.min(9, Math.log2(1 + gbs) * 1.2));

// How many stages (over all deployments) the busiest GPU of a node carries: rows of stage tags.
function stagesOn(topology, node) {
  const names = new Set(node.devices.map((d) => d.name));
  const counts = {};
  for (const d of topology.deployments || []) for (const p of d.pipelines) for (const s of p.stages) {
    if (names.has(s.device)) counts[s.device] = (counts[s.device] || 0) + 1;
  }
  return Math.max(0, ...Object.values(counts));
}

function layout(topology) {
  const boxes = [];
  let x = 10, y = BUS_Y + 40, rowH = 0;
  for (const node of topology.nodes) {
    const width = Math.max(170, node.devices.reduce((w, d) => w + gpuWidth(d.memory_gib) + 8, NODE_PAD * 2 - 8));
    const height = NODE_HEAD + GPU_H + 30 + 32 * Math.max(1, stagesOn(topology, node));
    if (x + width > MAX_W && x > 10) { x = 10; y += rowH + ROW_GAP; rowH = 0; }
    const gpus = [];
    let gx = x + NODE_PAD;
    for (const d of node.devices) {
      const w = gpuWidth(d.memory_gib);
      gpus.push({ ...d, x: gx, y: y + NODE_HEAD, w, h: GPU_H });
      gx += w + 8;
    }
    boxes.push({ node, x, y, width, height, gpus });
    x += width + 24;
    rowH = Math.max(rowH, height);
  }
  return { boxes, height: y + rowH + 20 };
}

export function drawTopology(svg, topology) {
  svg.replaceChildren();
  const { boxes, height } = layout(topology);
  svg.setAttribute("viewBox", `0 0 ${MAX_W + 20} ${height}`);
  const defs = el("defs");
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#7b3fbf" }));
  defs.append(marker);
  svg.append(defs);
  const gpuAt = new Map();
  const nodeAt = new Map();
  const under = el("g", { class: "links" }), over = el("g", { class: "overlay" });

  svg.append(el("line", { x1: 10, y1: BUS_Y, x2: MAX_W, y2: BUS_Y, stroke: "#8a94a3", "stroke-width": 4 }));
  svg.append(el("text", { x: 14, y: BUS_Y - 8, class: "muted" }, "network"));
  svg.append(under);

  for (const box of boxes) {
    const { node } = box;
    nodeAt.set(node.name, box);
    const g = el("g", { class: `node status-${node.status}`, "data-node": node.name });
    g.append(el("rect", { x: box.x, y: box.y, width: box.width, height: box.height, rx: 8, class: `node-box${node.emulated ? " emulated" : ""}` }));
    g.append(el("text", { x: box.x + 10, y: box.y + 20, class: "node-name" }, node.name));
    g.append(el("text", { x: box.x + box.width - 10, y: box.y + 20, class: `node-status status-${node.status}`, "text-anchor": "end" },
      node.emulated ? `${node.status} · EMULATED` : node.status));
    // The node's uplink to the shared network, as thick as its interface is fast.
    const cx = box.x + box.width / 2;
    under.append(el("line", { x1: cx, y1: box.y, x2: cx, y2: BUS_Y, stroke: LINK_STYLE.network.color, "stroke-width": strokeFor(node.network_gbps / 8), opacity: 0.55 }));
    under.append(el("text", { x: cx + 6, y: box.y - 8, class: "link-label" }, `${node.network_gbps} Gbit/s`));
    for (const gpu of box.gpus) {
      gpuAt.set(gpu.name, gpu);
      const gg = el("g", { class: `gpu${gpu.emulated ? " emulated" : ""}${gpu.down ? " down" : ""}`, "data-device": gpu.name });
      gg.append(el("title", {}, `${gpu.name}: ${gpu.model}, ${gpu.memory_gib} GiB${gpu.emulated ? " (emulated)" : ""}${gpu.down ? " — down" : ""}`));
      gg.append(el("rect", { x: gpu.x, y: gpu.y, width: gpu.w, height: gpu.h, rx: 4, class: "gpu-rect", fill: heat(undefined) }));
      gg.append(el("text", { x: gpu.x + 5, y: gpu.y + 15, class: "gpu-model" }, gpu.model.replace(/-SXM|-PCIE/i, "")));
      gg.append(el("text", { x: gpu.x + 5, y: gpu.y + 30, class: "gpu-mem" }, `gpu${gpu.index} · ${gpu.memory_gib} GiB`));
      gg.append(el("text", { x: gpu.x + 5, y: gpu.y + 50, class: "gpu-value" }, gpu.down ? "down" : "no data"));
      if (gpu.emulated) gg.append(el("text", { x: gpu.x + gpu.w - 4, y: gpu.y + gpu.h - 5, class: "emu-tag", "text-anchor": "end" }, "EMU"));
      g.append(gg);
    }
    svg.append(g);
  }

  for (const link of topology.links) {
    const style = LINK_STYLE[link.kind];
    const width = strokeFor(link.bandwidth_gbs || 1);
    const label = `${link.kind} ${Math.round(link.bandwidth_gbs)} GB/s`;
    if (link.kind === "network") {
      const a = nodeAt.get(link.a), b = nodeAt.get(link.b);
      if (!a || !b) continue;
      const ax = a.x + a.width / 2 + 30, bx = b.x + b.width / 2 - 30, top = Math.min(a.y, b.y) - 26;
      under.append(el("path", { d: `M ${ax} ${a.y} C ${ax} ${top}, ${bx} ${top}, ${bx} ${b.y}`, fill: "none", stroke: style.color, "stroke-width": width }));
      under.append(el("text", { x: (ax + bx) / 2, y: top + 4, class: "link-label", "text-anchor": "middle" }, label));
      continue;
    }
    const a = gpuAt.get(link.a), b = gpuAt.get(link.b);
    if (!a || !b) continue;
    // NVLink arcs under the GPU row, declared PCIe links in the gap above it.
    const below = link.kind === "nvlink";
    const ya = below ? a.y + a.h : a.y, yb = below ? b.y + b.h : b.y, bend = below ? 22 : -14;
    const ax = a.x + a.w / 2, bx = b.x + b.w / 2;
    const path = el("path", { d: `M ${ax} ${ya} C ${ax} ${ya + bend}, ${bx} ${yb + bend}, ${bx} ${yb}`, fill: "none",
      stroke: style.color, "stroke-width": width, "stroke-dasharray": style.dash, class: `link link-${link.kind}` });
    path.append(el("title", {}, `${label}${link.implied ? " (NVLink island)" : ""}: ${link.a} ↔ ${link.b}`));
    svg.append(path);
  }

  svg.append(over);
  drawDeployments(over, topology.deployments || [], gpuAt);
  return gpuAt;
}

function drawDeployments(layer, deployments, gpuAt) {
  const rows = new Map();  // device -> stage tags already drawn under it
  for (const deployment of deployments) {
    for (const pipeline of deployment.pipelines) {
      pipeline.stages.forEach((stage, si) => {
        const gpu = gpuAt.get(stage.device);
        if (!gpu) return;
        // A one-stage pipeline is trivially its own bottleneck: only longer pipelines get the mark.
        const bottleneck = pipeline.stages.length > 1 && pipeline.bottleneck_device === stage.device;
        const row = rows.get(stage.device) || 0;
        rows.set(stage.device, row + 1);
        const y = gpu.y + gpu.h + 6 + row * 32;
        const bits = precisionLabel(stage);
        const tag = el("g", { class: `stage${bottleneck ? " bottleneck" : ""}`, "data-stage": stage.stage_key || "", "data-device": stage.device });
        tag.append(el("title", {}, `${deployment.name} pipeline ${pipeline.pipeline} (plan replica ${pipeline.plan_replica}) stage ${si}: layers [${stage.layers[0]}, ${stage.layers[1]}) at ${bits}${bottleneck ? " — the pipeline's bottleneck" : ""}`));
        tag.append(el("rect", { x: gpu.x, y, width: gpu.w, height: 28, rx: 3, class: "stage-tag" }));
        tag.append(el("text", { x: gpu.x + 4, y: y + 11, class: "stage-text" }, `${deployment.name} r${pipeline.pipeline}·s${si}`));
        tag.append(el("text", { x: gpu.x + 4, y: y + 23, class: "stage-text strong" }, `L${stage.layers[0]}–${stage.layers[1]} ${bits}`));
        if (bottleneck) {
          tag.append(el("rect", { x: gpu.x - 3, y: gpu.y - 3, width: gpu.w + 6, height: gpu.h + 6, rx: 6, class: "bottleneck-ring" }));
          tag.append(el("text", { x: gpu.x + gpu.w / 2, y: gpu.y - 6, class: "bottleneck-text", "text-anchor": "middle" }, "▼ bottleneck"));
        }
        layer.append(tag);
        const next = pipeline.stages[si + 1] && gpuAt.get(pipeline.stages[si + 1].device);
        if (next) {
          const ax = gpu.x + gpu.w / 2, ay = gpu.y + gpu.h / 2, bx = next.x + next.w / 2, by = next.y + next.h / 2;
          const lift = 34 + Math.abs(by - ay) * 0.1;
          layer.append(el("path", { d: `M ${ax} ${ay} C ${ax} ${ay - lift}, ${bx} ${by - lift}, ${bx} ${by}`, class: "pipeline-arrow", "marker-end": "url(#arrow)" }));
        }
      });
    }
  }
}

export function paintDevices(svg, snapshot, metricName) {
  const metric = METRICS[metricName];
  for (const group of svg.querySelectorAll("g.gpu")) {
    const sample = snapshot.devices[group.dataset.device];
    if (!sample) continue;
    const value = metric.field === "memory_pct" && sample.memory_total_bytes
      ? 100 * sample.memory_used_bytes / sample.memory_total_bytes : sample[metric.field];
    group.querySelector("rect").setAttribute("fill", heat(value, metric.low, metric.high));
    group.querySelector(".gpu-value").textContent = value === undefined ? "no data" : metric.fmt(value);
    group.dataset.value = value ?? "";
  }
  for (const tag of svg.querySelectorAll("g.stage[data-stage]")) {
    const stage = snapshot.stages[tag.dataset.stage];
    if (stage) tag.dataset.state = stage.state || "";
  }
}

function main() {
  const svg = document.getElementById("topology");
  let topology = JSON.parse(document.getElementById("topology-data").textContent);
  let last = { devices: {}, stages: {} };
  const select = document.getElementById("colour-by");
  drawTopology(svg, topology);
  select.addEventListener("change", () => paintDevices(svg, last, select.value));
  connectLive({
    onSnapshot(snapshot) {
      last = snapshot;
      paintDevices(svg, snapshot, select.value);
      document.getElementById("updated").textContent = new Date(snapshot.at * 1000).toLocaleTimeString();
    },
    async onResync() {
      topology = await getJSON("/dashboard/topology.json");
      drawTopology(svg, topology);
      paintDevices(svg, last, select.value);
    },
  });
}

if (document.getElementById("topology")) main();
