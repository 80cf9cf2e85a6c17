// The topology as SVG, from `layoutFleet`'s positions: the network spine, a bus per row of nodes and
// each node's uplink (width: its bandwidth); each node compact (tiles) or expanded (cards sized by
// VRAM with model, memory and live figure, NVLink islands as enclosures, declared PCIe links as
// brackets above the cards); the chosen deployments' stages on their cards (pipeline, plan replica,
// stage, layers, precision), the pipeline order as arrows and each pipeline's bottleneck ringed.
// Emulated devices are dashed and tagged; every label is fitted to the box it names (svg.js).
import { reading } from "./device_metrics.js";
import { precisionLabel } from "./precision.js";
import { el, fitText, fitTexts, label } from "./svg.js";
import { layoutFleet, SIZE } from "./topology_layout.js";
import { grouped } from "./topology_select.js";

const LINK_COLOUR = { nvlink: "#2e9d4f", pcie: "#3c6fd1", network: "#d9822b" };
const strokeFor = (gbs) => Math.max(1.5, Math.min(9, Math.log2(1 + gbs) * 1.2));
export const statusText = (status) => (status === "declared" ? "declared (no agent)" : status);

// device name -> [{deployment, pipeline, index, stage, bottleneck}] for the deployments shown.
export function stagesByDevice(deployments) {
  const on = new Map();
  for (const deployment of deployments) for (const pipeline of deployment.pipelines) {
    pipeline.stages.forEach((stage, index) => {
      // A one-stage pipeline is trivially its own bottleneck: only longer pipelines get the mark.
      const bottleneck = pipeline.stages.length > 1 && pipeline.bottleneck_device === stage.device;
      if (!on.has(stage.device)) on.set(stage.device, []);
      on.get(stage.device).push({ deployment, pipeline, index, stage, bottleneck });
    });
  }
  return on;
}

export function drawTopology(svg, topology, { nodes, groupBy, isExpanded, deployments, width }) {
  const stages = stagesByDevice(deployments);
  const stageRows = (node) => Math.max(0, ...node.devices.map((d) => (stages.get(d.name) || []).length));
  const layout = layoutFleet({ groups: grouped(nodes, groupBy), expanded: isExpanded, stageRows, width });
  svg.replaceChildren(defs());
  svg.setAttribute("viewBox", `0 0 ${layout.width} ${layout.height}`);
  svg.dataset.width = layout.width;
  svg.dataset.height = layout.height;
  const gpuAt = new Map();
  const network = el("g", { class: "network" }), body = el("g", { class: "nodes" });
  const overlay = el("g", { class: "overlay" });
  svg.append(network, body, overlay);
  drawNetwork(network, layout, topology.links);
  for (const t of layout.titles) {
    body.append(label({ x: t.x, y: t.y, class: "group-title" },
      `${t.title} · ${t.count} node${t.count === 1 ? "" : "s"} · ${t.gpus} GPUs`, layout.width - t.x - SIZE.margin));
  }
  for (const box of layout.boxes) {
    body.append(drawNode(box, topology.links));
    for (const gpu of box.gpus) gpuAt.set(gpu.name, { ...gpu, expanded: box.expanded });
  }
  drawStages(overlay, stages, gpuAt, deployments);
  fitTexts(svg);
  return gpuAt;
}

function defs() {
  const d = el("defs");
  const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#7b3fbf" }));
  d.append(marker);
  return d;
}

