// A demand proposal's prediction (docs/dashboard.md, "Rebalance proposals"): the proposed plan's
// capacity against the forecast load, its TTFT and TPOT at the targets' percentile against each
// target, and whether it meets them, as the policy computed it (RebalanceProposal.forecast; {} for
// the other triggers, which draw nothing here).
import { h } from "./dom.js";

const ms = (value) => (value === null || value === undefined ? "unbounded (over capacity)" : `${value.toFixed(0)} ms`);

function latencyRow(name, label, predicted, target) {
  const within = target === null || target === undefined ? null : predicted !== null && predicted <= target;
  return h("tr", { "data-forecast": name },
    h("td", {}, label), h("td", { class: "num" }, ms(predicted)),
    h("td", { class: "num" }, target === null || target === undefined ? "no target" : `${target} ms`),
    h("td", { class: within === null ? "" : within ? "ok" : "error" }, within === null ? "—" : within ? "within" : "over"));
}

export function forecastTable(forecast) {
  if (!forecast || !Object.keys(forecast).length) return null;
  const q = forecast.percentile;
  const share = forecast.utilisation === null ? "no capacity" : `${Math.round(100 * forecast.utilisation)} % of it`;
  const load = h("p", { "data-forecast": "load" },
    `Forecast in ${forecast.horizon_s.toFixed(0)} s: ${forecast.forecast_output_tokens_per_s.toFixed(1)} output tokens/s ` +
    `(${forecast.forecast_requests_per_s.toFixed(2)} requests/s) against a capacity of ` +
    `${forecast.capacity_tokens_per_s.toFixed(1)} tokens/s with ${forecast.replicas} replica(s): ${share}.`);
  const table = h("table", { class: "grid" },
    h("thead", {}, h("tr", {}, h("th", {}), h("th", {}, `predicted p${q}`), h("th", {}, "target"), h("th", {}))),
    h("tbody", {},
      latencyRow("ttft", "time to first token", forecast.ttft_ms, forecast.ttft_target_ms),
      latencyRow("tpot", "time per output token", forecast.tpot_ms, forecast.tpot_target_ms)));
  const verdict = h("p", { "data-forecast": "verdict", "data-meets": String(forecast.meets), class: forecast.meets ? "ok" : "error" },
    forecast.meets ? "✓ The proposed plan meets the targets at the forecast load."
      : "✗ The proposed plan does not meet the targets at the forecast load.");
  return h("div", { class: "forecast" }, load, table, verdict);
}
