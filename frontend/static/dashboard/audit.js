// Audit page: filters and older pages from GET /api/v1/audit/ (read-only); the first page comes
// rendered by the server with the same filters, so this only refetches and appends.
import { getJSON } from "./api.js";

const form = document.getElementById("audit-filters");
const table = document.getElementById("audit-table");
const body = table.querySelector("tbody");
const more = document.getElementById("audit-more");
const status = document.getElementById("audit-status");
const pageSize = Number(table.dataset.pageSize) || 100;
let next = null;

const pad = (n) => String(n).padStart(2, "0");
function when(iso) {
  const d = new Date(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function cell(...children) {
  const td = document.createElement("td");
  td.append(...children);
  return td;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  node.textContent = text;
  if (className) node.className = className;
  return node;
}

function row(entry) {
  const tr = document.createElement("tr");
  tr.dataset.entry = entry.id;
  const at = cell(when(entry.at));
  at.title = entry.at;
  const detail = cell(Object.keys(entry.detail || {}).length ? JSON.stringify(entry.detail) : "");
  detail.className = "detail";
  tr.append(
    at,
    cell(`${entry.actor_label} `, el("span", entry.via, "badge")),
    cell(el("code", entry.action)),
    cell(el("span", entry.target_type, "muted"), ` ${entry.target_label || entry.target_id}`),
    cell(entry.remote_addr || "—"),
    detail,
  );
  return tr;
}

function query() {
  const params = new URLSearchParams([...new FormData(form)].filter(([, v]) => v.trim()));
  return params;
}

async function load(url, append) {
  status.className = "hint";
  status.textContent = "loading…";
  try {
    const page = await getJSON(url);
    if (!append) body.replaceChildren();
    body.append(...page.results.map(row));
    if (!body.children.length) body.append(Object.assign(document.createElement("tr"), {
      innerHTML: '<td colspan="6" class="empty">No audited action matches these filters.</td>' }));
    next = page.next;
    more.hidden = !next;
    status.textContent = `${page.count} entr${page.count === 1 ? "y" : "ies"}`;
  } catch (error) {
    status.className = "error";
    status.textContent = error.message;
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const params = query();
  history.replaceState(null, "", params.size ? `?${params}` : location.pathname);
  params.set("limit", pageSize);
  load(`/api/v1/audit/?${params}`, false);
});

more.addEventListener("click", async () => {
  if (next) {
    await load(next, true);
    return;
  }
  // The first page came from the server: continue after it.
  const params = query();
  params.set("limit", pageSize);
  params.set("offset", body.children.length);
  await load(`/api/v1/audit/?${params}`, true);
});
