// The run's processes overlaid on one wall-clock chart: one line per process of the learner's
// process curves (``system/<process>/<quantity>``, learner/driver/system_metrics.py), named by
// its role (static/js/sysnames.js), x = seconds from the first step's start to each sample.
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
    process, name: processRole(process), ...metricPoints(metrics, `${METRIC.SYSTEM}${process}/${quantity}`, { axis: "wall" }),
  }));
}

/** The figure of ``quantity`` for every process of ``metrics`` ([{step, values}]). */
export function processFigure(metrics, quantity) {
  const figure = seriesFigure(processSeries(metrics, quantity), {
    xTitle: "seconds since the first step started", yTitle: PROCESS_QUANTITIES[quantity] ?? quantity, height: 280,
  });
  figure.layout.uirevision = `processes-${quantity}`;
  return figure;
}
