// The run page's log panel: the learner's stderr as a reader wants it. tqdm redraws its progress
// bar after every line it writes (the log is a file, so each redraw is a line of its own), and a
// library's log record may follow a bar on the same line; the panel keeps only the newest bar,
// gives every record its own line and drops blank ones. The download keeps the file as written.

const BAR = /^\S[^|]*:\s+\d+%\|/; // "sync:  38%|███▊      | 3/8 [00:04<00:06,  1.39s/it]"
const GLUED_RECORD = /(?<=\S)(?=\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})/; // "...it][2026-12-01 19:15:24,354] [WARNING] ..."

/** Lines to show for the learner's log ``lines`` (in file order). */
export function readableLog(lines) {
  const split = lines.flatMap((line) => line.split(GLUED_RECORD));
  const shown = split.filter((line) => line.trim() !== "");
  let lastBar = -1;
  shown.forEach((line, i) => { if (BAR.test(line)) lastBar = i; });
  return shown.filter((line, i) => !BAR.test(line) || i === lastBar);
}
