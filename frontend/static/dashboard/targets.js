// The plan editor's service-level targets (docs/dashboard.md, "Service-level targets in the plan
// editor"): the form is rendered by the server from the deployment; Save sends every field with
// PATCH /api/v1/deployments/{id}/, so the API's own check decides, and each field the API refuses
// shows its message beside it. An empty box is sent as null: none for a target or the most replicas,
// refused by the API, with its field named, for the others.
import { patchJSON } from "./api.js";

function values(form) {
  const body = {};
  for (const field of form.querySelectorAll("input[name], select[name]")) {
    const text = field.value.trim();
    // A number box holding what is not a number reads "": sent as null, the API names the field.
    body[field.name] = text === "" ? null : Number(text);
  }
  return body;
}

function showErrors(form, details) {
  const left = [];
  for (const cell of form.querySelectorAll("[data-error-for]")) cell.textContent = "";
  for (const [name, messages] of Object.entries(details || {})) {
    const cell = form.querySelector(`[data-error-for="${name}"]`);
    const text = [].concat(messages).join(" ");
    if (cell) cell.textContent = text; else left.push(name === "non_field_errors" ? text : `${name}: ${text}`);
  }
  return left;
}

function fill(form, deployment) {
  for (const field of form.querySelectorAll("input[name], select[name]")) {
    const value = deployment[field.name];
    field.value = value === null || value === undefined ? "" : String(value);
  }
}

function start() {
  const section = document.getElementById("targets");
  if (!section) return;
  const form = document.getElementById("targets-form");
  const result = document.getElementById("targets-result");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = values(form);
    result.className = "";
    result.textContent = "saving…";
    try {
      const deployment = await patchJSON(`/api/v1/deployments/${section.dataset.deployment}/`, body);
      showErrors(form, {});
      fill(form, deployment);
      result.className = "ok";
      result.textContent = "saved: the demand figures and the rebalance policy measure against these targets";
    } catch (error) {
      const left = showErrors(form, error.data?.error?.details);
      result.className = "error";
      result.textContent = left.length ? `refused: ${left.join("; ")}` : "refused, nothing saved: see the message beside each field";
    }
  });
}

start();
