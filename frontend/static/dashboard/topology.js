// The Topology page: the drawing (topology_draw.js) under the operator's controls — a filter box,
// the grouping key, the deployments whose stages are laid over the cards, the colouring metric,
// zoom — with nodes that expand and collapse on click. A fleet of up to DETAIL_UP_TO GPUs starts
// with every node expanded; a larger one starts compact. Live colours come from /ws/dashboard/, for
// the nodes the filter leaves drawn only (the page subscribes to them as the filter changes).
import { getJSON } from "./api.js";
import { connectLive } from "./live.js";
import { drawTopology, paintDevices } from "./topology_draw.js";
import { defaultGroupKey, groupKeys, matching } from "./topology_select.js";

const DETAIL_UP_TO = 16;
const ZOOMS = [0.5, 0.67, 0.8, 1, 1.25, 1.5, 2];

const $ = (id) => document.getElementById(id);

function fillSelect(select, options, chosen) {
  select.replaceChildren(...options.map(([value, text]) => new Option(text, value, false, value === chosen)));
}

function main() {
  const svg = $("topology"), wrap = $("topology-wrap");
  const controls = { filter: $("topology-filter"), group: $("group-by"), overlay: $("overlay"), metric: $("colour-by") };
  let topology = JSON.parse($("topology-data").textContent);
  let last = { devices: {}, stages: {} };
  const opened = new Map();  // node name -> expanded, where the operator chose
  let zoom = 1, drawnWidth = 0;
  let shown = null, live = null;  // the names of the nodes drawn (null: every node), the socket
  controls.filter.value = new URLSearchParams(location.search).get("q") || "";

  function setUpControls() {
    const keys = groupKeys(topology.nodes);
    const labels = { fleet: "fleet", model: "GPU model", none: "no grouping" };
    fillSelect(controls.group, keys.map((k) => [k, labels[k] || k]), keys.includes(controls.group.value)
      ? controls.group.value : defaultGroupKey(keys));
    const names = topology.deployments.map((d) => d.name);
    const shown = controls.overlay.options.length ? controls.overlay.value : "*";
    fillSelect(controls.overlay, [["*", "all deployments"], ...names.map((n) => [n, n]), ["", "none"]],
      [...names, ""].includes(shown) ? shown : "*");
  }

  function deploymentsOn() {
    const on = new Map();
    for (const d of topology.deployments) for (const p of d.pipelines) for (const s of p.stages) {
      const node = s.device.split("/")[0];
      on.set(node, [...(on.get(node) || []), d.name]);
    }
    return on;
  }

  function render() {
    const total = topology.nodes.reduce((n, node) => n + node.devices.length, 0);
    const nodes = matching(topology.nodes, controls.filter.value, deploymentsOn());
    const chosen = controls.overlay.value;
    const deployments = topology.deployments.filter((d) => chosen === "*" || d.name === chosen);
    drawnWidth = wrap.clientWidth;
    drawTopology(svg, topology, {
      nodes, groupBy: controls.group.value, deployments, width: drawnWidth,
      isExpanded: (node) => opened.get(node.name) ?? total <= DETAIL_UP_TO,
    });
    applyZoom();
    paintDevices(svg, last, controls.metric.value, topology.slowdown_reasons);
    shown = nodes.length === topology.nodes.length ? null : nodes.map((n) => n.name);
    if (live) live.subscribe();
    const gpus = nodes.reduce((n, node) => n + node.devices.length, 0);
    $("filter-count").textContent = `${nodes.length} of ${topology.nodes.length} nodes · ${gpus} of ${total} GPUs`;
    if (!svg.dataset.firstDrawMs) svg.dataset.firstDrawMs = Math.round(performance.now());
  }

  function applyZoom() {
    svg.style.width = `${Number(svg.dataset.width) * zoom}px`;
    svg.style.height = `${Number(svg.dataset.height) * zoom}px`;
    $("zoom-level").textContent = `${Math.round(zoom * 100)} %`;
  }

  function zoomBy(step) {
    const i = ZOOMS.indexOf(zoom);
    zoom = step === 0 ? 1 : ZOOMS[Math.max(0, Math.min(ZOOMS.length - 1, i + step))];
    applyZoom();
  }

  svg.addEventListener("click", (event) => {
    const toggle = event.target.closest(".node-toggle");
    if (!toggle || svg.dataset.panned === "1") return;
    const node = toggle.closest("g.node");
    opened.set(node.dataset.node, node.dataset.expanded !== "1");
    render();
  });
  enablePan(svg, wrap);
  controls.filter.addEventListener("input", render);
  for (const select of [controls.group, controls.overlay]) select.addEventListener("change", render);
  controls.metric.addEventListener("change", () => paintDevices(svg, last, controls.metric.value, topology.slowdown_reasons));
  $("zoom-in").addEventListener("click", () => zoomBy(1));
  $("zoom-out").addEventListener("click", () => zoomBy(-1));
  $("zoom-reset").addEventListener("click", () => zoomBy(0));
  new ResizeObserver(() => { if (wrap.clientWidth !== drawnWidth) render(); }).observe(wrap);
  setUpControls();
  render();
  live = connectLive({
    nodes: () => shown,
    onSnapshot(snapshot) {
      last = snapshot;
      paintDevices(svg, snapshot, controls.metric.value, topology.slowdown_reasons);
      $("updated").textContent = new Date(snapshot.at * 1000).toLocaleTimeString();
      const { gpus, throttled } = snapshot.fleet;
      $("fleet-live").textContent = ` · fleet-wide ${gpus} GPUs reporting, ${throttled} throttled`;
    },
    async onResync() {
      topology = await getJSON("/dashboard/topology.json");
      setUpControls();
      render();
    },
  });
}

// Drag the drawing to pan it (the frame scrolls sideways, the page up and down); a drag is no click.
function enablePan(svg, wrap) {
  let start = null;
  svg.addEventListener("pointerdown", (event) => {
    start = { x: event.clientX, y: event.clientY, left: wrap.scrollLeft, top: window.scrollY, moved: false };
    svg.dataset.panned = "0";
  });
  svg.addEventListener("pointermove", (event) => {
    if (!start || !(event.buttons & 1)) return;
    const dx = event.clientX - start.x, dy = event.clientY - start.y;
    if (Math.abs(dx) + Math.abs(dy) < 5 && !start.moved) return;
    start.moved = true;
    svg.dataset.panned = "1";
    wrap.scrollLeft = start.left - dx;
    window.scrollTo(window.scrollX, start.top - dy);
  });
  window.addEventListener("pointerup", () => { start = null; });
}

if ($("topology")) main();
