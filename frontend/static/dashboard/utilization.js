// Live time series per GPU and per stage (plotly, served locally). The last 5 minutes come from the
// server's memory and grow with every snapshot; the last hour comes from stored 10 s rollups.
// A chart with a `source` is drawn only for the devices or stages that report one of its fields
// (NVLink: cards with active NVLinks, or emulated ones in an NVLink island; prefix caching: stages
// that cache prefixes, the host tier only where a stage has one); with none it is not shown.
import { connectLive } from "./live.js";
import { getJSON } from "./api.js";
import { hitRatePct } from "./prefix.js";

const GIB = 2 ** 30;
const sum = (a, b) => (a == null && b == null ? null : (a || 0) + (b || 0));
const GPU_CHARTS = [
  { id: "chart-utilization", title: "GPU utilization (%)", value: (s) => s.utilization_pct, range: [0, 100] },
  { id: "chart-memory", title: "Memory used (GiB)", value: (s) => (s.memory_used_bytes == null ? null : s.memory_used_bytes / GIB) },
  { id: "chart-temperature", title: "Temperature (°C)", value: (s) => s.temperature_c },
  { id: "chart-power", title: "Power (W)", value: (s) => s.power_w },
  { id: "chart-pcie", title: "PCIe throughput, tx + rx (GB/s)", value: (s) => gb(sum(s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s)) },
  { id: "chart-nvlink", title: "NVLink throughput, tx + rx (GB/s)", value: (s) => gb(sum(s.nvlink_tx_bytes_per_s, s.nvlink_rx_bytes_per_s)),
    source: ["nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s"] },
];
const STAGE_CHARTS = [
  { id: "chart-tokens", title: "Tokens/s per stage", value: (s) => s.tokens_per_s },
  { id: "chart-queue", title: "Queue depth per stage", value: (s) => s.queue_depth },
  { id: "chart-kv", title: "KV cache used (%)", value: (s) => kvPct(s), range: [0, 100] },
  { id: "chart-prefix-hit", title: "Prefix cache hit rate since the stage started (%)", value: hitRatePct, range: [0, 100],
    source: ["prefix_queried_tokens"] },
  { id: "chart-prefix-blocks", title: "Prefix-cached KV blocks on the device", value: (s) => s.prefix_cached_blocks,
    source: ["prefix_cached_blocks"] },
  { id: "chart-prefix-host", title: "Prefix-cached KV blocks in host memory", value: (s) => s.prefix_host_blocks,
    source: ["prefix_host_blocks"] },
];
const LAYOUT = { margin: { l: 48, r: 12, t: 34, b: 34 }, legend: { orientation: "h", y: -0.18, font: { size: 10 } },
  font: { size: 11 }, xaxis: { type: "date" }, uirevision: "keep" };
const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
const MAX_POINTS = 300;

function gb(bytes) { return bytes == null ? null : bytes / 1e9; }
function kvPct(s) {
  const total = (s.kv_tokens_used ?? 0) + (s.kv_tokens_free ?? 0);
  return total ? (100 * s.kv_tokens_used) / total : null;
}
function rows(columns) {
  return columns.t.map((_, i) => Object.fromEntries(Object.keys(columns).map((k) => [k, columns[k][i]])));
}

const state = { topology: null, devices: [], stageKeys: [], chartKeys: {}, lastT: {}, live: true };

// Whether a series (columns) or a sample reports any of the chart's source fields.
const seriesHas = (columns, fields) => fields.some((f) => (columns?.[f] ?? []).some((v) => v != null));
const sampleHas = (sample, fields) => fields.some((f) => sample?.[f] != null);

function selectedDevices() {
  const node = document.getElementById("node-filter").value;
  return state.topology.nodes.filter((n) => !node || n.name === node).flatMap((n) => n.devices.map((d) => d.name));
}

function drawSeries(charts, keys, series) {
  for (const chart of charts) {
    const shown = chart.source ? keys.filter((key) => seriesHas(series[key], chart.source)) : keys;
    state.chartKeys[chart.id] = shown;
    const element = document.getElementById(chart.id);
    element.style.display = shown.length ? "" : "none";
    if (!shown.length) { Plotly.purge(element); continue; }
    const traces = shown.map((key) => {
      const points = series[key] ? rows(series[key]) : [];
      return { name: key, mode: "lines", type: "scatter", x: points.map((p) => new Date(p.t * 1000)), y: points.map(chart.value) };
    });
    const layout = { ...LAYOUT, title: { text: chart.title, font: { size: 13 } }, yaxis: chart.range ? { range: chart.range } : {} };
    Plotly.react(chart.id, traces, layout, CONFIG);
  }
}

