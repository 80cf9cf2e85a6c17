// Fetch helpers for the REST API: session cookie + CSRF header, errors as exceptions with the
// API's message (controlplane.common.errors formats them as {"error": {"message", ...}}).

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

async function request(method, url, body) {
  const response = await fetch(url, {
    method,
    credentials: "same-origin",
    headers: { "Accept": "application/json", ...(body === undefined ? {} : { "Content-Type": "application/json", "X-CSRFToken": csrfToken() }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = data?.error?.message || data?.detail || `${method} ${url}: HTTP ${response.status}`;
    const error = new Error(message);
    error.status = response.status;
    error.data = data;
    throw error;
  }
  return data;
}

export const getJSON = (url) => request("GET", url);
export const postJSON = (url, body) => request("POST", url, body);
export const patchJSON = (url, body) => request("PATCH", url, body);
