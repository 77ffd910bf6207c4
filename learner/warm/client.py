"""Start a run through the warm runner (learner/warm/server.py) and watch it like a child process.

Standard library only: the controller's supervisor imports it without torch. ``WarmProcess``
answers what ``controller/supervision/supervisor.py`` asks of a ``subprocess.Popen``: ``pid`` (the run's
process, leader of its own process group), ``stdout``/``stderr`` (pipes this process made and
handed over), ``poll()``, ``wait(timeout)`` and ``returncode``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from pathlib import Path


class WarmProcess:
    """A run the warm runner forked for us."""

    def __init__(self, socket_path: Path, argv: list[str], cwd: Path, env: dict[str, str],
                 timeout: float = 10.0):
        self.socket_path = socket_path
        self.args = argv
        self.returncode: int | None = None
        self.lost = ""  # why the exit code is unknown: the runner died during the run
        self._eof = False
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            conn.connect(str(socket_path))
            request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}) + "\n"
            socket.send_fds(conn, [request.encode()], [null, out_w, err_w])
            self._conn, self._buffer = conn, b""
            reply = self._line(timeout)
            if not reply or not reply.startswith("pid "):
                raise OSError(f"the warm runner at {socket_path} did not start the run (answer: {reply!r})")
        except BaseException:
            conn.close()
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (out_w, err_w, null):
                os.close(fd)
        self.pid = int(reply.split()[1])
        self.stdout = open(out_r, "r")
        self.stderr = open(err_r, "r")

    def _line(self, timeout: float | None) -> str | None:
        """The runner's next line; None on timeout, '' once the runner closed the connection."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._conn], [], [], left)
            if not ready:
                return None
            data = self._conn.recv(4096)
            if not data:
                return ""
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _alive(self) -> bool:
        """The run's process exists and is not a zombie nobody reaps (its runner is gone)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def poll(self) -> int | None:
        return self.wait(0.0, raising=False)

    def wait(self, timeout: float | None = None, raising: bool = True) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not self._eof:
            line = self._line(timeout)
            if line and line.startswith("exit "):
                self.returncode = int(line.split()[1])
            self._eof = line == ""
        if self._eof:  # the runner is gone, and with it the exit status: wait for the run itself
            deadline = time.monotonic() + (timeout or 0.0)
            while self._alive() and (timeout is None or time.monotonic() < deadline):
                time.sleep(0.05)
            if not self._alive():
                self.returncode = -signal.SIGTERM  # what the runner's death sent it (PR_SET_PDEATHSIG)
                self.lost = f"the warm runner ({self.socket_path}) exited during the run"
        if self.returncode is not None:
            self._conn.close()
        elif raising and timeout is not None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode
