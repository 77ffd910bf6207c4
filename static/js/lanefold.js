// Readable at any lane count: past FOLD_PAST rollout lanes, the rollout lanes fold into at most
// FOLD_BANDS bands (consecutive lanes of one band share a row; translucent bars add up to the
// band's occupancy) and every other lane (learner ranks, replicas) is pinned above them, so the
// lanes that matter most keep a full row and their label. A zoom into the lane axis unfolds
// the bands it covers (unfoldedRange).

export const FOLD_PAST = 48;
export const FOLD_BANDS = 16;

const isRollout = (lane) => lane.startsWith("rollout/");

/**
 * {bars, lanes, bands} for ``bars`` on ``lanes`` (ordered): unchanged (bands null) at or below
 * ``past`` rollout lanes, else folded: bands = [{lane, members: [rollout lanes]}].
 */
export function foldLanes(bars, lanes, { past = FOLD_PAST, maxBands = FOLD_BANDS } = {}) {
  const rollout = lanes.filter(isRollout);
  if (rollout.length <= past) return { bars, lanes, bands: null };
  const size = Math.ceil(rollout.length / maxBands), bands = [], bandOf = new Map();
  for (let i = 0; i < rollout.length; i += size) {
    const members = rollout.slice(i, i + size);
    const last = members[members.length - 1].slice("rollout/".length);
    const lane = `${members[0]}…${last} ×${members.length}`;
    bands.push({ lane, members });
    for (const m of members) bandOf.set(m, lane);
  }
  const pinned = lanes.filter((l) => !isRollout(l));
  const folded = bars.map((b) => (bandOf.has(b.lane) ? { ...b, lane: bandOf.get(b.lane), folded: true } : b));
  return { bars: folded, lanes: [...pinned, ...bands.map((b) => b.lane)], bands };
}

/**
 * The unfolded lane axis range for a zoom to ``range`` (category positions, either order) on the
 * folded axis ``foldedLanes``: it covers every lane of the bands (and pinned lanes) zoomed into.
 * Returned reversed, as the lane axis runs top-down.
 */
export function unfoldedRange(foldedLanes, bands, range, lanes) {
  const lo = Math.max(0, Math.round(Math.min(...range))), hi = Math.min(foldedLanes.length - 1, Math.round(Math.max(...range)));
  const members = new Map(bands.map((b) => [b.lane, b.members]));
  const covered = foldedLanes.slice(lo, hi + 1).flatMap((l) => members.get(l) ?? [l]);
  const index = covered.map((l) => lanes.indexOf(l)).filter((i) => i >= 0);
  if (!index.length) return null;
  return [Math.max(...index) + 0.5, Math.min(...index) - 0.5];
}
