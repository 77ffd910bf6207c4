"""What the browser tests and the web benches share: a real daphne server process serving
controller.asgi on the test database, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
# The run page's documented debug flag (docs/pages.md): frame/draw logs and window.__thundersync.
DEBUG_FLAG = "window.THUNDERSYNC_DEBUG = true;"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_database_env() -> dict[str, str]:
    """The test database this process created, by name, when pytest-django made one (under
    pytest-xdist its name carries the worker's suffix, which the settings cannot derive)."""
    from django.db import connection

    name = connection.settings_dict["NAME"]
    return {"THUNDERSYNC_TEST_DATABASE": name} if str(name).startswith("test_") else {}


@contextmanager
def asgi_server(start_timeout: float = 60.0):
    """Run daphne with tests.harness.web_asgi in its own process; yields the base URL.

    A separate process, as in production: the websocket consumer talks to the worker only
    through the database and the Redis channel layer."""
    port = free_port()
    # production's 5 s wait for a pooled connection, not the test workers' 1 s: on a machine loaded
    # by a two-node run and two CPU hogs a login waited longer than 1 s (a 503 instead of the page)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controller.settings.test", "PYTHONPATH": str(ROOT),
           "THUNDERSYNC_TEST_DB_POOL_TIMEOUT_S": "5", **test_database_env()}
    log_path = ROOT / "artifacts" / f"daphne-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "tests.harness.web_asgi:application"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daphne did not listen within {start_timeout}s: {log_path.read_text()[-2000:]}")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch_chromium(playwright):
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def log_in(page, base_url: str, username: str, password: str) -> None:
    for attempt in range(2):
        page.goto(f"{base_url}/accounts/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        with page.expect_response(lambda r: r.request.method == "POST" and "/accounts/login/" in r.url,
                                  timeout=90_000) as answer:
            page.click("#login-form button[type=submit]")
        # a 503 is the app's answer while no pooled database connection frees up within its wait
        # (a two-node run beside the suite's other worker once held PostgreSQL that long): a user
        # tries again, and so does this, once; any other answer, or a second 503, is the test's
        if answer.value.status != 503 or attempt:
            break
        page.wait_for_timeout(2_000)
    # up to 90 s: a loaded 2-core machine once kept this navigation past playwright's default 30 s
    # (the two-node test, right after the connections load test on the same worker)
    page.wait_for_url(f"{base_url}/", timeout=90_000)


def pick_metrics(page, names: list[str]) -> None:
    """Ticks exactly ``names`` in the every-metric panel's list (static/js/metricpanel.js) and
    scrolls its charts into view: the run page draws a chart only while it is on screen
    (static/js/onscreen.js), as a reader scrolling to it would see it."""
    page.evaluate("""(names) => {
        for (const box of document.querySelectorAll('#metric-picker input')) box.checked = names.includes(box.value);
        document.getElementById('metric-picker').dispatchEvent(new Event('change'));
    }""", names)
    page.locator("#metric-charts").scroll_into_view_if_needed()


CHARTS_DRAWN = """() => [...document.querySelectorAll('[id^="chart-"]')].every(
    (div) => div.offsetParent === null || div.classList.contains('js-plotly-plot') || div.textContent.trim() !== '')"""


def screenshot(page, name: str) -> Path:
    """The whole page as a reader scrolling through it sees it: the page draws a chart only while
    it is on screen (static/js/onscreen.js), so the viewport is made as tall as the page until its
    charts have drawn (or said they have no data), then put back."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    viewport = page.viewport_size
    height = page.evaluate("document.documentElement.scrollHeight")
    if viewport and height > viewport["height"]:
        page.set_viewport_size({"width": viewport["width"], "height": min(height, 16_000)})
        try:
            page.wait_for_function(CHARTS_DRAWN, timeout=15_000)
        except Exception:  # noqa: BLE001 (a picture with an undrawn chart, not a failed test)
            pass
    page.screenshot(path=str(path), full_page=True)
    if viewport and height > viewport["height"]:
        page.set_viewport_size(viewport)
    return path


# -- pytest fixtures for tests/controller/test_browser_*.py (import them into the test module) --

class SharedAsgiServer:
    """The daphne processes of a pytest process's tests: one per environment a test starts it
    with, so most tests share one, and a test that sets THUNDERSYNC_RUN_DIR or another
    setting's variable first gets a server started with it. The two last used are kept (the
    shared one stays while such a test runs), a server that has exited is started again.
    Each test still has a database of its own (transactional_db empties every table after
    it), and the server keeps no state of its own between requests: starting daphne and
    importing the app took about half of a browser test's setup."""

    IGNORED = ("PYTEST_CURRENT_TEST",)  # pytest rewrites it for every test phase
    KEPT = 2

    def __init__(self):
        self.servers: dict[tuple, tuple[ExitStack, str]] = {}  # environment -> (its stop, URL); last used last

    def environment(self) -> tuple:
        return tuple(sorted((k, v) for k, v in os.environ.items() if k not in self.IGNORED))

    def url(self) -> str:
        key = self.environment()
        stack, url = self.servers.pop(key, (None, None))
        if url is not None and not self._answers(url):
            stack.close()
            url = None
        if url is None:
            while len(self.servers) >= self.KEPT:
                self.servers.pop(next(iter(self.servers)))[0].close()  # the least recently used
            stack = ExitStack()
            url = stack.enter_context(asgi_server())
        self.servers[key] = (stack, url)
        return url

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=2).close()
            return True
        except OSError:
            return False

    def close(self) -> None:
        while self.servers:
            self.servers.popitem()[1][0].close()


@pytest.fixture(scope="session")
def asgi_servers(django_db_setup):
    """The pytest process's daphne servers (SharedAsgiServer), stopped before the test database is dropped."""
    servers = SharedAsgiServer()
    yield servers
    servers.close()


