// Calibration figures (docs/dashboard.md): each stage's decode step at the load it runs, predicted by
// the planner from first principles (raw), times its device's measured factor (calibrated), and
// measured, from GET /api/v1/plans/calibration/ every REFRESH_MS. The deployments page has a table per
// deployment (startCalibration); the plan editor shows the same beside each stage of a plan
// (stagePredictions).
import { getJSON } from "./api.js";

const REFRESH_MS = 5000;
const fmt = (v, digits = 3) => (v === undefined || v === null ? "—" : Number(v).toFixed(digits));
const pct = (v) => `${Math.round(100 * v)} %`;
export const errorOf = (predicted, measured) => Math.abs(predicted - measured) / measured;

export function factorLabel(factor, source, samples) {
  const why = { measured: `${samples} samples`, model: "its GPU model's", kind: "its kind's", none: "not measured" };
  return `×${fmt(factor, 2)} (${why[source] ?? source})`;
}

function fill(row, figures) {
  const set = (key, text) => { row.querySelector(`[data-cal="${key}"]`).textContent = text; };
  if (!figures) {
    ["raw_ms", "factor", "calibrated_ms", "measured_ms", "error"].forEach((key) => set(key, "—"));
    set("load", "no decode traffic");
    return;
  }
  set("load", `${fmt(figures.batch, 1)} seq × ${figures.context} tok`);
  set("raw_ms", `${fmt(figures.raw_ms)} ms`);
  set("factor", factorLabel(figures.factor, figures.source, figures.samples));
  set("calibrated_ms", `${fmt(figures.calibrated_ms)} ms`);
  set("measured_ms", `${fmt(figures.measured_ms)} ms${figures.throttled ? " (throttled)" : ""}`);
  set("error", `${pct(errorOf(figures.raw_ms, figures.measured_ms))} → ${pct(errorOf(figures.calibrated_ms, figures.measured_ms))}`);
}

async function refresh() {
  let body;
  try {
    body = await getJSON("/api/v1/plans/calibration/");
  } catch (error) {
    console.warn("calibration:", error.message);
    return;
  }
  for (const row of document.querySelectorAll("tr[data-calibration-stage]")) {
    fill(row, body.stages[row.dataset.calibrationStage]);
  }
}

export function startCalibration() {
  refresh();
  setInterval(refresh, REFRESH_MS);
}

// The plan editor: per stage of ``plan`` (the planner's JSON with "calibration" and "predicted_raw",
// as the plans API answers), its compute time raw and calibrated at the plan's load, and, for a
// stage running as it is now, what it measures at the load it runs (``live``: the calibration API's
// stages by key, of this deployment) with the planner's figures for that load.
export function stagePredictions(plan, live, deploymentId) {
  const rows = [];
  plan.replicas.forEach((replica, r) => replica.stages.forEach((stage, s) => {
    const now = live[`d${deploymentId}-r${r}-s${s}`];
    const running = now && now.device === stage.device;
    const cal = stage.calibration || { factor: 1, source: "none", samples: 0 };
    rows.push({
      label: `r${r} s${s}`, device: stage.device,
      raw: stage.predicted_raw ? stage.predicted_raw.compute_ms : null,
      factor: factorLabel(cal.factor, cal.source, cal.samples), calibrated: stage.predicted.compute_ms,
      measured: running ? `${fmt(now.measured_ms)} ms` : "—",
      there: running ? `at ${fmt(now.batch, 1)} seq × ${now.context} tok: predicted ${fmt(now.raw_ms)} raw, ` +
        `${fmt(now.calibrated_ms)} calibrated` : "",
    });
  }));
  return rows;
}

export async function liveStages(deploymentId) {
  try {
    return (await getJSON(`/api/v1/plans/calibration/?deployment=${deploymentId}`)).stages;
  } catch (error) {
    console.warn("calibration:", error.message);
    return {};
  }
}

export { REFRESH_MS };