function drawNetwork(layer, layout, links) {
  const line = (x1, y1, x2, y2, attrs) => el("line", { x1, y1, x2, y2, stroke: "#8a94a3", ...attrs });
  if (layout.spine) layer.append(line(layout.spine.x, layout.spine.y1, layout.spine.x, layout.spine.y2, { "stroke-width": 4, class: "bus" }));
  for (const bus of layout.buses) layer.append(line(bus.x1, bus.y, bus.x2, bus.y, { "stroke-width": 4, class: "bus" }));
  const boxAt = new Map();
  for (const box of layout.boxes) {
    boxAt.set(box.node.name, box);
    const cx = box.x + box.width / 2;
    const drop = line(cx, box.busY, cx, box.y, { stroke: LINK_COLOUR.network, "stroke-width": strokeFor(box.node.network_gbps / 8), opacity: 0.6, class: "uplink" });
    drop.append(el("title", {}, `${box.node.name}: ${box.node.network_gbps} Gbit/s to the network`));
    layer.append(drop);
  }
  // A declared node-to-node link is drawn along the bus when both nodes hang on the same one.
  for (const link of links) {
    const a = boxAt.get(link.a), b = boxAt.get(link.b);
    if (link.kind !== "network" || !a || !b || a.busY !== b.busY) continue;
    const ax = a.x + a.width / 2, bx = b.x + b.width / 2, y = a.busY - 5;
    const path = el("path", { d: `M ${ax} ${a.busY} L ${ax} ${y} L ${bx} ${y} L ${bx} ${b.busY}`, fill: "none",
      stroke: LINK_COLOUR.network, "stroke-width": strokeFor(link.bandwidth_gbs), class: "link link-network" });
    path.append(el("title", {}, `network ${Math.round(link.bandwidth_gbs)} GB/s: ${link.a} ↔ ${link.b}`));
    layer.append(path);
  }
}

function nodeTitle(node, links) {
  const declared = links.filter((l) => l.kind === "network" && (l.a === node.name || l.b === node.name))
    .map((l) => `\n${l.a} ↔ ${l.b}: ${Math.round(l.bandwidth_gbs)} GB/s`).join("");
  return `${node.name}: ${statusText(node.status)}, ${node.devices.length} GPUs, ${node.network_gbps} Gbit/s${declared}`;
}

function drawNode(box, links) {
  const { node } = box, inner = box.width - 2 * SIZE.pad;
  const g = el("g", { class: `node status-${node.status}`, "data-node": node.name, "data-expanded": box.expanded ? "1" : "0" });
  g.append(el("rect", { x: box.x, y: box.y, width: box.width, height: box.height, rx: 8, class: `node-box${node.emulated ? " emulated" : ""}` }));
  g.append(label({ x: box.x + SIZE.pad, y: box.y + 18, class: "node-name" }, node.name, inner));
  const state = `${statusText(node.status)}${node.emulated ? " · EMULATED" : ""}`;
  g.append(label({ x: box.x + SIZE.pad, y: box.y + 35, class: `node-status status-${node.status}` },
    box.expanded ? `${state} · ${node.network_gbps} Gbit/s` : state, inner));
  for (const gpu of box.gpus) g.append(box.expanded ? drawCard(gpu) : drawTile(gpu));
  if (box.expanded) drawCardLinks(g, box, links);
  // What a click toggles: the header of an expanded node, the whole of a compact one.
  const toggle = el("rect", { x: box.x, y: box.y, width: box.width, height: box.expanded ? SIZE.head - 14 : box.height,
    class: "node-toggle", role: "button", "aria-label": `${box.expanded ? "collapse" : "expand"} ${node.name}` });
  toggle.append(el("title", {}, `${nodeTitle(node, links)}\nclick to ${box.expanded ? "collapse" : "expand"}`));
  g.append(toggle);
  return g;
}

const deviceTitle = (gpu) => `${gpu.name}: ${gpu.model}, ${gpu.memory_gib} GiB, health ${gpu.health}` +
  `${gpu.emulated ? " (emulated)" : ""}${gpu.down ? " — down" : ""}`;

function drawTile(gpu) {
  const g = el("g", { class: `gpu tile${gpu.emulated ? " emulated" : ""}${gpu.down ? " down" : ""}`, "data-device": gpu.name });
  g.append(el("title", {}, deviceTitle(gpu)));
  g.append(el("rect", { x: gpu.x, y: gpu.y, width: gpu.w, height: gpu.h, rx: 2, class: "gpu-rect", fill: reading(undefined, "utilization").colour }));
  return g;
}

