// Span kinds and metric names as the learner defines them (learner/timeline.py, docs/spans.md),
// served in every page by templates/base.html ({% conventions_json %}): the pages never keep
// their own copy of the names.
const data = JSON.parse(document.getElementById("ts-conventions").textContent);

export const KIND = Object.freeze(data.kind);
export const METRIC = Object.freeze(data.metric);
export const SPAN_KINDS = Object.freeze(data.span_kinds);
export const LEARNER_KINDS = new Set(data.learner_kinds);