@pytest.fixture
def live_url(transactional_db, asgi_servers):
    """Base URL of a daphne process serving the app on this test's (committed) database."""
    return asgi_servers.url()


@pytest.fixture
def browser_page(monkeypatch):
    """(page, errors): a chromium page and the uncaught page errors it collected."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop on this thread, which trips Django's guard
    # against blocking calls inside a running loop; the loop is idle whenever test code runs.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.add_init_script(DEBUG_FLAG)
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        yield page, errors
        browser.close()
        # Django keys connections by async context, so queries made inside this block opened
        # their own connection; close it here, where it is visible, before the database goes.
        from django.db import connections

        connections.close_all()


# -- benches: a throwaway test database and a run-shaped workload of spans ------------------

@contextmanager
def bench_database():
    """Django on the test settings with a fresh test database, dropped on exit."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "controller.settings.test"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.test.utils import setup_databases, teardown_databases

    old = setup_databases(verbosity=0, interactive=False)
    try:
        yield
    finally:
        from django.db import connections

        connections.close_all()
        teardown_databases(old, verbosity=0)


def bench_run(status: str, username: str = "bench", password: str = "bench-password"):
    """A user, an experiment on configs/quickstart.yaml, a streaming preset and one run."""
    import yaml
    from django.contrib.auth import get_user_model

    from controller.config_merge import run_config
    from controller.models import Experiment, Run, Schedule

    user = get_user_model().objects.create_user(username, password=password)
    config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    experiment = Experiment.objects.create(owner=user, name="web bench", config=config)
    schedule = Schedule.objects.create(owner=None, name="streaming", kind="streaming")
    return Run.objects.create(experiment=experiment, schedule=schedule, steps=10, status=status,
                              config=run_config(config, schedule.overrides(), 10, "web bench"))


def agent_run_events(steps: int, groups: int, group_size: int, workers: int, slots: int, max_turns: int = 8,
                     seed: int = 0, learn_after_rollout: bool = False):
    """Span and metrics events shaped like a streaming GRPO run of a multi-turn tool agent.

    Per trajectory: 1 to ``max_turns`` turns of rollout.generate separated by rollout.tool waits (lognormal,
    as learner.tasks.env's latency model), then rollout.verify, on the least-loaded of
    ``workers x slots`` rollout slots; the learner runs each trajectory's backward as soon as
    its reward exists (``learn_after_rollout``: sync's shape, once every reward is in), closes each
    group after its last member, then optimizer and publish.
    Metrics come from the spans through learner.timeline.window_metrics, as the learner's do.
    Returns (span events in seq order, metrics events)."""
    import random

    from learner.timeline import window_metrics

    rng = random.Random(seed)
    spans, metrics, t, traj_id = [], [], 0.0, 0
    for step in range(steps):
        t_start, free = t, {(w, s): t for w in range(workers) for s in range(slots)}
        step_spans, rewards = [], []

        def span(kind, t0, t1, lane, traj=None, group=None, turn=None, version=step, tokens=0):
            step_spans.append({"type": "span", "step": step, "kind": kind, "t0": t0, "t1": t1, "lane": lane,
                               "traj": traj, "group": group, "turn": turn, "policy_version": version,
                               "tokens": tokens})

        for g in range(step * groups, (step + 1) * groups):
            for _ in range(group_size):
                (w, s), clock = min(free.items(), key=lambda kv: kv[1])
                lane, turns = f"rollout/{w}/{s}", rng.randint(1, max_turns)
                for turn in range(turns):
                    d = rng.uniform(0.05, 0.25)
                    span("rollout.generate", clock, clock + d, lane, traj_id, g, turn, tokens=rng.randint(8, 24))
                    clock += d
                    if turn < turns - 1:
                        d = 0.05 * rng.lognormvariate(0.0, 0.8)
                        span("rollout.tool", clock, clock + d, lane, traj_id, g, turn)
                        clock += d
                span("rollout.verify", clock, clock + 0.005, lane, traj_id, g)
                free[(w, s)] = clock + 0.005
                rewards.append((clock + 0.005, traj_id, g))
                traj_id += 1
        learner, members = (max(r[0] for r in rewards) if learn_after_rollout else t_start), {}
        for ready, traj, g in sorted(rewards):
            learner = max(learner, ready)
            d = rng.uniform(0.02, 0.05)
            span("learner.backward", learner, learner + d, "learner/0", traj, g, tokens=rng.randint(20, 80))
            learner += d
            members[g] = members.get(g, 0) + 1
            if members[g] == group_size:
                span("learner.group_close", learner, learner + 0.002, "learner/0", group=g)
                learner += 0.002
        span("learner.optimizer", learner, learner + 0.05, "learner/0")
        span("learner.publish", learner + 0.05, learner + 0.08, "learner/0", version=step + 1)
        t = learner + 0.08
        step_spans.sort(key=lambda e: e["t1"])  # emission order: a span is reported when it ends
        values = window_metrics(step_spans, t_start, t)
        last_reward = max(r[0] for r in rewards)
        first_backward = min(e["t0"] for e in step_spans if e["kind"] == "learner.backward")
        values.update({"timing_s/step": t - t_start, "step/t_start": t_start, "step/t_end": t,
                       "step/last_reward_t": last_reward, "step/first_backward_t": first_backward,
                       "timing_s/tail": t - last_reward,
                       "staleness/mean": 0.0, "staleness/max": 0.0, "reward/mean": rng.uniform(0.2, 0.8)})
        spans += step_spans
        metrics.append({"type": "metrics", "step": step, "values": values})
    for seq, event in enumerate(spans):
        event["seq"] = seq
    return spans, metrics
