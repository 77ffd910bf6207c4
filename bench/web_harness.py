"""What the browser tests and the web benches share: a real daphne server process serving
controller.asgi on the test database, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def asgi_server(start_timeout: float = 60.0):
    """Run daphne with bench.web_asgi in its own process; yields the base URL.

    A separate process, as in production: the websocket consumer talks to the worker only
    through the database and the Redis channel layer."""
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controller.settings.test", "PYTHONPATH": str(ROOT)}
    log_path = ROOT / "artifacts" / f"daphne-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "bench.web_asgi:application"],
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
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-form button[type=submit]")
    page.wait_for_url(f"{base_url}/")


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# -- pytest fixtures for tests/controller/test_browser_*.py (import them into the test module) --

@pytest.fixture
def live_url(transactional_db):
    """Base URL of a daphne process serving the app on this test's (committed) database."""
    with asgi_server() as url:
        yield url


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
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        yield page, errors
        browser.close()
        # Django keys connections by async context, so queries made inside this block opened
        # their own connection; close it here, where it is visible, before the database goes.
        from django.db import connections

        connections.close_all()
