"""Oversize request bodies keep the web process's memory flat: a 1 GiB chunked body sent to
daphne on the production settings, anonymous and logged in, is answered 413 after
THUNDERSYNC_MAX_REQUEST_BYTES and its connection closed, while daphne's resident set grows
by less than 20 MB (controller/limits/body_limit.py)."""

import socket
import threading
import time
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from .faults import ProductionWeb, RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
CHUNK = b"x" * (1 << 20)
GIB = 1 << 30


@pytest.fixture
def web(tmp_path, alice):
    hasher = PBKDF2PasswordHasher()
    alice.password = hasher.encode("alice-password", hasher.salt(), iterations=1000)
    alice.save(update_fields=["password"])
    redis = RedisServer(tmp_path / "redis").start()
    server = ProductionWeb(redis.url, tmp_path / "runs", tmp_path / "daphne.log")
    yield server
    server.stop()
    redis.stop()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def send_chunked(port: int, cookies: str) -> tuple[bytes, int]:
    """POST a 1 GiB chunked body, stopping when the server closes; (its answer, bytes sent)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST /api/experiments/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n" + cookies.encode() + b"\r\n")
        try:
            while sent < GIB:
                sock.sendall(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
                sent += len(CHUNK)
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: the rest of the body is never read
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return answer, sent


@pytest.mark.parametrize("logged_in", [False, True])
def test_a_1_gib_chunked_body_is_refused_with_flat_memory(web, logged_in):
    cookies = ""
    if logged_in:
        session = web.login("alice", "alice-password")
        cookies = "Cookie: " + "; ".join(f"{k}={v}" for k, v in session.cookies.get_dict().items()) + "\r\n"
    pid = web.proc.pid
    before, peak, done = rss_kb(pid), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_kb(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        answer, sent = send_chunked(web.port, cookies)
    finally:
        done.set()
        sampler.join(timeout=10)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b"request body larger than" in answer
    assert sent < 256 << 20  # cut off long before the gigabyte
    assert (peak[0] - before) < 20 * 1024, (before, peak[0])
