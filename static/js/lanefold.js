// Readable at any lane count: every lane that is not a rollout slot (learner ranks, replicas) is
// pinned at the top with a full row and its label, whatever the rollout lanes do. Past FOLD_PAST
// rollout lanes, those fold into at most FOLD_BANDS bands (consecutive lanes of one band share a
// row; translucent bars add up to the band's occupancy). A zoom into the lane axis shows the
// rollout lanes it covers, each in a full row, below the pinned lanes (zoomedLanes): the zoom
// narrows the rollout lanes, never the pinned ones. Double-click (autorange) zooms back out.

export const FOLD_PAST = 48;
export const FOLD_BANDS = 16;

const isRollout = (lane) => lane.startsWith("rollout/");

/**
 * {bars, lanes, bands} for ``bars`` on ``lanes`` (ordered): the pinned lanes first, then
 * ``window`` (the rollout lanes a zoom chose, in full rows) when given, else the rollout lanes,
 * folded when ``fold`` and past ``past`` of them: bands = [{lane, members: [rollout lanes]}] (null
 * unfolded).
 */
export function foldLanes(bars, lanes, { past = FOLD_PAST, maxBands = FOLD_BANDS, fold = true, window = null } = {}) {
  const pinned = lanes.filter((l) => !isRollout(l)), rollout = lanes.filter(isRollout);
  if (window) {
    const shown = new Set([...pinned, ...window]);
    return { bars: bars.filter((b) => shown.has(b.lane)), lanes: [...pinned, ...rollout.filter((l) => shown.has(l))], bands: null };
  }
  if (!fold || rollout.length <= past) return { bars, lanes: [...pinned, ...rollout], bands: null };
  const size = Math.ceil(rollout.length / maxBands), bands = [], bandOf = new Map();
  for (let i = 0; i < rollout.length; i += size) {
    const members = rollout.slice(i, i + size);
    const last = members[members.length - 1].slice("rollout/".length);
    const lane = `${members[0]}…${last} ×${members.length}`;
    bands.push({ lane, members });
    for (const m of members) bandOf.set(m, lane);
  }
  const folded = bars.map((b) => (bandOf.has(b.lane) ? { ...b, lane: bandOf.get(b.lane), folded: true } : b));
  return { bars: folded, lanes: [...pinned, ...bands.map((b) => b.lane)], bands };
}

/**
 * The rollout lanes a zoom to ``range`` (category positions, either order) on the shown lane axis
 * ``shownLanes`` covers: the members of the bands zoomed into and the rollout lanes themselves;
 * null when it covers none (a zoom into the pinned lanes only keeps the view).
 */
export function zoomedLanes(shownLanes, bands, range) {
  const lo = Math.max(0, Math.round(Math.min(...range))), hi = Math.min(shownLanes.length - 1, Math.round(Math.max(...range)));
  const members = new Map((bands ?? []).map((b) => [b.lane, b.members]));
  const covered = shownLanes.slice(lo, hi + 1).flatMap((l) => members.get(l) ?? [l]).filter(isRollout);
  return covered.length ? covered : null;
}
