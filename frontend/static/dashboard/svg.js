// SVG helpers of the drawings: an element factory, and text fitted to the box it labels, so that no
// label runs into its neighbour whatever the names and figures are (the full text stays in its title).
const SVG = "http://www.w3.org/2000/svg";

export const el = (name, attrs = {}, text) => {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
};

// A text that may take at most `width` pixels: `fitTexts` shortens it (with "…") once it is drawn.
export const label = (attrs, text, width) => el("text", { ...attrs, "data-fit": Math.max(0, width) }, text);

// Shorten every drawn `label` under `root` until its measured length fits its width; a shortened one
// keeps its full text as a tooltip. One layout pass for the measures, then only the long ones again.
export function fitTexts(root) {
  for (const text of root.querySelectorAll("text[data-fit]")) fitText(text, Number(text.dataset.fit));
}

export function fitText(text, width) {
  const full = text.dataset.full ?? text.textContent;
  text.textContent = full;
  let length = text.getComputedTextLength();
  if (length <= width) return;
  text.dataset.full = full;
  let keep = Math.max(0, Math.floor(full.length * width / length) - 1);
  for (;;) {
    text.textContent = keep > 0 ? `${full.slice(0, keep).trimEnd()}…` : "";
    if (keep === 0 || text.getComputedTextLength() <= width) break;
    keep -= 1;
  }
  text.append(el("title", {}, full));
}
