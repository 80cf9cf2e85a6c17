// The dashboard socket (/ws/dashboard/): a full snapshot of the nodes this page shows, then deltas
// from the version it acknowledged, applied here to one state object that onSnapshot is handed each
// time (same shape as a snapshot: version, at, fleet, devices, stages). Each frame is acknowledged by
// the version this page now holds, so the server never sends faster than the page draws; a delta
// that does not start from that version (a gap) is acknowledged with null and the server answers
// with a full snapshot. `nodes()` says which nodes the page shows (null: every node); the page calls
// subscribe() when that changes. On every (re)connect the page first resyncs from the REST API
// (onResync), because frames missed while disconnected are gone by design.
// A subscription over the server's limits (256 names; MOTLEY_DASHBOARD_WS_MAX_MESSAGE_BYTES, 4096 by
// default) asks for every node instead.
const SUBSCRIBE_MAX_NODES = 256, SUBSCRIBE_MAX_BYTES = 3072, SUBSCRIBE_EVERY_MS = 300;
const CLOSE_BAD_SUBSCRIPTION = 4400, CLOSE_UNAUTHENTICATED = 4401;

function subscribeText(shown) {
  const every = JSON.stringify({ subscribe: { nodes: "*" } });
  if (!shown || shown.length > SUBSCRIBE_MAX_NODES) return every;
  const text = JSON.stringify({ subscribe: { nodes: [...shown].sort() } });
  return new TextEncoder().encode(text).length > SUBSCRIBE_MAX_BYTES ? every : text;
}

// The state after one frame: a snapshot replaces it, a delta from its version updates it; null for a
// delta this state cannot take (a gap).
export function applyFrame(state, frame) {
  if (frame.type === "snapshot") {
    return { version: frame.version, at: frame.at, fleet: frame.fleet, devices: frame.devices, stages: frame.stages };
  }
  if (frame.type !== "delta" || !state || frame.from !== state.version) return null;
  for (const name of frame.removed.devices) delete state.devices[name];
  for (const key of frame.removed.stages) delete state.stages[key];
  Object.assign(state.devices, frame.devices);
  for (const [name, fields] of Object.entries(frame.patches)) Object.assign(state.devices[name], fields);
  Object.assign(state.stages, frame.stages);
  return Object.assign(state, { version: frame.version, at: frame.at, fleet: frame.fleet });
}

export function connectLive({ onSnapshot, onResync, nodes }) {
  const badge = document.getElementById("live-status");
  let delay = 250;
  let socket, state = null, subscribed = null, timer = null;

  function setStatus(text, state) {
    if (!badge) return;
    badge.hidden = false;
    badge.textContent = text;
    badge.dataset.state = state;
  }

  function count(kind) {  // how many frames of each kind this page applied (read by the browser tests)
    if (badge) badge.dataset[kind] = Number(badge.dataset[kind] || 0) + 1;
  }

  function subscribe() {
    timer = null;
    const text = subscribeText(nodes ? nodes() : null);
    if (text === subscribed || !socket || socket.readyState !== WebSocket.OPEN) return;
    subscribed = text;
    socket.send(text);
  }

  function open() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/dashboard/`);
    state = null;
    subscribed = null;
    setStatus("connecting", "connecting");
    socket.addEventListener("open", async () => {
      delay = 250;
      setStatus("live", "live");
      subscribe();
      if (onResync) await onResync();
    });
    socket.addEventListener("message", (event) => {
      const frame = JSON.parse(event.data);
      const next = applyFrame(state, frame);
      if (!next) {
        socket.send(JSON.stringify({ ack: null }));  // a gap: the server sends a snapshot
        return;
      }
      state = next;
      count(frame.type === "delta" ? "deltas" : "snapshots");
      try {
        onSnapshot(state);
      } finally {
        socket.send(JSON.stringify({ ack: state.version }));
      }
    });
    socket.addEventListener("close", (event) => {
      if (event.code === CLOSE_UNAUTHENTICATED) {  // the session ended: the login page, not a reconnect loop
        location.href = `/accounts/login/?next=${encodeURIComponent(location.pathname)}`;
        return;
      }
      if (event.code === CLOSE_BAD_SUBSCRIPTION) {  // this page's own mistake: say so, do not loop
        setStatus(`refused: ${event.reason}`, "offline");
        return;
      }
      setStatus("reconnecting", "offline");
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    });
  }

  open();
  return {
    close: () => socket && socket.close(),
    // The page shows other nodes: tell the server, at most every SUBSCRIBE_EVERY_MS (typing in a filter
    // box must not run into the socket's message rate).
    subscribe: () => { if (timer === null) timer = setTimeout(subscribe, SUBSCRIBE_EVERY_MS); },
  };
}

// Colour scales shared by the pages: utilization 0-100 %, temperature 30-90 °C.
export function heat(value, low, high) {
  if (value === undefined || value === null || Number.isNaN(value)) return "#d9dde3";
  const x = Math.max(0, Math.min(1, (value - low) / (high - low)));
  const hue = 210 - 210 * x;  // blue (idle/cool) through green and yellow to red (busy/hot)
  return `hsl(${hue}, 70%, ${52 - 8 * x}%)`;
}
