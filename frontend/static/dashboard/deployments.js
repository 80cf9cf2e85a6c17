// Deployments page: measured figures from live stage statistics next to the predicted ones (prefix
// caching's hit rate and cached blocks, speculation's acceptance rate and tokens per step among them),
// and statuses and the caching and speculation switches refreshed
// from the REST API whenever the socket (re)connects. The events lists are the
// stored events (GET /api/v1/events/), redrawn on every (re)connect and every EVENTS_REFRESH_MS; the
// targets and demand figures from the demand API (demand.js).
import { connectLive } from "./live.js";
import { getJSON } from "./api.js";
import { startRouting } from "./routing.js";
import { startCalibration } from "./calibration.js";
import { startDemand } from "./demand.js";
import { cachedBlocksText, hitRateText } from "./prefix.js";
import { showCaching } from "./caching.js";
import { acceptanceText, showSpeculation, tokensPerStepText } from "./speculation.js";

const fmt = (v, digits = 1) => (v === undefined || v === null ? "—" : Number(v).toFixed(digits));

function onSnapshot(snapshot) {
  for (const section of document.querySelectorAll("section.deployment")) {
    const lastStage = {};  // pipeline -> stats of its last stage (its tokens/s is the pipeline's)
    let slowest = null;
    for (const row of section.querySelectorAll("tr[data-stage]")) {
      const stats = snapshot.stages[row.dataset.stage];
      if (!stats) continue;
      row.querySelector('[data-live="step_ms"]').textContent = fmt(stats.step_ms, 2);
      row.querySelector('[data-live="tokens_per_s"]').textContent = fmt(stats.tokens_per_s);
      row.querySelector('[data-live="queue_depth"]').textContent = fmt(stats.queue_depth, 0);
      const kvTotal = (stats.kv_tokens_used ?? 0) + (stats.kv_tokens_free ?? 0);
      row.querySelector('[data-live="kv"]').textContent = kvTotal ? `${fmt((100 * stats.kv_tokens_used) / kvTotal, 0)} %` : "—";
      row.querySelector('[data-live="prefix_hit_rate"]').textContent = hitRateText(stats);
      row.querySelector('[data-live="prefix_blocks"]').textContent = cachedBlocksText(stats);
      row.querySelector('[data-live="spec_acceptance"]').textContent = acceptanceText(stats);
      row.querySelector('[data-live="spec_tokens_per_step"]').textContent = tokensPerStepText(stats);
      if (stats.state) {
        const badge = row.querySelector('[data-field="state"]');
        badge.textContent = stats.state;
        badge.className = `status status-${stats.state}`;
      }
      const pipeline = row.dataset.pipeline, index = Number(row.dataset.index);
      if (!lastStage[pipeline] || lastStage[pipeline].index < index) lastStage[pipeline] = { index, stats };
      if (stats.step_ms !== undefined && (!slowest || stats.step_ms > slowest.step_ms)) slowest = { ...stats, key: row.dataset.stage };
    }
    const pipelines = Object.values(lastStage);
    if (!pipelines.length) continue;
    const tokens = pipelines.reduce((sum, p) => sum + (p.stats.tokens_per_s || 0), 0);
    section.querySelector('[data-measured="pipelines"]').textContent = pipelines.length;
    section.querySelector('[data-measured="tokens_per_s"]').textContent = fmt(tokens);
    const steps = [...section.querySelectorAll('[data-live="step_ms"]')].map((c) => Number(c.textContent)).filter((v) => !Number.isNaN(v));
    section.querySelector('[data-measured="latency"]').textContent = steps.length ? `${fmt(steps.reduce((a, b) => a + b, 0) / pipelines.length)} ms` : "—";
    section.querySelector('[data-measured="slowest"]').textContent = slowest ? `${slowest.key} · ${fmt(slowest.step_ms, 2)} ms` : "—";
  }
}

const EVENTS_REFRESH_MS = 10000;
const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const pad = (n) => String(n).padStart(2, "0");
// As the server renders it ("H:i:s d M", UTC).
const when = (iso) => {
  const t = new Date(iso);
  return `${pad(t.getUTCHours())}:${pad(t.getUTCMinutes())}:${pad(t.getUTCSeconds())} ${pad(t.getUTCDate())} ${MONTHS[t.getUTCMonth()]}`;
};

function drawEvents(list, events) {
  const items = events.map((e) => {
    const li = document.createElement("li");
    li.className = `event-${e.kind}`;
    li.title = e.kind_display;
    const at = document.createElement("span");
    at.className = "muted";
    at.textContent = when(e.at);
    li.append(at, ` ${e.message}`);
    return li;
  });
  if (!items.length) {
    const none = document.createElement("li");
    none.className = "muted";
    none.textContent = "none recorded";
    items.push(none);
  }
  list.replaceChildren(...items);
}

async function refreshEvents() {
  await Promise.all([...document.querySelectorAll("ul[data-events]")].map(async (list) => {
    const scope = list.dataset.events;
    const filter = scope === "fleet" ? "fleet=true" : `deployment=${scope}`;
    try {
      drawEvents(list, (await getJSON(`/api/v1/events/?${filter}&limit=${list.dataset.limit}`)).results);
    } catch (error) {
      console.warn("events:", error.message);
    }
  }));
}

// The precision a degraded plan lowered on the emergency quality budget, as the server renders it
// (deployments.degrade.precision_text): "" when none was.
function precisionText(p) {
  if (!p) return "";
  const layers = Object.entries(p.layers).sort((a, b) => b[0] - a[0])
    .map(([bits, count]) => `${count} layer(s) at ${bits} bits`).join(", ") || "no layer below 16 bits";
  const kl = p.kl === null ? "KL unmeasured" : `KL ${+p.kl.toPrecision(4)}`;
  return `; precision lowered: ${layers}, ${kl} of the emergency budget ${+p.max_kl.toPrecision(4)}`;
}

async function onResync() {
  refreshEvents();
  const page = await getJSON("/api/v1/deployments/?limit=1000");
  for (const deployment of page.results) {
    const section = document.querySelector(`section.deployment[data-deployment="${deployment.id}"]`);
    if (!section) { location.reload(); return; }  // a new deployment: the server renders it
    const badge = section.querySelector('[data-field="status"]');
    badge.textContent = deployment.status;
    badge.className = `status status-${deployment.status}`;
    section.querySelector('[data-field="status_message"]').textContent = deployment.status_message;
    const degraded = section.querySelector('[data-field="degraded"]'), d = deployment.degraded;
    degraded.hidden = !d;
    const replicas = d && d.planned.replicas !== d.asked.replicas ? `${d.planned.replicas} of ${d.asked.replicas} replicas, ` : "";
    degraded.textContent = d ? `Serving a degraded plan: ${replicas}${d.planned.batch} of ${d.asked.batch} sequences, context ${d.planned.context} of ${d.asked.context} tokens${precisionText(d.precision)}; the full plan is restored when the fleet fits it again.` : "";
    showCaching(section.querySelector("[data-caching]"), deployment.prefix_caching);
    showSpeculation(section.querySelector("[data-speculation]"), deployment);
    for (const stage of deployment.stages) {
      const cell = section.querySelector(`tr[data-stage="${stage.stage_key}"] [data-field="state"]`);
      if (cell) { cell.textContent = stage.state; cell.className = `status status-${stage.state}`; }
    }
  }
}

connectLive({ onSnapshot, onResync });
setInterval(refreshEvents, EVENTS_REFRESH_MS);
startRouting();
startCalibration();
startDemand();
