// The Request traces page: recent sampled requests (GET /api/v1/traces/, the first paint embedded) and a
// waterfall of the one picked (GET /api/v1/traces/<id>/): a bar per span from its start to its end, each
// under its parent, coloured by the process that made it (gateway, head, other stages), failed ones red,
// its events as marks on its bar; a click on a bar or a mark shows the span's attributes.
import { getJSON } from "./api.js";
import { h } from "./dom.js";

const COLOURS = { gateway: "#4c78a8", head: "#f58518", stage: "#54a24b", error: "#e45756" };
const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
const ROW_PX = 26;

const list = document.querySelector("#trace-list tbody");
let shown = null;  // the trace drawn: {trace_id, spans, …}

const cell = (text, numeric) => h("td", { class: numeric ? "num" : false }, String(text ?? ""));

function drawList(traces) {
  if (!traces.length) {
    list.replaceChildren(h("tr", {}, h("td", { class: "empty", colspan: 7 }, "No sampled request kept yet.")));
    return;
  }
  list.replaceChildren(...traces.map((trace) => h("tr", {
    "data-trace": trace.trace_id, "aria-selected": String(shown?.trace_id === trace.trace_id),
    onclick: () => show(trace.trace_id),
  }, cell(new Date(trace.start_ns / 1e6).toLocaleTimeString()), cell(trace.name), cell(trace.model),
  h("td", { class: trace.error ? "bad" : false }, trace.outcome ?? (trace.error ? "error" : "")),
  cell(`${(trace.duration_s * 1000).toFixed(1)} ms`, true), cell(trace.spans, true),
  cell(trace.trace_id.slice(0, 12)))));
}

function process(span) {
  const role = span.resource["motley.role"];
  if (role !== "stage") return role ?? "?";
  return span.name === "head.request" ? "head" : "stage";
}

function where(span) {
  return span.resource["motley.stage"] ?? span.resource["motley.node"] ?? "";
}

function drawWaterfall(trace) {
  const spans = trace.spans;
  const rows = spans.map((_, i) => i);
  // Indented by depth (non-breaking spaces: SVG text collapses plain ones), a child marked as one.
  const labels = spans.map((s) => `${"\u00a0".repeat(3 * s.depth)}${s.depth ? "└ " : ""}${s.name} · ${where(s)}`);
  const bars = {
    type: "bar", orientation: "h", y: rows, base: spans.map((s) => s.offset_s * 1000),
    x: spans.map((s) => Math.max(s.duration_s * 1000, 0.05)), customdata: rows,
    marker: { color: spans.map((s) => (s.status_code === 2 ? COLOURS.error : COLOURS[process(s)] ?? "#999")) },
    hovertext: spans.map((s) => `${s.name} (${where(s)})<br>starts ${(s.offset_s * 1000).toFixed(2)} ms, `
      + `lasts ${(s.duration_s * 1000).toFixed(2)} ms`),
    hoverinfo: "text", name: "spans", showlegend: false,
  };
  const events = spans.flatMap((s, i) => s.events.map((e) => ({ row: i, at: e.offset_s * 1000, name: e.name })));
  const marks = {
    type: "scatter", mode: "markers", y: events.map((e) => e.row), x: events.map((e) => e.at),
    customdata: events.map((e) => e.row),
    text: events.map((e) => e.name), hovertemplate: "%{text} at %{x:.2f} ms<extra></extra>",
    marker: { symbol: "line-ns-open", size: 14, color: "#222" }, name: "events", showlegend: false,
  };
  const element = document.getElementById("trace-waterfall");
  element.hidden = false;
  const layout = {
    margin: { l: 300, r: 16, t: 10, b: 40 }, height: 70 + ROW_PX * spans.length, font: { size: 11 },
    xaxis: { title: { text: "ms from the request's start" }, zeroline: false },
    yaxis: { tickvals: rows, ticktext: labels, autorange: "reversed", automargin: true },
    bargap: 0.35,
  };
  Plotly.react(element, [bars, marks], layout, CONFIG);
  element.removeAllListeners?.("plotly_click");
  // A click shows the span of the bar or of the event mark under the pointer: plotly reports the mark
  // alone where one lies within its hover distance of the pointer, as on a short bar's middle.
  element.on("plotly_click", (event) => {
    const point = event.points.find((p) => p.customdata !== undefined);
    if (point) detail(spans[point.customdata]);
  });
}

function detail(span) {
  const pre = document.getElementById("span-detail");
  pre.hidden = false;
  pre.textContent = JSON.stringify({ name: span.name, span_id: span.span_id, parent_span_id: span.parent_span_id,
    status: span.status_code === 2 ? `error: ${span.status_message}` : "ok", attributes: span.attributes,
    events: span.events.map((e) => ({ name: e.name, at_ms: +(e.offset_s * 1000).toFixed(3), ...e.attributes })),
    resource: span.resource }, null, 2);
}

async function show(traceId) {
  const title = document.getElementById("trace-title");
  try {
    shown = await getJSON(`/api/v1/traces/${encodeURIComponent(traceId)}/`);
  } catch (error) {
    title.hidden = false;
    title.querySelector("code").textContent = `${traceId}: ${error.message}`;
    return;
  }
  title.hidden = false;
  title.querySelector("code").textContent = traceId;
  const link = document.getElementById("trace-ui");
  link.hidden = !shown.tracing_ui_url;
  if (shown.tracing_ui_url) link.href = shown.tracing_ui_url;
  for (const tr of list.querySelectorAll("tr[data-trace]")) {
    tr.setAttribute("aria-selected", String(tr.dataset.trace === traceId));
  }
  document.getElementById("span-detail").hidden = true;
  drawWaterfall(shown);
  history.replaceState(null, "", `?trace=${encodeURIComponent(traceId)}`);
}

async function refresh() {
  try {
    drawList((await getJSON("/api/v1/traces/")).traces);
  } catch (error) {
    console.warn("traces:", error.message);
  }
}

document.getElementById("traces-refresh").addEventListener("click", refresh);
drawList(JSON.parse(document.getElementById("traces-data").textContent));
const selected = JSON.parse(document.getElementById("trace-selected").textContent);
if (selected) show(selected);
