// JSON API reads for the pages (docs/web-contract.md, "JSON API"); session cookie auth.

const SPANS_PAGE = 10000;

export async function getJSON(url) {
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = "";
    try { detail = JSON.stringify((await response.json()).errors); } catch { /* not JSON */ }
    throw new Error(`${url}: HTTP ${response.status} ${detail}`);
  }
  return response.json();
}

/** Every span of steps [stepFrom, stepTo] (inclusive), following the ``after`` cursor page by page. */
export async function fetchSpans(apiBase, stepFrom, stepTo) {
  const spans = [];
  let after = -1;
  for (;;) {
    const page = await getJSON(`${apiBase}spans/?step_from=${stepFrom}&step_to=${stepTo}&after=${after}&limit=${SPANS_PAGE}`);
    spans.push(...page.spans);
    if (page.spans.length < SPANS_PAGE) return spans;
    after = page.last_seq;
  }
}
