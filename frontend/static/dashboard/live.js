// The dashboard socket: full snapshots pushed by the server, each acknowledged so the server never
// sends faster than this page draws. On every (re)connect the page first resyncs from the REST API
// (onResync), because snapshots missed while disconnected are gone by design.

export function connectLive({ onSnapshot, onResync }) {
  const badge = document.getElementById("live-status");
  let delay = 500;
  let socket;

  function setStatus(text, state) {
    if (!badge) return;
    badge.hidden = false;
    badge.textContent = text;
    badge.dataset.state = state;
  }

  function open() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/dashboard/`);
    setStatus("connecting", "connecting");
    socket.addEventListener("open", async () => {
      delay = 500;
      setStatus("live", "live");
      if (onResync) await onResync();
    });
    socket.addEventListener("message", (event) => {
      const snapshot = JSON.parse(event.data);
      if (snapshot.type !== "snapshot") return;
      try {
        onSnapshot(snapshot);
      } finally {
        socket.send(JSON.stringify({ ack: snapshot.version }));
      }
    });
    socket.addEventListener("close", (event) => {
      if (event.code === 4401) {  // the session ended: the login page, not a reconnect loop
        location.href = `/accounts/login/?next=${encodeURIComponent(location.pathname)}`;
        return;
      }
      setStatus("reconnecting", "offline");
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    });
  }

  open();
  return { close: () => socket && socket.close() };
}

// Colour scales shared by the pages: utilization 0-100 %, temperature 30-90 °C.
export function heat(value, low, high) {
  if (value === undefined || value === null || Number.isNaN(value)) return "#d9dde3";
  const x = Math.max(0, Math.min(1, (value - low) / (high - low)));
  const hue = 210 - 210 * x;  // blue (idle/cool) through green and yellow to red (busy/hot)
  return `hsl(${hue}, 70%, ${52 - 8 * x}%)`;
}
