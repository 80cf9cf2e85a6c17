// h(tag, attrs, ...children): one element; an "on…" attribute adds that event's listener, true sets a
// bare attribute and false leaves it out. The editor's tables are rebuilt from their model on each edit.
export const h = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v); else if (v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  node.append(...children);
  return node;
};
