// The Usage page: totals per API key, user or model and a stacked time chart (plotly, served locally),
// from GET /api/v1/usage/ (the first paint is the same report, embedded). Redrawn when the grouping,
// window or metric change and every 30 s; the CSV link follows the same query.
import { getJSON } from "./api.js";

const REFRESH_MS = 30_000;
const COUNTS = ["requests", "prompt_tokens", "completion_tokens", "total_tokens", "errors", "refused"];
const BUCKET_MS = { minute: 60_000, hour: 3_600_000, day: 86_400_000 };
const HEADINGS = { key: "API key", user: "User", model: "Model" };
const METRICS = { total_tokens: "Tokens (prompt + completion)", requests: "Requests", errors: "Errors",
  refused: "Refused by limits" };
const LAYOUT = { margin: { l: 56, r: 12, t: 34, b: 40 }, legend: { orientation: "h", y: -0.2, font: { size: 10 } },
  font: { size: 11 }, barmode: "stack", xaxis: { type: "date" }, uirevision: "keep" };
const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

const controls = {
  groupBy: document.getElementById("group-by"),
  span: document.getElementById("span"),
  metric: document.getElementById("metric"),
};
let report = JSON.parse(document.getElementById("usage-data").textContent);

function query() {
  const [seconds, bucket] = controls.span.value.split(":");
  const until = new Date();
  const since = new Date(until.getTime() - Number(seconds) * 1000);
  return new URLSearchParams({ group_by: controls.groupBy.value, bucket, since: since.toISOString(),
    until: until.toISOString() });
}

function drawChart() {
  const metric = controls.metric.value;
  const groups = [...new Set(report.series.map((row) => row.group))];
  const span = BUCKET_MS[report.bucket];
  const traces = groups.map((group) => {
    const rows = report.series.filter((row) => row.group === group);
    // Each bar covers its bucket: centred on it, 90 % of its width (a date axis counts in ms).
    return { type: "bar", name: group, x: rows.map((row) => new Date(Date.parse(row.bucket_start) + span / 2)),
      y: rows.map((row) => row[metric]), width: rows.map(() => span * 0.9),
      hovertemplate: `%{y} ${metric.replace("_", " ")}<extra>${group}</extra>` };
  });
  const title = `${METRICS[metric]} per ${report.bucket} (UTC)`;
  Plotly.react("usage-chart", traces, { ...LAYOUT, title: { text: title, font: { size: 13 } },
    xaxis: { type: "date", range: [Math.floor(Date.parse(report.since) / span) * span,
      Math.ceil(Date.parse(report.until) / span) * span] } }, CONFIG);
}

function cell(text, numeric) {
  const td = document.createElement("td");
  td.textContent = text ?? "";
  if (numeric) td.className = "num";
  return td;
}

function drawTable() {
  document.getElementById("group-heading").textContent = HEADINGS[report.group_by];
  const body = document.querySelector("#usage-totals tbody");
  body.replaceChildren(...report.totals.map((row) => {
    const tr = document.createElement("tr");
    tr.append(cell(row.group), cell(row.user), ...COUNTS.map((name) => cell(row[name], true)));
    return tr;
  }));
  if (!report.totals.length) {
    const tr = document.createElement("tr");
    const td = cell("No usage in this window.");
    td.colSpan = 8;
    td.className = "empty";
    tr.append(td);
    body.append(tr);
  }
  for (const td of document.querySelectorAll("#usage-totals [data-total]")) {
    td.textContent = report.total[td.dataset.total];
  }
}

function draw() {
  drawChart();
  drawTable();
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
}

async function refresh() {
  const params = query();
  document.getElementById("csv-link").href = `/api/v1/usage/?format=csv&${params}`;
  try {
    report = await getJSON(`/api/v1/usage/?${params}`);
    draw();
  } catch (error) {
    document.getElementById("updated").textContent = `failed: ${error.message}`;
  }
}

for (const control of [controls.groupBy, controls.span]) control.addEventListener("change", refresh);
controls.metric.addEventListener("change", drawChart);
document.getElementById("csv-link").href = `/api/v1/usage/?format=csv&${query()}`;
draw();
setInterval(refresh, REFRESH_MS);
