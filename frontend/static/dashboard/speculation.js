// Speculative decoding on the Deployments page. From a head's statistics (contracts §4, spec_*): its
// acceptance rate (proposed tokens accepted over those proposed since it started) and its tokens per
// step ((accepted + drafts) / drafts: what a speculating sequence gains per pass); a stage that
// reports no such figure (a relay, speculation off, or an engine without it) shows "—". And each
// deployment's switch ([data-speculation="<deployment id>"]): the mode and the most proposals per
// step, sent by Apply as PATCH /api/v1/deployments/{id}/; the stages take them in place
// (docs/deployments.md, "Speculative decoding"). A refusal (a plain account, a bad value) shows the
// API's message. showSpeculation redraws a box from the API's deployment (deployments.js, on every
// resync) but keeps a mode or ceiling the operator changed and has not applied yet: a resync that
// lands between choosing and Apply must not send the old values.
import { patchJSON } from "./api.js";

export function acceptanceText(stats) {
  const proposed = stats?.spec_draft_tokens, accepted = stats?.spec_accepted_tokens;
  return proposed > 0 && accepted != null ? `${((100 * accepted) / proposed).toFixed(0)} %` : "—";
}

export function tokensPerStepText(stats) {
  const drafts = stats?.spec_drafts, accepted = stats?.spec_accepted_tokens;
  return drafts > 0 && accepted != null ? ((accepted + drafts) / drafts).toFixed(2) : "—";
}

export function showSpeculation(box, deployment) {
  if (box.dataset.edited !== "true") {
    box.querySelector('[data-field="speculation"]').value = deployment.speculation;
    box.querySelector('[data-field="speculative_tokens"]').value = deployment.speculative_tokens;
  }
  box.querySelector('[data-field="draft_deployment"]').textContent =
    deployment.draft_deployment_name ? `served by ${deployment.draft_deployment_name}` : "";
}

// The PATCH body: the mode and the ceiling, and with speculation "draft" the chosen draft model (the
// API deploys it where the planner places it; the same model as now changes nothing).
export function speculationBody(box) {
  const mode = box.querySelector('[data-field="speculation"]').value;
  const draftModel = box.querySelector('[data-field="draft_model"]').value;
  return {
    speculation: mode,
    speculative_tokens: Number(box.querySelector('[data-field="speculative_tokens"]').value),
    ...(mode === "draft" && draftModel ? { draft_model: Number(draftModel) } : {}),
  };
}

for (const box of document.querySelectorAll("[data-speculation]")) {
  const result = box.querySelector('[role="status"]');
  for (const event of ["input", "change"]) box.addEventListener(event, () => { box.dataset.edited = "true"; });
  box.querySelector("button").addEventListener("click", async () => {
    result.textContent = "";
    result.className = "";
    try {
      const deployment = await patchJSON(`/api/v1/deployments/${box.dataset.speculation}/`, speculationBody(box));
      delete box.dataset.edited;
      showSpeculation(box, deployment);
      result.textContent = "applied";
    } catch (error) {
      result.textContent = error.message;
      result.className = "problems";
    }
  });
}
