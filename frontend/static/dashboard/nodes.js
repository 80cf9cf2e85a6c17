// The Nodes page's actions on a node's intent: cordon, uncordon, drain, undrain, each after a
// confirmation, through POST /api/v1/nodes/<id>/<action>/ (docs/api.md, "Node intent"); the page
// reloads to show the node as the control plane now has it. A refusal is shown with its reason.
import { postJSON } from "./api.js";

const EXPLAIN = {
  cordon: "No new stage will be placed on it. The stages running there stay; a later plan of their " +
    "deployment (an edit, a re-plan) goes around it.",
  uncordon: "New stages may be placed on it again.",
  drain: "Every deployment with a stage on it is re-planned without it, and its stages move off " +
    "(make before break). Refused, with the reason, if one of them does not fit without it.",
  undrain: "New stages may be placed on it again. The stages moved off it do not come back by " +
    "themselves: a rebalance or a new deployment may use it.",
};

const dialog = document.getElementById("node-confirm");
const result = document.getElementById("node-action-result");
let pending = null;

for (const button of document.querySelectorAll("#nodes-table button[data-action]")) {
  button.addEventListener("click", () => {
    const { action, nodeId, nodeName } = button.dataset;
    pending = { action, nodeId, nodeName };
    document.getElementById("node-confirm-title").textContent =
      `${action[0].toUpperCase()}${action.slice(1)} node ${nodeName}?`;
    document.getElementById("node-confirm-explain").textContent = EXPLAIN[action];
    document.getElementById("node-confirm-ok").textContent = action[0].toUpperCase() + action.slice(1);
    dialog.returnValue = "";  // Escape leaves it as it is: never the last confirmation
    dialog.showModal();
  });
}

dialog.addEventListener("close", async () => {
  const chosen = pending;
  pending = null;
  if (dialog.returnValue !== "confirm" || !chosen) return;
  result.className = "";
  result.textContent = `${chosen.action}: ${chosen.nodeName}…`;
  try {
    // A body, even empty, so that api.js sends the CSRF header (it adds it only with a body).
    const answer = await postJSON(`/api/v1/nodes/${chosen.nodeId}/${chosen.action}/`, {});
    const moved = answer.deployments.length ? `; re-planned: ${answer.deployments.map((d) => d.name).join(", ")}` : "";
    result.className = "ok";
    result.textContent = answer.changed
      ? `node ${answer.node.name} is ${answer.node.intent}${moved}`
      : `node ${answer.node.name} already was ${answer.node.intent}: nothing to do`;
    setTimeout(() => location.reload(), 800);
  } catch (error) {
    result.className = "error";
    result.textContent = `refused: ${error.message}`;
  }
});
