// Figures out: every chart's modebar downloads PNG and SVG. Plotly's own image export draws only
// what plotly drew, so a Gantt (bars painted on a canvas, static/js/gantt.js) adds its bars: the
// canvas composited into the PNG, one <path> of rectangles per span kind inside the SVG.

const SVG_NS = "http://www.w3.org/2000/svg";

/** Where the chart is: "run-12" on /runs/12/, "comparison-3" on /comparisons/3/, "compare-4-5" on
 * /compare/?runs=4,5 (so two runs' Gantts never download under one name). */
export function pagePrefix(location = window.location) {
  const path = location.pathname.split("/").filter(Boolean);
  const runs = new URLSearchParams(location.search).get("runs");
  if (path[0] === "runs" && path[1]) return `run-${path[1]}`;
  if (path[0] === "comparisons" && path[1]) return `comparison-${path[1]}`;
  if (path[0] === "compare" && runs) return `compare-${runs.split(",").filter(Boolean).join("-")}`;
  return path.join("-") || "thundersync";
}

/** The chart's shown x range as "t12.3-15.0" (seconds, or steps), when a zoom set one. */
function shownRange(gd) {
  const axis = gd._fullLayout?.xaxis;
  if (!axis || axis.autorange || !Array.isArray(axis.range)) return "";
  const [a, b] = axis.range.map(Number);
  return Number.isFinite(a) && Number.isFinite(b) ? `t${a.toFixed(1)}-${b.toFixed(1)}` : "";
}

export function fileName(gd, location = window.location) {
  const parts = [pagePrefix(location), gd.dataset.exportName || gd.id || "chart", shownRange(gd)];
  return parts.filter(Boolean).join("-").replace(/[^\w.-]+/g, "-");
}

function save(url, name) {
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
}

/** The PNG of a chart with its canvas bars (``bars``: a GanttChart, or null) drawn in place. */
async function pngWithBars(gd, bars) {
  const { width, height } = gd._fullLayout, scale = 2;
  const url = await Plotly.toImage(gd, { format: "png", width, height, scale });
  if (!bars) return url;
  const image = new Image();
  await new Promise((resolve, reject) => { image.onload = resolve; image.onerror = reject; image.src = url; });
  const out = document.createElement("canvas");
  out.width = width * scale;
  out.height = height * scale;
  const ctx = out.getContext("2d");
  ctx.drawImage(image, 0, 0);
  const { left, top, width: w, height: h } = bars.plotArea();
  ctx.drawImage(bars.canvas, left * scale, top * scale, w * scale, h * scale);
  return out.toDataURL("image/png");
}

/** The SVG of a chart, with the bars of ``bars`` (a GanttChart, or null) as paths. */
async function svgWithBars(gd, bars) {
  const { width, height } = gd._fullLayout;
  const url = await Plotly.toImage(gd, { format: "svg", width, height });
  const text = decodeURIComponent(url.slice(url.indexOf(",") + 1));
  if (!bars) return text;
  const doc = new DOMParser().parseFromString(text, "image/svg+xml");
  const svg = doc.documentElement;
  const { left, top, width: w, height: h, kinds } = bars.barRects();
  const group = doc.createElementNS(SVG_NS, "g");
  group.setAttribute("class", "gantt-bars");
  group.setAttribute("transform", `translate(${left},${top})`);
  const clip = doc.createElementNS(SVG_NS, "clipPath");
  clip.setAttribute("id", "gantt-bars-clip");
  const box = doc.createElementNS(SVG_NS, "rect");
  Object.entries({ width: w, height: h }).forEach(([k, v]) => box.setAttribute(k, String(v)));
  clip.appendChild(box);
  group.appendChild(clip);
  group.setAttribute("clip-path", "url(#gantt-bars-clip)");
  for (const { kind, colour, alpha, rects } of kinds) {
    const path = doc.createElementNS(SVG_NS, "path");
    path.setAttribute("d", rects.map(([x, y, rw, rh]) => `M${x.toFixed(2)} ${y.toFixed(2)}h${rw.toFixed(2)}v${rh.toFixed(2)}h${(-rw).toFixed(2)}z`).join(""));
    path.setAttribute("fill", colour);
    if (alpha < 1) path.setAttribute("fill-opacity", String(alpha));
    path.setAttribute("data-kind", kind);
    group.appendChild(path);
  }
  // above the plot layer (grid, axes), below the top layer (barriers, legend): as on the page
  const above = svg.querySelector(".layer-above, .infolayer");
  svg.insertBefore(group, above);
  return new XMLSerializer().serializeToString(svg);
}

/** Downloads ``gd`` as "png" or "svg"; ``bars``: the GanttChart painting its bars, or null. */
export async function downloadFigure(gd, format, bars = null) {
  const name = `${fileName(gd)}.${format}`;
  if (format === "png") {
    save(await pngWithBars(gd, bars), name);
  } else {
    const blob = new Blob([await svgWithBars(gd, bars)], { type: "image/svg+xml" });
    const url = URL.createObjectURL(blob);
    save(url, name);
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  }
}

// The SVG button's own icon (a pen nib: a drawing in vectors), so the two downloads never look alike.
const VECTOR_ICON = {
  width: 1000, height: 1000,
  path: "M500 50 L800 450 L620 900 L380 900 L200 450 Z M500 180 L500 520 M430 590 a70 70 0 1 0 140 0 a70 70 0 1 0 -140 0",
  transform: "matrix(1 0 0 -1 0 1000)",
};

/** Plotly config whose modebar has "Download PNG" (camera) and "Download SVG" (pen nib) instead
 * of plotly's camera, with the base config's removals kept. */
export function exportConfig(base, bars = null) {
  const button = (format) => ({
    name: `download-${format}`, title: `Download ${format.toUpperCase()}`,
    icon: format === "png" ? Plotly.Icons.camera : VECTOR_ICON,
    click: (gd) => downloadFigure(gd, format, bars),
  });
  return { ...base, modeBarButtonsToRemove: [...(base.modeBarButtonsToRemove || []), "toImage"],
           modeBarButtonsToAdd: [button("png"), button("svg")] };
}
