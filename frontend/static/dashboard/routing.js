// Deployments page, "Routing": what the gateway's router uses for each replica of a deployment now
// (health and why, throttling, memory, errors, costs and where they come from, free KV, load,
// telemetry age) and its recent decisions with the inputs it saw for every replica, from
// GET /api/v1/gateway/router/ every REFRESH_MS (docs/gateway.md, "Live inputs"); and the gateway's
// queue of requests waiting for a routable replica of the deployment's model, and migrations
// (docs/gateway.md, "Waiting for a replica", "Request migration").
import { getJSON } from "./api.js";

const REFRESH_MS = 2000;
const DECISIONS_SHOWN = 8;
const fmt = (v, digits = 1) => (v === undefined || v === null ? "—" : Number(v).toFixed(digits));
const pct = (v) => (v === undefined || v === null ? "—" : `${Math.round(100 * v)} %`);

function cell(text, className = "") {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function badge(ok, reason) {
  const td = document.createElement("td");
  const span = document.createElement("span");
  span.className = `status status-${ok ? "healthy" : "unhealthy"}`;
  span.textContent = ok ? "healthy" : "avoided";
  td.append(span);
  if (!ok && reason) {
    const why = document.createElement("div");
    why.className = "hint";
    why.textContent = reason;
    td.append(why);
  }
  return td;
}

// The replicas of deployment ``id`` among every served model's: pipeline ids are "d<id>-r<n>".
function replicasOf(stats, id) {
  const found = [];
  for (const model of Object.values(stats.models)) {
    for (const [name, replica] of Object.entries(model.replicas)) {
      if (name.startsWith(`d${id}-`)) found.push({ name, strategy: model.strategy, ...replica });
    }
  }
  return found.sort((a, b) => a.name.localeCompare(b.name));
}

function replicaRow(replica, routed) {
  const r = replica.router;
  const tr = document.createElement("tr");
  tr.dataset.replica = replica.name;
  const devices = r.telemetry.devices || [];
  const throttle = devices.filter((d) => d.throttle > 0).map((d) => `${d.device} ${pct(d.throttle)} (${d.throttle_reasons.join(", ")})`);
  const age = r.telemetry.age_s ?? null;
  tr.append(
    cell(replica.name), badge(r.healthy, r.reason),
    cell(throttle.length ? throttle.join("; ") : pct(r.health.throttle)), cell(pct(r.health.memory_pressure), "num"),
    cell(pct(r.health.error_rate), "num"), cell(`×${fmt(r.slowdown, 2)}`, "num"),
    cell(`${fmt(1000 * r.costs.decode_step_s, 2)} ms`, "num"),
    cell(r.costs_source + (r.calibration.factor ? ` ×${fmt(r.calibration.factor, 2)}` : "")),
    cell(`${r.kv_free} / ${r.kv_capacity}`, "num"), cell(String(r.in_flight), "num"),
    cell(r.head ? fmt(r.head.queue_depth, 0) : "—", "num"),
    cell(r.telemetry.expected ? (age === null ? "none" : `${fmt(age, 1)} s`) : "not used", "num"),
    cell(String(routed[replica.name] || 0), "num"),
  );
  return tr;
}

function decisionRow(record, own) {
  const tr = document.createElement("tr");
  const at = new Date(record.at * 1000).toISOString().slice(11, 19);
  const went = record.replica || record.outcome.replace("rejected:", "refused: ");
  const seen = record.inputs.filter((i) => own.has(i.replica)).map((i) => {
    const est = i.estimated_finish_s === null ? "" : ` ${fmt(i.estimated_finish_s, 2)} s`;
    const why = i.reason ? ` — ${i.reason}` : "";
    return `${i.replica}:${est} ×${fmt(i.slowdown, 2)} ${i.costs_source}${why}`;
  });
  tr.append(cell(at), cell(record.strategy), cell(went), cell(record.outcome), cell(seen.join(" · ")));
  return tr;
}

// One line: requests of ``model`` waiting now, past waits and how they ended, requests migrated.
function waitingLine(stats, model) {
  const served = stats.models[model];
  if (!served) return "Gateway queue: model not served by the gateway";
  const w = served.waiting;
  const migrated = stats.router.totals
    .filter((t) => t.model === model && t.outcome === "migrated")
    .reduce((n, t) => n + t.count, 0);
  const parts = [
    `${w.depth} waiting now${w.oldest_s === null ? "" : ` (oldest ${fmt(w.oldest_s)} s)`}`,
    `${w.waited} waited (longest ${fmt(w.longest_s)} s, mean ${fmt(w.avg_s)} s)`,
    `${w.timed_out} timed out`, `${w.full} refused with the queue full`, `${migrated} migrated`,
  ];
  return `Gateway queue: ${parts.join(" · ")}${served.reason ? ` — ${served.reason}` : ""}`;
}

function draw(stats) {
  for (const line of document.querySelectorAll("[data-waiting]")) {
    line.textContent = waitingLine(stats, line.dataset.model);
  }
  for (const table of document.querySelectorAll("table[data-routing]")) {
    const id = table.dataset.routing;
    const replicas = replicasOf(stats, id);
    const own = new Set(replicas.map((r) => r.name));
    const recent = stats.router.recent.filter((rec) => rec.inputs.some((i) => own.has(i.replica)));
    const routed = {};
    for (const rec of recent) if (rec.replica) routed[rec.replica] = (routed[rec.replica] || 0) + 1;
    const rows = replicas.map((r) => replicaRow(r, routed));
    if (!rows.length) rows.push(Object.assign(document.createElement("tr"), { innerHTML: '<td colspan="13" class="empty">not served by the gateway</td>' }));
    table.tBodies[0].replaceChildren(...rows);
    const decisions = document.querySelector(`table[data-decisions="${id}"]`);
    if (decisions) {
      const last = recent.slice(-DECISIONS_SHOWN).reverse().map((rec) => decisionRow(rec, own));
      if (!last.length) last.push(Object.assign(document.createElement("tr"), { innerHTML: '<td colspan="5" class="empty">no request yet</td>' }));
      decisions.tBodies[0].replaceChildren(...last);
    }
  }
}

export function startRouting() {
  if (!document.querySelector("table[data-routing]")) return;
  const refresh = async () => {
    try {
      draw(await getJSON("/api/v1/gateway/router/"));
    } catch (error) {
      console.warn("routing:", error.message);
    }
  };
  refresh();
  setInterval(refresh, REFRESH_MS);
}
