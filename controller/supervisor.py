"""Start the learner for one run, ingest what it reports, stop it when the user cancels.

The learner (``thundersync train --config FILE --events -``) runs in its own session, so it
leads a process group that also holds its rollout workers and tool sandboxes: cancel sends
SIGTERM to the whole group, then SIGKILL after a grace period, and whatever is left of the
group is killed when the run ends, so no worker outlives its run.
"""

import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import yaml
from django.conf import settings

from . import runlog
from .ingestion import RunIngestor, finish_run
from .runlog import LOG_NAME, count_lines
from .models import Run

log = logging.getLogger(__name__)
ORPHAN_GRACE_S = 2.0  # how long group members may outlive the learner before SIGKILL


class LearnerProcess:
    """The child process, with threads draining stdout (events) and stderr (progress, errors)."""

    def __init__(self, command: list[str], cwd: Path, stderr_lines: int,
                 on_log: Callable[[int, str], None] = lambda number, line: None):
        self.proc = subprocess.Popen(
            command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.pid = self.proc.pid
        self.stderr_tail: deque[str] = deque(maxlen=stderr_lines)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stdout_done = False
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, args=(cwd / LOG_NAME, on_log),
                                               daemon=True)
        self._stderr_reader.start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read_stderr(self, log_path: Path, on_log: Callable[[int, str], None]) -> None:
        number = count_lines(log_path)
        with open(log_path, "a") as log_file:
            for line in self.proc.stderr:
                log_file.write(line if line.endswith("\n") else line + "\n")
                log_file.flush()  # pages read the tail of this file on connect
                self.stderr_tail.append(line.rstrip("\n"))
                on_log(number, line.rstrip("\n"))
                number += 1

    def next_line(self, timeout: float) -> str | None:
        """The next stdout line, '' if none arrived within ``timeout``, None once stdout closed."""
        if self._stdout_done:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            return None
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return ""
        if line is None:
            self._stdout_done = True
        return line

    def drained(self) -> bool:
        """Nothing read from stdout is waiting: the learner's last write has been fed."""
        return self._lines.empty()

    def wait_for_stderr(self, timeout: float) -> None:
        """Let the reader take the last stderr lines (they make the error text)."""
        self._stderr_reader.join(timeout)

    def exited(self) -> bool:
        return self._stdout_done and self.proc.poll() is not None

    def signal_group(self, sig: signal.Signals) -> bool:
        """Signal every process of the group; False once none is left."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill_group(self, timeout: float) -> None:
        """SIGKILL what is left of the group and wait until it is gone (grandchildren are
        reaped by init, not by us, so this takes a moment after the learner exits)."""
        deadline = time.monotonic() + timeout
        while self.signal_group(signal.SIGKILL):
            if time.monotonic() > deadline:
                log.warning("process group %s still has members %.0fs after SIGKILL", self.pid, timeout)
                return
            time.sleep(0.05)


def learner_command(config_path: Path) -> list[str]:
    return [*settings.THUNDERSYNC_LEARNER_COMMAND, "train", "--config", str(config_path), "--events", "-"]


def supervise(run: Run) -> Run:
    """Train ``run`` to the end (or until cancelled) and record its final state."""
    run_dir = runlog.run_dir(run.pk)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(run.config, sort_keys=False))
    command = learner_command(config_path)
    ingestor = RunIngestor(run.pk, settings.THUNDERSYNC_INGEST_FLUSH_S, settings.THUNDERSYNC_INGEST_FLUSH_SPANS)
    try:
        child = LearnerProcess(command, run_dir, settings.THUNDERSYNC_STDERR_TAIL_LINES, on_log=ingestor.add_log)
    except OSError as err:
        return finish_run(run.pk, Run.Status.FAILED, f"could not start the learner {command[0]}: {err}")
    Run.objects.filter(pk=run.pk).update(pids=[child.pid])
    try:
        cancelled = pump(child, ingestor, run.pk)
        ingestor.flush()
    finally:
        child.kill_group(timeout=10.0)  # leftovers of the group never outlive the run
    child.wait_for_stderr(timeout=2.0)
    ingestor.publish_log()  # the last lines (a traceback) came after the last flush
    status, error = outcome(child, ingestor, cancelled)
    return finish_run(run.pk, status, error, ingestor.summary)


def pump(child: LearnerProcess, ingestor: RunIngestor, run_id: int) -> bool:
    """Feed events until the learner exits; returns whether it was cancelled."""
    poll_s, grace_s = settings.THUNDERSYNC_CANCEL_POLL_S, settings.THUNDERSYNC_CANCEL_GRACE_S
    next_poll, kill_at, cancelled, leader_gone_at = 0.0, None, False, None
    while not child.exited():
        line = child.next_line(timeout=ingestor.wait_s())
        if line:
            ingestor.feed(line)
        ingestor.flush_if_due(drained=child.drained())
        now = time.monotonic()
        if not cancelled and now >= next_poll:
            next_poll = now + poll_s
            if Run.objects.filter(pk=run_id, cancel_requested=True).exists():
                log.info("run %s: cancel requested, sending SIGTERM to process group %s", run_id, child.pid)
                cancelled, kill_at = True, now + grace_s
                child.signal_group(signal.SIGTERM)
        if kill_at is not None and now >= kill_at:
            log.info("run %s: still alive %.1fs after SIGTERM, sending SIGKILL", run_id, grace_s)
            child.signal_group(signal.SIGKILL)
            kill_at = None
        if child.proc.poll() is not None:
            # The learner is gone; orphans of its group must not keep its stdout open.
            leader_gone_at = leader_gone_at or now
            if now - leader_gone_at > ORPHAN_GRACE_S:
                child.signal_group(signal.SIGKILL)
    return cancelled


def outcome(child: LearnerProcess, ingestor: RunIngestor, cancelled: bool) -> tuple[str, str]:
    """Final status and error text: the failed event, else the exit code, with stderr's tail."""
    if cancelled:
        return Run.Status.CANCELLED, ""
    code = child.proc.returncode
    if ingestor.failure:
        reason = ingestor.failure
    elif code < 0:
        reason = f"the learner was killed by {signal.Signals(-code).name}"
    elif code > 0:
        reason = f"the learner exited with code {code}"
    elif not ingestor.finished:
        reason = "the learner exited without reporting the end of the run"
    else:
        return Run.Status.SUCCEEDED, ""
    details = [reason]
    if ingestor.rejected:
        details.append(f"{len(ingestor.rejected)} malformed event line(s), first: {ingestor.rejected[0]}")
    tail = list(child.stderr_tail)
    if tail and tail[-1].strip() == reason.strip():
        tail.pop()  # a traceback ends with the error the learner reported: say it once
    if tail:
        details.append("last stderr lines:\n" + "\n".join(tail))
    return Run.Status.FAILED, "\n".join(details)
