// The rebalance policy's open proposal of each deployment (docs/dashboard.md, "Rebalance proposals"):
// every [data-proposal="<deployment id>"] box shows it (trigger, reason, predicted gain, what moves,
// and a demand proposal's prediction at the forecast load: forecast.js) with Accept and Dismiss, or
// stays hidden when there is none. Accepting applies the plan
// (POST /api/v1/rebalance-proposals/{id}/accept/) and reloads the page on the new revision.
import { getJSON, postJSON } from "./api.js";
import { forecastTable } from "./forecast.js";

const REFRESH_MS = 10000;

const layers = (range) => (range ? `[${range[0]}, ${range[1]})` : "—");

function describe(change) {
  const parts = [`r${change.replica} s${change.stage}`];
  if (change.device) parts.push(`${change.device[0] ?? "—"} → ${change.device[1] ?? "—"}`);
  if (change.layers) parts.push(`layers ${layers(change.layers[0])} → ${layers(change.layers[1])}`);
  if (change.precision) parts.push(`${change.precision[0] ?? "—"} → ${change.precision[1] ?? "—"}`);
  return parts.join(" · ");
}

function draw(box, proposal) {
  if (!proposal) { box.hidden = true; box.replaceChildren(); return; }
  const head = document.createElement("p");
  const gain = `${proposal.gain >= 0 ? "+" : ""}${(100 * proposal.gain).toFixed(0)} %`;
  head.innerHTML = "<strong>Rebalance proposed</strong> ";
  head.append(`(${proposal.trigger.replace("_", " ")}): ${proposal.reason}. Predicted ${proposal.proposed_tokens_per_s.toFixed(1)} tokens/s against ${proposal.current_tokens_per_s.toFixed(1)} now (${gain}).`);
  const diff = document.createElement("ul");
  diff.className = "diff";
  for (const change of proposal.diff.stages) {
    const li = document.createElement("li");
    li.textContent = describe(change);
    diff.append(li);
  }
  const actions = document.createElement("div");
  actions.className = "actions";
  const result = document.createElement("p");
  result.setAttribute("role", "status");
  for (const [verb, label, cls] of [["accept", "Accept", ""], ["dismiss", "Dismiss", "secondary"]]) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.dataset.decide = verb;
    if (cls) button.className = cls;
    button.addEventListener("click", async () => {
      try {
        await postJSON(`/api/v1/rebalance-proposals/${proposal.id}/${verb}/`, {});  // a body: the CSRF header goes with it
        if (verb === "accept") location.reload(); else draw(box, null);
      } catch (error) {
        result.textContent = error.message;
        result.className = "problems";
      }
    });
    actions.append(button);
  }
  const forecast = forecastTable(proposal.forecast);
  box.replaceChildren(head, ...(forecast ? [forecast] : []), diff, actions, result);
  box.hidden = false;
}

async function refresh() {
  await Promise.all([...document.querySelectorAll("[data-proposal]")].map(async (box) => {
    try {
      const page = await getJSON(`/api/v1/deployments/${box.dataset.proposal}/proposals/?status=open`);
      draw(box, page.results[0]);
    } catch (error) {
      console.warn("rebalance proposal:", error.message);
    }
  }));
}

refresh();
setInterval(refresh, REFRESH_MS);
