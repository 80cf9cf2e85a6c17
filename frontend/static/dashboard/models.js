// Model registration through the REST API (POST /api/v1/models/); the list reloads on success.
import { postJSON } from "./api.js";

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
