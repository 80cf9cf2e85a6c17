// Which nodes the topology draws and how it groups them: the operator's filter (words matched
// against a node's name, status, fleet, labels, GPU models, GPU health and the deployments on it;
// every word must match) and the grouping key (the fleet, the GPU model, or any node label such as
// rack or generation).
export function groupKeys(nodes) {
  const labels = new Set();
  for (const node of nodes) for (const key of Object.keys(node.labels || {})) labels.add(key);
  return ["fleet", "model", ...[...labels].sort(), "none"];
}

export const defaultGroupKey = (keys) => ["rack", "generation"].find((k) => keys.includes(k)) || "fleet";

const majorityModel = (node) => {
  const counts = {};
  for (const d of node.devices) counts[d.model] = (counts[d.model] || 0) + 1;
  return Object.entries(counts).sort((a, b) => b[1] - a[1])[0]?.[0] || "no GPU";
};

export function groupOf(node, key) {
  if (key === "none") return "all nodes";
  if (key === "fleet") return node.fleet ? `fleet ${node.fleet}` : "discovered";
  if (key === "model") return majorityModel(node);
  const value = (node.labels || {})[key];
  return value ? `${key} ${value}` : `no ${key}`;
}

// [[title, nodes], …] in title order, nodes in their given order.
export function grouped(nodes, key) {
  const groups = new Map();
  for (const node of nodes) {
    const title = groupOf(node, key);
    if (!groups.has(title)) groups.set(title, []);
    groups.get(title).push(node);
  }
  return [...groups.entries()].sort((a, b) => a[0].localeCompare(b[0], undefined, { numeric: true }));
}

export function haystack(node, deploymentsOn) {
  return [node.name, node.status, node.fleet, ...Object.values(node.labels || {}),
    ...node.devices.flatMap((d) => [d.name, d.model, d.health]), ...(deploymentsOn.get(node.name) || [])]
    .join(" ").toLowerCase();
}

export function matching(nodes, query, deploymentsOn) {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return nodes;
  return nodes.filter((node) => {
    const text = haystack(node, deploymentsOn);
    return words.every((word) => text.includes(word));
  });
}
