// Prefix caching as the pages show it, from a stage's statistics (contracts §4, prefix_*): its hit
// rate (prompt tokens reused over those looked up since the stage started) and the KV blocks it keeps
// for reuse. A stage that reports no such figure (caching off, or an engine without it) shows "—".

export function hitRatePct(stats) {
  const queried = stats?.prefix_queried_tokens, hit = stats?.prefix_hit_tokens;
  return queried > 0 && hit != null ? (100 * hit) / queried : null;
}

export function hitRateText(stats) {
  const pct = hitRatePct(stats);
  return pct === null ? "—" : `${pct.toFixed(0)} %`;
}

export function cachedBlocksText(stats) {
  const device = stats?.prefix_cached_blocks, host = stats?.prefix_host_blocks;
  if (device == null) return "—";
  return host ? `${device} + ${host} host` : String(device);
}
