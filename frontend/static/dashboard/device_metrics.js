// What a GPU's live sample (a /ws/dashboard/ snapshot's `devices[name]`) says, by the metric an
// operator picks: the one definition the topology's tiles and the fleet heat map colour by.
import { heat } from "./live.js";

export const METRICS = {
  utilization: { label: "utilization", low: 0, high: 100, fmt: (v) => `${v.toFixed(0)} %`,
    value: (s) => s.utilization_pct },
  memory: { label: "memory used", low: 0, high: 100, fmt: (v) => `${v.toFixed(0)} % mem`,
    value: (s) => (s.memory_total_bytes ? 100 * s.memory_used_bytes / s.memory_total_bytes : undefined) },
  temperature: { label: "temperature", low: 30, high: 90, fmt: (v) => `${v.toFixed(0)} °C`,
    value: (s) => s.temperature_c },
  // 1 while the card reports a slowdown reason (contracts' SLOWDOWN_REASONS, sent with the page).
  throttling: { label: "throttling", low: 0, high: 1, fmt: (v) => (v ? "throttled" : "not throttled"),
    value: (s, slowdown) => (s.throttle ? Number(isThrottled(s, slowdown)) : undefined) },
};

export const isThrottled = (sample, slowdown) =>
  Boolean(sample && (sample.throttle || []).some((reason) => slowdown.includes(reason)));

// The metric's value for a sample (undefined: no data) and its colour.
export function reading(sample, metricName, slowdown = []) {
  const metric = METRICS[metricName];
  const value = sample ? metric.value(sample, slowdown) : undefined;
  return { value, colour: heat(value, metric.low, metric.high), text: value === undefined ? "no data" : metric.fmt(value) };
}
