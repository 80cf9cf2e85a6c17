// The prefix caching switch of each deployment ([data-caching="<deployment id>"]): says whether it is
// on, and its button asks PATCH /api/v1/deployments/{id}/ for the other value; the stages take it in
// place (docs/deployments.md, "Prefix caching"). A refused switch (a plain account) shows the API's
// message. showCaching redraws a box from the API's deployment (deployments.js, on every resync).
import { patchJSON } from "./api.js";

export function showCaching(box, on) {
  box.dataset.on = String(on);
  box.querySelector('[data-field="prefix_caching"]').textContent = on ? "on" : "off";
  box.querySelector("button").textContent = on ? "Turn off" : "Turn on";
}

for (const box of document.querySelectorAll("[data-caching]")) {
  const result = box.querySelector('[role="status"]');
  box.querySelector("button").addEventListener("click", async () => {
    result.textContent = "";
    try {
      const deployment = await patchJSON(`/api/v1/deployments/${box.dataset.caching}/`,
        { prefix_caching: box.dataset.on !== "true" });
      showCaching(box, deployment.prefix_caching);
    } catch (error) {
      result.textContent = error.message;
      result.className = "problems";
    }
  });
}
