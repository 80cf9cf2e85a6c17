// The Deployments page's targets and demand (docs/dashboard.md, "Targets and demand"), redrawn from
// GET /api/v1/deployments/{id}/demand/ every REFRESH_MS without a reload: attainment and measured
// percentiles next to each target, the arrival rate, tokens/s, queue and KV use. The line under the
// figures says how old they are: when the API last answered, that the window holds no request, or,
// when it stops answering, that the figures are those of the last answer and since when.
import { getJSON } from "./api.js";

const REFRESH_MS = 4000;
const none = (v) => v === null || v === undefined;
const fixed = (v, digits) => Number(v).toFixed(digits);
const pct = (share) => `${Math.round(100 * share)} %`;
const clock = (at) => new Date(at).toISOString().slice(11, 19);

function drawRow(row, figures) {
  const set = (cell, text) => { row.querySelector(`[data-cell="${cell}"]`).textContent = text; };
  set("target", figures.target_ms ? `${figures.target_ms} ms at p${figures.percentile}` : "none");
  set("p95", none(figures.p95_ms) ? "—" : `${fixed(figures.p95_ms, 1)} ms`);
  set("p99", none(figures.p99_ms) ? "—" : `${fixed(figures.p99_ms, 1)} ms`);
  set("attainment", none(figures.attainment) ? "—" : pct(figures.attainment));
  row.querySelector('[data-cell="attainment"]').classList.toggle("missed", figures.met === false);
  set("samples", String(figures.samples));
}

// The same words as the server's first paint (templates/dashboard/demand.html).
function signalsText(m) {
  const heads = none(m.queue.head_queue) ? "" : `, in the heads' queues ${m.queue.head_queue}`;
  const wait = none(m.queue.wait_mean_ms) ? "—" : `${fixed(m.queue.wait_mean_ms, 0)} ms mean`;
  const kv = none(m.kv.use) ? "—" : `${pct(m.kv.use)} (fullest stage)`;
  const overall = none(m.overall.attainment) ? "—" : `${pct(m.overall.attainment)} of ${m.overall.ended} ended`;
  return `${fixed(m.arrival_rate, 2)} requests/s · ${fixed(m.prompt_tokens_per_s, 1)} prompt and ` +
    `${fixed(m.output_tokens_per_s, 1)} output tokens/s · waiting for a first token ${m.queue.waiting}${heads} ` +
    `· gateway wait ${wait} · KV use ${kv} · within every target ${overall}`;
}

function draw(section, m) {
  const table = section.querySelector("table[data-demand]");
  for (const name of ["ttft", "tpot"]) drawRow(table.querySelector(`tr[data-target="${name}"]`), m[name]);
  const covered = m.covered_s < m.window_s ? ` (records cover ${fixed(m.covered_s, 0)} s)` : "";
  section.querySelector("[data-demand-window]").textContent = `over the last ${m.window_s} s${covered}`;
  section.querySelector("[data-signals]").textContent = signalsText(m);
  const state = section.querySelector("[data-demand-state]");
  state.dataset.state = "live";
  state.dataset.at = String(m.at);
  state.className = "hint";
  state.textContent = `as of ${clock(1000 * m.at)} UTC${m.requests ? "" : ": no request in the window"}`;
}

function drawStale(section, error) {
  const state = section.querySelector("[data-demand-state]");
  const since = state.dataset.at ? `${clock(1000 * Number(state.dataset.at))} UTC` : "the page was served";
  state.dataset.state = "stale";
  state.className = "hint stale";
  state.textContent = `stale: the figures above are from ${since}; the demand API does not answer (${error.message})`;
}

async function refresh() {
  await Promise.all([...document.querySelectorAll("section.deployment")].map(async (section) => {
    if (!section.querySelector("table[data-demand]")) return;
    try {
      draw(section, await getJSON(`/api/v1/deployments/${section.dataset.deployment}/demand/`));
    } catch (error) {
      drawStale(section, error);
    }
  }));
}

export function startDemand() {
  refresh();
  setInterval(refresh, REFRESH_MS);
}
