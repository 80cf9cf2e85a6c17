// Plan editor: edit the applied plan's placement, have every edit priced by the planner
// (POST /api/v1/plans/validate/), and apply a valid plan as a new revision after confirming the diff.
import { postJSON } from "./api.js";
import { h } from "./dom.js";
import { addRank, canAddRank, groupLabel, ranksOf, sharesRow, showGroupFigures } from "./group_editor.js";
import { bitsLabel, precisionLabel } from "./precision.js";
import { liveStages, REFRESH_MS, stagePredictions } from "./calibration.js";

const editor = JSON.parse(document.getElementById("editor-data").textContent);
// A revision stores its request in the plans API's own form (controlplane/deployments/requests.py),
// so the editor sends it back unchanged to validate, rebalance and apply.
const stored = editor.request || {};
const layers = editor.model.num_layers;
const placement = (plan) => ({ replicas: plan.replicas.map((r) => ({
  micro_batches: r.micro_batches, stages: r.stages.map((s) => ({ device: s.device, layers: [...s.layers], bits: s.bits,
    ...(s.low_bits ? { low_bits: s.low_bits, low_from: s.low_from } : {}),
    ...(s.group ? { group: s.group.map((g) => ({ ...g })) } : {}) })) })) });
const current = editor.plan && placement(editor.plan);
let edited = editor.plan && placement(editor.plan);
let check = null, checkSeq = 0, timer = null, live = {};
// The Rebalance proposal's placement: applied unchanged, it goes as the planner's (audited as a
// proposal accepted); once edited, as the operator's.
let proposed = null;

const GIB = 2 ** 30;
const fmt = (v, d = 1) => (v === undefined || v === null ? "—" : Number(v).toFixed(d));
// One colour per device, spread around the hue circle by the golden angle so neighbours differ.
const deviceIndex = new Map(editor.devices.map((d, i) => [d.name, i]));
function colour(name) {
  const i = deviceIndex.get(name) ?? 0;
  return `hsl(${(i * 137.5) % 360}, 55%, 42%)`;
}

const HEADINGS = ["", "device", "from layer", "to layer (excl.)", "precision", "last layers at", "from layer", "ranks"];

function renderTables() {
  const root = document.getElementById("stage-tables");
  const used = new Set(edited.replicas.flatMap((replica) => replica.stages.flatMap((s) => s.group ? s.group.map((g) => g.device) : [s.device])));
  const groups = { devices: editor.devices, layout: editor.model.layout, edit, span: HEADINGS.length };
  root.replaceChildren(...edited.replicas.map((replica, r) => {
    const rows = replica.stages.flatMap((stage, s) => [h("tr", { "data-replica": r, "data-stage": s },
      h("td", {}, `stage ${s}`),
      h("td", {}, h("select", { class: "device", "aria-label": `replica ${r} stage ${s} device`,
        onchange: (e) => edit(() => { stage.device = e.target.value; if (stage.group) stage.group[0].device = stage.device; }) },
        ...editor.devices.map((d) => h("option", { value: d.name, selected: d.name === stage.device },
          `${d.name} · ${d.model} · ${d.memory_gib} GiB${d.emulated ? " (emulated)" : ""}`)))),
      h("td", { class: "num" }, String(stage.layers[0])),
      h("td", {}, h("input", { type: "number", class: "end", min: 1, max: layers, value: stage.layers[1],
        "aria-label": `replica ${r} stage ${s} last layer (exclusive)`,
        onchange: (e) => edit(() => moveBoundary(replica, s, Number(e.target.value))) })),
      h("td", {}, h("select", { class: "bits", "aria-label": `replica ${r} stage ${s} precision`,
        onchange: (e) => edit(() => { stage.bits = Number(e.target.value); stage.group?.forEach((g) => { g.bits = stage.bits; }); }) },
        ...[16, 8, 4].map((b) => h("option", { value: b, selected: b === stage.bits }, bitsLabel(b))))),
      h("td", {}, h("select", { class: "low-bits", "aria-label": `replica ${r} stage ${s} precision of its last layers`,
        onchange: (e) => edit(() => setLowBits(stage, Number(e.target.value))) },
        ...[0, 8, 4].map((b) => h("option", { value: b, selected: b === (stage.low_bits || 0) }, b ? bitsLabel(b) : "—")))),
      h("td", {}, h("input", { type: "number", class: "low-from", min: stage.layers[0] + 1, max: stage.layers[1] - 1,
        value: stage.low_from ?? "", disabled: !stage.low_bits, "aria-label": `replica ${r} stage ${s} first layer at the lower precision`,
        onchange: (e) => edit(() => { stage.low_from = Number(e.target.value); }) })),
      h("td", {}, h("button", { type: "button", class: "secondary add-rank", "aria-label": `replica ${r} stage ${s} add a rank`,
        disabled: !canAddRank(stage, editor.devices, editor.model.layout, used),
        title: "split the stage's layers with another card of its node (tensor parallel)",
        onclick: () => edit(() => addRank(stage, editor.devices, editor.model.layout, used)) }, "+ rank"))),
    ...(stage.group ? [sharesRow(stage, r, s, groups)] : [])]);
    return h("table", { class: "grid replica-table" },
      h("caption", {}, `Replica ${r}`),
      h("thead", {}, h("tr", {}, ...HEADINGS.map((t) => h("th", {}, t)))),
      h("tbody", {}, ...rows));
  }));
}

