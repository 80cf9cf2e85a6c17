// Model registration through the REST API (POST /api/v1/models/); the list reloads on success.
// Measured quality (GET /api/v1/models/{id}/quality/): one plotly chart per measured model, KL per layer.
import { getJSON, postJSON } from "./api.js";

const form = document.getElementById("register-model");
const result = document.getElementById("register-result");

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = Object.fromEntries([...new FormData(form)].filter(([, v]) => v.trim()));
  result.className = "";
  result.textContent = "registering…";
  try {
    const model = await postJSON("/api/v1/models/", body);
    result.className = "ok";
    result.textContent = `registered ${model.name}: ${model.num_layers} layers`;
    setTimeout(() => location.reload(), 600);
  } catch (error) {
    result.className = "error";
    const fields = error.data?.error?.fields || error.data?.error?.details;
    result.textContent = fields ? `${error.message} ${JSON.stringify(fields)}` : error.message;
  }
});

const section = document.getElementById("quality-section");
const charts = document.getElementById("quality-charts");

function drawQuality(name, quality) {
  const div = document.createElement("div");
  div.className = "chart";
  charts.append(div);
  const fp32 = quality.perplexity.fp32;
  const ppl = Object.entries(quality.perplexity)
    .map(([k, v]) => `${k} ${v.toFixed(2)}${k === "fp32" ? "" : ` (${((v / fp32 - 1) * 100).toFixed(2)} %)`}`)
    .join(", ");
  const traces = Object.entries(quality.layer_kl).map(([bits, kl]) => ({
    type: "bar", name: `int${bits}`, x: kl.map((_, i) => i), y: kl,
    hovertemplate: `layer %{x} at int${bits}: KL %{y:.3e}<extra></extra>`,
  }));
  Plotly.newPlot(div, traces, {
    title: { text: `${name}: perplexity ${ppl}`, font: { size: 13 } }, barmode: "group", height: 320,
    xaxis: { title: { text: "layer" }, dtick: 1 }, yaxis: { title: { text: "KL (nats/token)" }, type: "log" },
    margin: { t: 40, r: 10, b: 40, l: 60 },
  }, { displayModeBar: false, responsive: true });
}

for (const row of document.querySelectorAll("#models-table tr[data-model-id]")) {
  getJSON(`/api/v1/models/${row.dataset.modelId}/quality/`).then((quality) => {
    if (!quality?.layer_kl) return;
    section.hidden = false;
    drawQuality(row.dataset.modelName, quality);
  }).catch(() => {});
}
