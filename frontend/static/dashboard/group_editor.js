// The plan editor's tensor-parallel groups (docs/dashboard.md, "Plan editor"): a group stage's shares
// under its row, each rank's device, key-value heads, MLP columns and precision editable, ranks added
// and removed among the node's devices. The editor keeps the stage's device its first rank's; whether
// the shares add up is the planner's what-if check's to say, so an edit never fixes a count silently.
import { h } from "./dom.js";
import { bitsLabel } from "./precision.js";

const nodeOf = (devices, name) => devices.find((d) => d.name === name)?.node;

// Diff lines and bar titles name every rank's share, so a share edit reads as a change.
export const groupLabel = (stage) => (stage.group
  ? ` · ranks ${stage.group.map((g) => `${g.device} ${g.kv_heads} heads ${g.columns} columns ${bitsLabel(g.bits)}`).join(", ")}`
  : "");

// The devices a stage runs on, as bars and memory rows name it: "node-a/gpu2 + node-a/gpu3".
export const ranksOf = (stage) => (stage.group ? stage.group.map((g) => g.device).join(" + ") : stage.device);

// A device of the stage's node that is not one of its ranks yet: one no other stage uses first.
function spareDevice(stage, devices, used) {
  const node = nodeOf(devices, stage.device);
  const ranks = new Set((stage.group || []).map((g) => g.device).concat(stage.device));
  const free = devices.filter((d) => d.node === node && !ranks.has(d.name));
  return (free.find((d) => !used.has(d.name)) || free[0])?.name;
}

export const canAddRank = (stage, devices, layout, used) => Boolean(layout && spareDevice(stage, devices, used));

// A new rank takes half of the heads and half of the columns (whole int4 groups) of the ranks that hold
// the most, so the counts still add up; a stage on one card becomes a group of two.
export function addRank(stage, devices, layout, used) {
  const device = spareDevice(stage, devices, used);
  stage.group ??= [{ device: stage.device, kv_heads: layout.kv_heads, columns: layout.columns, bits: stage.bits }];
  const most = (key) => stage.group.reduce((a, b) => (b[key] > a[key] ? b : a));
  const heads = most("kv_heads"), wide = most("columns");
  const kv = Math.floor(heads.kv_heads / 2);
  const columns = Math.floor(wide.columns / 2 / layout.block) * layout.block;
  heads.kv_heads -= kv;
  wide.columns -= columns;
  stage.group.push({ device, kv_heads: kv, columns, bits: stage.bits });
}

// A removed rank's heads and columns go to the first rank; with one rank left the stage is on one card.
export function removeRank(stage, i) {
  const [gone] = stage.group.splice(i, 1);
  stage.group[0].kv_heads += gone.kv_heads;
  stage.group[0].columns += gone.columns;
  stage.device = stage.group[0].device;
  if (stage.group.length === 1) delete stage.group;
}

function share(stage, g, i, label, onNode, edit) {
  const number = (key, text, attrs = {}) => h("input", { type: "number", class: key.replace("_", "-"), min: 0,
    value: g[key], "aria-label": `${label} ${text}`, ...attrs,
    onchange: (e) => edit(() => { g[key] = Number(e.target.value); }) });
  const options = onNode.some((d) => d.name === g.device) ? onNode : [{ name: g.device, model: "?" }, ...onNode];
  return h("tr", { "data-rank": i },
    h("td", {}, `rank ${i}`),
    h("td", {}, h("select", { class: "rank-device", "aria-label": `${label} device`,
      onchange: (e) => edit(() => { g.device = e.target.value; if (i === 0) stage.device = g.device; }) },
      ...options.map((d) => h("option", { value: d.name, selected: d.name === g.device }, `${d.name} · ${d.model}`)))),
    h("td", {}, number("kv_heads", "kv heads")),
    h("td", {}, number("columns", "MLP columns")),
    h("td", {}, h("select", { class: "rank-bits", "aria-label": `${label} precision`,
      onchange: (e) => edit(() => { g.bits = Number(e.target.value); }) },
      ...[16, 8, 4].map((b) => h("option", { value: b, selected: b === g.bits }, bitsLabel(b))))),
    h("td", {}, h("button", { type: "button", class: "secondary remove-rank", "aria-label": `${label} remove`,
      onclick: () => edit(() => removeRank(stage, i)) }, "remove")));
}

// The row under a group stage: its shares, their sums against the model's, and the predicted figures
// (filled by showGroupFigures once the check answers).
export function sharesRow(stage, r, s, { devices, layout, edit, span }) {
  const node = nodeOf(devices, stage.device);
  const onNode = devices.filter((d) => d.node === node);
  const total = (key) => stage.group.reduce((sum, g) => sum + g[key], 0);
  const sums = layout ? `kv heads ${total("kv_heads")} of ${layout.kv_heads} · MLP columns ${total("columns")} of ` +
    `${layout.columns} (a rank at int4 holds whole groups of ${layout.block})` : "";
  return h("tr", { class: "shares", "data-replica": r, "data-stage": s }, h("td", { colspan: span },
    h("table", { class: "grid shares-table" },
      h("caption", {}, `stage ${s}: tensor-parallel group of ${stage.group.length} cards on ${node ?? "an unknown node"}`),
      h("thead", {}, h("tr", {}, ...["", "device", "kv heads", "MLP columns", "precision", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, ...stage.group.map((g, i) => share(stage, g, i, `replica ${r} stage ${s} rank ${i}`, onNode, edit)))),
    h("p", { class: "hint group-sums" }, sums),
    h("p", { class: "group-figures", "data-replica": r, "data-stage": s }, "checking…")));
}

// Each group's predicted decode step and the link its all-reduces cross, from the check's priced plan.
export function showGroupFigures(predicted) {
  for (const box of document.querySelectorAll(".group-figures")) {
    const stage = predicted?.replicas[Number(box.dataset.replica)]?.stages[Number(box.dataset.stage)];
    if (!stage?.group) { box.textContent = "not priced until the plan's problems are fixed"; continue; }
    const link = stage.group_link;
    box.textContent = `predicted step ${stage.predicted.step_ms.toFixed(3)} ms (compute ${stage.predicted.compute_ms.toFixed(3)} ms)` +
      (link ? ` · group link ${link.kind}, ${link.bandwidth_gbs} GB/s` : "");
  }
}