// A stage may run its last layers at a lower precision; "—" keeps one precision. A new split starts
// half-way through the stage; the planner's check says whether it is allowed and what it buys.
function setLowBits(stage, bits) {
  if (!bits) { delete stage.low_bits; delete stage.low_from; return; }
  stage.low_bits = bits;
  stage.low_from ??= Math.floor((stage.layers[0] + stage.layers[1] + 1) / 2);
}

function moveBoundary(replica, s, end) {
  replica.stages[s].layers[1] = end;
  if (replica.stages[s + 1]) replica.stages[s + 1].layers[0] = end;  // the next stage starts where this one ends
}

function bar(replica, label) {
  return h("div", {}, h("div", { class: "muted" }, label),
    h("div", { class: "bar" }, ...replica.stages.map((s) => {
      const width = Math.max(0, s.layers[1] - s.layers[0]) / layers * 100;
      return h("div", { style: `width:${width}%;background:${colour(s.device)}`, title: `${s.device} layers [${s.layers[0]}, ${s.layers[1]}) ${precisionLabel(s)}${groupLabel(s)}` },
        `${ranksOf(s)} ${s.layers[0]}–${s.layers[1]} ${s.bits === 16 && !s.low_bits ? "" : precisionLabel(s)}`);
    })));
}

function renderBars() {
  document.getElementById("bars").replaceChildren(...edited.replicas.flatMap((replica, r) => [
    bar(current.replicas[r] || { stages: [] }, `replica ${r} · current`), bar(replica, `replica ${r} · edited`)]));
}

function renderCheck() {
  const status = document.getElementById("check-status");
  const problems = document.getElementById("problems");
  const changed = diff().length > 0;
  if (!check) { status.className = ""; status.textContent = "checking…"; return; }
  problems.replaceChildren(...check.problems.map((p) => h("li", { "data-code": p.code }, p.message)));
  status.className = check.valid ? "ok" : "error";
  status.textContent = check.valid ? (changed ? "valid: this plan can be applied" : "valid (no change yet)")
    : `${check.problems.length} problem${check.problems.length === 1 ? "" : "s"}: this plan cannot be applied`;
  // A plan posted without figures (an API client's edit) has no "current" column until priced.
  const applied = editor.plan.predicted ? editor.plan : null;
  const columns = [applied, check.predicted, check.reference];
  for (const row of document.querySelectorAll("#figures tr[data-figure]")) {
    const key = row.dataset.figure;
    const cells = row.querySelectorAll("td");
    columns.forEach((plan, i) => {
      cells[i + 1].textContent = !plan ? "—" : key === "bottleneck"
        ? `${plan.bottleneck.device} · ${plan.bottleneck.resource}` : fmt(plan.predicted[key], key === "decode_tokens_per_s" ? 1 : 2);
    });
    if (key === "decode_tokens_per_s" && check.predicted && applied) {
      const delta = check.predicted.predicted[key] - editor.plan.predicted[key];
      cells[2].className = delta > 0.05 ? "better" : delta < -0.05 ? "worse" : "";
    }
  }
  renderMemory();
  renderPredictions();
  showGroupFigures(check.predicted);
  document.getElementById("apply").disabled = !(check.valid && changed);
}

// Per stage of the edited plan: compute ms raw (first principles) and calibrated (x the device's
// measured factor, which the planner priced it with), and what the stage running there measures.
function renderPredictions() {
  const root = document.getElementById("stage-predictions");
  if (!check?.predicted) { root.replaceChildren(); return; }
  root.replaceChildren(...stagePredictions(check.predicted, live, editor.deployment.id).map((row) =>
    h("tr", { "data-device": row.device }, h("td", {}, row.label), h("td", {}, row.device),
      h("td", { class: "num" }, fmt(row.raw, 3)), h("td", { class: "num" }, row.factor),
      h("td", { class: "num" }, fmt(row.calibrated, 3)),
      h("td", { class: "num" }, row.measured, h("div", { class: "hint" }, row.there)))));
}

async function refreshLive() {
  live = await liveStages(editor.deployment.id);
  renderPredictions();
}

