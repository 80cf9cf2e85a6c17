// Where the topology draws each thing, in page pixels: nodes in groups, each group's nodes in rows
// that wrap to the drawing's width, a network bus in the gap above each row (the node's uplink drops
// onto it from above, so no network line crosses a box). A node is either compact (its cards as a
// grid of tiles) or expanded (each card with its model, memory, live figure and stage tags). Nothing
// here touches the DOM: the same inputs give the same picture.
export const SIZE = {
  margin: 12, spine: 18,            // left margin; the network spine runs at margin + spine / 2
  groupHead: 28, groupGap: 14,      // a group's title band; space between groups
  busGap: 24, nodeGap: 10,          // band above a row holding its bus; space between two nodes
  pad: 10,                          // inside a node box
  compactHead: 44, tile: 14, tileGap: 3, tileCols: 8, compactMinW: 150,
  head: 62, gpuH: 66, gpuGap: 12, gpuMinW: 104, stageH: 30, stageGap: 4,
};

const gpuWidth = (gib) => Math.max(SIZE.gpuMinW, 64 + gib * 0.55);

function compactBox(node) {
  const n = node.devices.length, cols = Math.max(1, Math.min(n, SIZE.tileCols));
  const step = SIZE.tile + SIZE.tileGap, rows = Math.ceil(n / cols);
  const width = Math.max(SIZE.compactMinW, 2 * SIZE.pad + cols * step - SIZE.tileGap);
  const height = SIZE.compactHead + Math.max(1, rows) * step - SIZE.tileGap + SIZE.pad;
  const gpus = node.devices.map((d, i) => ({
    ...d, dx: SIZE.pad + (i % cols) * step, dy: SIZE.compactHead + Math.floor(i / cols) * step,
    w: SIZE.tile, h: SIZE.tile,
  }));
  return { width, height, gpus };
}

function expandedBox(node, stageRows) {
  let dx = SIZE.pad + 4;
  const gpus = node.devices.map((d) => {
    const w = gpuWidth(d.memory_gib), gpu = { ...d, dx, dy: SIZE.head, w, h: SIZE.gpuH };
    dx += w + SIZE.gpuGap;
    return gpu;
  });
  const width = Math.max(SIZE.compactMinW, dx - SIZE.gpuGap + SIZE.pad + 4);
  const height = SIZE.head + SIZE.gpuH + 10 + stageRows * (SIZE.stageH + SIZE.stageGap) + SIZE.pad;
  return { width, height, gpus };
}

// groups: [[title, [node, …]], …]; expanded(node) and stageRows(node) say how each node is drawn.
export function layoutFleet({ groups, expanded, stageRows, width }) {
  const left = SIZE.margin + SIZE.spine, right = Math.max(width - SIZE.margin, left + SIZE.compactMinW);
  const boxes = [], buses = [], titles = [];
  let y = SIZE.margin, widest = width;
  for (const [title, nodes] of groups) {
    titles.push({ title, count: nodes.length, gpus: nodes.reduce((n, node) => n + node.devices.length, 0),
      x: left, y: y + 18 });
    y += SIZE.groupHead;
    let row = [];
    const closeRow = () => {
      if (!row.length) return;
      const height = Math.max(...row.map((b) => b.height));
      const busY = y + 8;
      for (const box of row) box.busY = busY;
      buses.push({ y: busY, x1: SIZE.margin + SIZE.spine / 2, x2: Math.max(...row.map((b) => b.x + b.width / 2)) });
      y += SIZE.busGap + height + 6;
      row = [];
    };
    let x = left;
    for (const node of nodes) {
      const open = expanded(node);
      const shape = open ? expandedBox(node, stageRows(node)) : compactBox(node);
      if (row.length && x + shape.width > right) { closeRow(); x = left; }
      const box = { node, expanded: open, x, y: y + SIZE.busGap, ...shape };
      for (const gpu of box.gpus) { gpu.x = box.x + gpu.dx; gpu.y = box.y + gpu.dy; }
      row.push(box);
      boxes.push(box);
      x += shape.width + SIZE.nodeGap;
      widest = Math.max(widest, box.x + box.width + SIZE.margin);
    }
    closeRow();
    y += SIZE.groupGap;
  }
  const spine = buses.length ? { x: SIZE.margin + SIZE.spine / 2, y1: buses[0].y, y2: buses.at(-1).y } : null;
  return { boxes, buses, titles, spine, width: widest, height: y + SIZE.margin };
}