function drawCard(gpu) {
  const g = el("g", { class: `gpu no-data${gpu.emulated ? " emulated" : ""}${gpu.down ? " down" : ""}`, "data-device": gpu.name });
  const inner = gpu.w - 12;
  g.append(el("title", {}, deviceTitle(gpu)));
  g.append(el("rect", { x: gpu.x, y: gpu.y, width: gpu.w, height: gpu.h, rx: 4, class: "gpu-rect", fill: reading(undefined, "utilization").colour }));
  g.append(label({ x: gpu.x + 6, y: gpu.y + 15, class: "gpu-model" }, gpu.model.replace(/-SXM|-PCIE/i, ""), inner));
  g.append(label({ x: gpu.x + 6, y: gpu.y + 31, class: "gpu-mem" }, `gpu${gpu.index} · ${gpu.memory_gib} GiB`, inner));
  const idle = gpu.down ? "down" : gpu.health === "unknown" ? "no agent" : "no data";
  g.append(label({ x: gpu.x + 6, y: gpu.y + 48, class: "gpu-value" }, idle, inner));
  if (gpu.emulated) g.append(label({ x: gpu.x + 6, y: gpu.y + 61, class: "emu-tag" }, "EMU", inner));
  return g;
}

// NVLink islands as enclosures around their cards; other declared card links as brackets above them.
function drawCardLinks(g, box, links) {
  const at = new Map(box.gpus.map((gpu) => [gpu.name, gpu]));
  const islands = new Map();
  for (const gpu of box.gpus) if (gpu.island) islands.set(gpu.island, [...(islands.get(gpu.island) || []), gpu]);
  for (const [island, members] of islands) {
    if (members.length < 2) continue;
    const x1 = Math.min(...members.map((m) => m.x)) - 5, x2 = Math.max(...members.map((m) => m.x + m.w)) + 5;
    const y = members[0].y - 5, bandwidth = members[0].nvlink_bandwidth_gbs;
    const rect = el("rect", { x: x1, y, width: x2 - x1, height: SIZE.gpuH + 10, rx: 7, class: "island link link-nvlink",
      "stroke-width": strokeFor(bandwidth || 1) / 2 + 1 });
    rect.append(el("title", {}, `NVLink island ${island}: ${members.map((m) => m.name).join(", ")}`));
    g.append(rect);
  }
  for (const link of links) {
    const a = at.get(link.a), b = at.get(link.b);
    if (!a || !b || link.implied || link.kind === "network") continue;
    const ax = a.x + a.w / 2, bx = b.x + b.w / 2, top = a.y - 11;
    const path = el("path", { d: `M ${ax} ${a.y} L ${ax} ${top} L ${bx} ${top} L ${bx} ${b.y}`, fill: "none",
      stroke: LINK_COLOUR[link.kind], "stroke-width": strokeFor(link.bandwidth_gbs || 1),
      "stroke-dasharray": link.kind === "pcie" ? "5 3" : "", class: `link link-${link.kind}` });
    path.append(el("title", {}, `${link.kind} ${Math.round(link.bandwidth_gbs)} GB/s: ${link.a} ↔ ${link.b}`));
    g.append(path);
  }
}