function renderMemory() {
  const root = document.getElementById("memory");
  if (!check.predicted) { root.replaceChildren(h("p", { class: "hint" }, "the edited plan cannot be priced until its structure is fixed")); return; }
  root.replaceChildren(...check.predicted.replicas.flatMap((r) => r.stages).map((s) => {
    // Weights and workspace are fixed; the planner gives the KV cache whatever is left, so the
    // bar shows what the layers take and how much room the cache keeps (a group's: summed over its ranks).
    const { weights_bytes: weights, workspace_bytes: workspace, kv_bytes: kv, total_bytes: used, capacity_bytes: cap } = s.memory;
    const over = used > cap;
    const pct = (bytes) => `${Math.min(100, (100 * bytes) / Math.max(cap, used))}%`;
    return h("div", { class: `memory-row${over ? " over" : ""}`, "data-device": s.device },
      h("span", {}, ranksOf(s)),
      h("div", { class: "track", title: `weights ${fmt(weights / GIB, 2)} GiB, workspace ${fmt(workspace / GIB, 2)} GiB, KV cache ${fmt(kv / GIB, 2)} GiB (${s.kv_tokens} tokens) of ${fmt(cap / GIB, 2)} GiB usable` },
        h("div", { class: "fill weights", style: `width:${pct(weights)}` }),
        h("div", { class: "fill workspace", style: `width:${pct(workspace)}` }),
        h("div", { class: "fill kv", style: `width:${pct(kv)}` })),
      h("span", { class: "num" }, `${fmt(weights / GIB)} weights · ${fmt(cap / GIB)} GiB`));
  }));
}

function diff() {
  const lines = [];
  edited.replicas.forEach((replica, r) => replica.stages.forEach((s, i) => {
    const before = current.replicas[r]?.stages[i];
    const describe = (x) => `${x.device} [${x.layers[0]}, ${x.layers[1]}) ${precisionLabel(x)}${groupLabel(x)}`;
    if (!before) lines.push(`replica ${r} stage ${i}: new, ${describe(s)}`);
    else if (describe(before) !== describe(s)) lines.push(`replica ${r} stage ${i}: ${describe(before)} → ${describe(s)}`);
  }));
  return lines;
}

async function validate() {
  const seq = ++checkSeq;
  check = null;
  document.getElementById("apply").disabled = true;
  renderCheck();
  try {
    const result = await postJSON("/api/v1/plans/validate/",
      { ...stored, model: editor.model.id, deployment: editor.deployment.id, plan: edited });
    if (seq === checkSeq) { check = result; renderCheck(); }
  } catch (error) {
    if (seq !== checkSeq) return;
    check = { valid: false, problems: [{ code: "request", message: error.message }], predicted: null, reference: null };
    renderCheck();
  }
}

// An edit makes the last check stale at once: it reads "checking…" and Apply waits for the next one.
// A check still in flight priced the plan before this edit, so its answer is dropped: taken, it would
// enable Apply for a plan other than the one shown, and Apply posts the checked plan.
function edit(change) {
  change();
  checkSeq += 1;
  check = null;
  document.getElementById("apply").disabled = true;
  renderCheck();
  renderTables();
  renderBars();
  clearTimeout(timer);
  timer = setTimeout(validate, 150);
}

function main() {
  document.getElementById("reset").addEventListener("click", () => {
    document.getElementById("proposal").hidden = true;
    edit(() => { edited = placement(editor.plan); });
  });

  document.getElementById("rebalance").addEventListener("click", async () => {
    const proposal = document.getElementById("proposal");
    proposal.hidden = false;
    proposal.className = "card";
    proposal.textContent = "asking the planner for a fresh plan from current health and calibration…";
    try {
      const plan = await postJSON("/api/v1/plans/",
        { ...stored, model: editor.model.id, deployment: editor.deployment.id });
      const blockers = plan.deploy_blockers.length ? ` Applying it would be refused now: ${plan.deploy_blockers.join("; ")}.` : "";
      proposal.textContent = `Proposal from the planner: ${fmt(plan.predicted.decode_tokens_per_s)} tokens/s predicted, ` +
        `bottleneck ${plan.bottleneck.device}. Review it below and apply it, or reset.${blockers}`;
      edit(() => { edited = placement(plan); });
      proposed = JSON.stringify(edited);
    } catch (error) {
      proposal.className = "card error";
      proposal.textContent = `The planner found no plan: ${error.message}`;
    }
  });

  document.getElementById("apply").addEventListener("click", () => {
    document.getElementById("diff").replaceChildren(...diff().map((line) => h("li", { class: "changed" }, line)));
    document.getElementById("confirm").showModal();
  });

  document.getElementById("confirm").addEventListener("close", async (event) => {
    if (event.target.returnValue !== "apply" || !check?.valid) return;
    const result = document.getElementById("apply-result");
    result.className = "";
    result.textContent = "applying…";
    try {
      const deployment = await postJSON(`/api/v1/deployments/${editor.deployment.id}/apply/`,
        { plan: check.predicted, request: stored, source: proposed === JSON.stringify(edited) ? "planner" : "edited" });
      result.className = "ok";
      result.textContent = `applied as revision ${deployment.revision_number}; the controller is moving the stages`;
      setTimeout(() => { location.href = "/deployments/"; }, 800);
    } catch (error) {
      result.className = "error";
      result.textContent = `refused: ${error.message}`;
    }
  });

  renderTables();
  renderBars();
  validate();
  refreshLive();
  setInterval(refreshLive, REFRESH_MS);
}

if (editor.plan) main();
