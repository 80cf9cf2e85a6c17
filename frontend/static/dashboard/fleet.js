// The Fleet page: every card of the fleet as one cell of a heat map (rows: nodes, columns: the
// cards' indices) coloured by the chosen metric, and how many cards are in each state, each count
// opening the list of its cards (links to them on the Topology page) and outlining their cells.
// A card is in the first state that holds: declared (its node has no agent), lost (its node is),
// throttled (its live sample reports a slowdown), serving (it carries a deployment's stage), idle.
import { getJSON } from "./api.js";
import { isThrottled, METRICS, reading } from "./device_metrics.js";
import { connectLive } from "./live.js";

const STATES = ["serving", "idle", "throttled", "lost", "declared"];
const STATE_LABEL = { declared: "declared (no agent)" };
const $ = (id) => document.getElementById(id);
const cardLink = (name) => `/topology/?q=${encodeURIComponent(name.split("/")[0])}`;

function servingDevices(topology) {
  const serving = new Set();
  for (const d of topology.deployments) for (const p of d.pipelines) for (const s of p.stages) serving.add(s.device);
  return serving;
}

export function cardState(node, device, sample, serving, slowdown) {
  if (node.status === "declared") return "declared";
  if (node.status === "lost") return "lost";
  if (isThrottled(sample, slowdown)) return "throttled";
  return serving.has(device.name) ? "serving" : "idle";
}

function drawGrid(grid, topology) {
  const columns = Math.max(1, ...topology.nodes.map((n) => n.devices.length));
  grid.style.gridTemplateColumns = `minmax(90px, 160px) repeat(${columns}, 18px)`;
  const cells = [document.createElement("span")];
  for (let i = 0; i < columns; i += 1) {
    const head = document.createElement("span");
    head.className = "col-head";
    head.textContent = i;
    cells.push(head);
  }
  for (const node of topology.nodes) {
    const name = document.createElement("a");
    name.className = "row-head";
    name.dataset.status = node.status;
    name.href = cardLink(node.name);
    name.textContent = node.name;
    name.title = `${node.name}: ${node.status === "declared" ? "declared (no agent)" : node.status}`;
    cells.push(name);
    for (let i = 0; i < columns; i += 1) {
      const device = node.devices[i];
      const cell = document.createElement(device ? "a" : "span");
      cell.className = device ? "cell" : "cell empty";
      if (device) {
        cell.href = cardLink(device.name);
        cell.dataset.device = device.name;
      }
      cells.push(cell);
    }
  }
  grid.replaceChildren(...cells);
}

function paint(grid, topology, snapshot, metricName) {
  const serving = servingDevices(topology), slowdown = topology.slowdown_reasons;
  const byState = Object.fromEntries(STATES.map((s) => [s, []]));
  const devices = new Map(topology.nodes.flatMap((n) => n.devices.map((d) => [d.name, [n, d]])));
  for (const cell of grid.querySelectorAll(".cell[data-device]")) {
    const [node, device] = devices.get(cell.dataset.device);
    const sample = snapshot.devices[device.name];
    const state = cardState(node, device, sample, serving, slowdown);
    const { value, colour, text } = reading(sample, metricName, slowdown);
    byState[state].push(device.name);
    cell.dataset.state = state;
    cell.dataset.value = value ?? "";
    cell.style.background = colour;
    cell.title = `${device.name}: ${device.model}, ${STATE_LABEL[state] || state}, ${METRICS[metricName].label} ${text}`;
  }
  return byState;
}

function showCounts(byState, picked, onPick) {
  const list = $("state-counts");
  list.replaceChildren(...STATES.map((state) => {
    const button = document.createElement("button");
    button.type = "button";
    button.className = `secondary state state-${state}${state === picked ? " picked" : ""}`;
    button.dataset.state = state;
    button.dataset.count = byState[state].length;
    button.textContent = `${STATE_LABEL[state] || state}: ${byState[state].length}`;
    button.addEventListener("click", () => onPick(state === picked ? null : state));
    const item = document.createElement("li");
    item.append(button);
    return item;
  }));
  const cards = $("state-cards");
  cards.replaceChildren(...(picked ? byState[picked] : []).map((name) => {
    const link = document.createElement("a");
    link.href = cardLink(name);
    link.textContent = name;
    return link;
  }));
  cards.hidden = !picked;
}

function main() {
  const grid = $("heatmap"), metric = $("heat-metric");
  let topology = JSON.parse($("topology-data").textContent);
  let last = { devices: {}, stages: {} }, picked = null;
  const refresh = () => {
    const byState = paint(grid, topology, last, metric.value);
    for (const cell of grid.querySelectorAll(".cell[data-device]")) cell.classList.toggle("picked", cell.dataset.state === picked);
    showCounts(byState, picked, (state) => { picked = state; refresh(); });
  };
  metric.addEventListener("change", refresh);
  drawGrid(grid, topology);
  refresh();
  grid.dataset.firstDrawMs = Math.round(performance.now());
  connectLive({
    onSnapshot(snapshot) { last = snapshot; refresh(); },
    async onResync() {
      topology = await getJSON("/dashboard/topology.json");
      drawGrid(grid, topology);
      refresh();
    },
  });
}

if ($("heatmap")) main();