async function resync() {
  const window = document.getElementById("window").value;
  state.live = window === "300";
  state.devices = selectedDevices();
  const query = (kind, keys) => `/dashboard/telemetry/?kind=${kind}&window=${window}` + keys.map((k) => `&key=${encodeURIComponent(k)}`).join("");
  const [devices, stages] = await Promise.all([getJSON(query("device", state.devices)), getJSON(query("stage", []))]);
  state.stageKeys = Object.keys(stages.series).sort();
  state.lastT = {};
  for (const [key, columns] of [...Object.entries(devices.series), ...Object.entries(stages.series)]) {
    state.lastT[key] = columns.t[columns.t.length - 1];
  }
  drawSeries(GPU_CHARTS, state.devices, devices.series);
  drawSeries(STAGE_CHARTS, state.stageKeys, stages.series);
}

function extend(charts, keys, samples) {
  const fresh = keys.filter((key) => samples[key] && samples[key].t > (state.lastT[key] ?? 0));
  if (!fresh.length) return;
  for (const chart of charts) {
    const shown = state.chartKeys[chart.id] ?? keys;  // trace i of the chart is shown[i]
    const points = fresh.map((key) => [shown.indexOf(key), samples[key]]).filter(([i]) => i >= 0);
    if (!points.length) continue;
    const x = points.map(([, s]) => [new Date(s.t * 1000)]);
    const y = points.map(([, s]) => [chart.value(s)]);
    Plotly.extendTraces(chart.id, { x, y }, points.map(([i]) => i), MAX_POINTS);
  }
  for (const key of fresh) state.lastT[key] = samples[key].t;
}

// A device or stage that starts reporting a chart's source (an NVLink card's first rate, a stage's
// first prefix-cache figure) needs its trace drawn.
function newSource(charts, keys, samples) {
  return charts.some((chart) => chart.source && keys.some(
    (key) => sampleHas(samples[key], chart.source) && !(state.chartKeys[chart.id] ?? []).includes(key)));
}

function drawStepSplit(stages) {
  const keys = Object.keys(stages).sort();
  const part = (f) => keys.map((k) => stages[k][f] ?? 0);
  const idle = keys.map((k) => (stages[k].step_ms ?? 0) * (stages[k].bubble_fraction ?? 0));
  Plotly.react("chart-step-split", [
    { type: "bar", name: "compute", y: keys, x: part("compute_ms"), orientation: "h", marker: { color: "#3c6fd1" } },
    { type: "bar", name: "transfer", y: keys, x: part("transfer_ms"), orientation: "h", marker: { color: "#d9822b" } },
    { type: "bar", name: "idle (bubble)", y: keys, x: idle, orientation: "h", marker: { color: "#b8c0cc" } },
  ], { ...LAYOUT, barmode: "stack", xaxis: { title: { text: "ms per step" } }, yaxis: { automargin: true },
    title: { text: "Step time split, latest", font: { size: 13 } } }, CONFIG);
}

function onSnapshot(snapshot) {
  document.getElementById("updated").textContent = new Date(snapshot.at * 1000).toLocaleTimeString();
  drawStepSplit(snapshot.stages);
  if (!state.live) return;
  const newStages = Object.keys(snapshot.stages).filter((k) => !state.stageKeys.includes(k));
  if (newStages.length || newSource(GPU_CHARTS, state.devices, snapshot.devices)
      || newSource(STAGE_CHARTS, state.stageKeys, snapshot.stages)) { resync(); return; }  // a new trace: redraw
  extend(GPU_CHARTS, state.devices, snapshot.devices);
  extend(STAGE_CHARTS, state.stageKeys, snapshot.stages);
}

function main() {
  state.topology = JSON.parse(document.getElementById("topology-data").textContent);
  for (const id of ["node-filter", "window"]) document.getElementById(id).addEventListener("change", resync);
  connectLive({ onSnapshot, onResync: resync });
}

main();
