// The run's processes overlaid on one wall-clock chart: one line per process of the learner's
// process curves (``system/<process>/<quantity>``, learner/driver/system_metrics.py), named by
// its role (static/js/sysnames.js) and, on a run that spans nodes, its node; x = seconds since the
// run started: the run clock of the spans, so the Gantt's time axis. The samples taken every ``tracking.system_every_s`` seconds (``system``
// frames) where the run has them, else the values recorded at each step's end.
import { METRIC } from "./conventions.js";
import { metricPoints } from "./metricpanel.js";
import { seriesFigure } from "./plots.js";
import { processRole } from "./sysnames.js";

export const PROCESS_QUANTITIES = { cpu_percent: "CPU %", rss_mb: "RSS (MB)", gpu_util: "GPU utilisation %", gpu_memory_mb: "GPU memory (MB)" };

/** The processes that recorded ``quantity``, in name order: [{process, name, x, y}]. */
export function processSeries(metrics, quantity) {
  const processes = new Set();
  for (const m of metrics) {
    for (const key of Object.keys(m.values)) {
      if (!key.startsWith(METRIC.SYSTEM) || !key.endsWith(`/${quantity}`)) continue;
      processes.add(key.slice(METRIC.SYSTEM.length, key.length - quantity.length - 1));
    }
  }
  return [...processes].sort().map((process) => ({
    process, name: processRole(process), ...metricPoints(metrics, `${METRIC.SYSTEM}${process}/${quantity}`, { axis: "wall", origin: 0 }),
  }));
}

/** The processes of the wall-clock ``samples`` ([{t, node, values}]) that recorded ``quantity``,
 * per node and process: [{process, node, name, x, y}], x from ``origin`` (run clock). */
export function sampledSeries(samples, quantity, origin = 0) {
  const suffix = `/${quantity}`, lines = new Map();
  const nodes = new Set(samples.map((s) => s.node));
  for (const sample of [...samples].sort((a, b) => a.t - b.t)) {
    for (const [key, v] of Object.entries(sample.values)) {
      if (!key.startsWith(METRIC.SYSTEM) || !key.endsWith(suffix) || typeof v !== "number" || !Number.isFinite(v)) continue;
      const process = key.slice(METRIC.SYSTEM.length, key.length - suffix.length);
      const id = `${sample.node}\u0000${process}`;
      if (!lines.has(id)) {
        const name = nodes.size > 1 ? `${processRole(process)} @ ${sample.node}` : processRole(process);
        lines.set(id, { process, node: sample.node, name, x: [], y: [] });
      }
      lines.get(id).x.push(sample.t - origin);
      lines.get(id).y.push(v);
    }
  }
  return [...lines.values()].sort((a, b) => a.name.localeCompare(b.name));
}

/** The figure of ``quantity`` for every process: from ``samples`` where they hold it, else from
 * the step-end values of ``metrics`` ([{step, values}]). */
export function processFigure(metrics, quantity, samples = []) {
  const sampled = sampledSeries(samples, quantity, 0);
  const figure = seriesFigure(sampled.length ? sampled : processSeries(metrics, quantity), {
    xTitle: "seconds since run start", // the Gantt's axis: both on the run clock yTitle: PROCESS_QUANTITIES[quantity] ?? quantity, height: 280,
  });
  figure.layout.uirevision = `processes-${quantity}`;
  return figure;
}
