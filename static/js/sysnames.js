// Readable names of the learner's process curves (``system/<process>/<quantity>``,
// learner/driver/system_metrics.py): the process's role and the quantity in words, so the
// metric panel says which curve is the learner and a search for "learner rss" finds it.
import { METRIC } from "./conventions.js";

const QUANTITIES = { cpu_percent: "CPU %", rss_mb: "RSS (MB)", gpu_util: "GPU utilisation %", gpu_memory_mb: "GPU memory (MB)" };

/** The role of a process name: the driver (the learner itself unless its ranks run in processes
 * of their own), a learner rank, a rollout worker; other names as they are. */
export function processRole(process) {
  if (process === "driver") return "driver / learner";
  let m = process.match(/^learner_rank(\d+)$/);
  if (m) return `learner rank ${m[1]}`;
  m = process.match(/^rollout_(\d+)$/);
  if (m) return `rollout worker ${m[1]}`;
  return process;
}

/** "driver / learner · RSS (MB)" for ``system/driver/rss_mb``; "" for any other metric. */
export function systemLabel(name) {
  const prefix = METRIC.SYSTEM;
  if (!name.startsWith(prefix)) return "";
  const rest = name.slice(prefix.length), cut = rest.lastIndexOf("/");
  if (cut < 0) return "";
  const quantity = rest.slice(cut + 1);
  return `${processRole(rest.slice(0, cut))} · ${QUANTITIES[quantity] ?? quantity}`;
}