function drawStages(layer, stages, gpuAt, deployments) {
  for (const [device, tags] of stages) {
    const gpu = gpuAt.get(device);
    if (!gpu) continue;
    tags.forEach((tag, row) => (gpu.expanded ? layer.append(stageTag(gpu, tag, row)) : markTile(layer, gpu, tag)));
  }
  for (const deployment of deployments) for (const pipeline of deployment.pipelines) {
    pipeline.stages.forEach((stage, si) => {
      const a = gpuAt.get(stage.device), b = pipeline.stages[si + 1] && gpuAt.get(pipeline.stages[si + 1].device);
      if (!a || !b) return;
      const ax = a.x + a.w / 2, ay = a.y + a.h / 2, bx = b.x + b.w / 2, by = b.y + b.h / 2;
      const lift = (a.expanded ? 34 : 12) + Math.abs(by - ay) * 0.1;
      layer.append(el("path", { d: `M ${ax} ${ay} C ${ax} ${ay - lift}, ${bx} ${by - lift}, ${bx} ${by}`, class: "pipeline-arrow", "marker-end": "url(#arrow)" }));
    });
  }
}

const stageTitle = ({ deployment, pipeline, index, stage, bottleneck }) =>
  `${deployment.name} pipeline ${pipeline.pipeline} (plan replica ${pipeline.plan_replica}) stage ${index}: ` +
  `layers [${stage.layers[0]}, ${stage.layers[1]}) at ${precisionLabel(stage)}${bottleneck ? " — the pipeline's bottleneck" : ""}`;

function stageTag(gpu, tag, row) {
  const { deployment, pipeline, index, stage, bottleneck } = tag;
  const y = gpu.y + gpu.h + 10 + row * (SIZE.stageH + SIZE.stageGap), inner = gpu.w - 8;
  const g = el("g", { class: `stage${bottleneck ? " bottleneck" : ""}`, "data-stage": stage.stage_key || "", "data-device": stage.device });
  g.append(el("title", {}, stageTitle(tag)));
  g.append(el("rect", { x: gpu.x, y, width: gpu.w, height: SIZE.stageH, rx: 3, class: "stage-tag" }));
  g.append(label({ x: gpu.x + 4, y: y + 12, class: "stage-text" }, `${deployment.name} r${pipeline.pipeline}·s${index}`, inner));
  g.append(label({ x: gpu.x + 4, y: y + 26, class: "stage-text strong" }, `L${stage.layers[0]}–${stage.layers[1]} ${precisionLabel(stage)}`, inner));
  if (bottleneck) {
    g.append(el("rect", { x: gpu.x - 3, y: gpu.y - 3, width: gpu.w + 6, height: gpu.h + 6, rx: 6, class: "bottleneck-ring" }));
    g.append(label({ x: gpu.x + gpu.w / 2, y: gpu.y - 9, class: "bottleneck-text", "text-anchor": "middle" }, "▼ bottleneck", gpu.w));
  }
  return g;
}

function markTile(layer, gpu, tag) {
  const g = el("g", { class: `stage-mark${tag.bottleneck ? " bottleneck" : ""}`, "data-stage": tag.stage.stage_key || "", "data-device": gpu.name });
  g.append(el("title", {}, stageTitle(tag)));
  g.append(el("rect", { x: gpu.x - 1.5, y: gpu.y - 1.5, width: gpu.w + 3, height: gpu.h + 3, rx: 3, class: "stage-outline" }));
  layer.append(g);
}

// Colour every card by the chosen metric from a snapshot, and mark each stage with its live state.
export function paintDevices(svg, snapshot, metricName, slowdown) {
  for (const group of svg.querySelectorAll("g.gpu")) {
    const sample = snapshot.devices[group.dataset.device];
    if (!sample) continue;
    const { value, colour, text } = reading(sample, metricName, slowdown);
    group.querySelector("rect").setAttribute("fill", colour);
    group.classList.remove("no-data");
    const figure = group.querySelector(".gpu-value");
    if (figure) {
      delete figure.dataset.full;
      figure.textContent = text;
      fitText(figure, Number(figure.dataset.fit));
    }
    group.dataset.value = value ?? "";
  }
  for (const tag of svg.querySelectorAll("[data-stage]")) {
    const stage = snapshot.stages[tag.dataset.stage];
    if (stage) tag.dataset.state = stage.state || "";
  }
}
