// Charts drawn only while on screen. A run page left open redraws its charts on every step; most
// of them sit below the fold, and each plotly redraw costs tens of milliseconds of a core the
// run may share (docs/bench-web.md, "A viewer beside a run"). A chart out of view keeps only its
// latest draw, which runs when it scrolls within MARGIN of the viewport: what a reader looks at
// is always current, what nobody sees costs nothing.
const MARGIN = "300px 0px";

export class OnScreen {
  constructor() {
    this.shown = new Set(); // elements the observer last reported within the margin
    this.watched = new Set();
    this.waiting = new Map(); // element -> its latest draw, for when it shows
    this.observer = typeof IntersectionObserver === "function"
      ? new IntersectionObserver((entries) => this.changed(entries), { rootMargin: MARGIN }) : null;
  }

  changed(entries) {
    for (const entry of entries) {
      const el = entry.target;
      if (!entry.isIntersecting) { this.shown.delete(el); continue; }
      this.shown.add(el);
      const draw = this.waiting.get(el);
      if (draw) {
        this.waiting.delete(el);
        Promise.resolve(draw()).catch((err) => console.error("chart draw failed", err));
      }
    }
  }

  /**
   * Runs ``draw`` (sync or async) now when ``el`` is on screen, else keeps it as the element's
   * pending draw (replacing an older one) until the element shows. Resolves once drawn, or at
   * once for a deferred draw. An element is observed from its first call; until the observer's
   * first report (the next frame) its draw waits, then runs if it is in view.
   */
  draw(el, draw) {
    if (!this.observer) return Promise.resolve(draw());
    if (!this.watched.has(el)) { this.watched.add(el); this.observer.observe(el); }
    if (this.shown.has(el)) { this.waiting.delete(el); return Promise.resolve(draw()); }
    this.waiting.set(el, draw);
    return Promise.resolve();
  }

  /** Whether ``el`` has a draw waiting for it to scroll into view. */
  pending(el) { return this.waiting.has(el); }

  /** Stops watching an element taken off the page (e.g. an unticked metric's chart). */
  forget(el) {
    this.waiting.delete(el);
    this.shown.delete(el);
    if (this.watched.delete(el)) this.observer.unobserve(el);
  }
}
