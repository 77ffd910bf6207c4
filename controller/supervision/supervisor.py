"""Start the learner for one run, ingest what it reports, stop it when the user cancels.

The learner (``thundersync train --config FILE --events -``) runs in its own session, so it
leads a process group that also holds its rollout workers and tool sandboxes: cancel sends
SIGTERM to the whole group, then SIGKILL after a grace period, and whatever is left of the
group is killed when the run ends, so no worker outlives its run.

While it runs the supervisor stamps the run's heartbeat (``controller/supervision/ownership.py``), and
it outlives infrastructure faults: database errors are retried with backoff while the
learner keeps training, a learner that makes no progress (no span, trajectory, step metrics or
checkpoint; its system samples only say it is alive) for THUNDERSYNC_PROGRESS_TIMEOUT_S is
stopped with that reason, and a stderr log that cannot be written (a full disk) fails
the run with the reason instead of silently blocking the learner on a full pipe.
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
from typing import Callable, TypeVar

import yaml
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils import timezone

from learner.stopping import sweep_semaphores

from controller.supervision import liveness
from controller.supervision import nodes
from controller.supervision import ownership
from controller.supervision import runlog
from controller.supervision import warm
from controller.supervision.child_env import run_environment
from controller.limits.disk_quota import DiskWatch
from controller.supervision.processes import die_with_parent, me
from controller.ingest.ingestion import RunIngestor, finish_run
from controller.ingest.run_events import Parsed
from controller.supervision.priority import yield_to_runs
from controller.supervision.runlog import LOG_NAME, count_lines
from controller.models import Run
from controller.supervision.resuming import commit_point, output_dir, remove_half_written, resume_arguments
from controller.server_paths import run_dir_escape

log = logging.getLogger(__name__)
T = TypeVar("T")
ORPHAN_GRACE_S = 2.0  # how long group members may outlive the learner before SIGKILL
LIVENESS_ONLY = ("system",)  # events that say the learner is alive, not that it got anything done


def is_progress(parsed) -> bool:
    """Whether a line is work done (a span, a trajectory, a step's metrics, a checkpoint, the run's
    start or end), which the progress watchdog counts; a system sample or a bad line is not."""
    if not isinstance(parsed, Parsed) or parsed.span is not None:
        return True
    return parsed.event is not None and parsed.event.get("type") not in LIVENESS_ONLY


class LearnerProcess:
    """The child process, with threads draining stdout (events) and stderr (progress, errors).

    The readers never stop reading while the pipes are open (a reader that died would
    leave the learner blocked on a full pipe): a failure to write the stderr log (a full
    disk) is recorded in ``reader_error``, for the supervisor to fail the run with."""

    def __init__(self, command: list[str], cwd: Path, stderr_lines: int,
                 on_log: Callable[[int, str], None] = lambda number, line: None, env: dict[str, str] | None = None,
                 parse: Callable[[str], object] = lambda line: line):
        env = run_environment(env)  # no secrets of the worker's (controller/supervision/child_env.py)
        # forked by this worker's warm runner if it has one (controller/supervision/warm.py), else cold
        self.proc = warm.spawn(command, cwd, env) or subprocess.Popen(
            command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1, start_new_session=True, env=env, preexec_fn=die_with_parent,
        )
        self.pid = self.proc.pid
        self.stderr_tail: deque[str] = deque(maxlen=stderr_lines)
        self.reader_error = ""
        self._lines: queue.Queue = queue.Queue()
        self._stdout_done = False
        threading.Thread(target=self._read_stdout, args=(parse,), daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, args=(cwd / LOG_NAME, on_log),
                                               daemon=True)
        self._stderr_reader.start()

    def _read_stdout(self, parse: Callable[[str], object]) -> None:
        """Reads and decodes (``parse``) each line at the app's lower priority (controller/supervision/priority.py)."""
        yield_to_runs()
        try:
            for line in self.proc.stdout:
                parsed = parse(line)
                if parsed is not None:  # None: a blank line
                    self._lines.put(parsed)
        except (OSError, ValueError) as err:  # undecodable output and the like
            self.reader_error = self.reader_error or f"could not read the learner's events: {err}"
        finally:
            self._lines.put(None)

    def _read_stderr(self, log_path: Path, on_log: Callable[[int, str], None]) -> None:
        """Appends each line to the log file and hands it, numbered as in the file, to ``on_log``
        (the run page's log panel, controller/supervision/runlog.py)."""
        yield_to_runs()
        log_file, number = None, count_lines(log_path)
        try:
            log_file = open(log_path, "a")
        except OSError as err:
            self.reader_error = f"cannot write {log_path}: {err.strerror}"
        try:
            for line in self.proc.stderr:
                self.stderr_tail.append(line.rstrip("\n"))
                on_log(number, line.rstrip("\n"))
                number += 1
                if log_file is not None:
                    try:
                        log_file.write(line if line.endswith("\n") else line + "\n")
                        log_file.flush()  # pages read the tail of this file on connect
                    except OSError as err:  # ENOSPC: keep draining the pipe, report it
                        self.reader_error = self.reader_error or f"cannot write {log_path}: {err.strerror}"
                        log_file = None
        except (OSError, ValueError) as err:
            self.reader_error = self.reader_error or f"could not read the learner's stderr: {err}"
        finally:
            if log_file is not None:
                try:
                    log_file.close()
                except OSError as err:
                    self.reader_error = self.reader_error or f"cannot write {log_path}: {err.strerror}"

    def next_line(self, timeout: float):
        """The next stdout line as ``parse`` made it, '' if none arrived within ``timeout``, None once
        stdout closed."""
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
    """Train ``run`` to the end (or until cancelled) and record its final state. A resumed
    attempt (``run.attempt`` > 0) continues from its latest checkpoint (controller/supervision/resuming.py)."""
    run_dir = runlog.run_dir(run.pk)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    # every run keeps its final model (and checkpoints, if asked) under its run directory
    config = {**run.config, "train": {**run.config.get("train", {}), "output_dir": output_dir(run.config)}}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    if escape := run_dir_escape(config, run_dir):
        return finish_run(run.pk, Run.Status.FAILED, escape)
    if run.attempt:
        commit_point(run, run_dir)
        command = [*settings.THUNDERSYNC_LEARNER_COMMAND, "train", *resume_arguments(run, run_dir), "--events", "-"]
    else:
        command = learner_command(config_path)
    ingestor = RunIngestor(run.pk, settings.THUNDERSYNC_INGEST_FLUSH_S, settings.THUNDERSYNC_INGEST_FLUSH_SPANS)
    _, remote = nodes.placement(config)
    # ranks on other nodes: their tasks go out now and connect once the driver listens
    env = nodes.start_remote_ranks(run, remote) if remote else None
    # ours from the claim on: the warm runner may still be importing (THUNDERSYNC_WARM_WAIT_S), and
    # the reaper must not take this run for one whose supervisor stopped meanwhile
    with ownership.supervising(run.pk):
        try:
            child = LearnerProcess(command, run_dir, settings.THUNDERSYNC_STDERR_TAIL_LINES, on_log=ingestor.add_log,
                                   env=env, parse=ingestor.parse)
        except OSError as err:
            return finish_run(run.pk, Run.Status.FAILED, f"could not start the learner {command[0]}: {err}")
        Run.objects.filter(pk=run.pk).update(pids=[child.pid], supervisor=me(), heartbeat=timezone.now())
        watch = RunWatch(child, ingestor, run.pk, spans_nodes=bool(remote))
        try:
            watch.pump()
            watch.db.until_done("store the last events", watch.ingestor.flush)
        finally:
            child.kill_group(timeout=10.0)  # leftovers of the group never outlive the run
            sweep_semaphores({child.pid})  # what a SIGKILLed group leaves in /dev/shm (learner/stopping.py)
            remove_half_written(run_dir, config)  # a checkpoint the learner died writing (a full disk)
        child.wait_for_stderr(timeout=2.0)
        ingestor.publish_log()  # the last lines (a traceback) came after the last flush
        status, error = watch.outcome()
        return watch.db.until_done("record the final state",
                                   lambda: finish_run(run.pk, status, error, watch.ingestor.summary))


class DatabaseRetry:
    """Database calls of a supervisor that outlive a database outage: on a connection error
    the broken connection is dropped and the call is tried again later (backoff up to
    THUNDERSYNC_DB_RETRY_MAX_S) while the learner keeps training and its events are kept;
    one warning per outage. Past THUNDERSYNC_DB_OUTAGE_LIMIT_S the error is raised."""

    def __init__(self, run_id: int, supervisor: str):
        self.run_id, self.delay, self.next_try, self.down_since = run_id, 0.0, 0.0, None
        self.supervisor = supervisor

    def attempt(self, what: str, call: Callable[[], object]) -> bool:
        """Run ``call`` unless backing off; False if it did not run or the database failed."""
        now = time.monotonic()
        if now < self.next_try:
            return False
        try:
            call()
        except (OperationalError, InterfaceError) as err:
            close_old_connections()
            if self.down_since is None:
                self.down_since = now
                log.warning("run %s: the database is unreachable (%s: %s); retrying while the learner trains",
                            self.run_id, what, str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__)
            if now - self.down_since > settings.THUNDERSYNC_DB_OUTAGE_LIMIT_S:
                raise
            self.delay = min(max(2 * self.delay, 0.25), settings.THUNDERSYNC_DB_RETRY_MAX_S)
            self.next_try = now + self.delay
            return False
        if self.down_since is not None:
            log.warning("run %s: the database is back after %.1fs", self.run_id, now - self.down_since)
        self.down_since, self.delay = None, 0.0
        return True

    def until_done(self, what: str, call: Callable[[], T]) -> T:
        box: list[T] = []
        while not self.attempt(what, lambda: box.append(call())):
            liveness.mark_alive(self.run_id, self.supervisor)  # alive, only the database is not
            time.sleep(max(0.05, self.next_try - time.monotonic()))
        return box[0]


class RunWatch:
    """The supervisor's loop for one run: events in, heartbeat out, cancel, watchdogs."""

    def __init__(self, child: LearnerProcess, ingestor: RunIngestor, run_id: int, spans_nodes: bool = False):
        self.child, self.ingestor, self.run_id, self.spans_nodes = child, ingestor, run_id, spans_nodes
        self.me = me()
        self.db = DatabaseRetry(run_id, self.me)
        self.disk = DiskWatch(run_id)
        self.stopping: str | None = None  # why the learner is being stopped: cancelled / lost / a failure
        self.failure = ""
        self.kill_at: float | None = None
        self.leader_gone_at: float | None = None
        now = time.monotonic()
        self.next_poll = self.next_stamp = self.next_alive = now
        self.last_progress = now

    def pump(self) -> None:
        """Feed events until the learner exits."""
        child = self.child
        while not child.exited():
            line = child.next_line(timeout=self.ingestor.wait_s())
            now = time.monotonic()
            if line:
                self.ingestor.take(line)
                if is_progress(line):  # a system sample says the learner is alive, not that it gets work done
                    self.last_progress = now
            if now >= self.next_alive:  # liveness through the run directory, whatever the database does
                self.next_alive = now + settings.THUNDERSYNC_HEARTBEAT_S
                liveness.mark_alive(self.run_id, self.me)
            self.db.attempt("store events", lambda: self.ingestor.flush_if_due(drained=child.drained()))
            if now >= self.next_poll:
                self.next_poll = now + settings.THUNDERSYNC_CANCEL_POLL_S
                self.db.attempt("read the cancel flag", self.poll)
            self.watchdogs(now)
            if self.kill_at is not None and now >= self.kill_at:
                log.info("run %s: still alive %.1fs after SIGTERM, sending SIGKILL", self.run_id,
                         settings.THUNDERSYNC_CANCEL_GRACE_S)
                child.signal_group(signal.SIGKILL)
                self.kill_at = None
            if child.proc.poll() is not None:
                # The learner is gone; orphans of its group must not keep its stdout open.
                self.leader_gone_at = self.leader_gone_at or now
                if now - self.leader_gone_at > ORPHAN_GRACE_S:
                    child.signal_group(signal.SIGKILL)

    def poll(self) -> None:
        """Stamp the heartbeat (every THUNDERSYNC_HEARTBEAT_S) and read the cancel flag."""
        if time.monotonic() >= self.next_stamp:
            owned = Run.objects.filter(pk=self.run_id, status__in=Run.ACTIVE, supervisor=self.me).update(
                heartbeat=timezone.now())
            self.next_stamp = time.monotonic() + settings.THUNDERSYNC_HEARTBEAT_S
            if not owned:  # ended or taken over meanwhile (the reaper, after a long outage)
                self.stop("lost", "the run is no longer ours")
        if Run.objects.filter(pk=self.run_id, cancel_requested=True).exists():
            self.stop("cancelled", "cancel requested")
        if self.spans_nodes and not self.ingestor.failure and (failure := nodes.node_failure(self.run_id)):
            self.stop("failed", failure)  # a node's task died or failed: the run fails everywhere
        if over := self.disk.over():  # the owner's runs outgrew their disk quota (controller/limits/disk_quota.py)
            self.stop("failed", over)

    def watchdogs(self, now: float) -> None:
        if self.child.reader_error:
            self.stop("failed", self.child.reader_error)
        idle = now - self.last_progress
        if idle > settings.THUNDERSYNC_PROGRESS_TIMEOUT_S and self.child.proc.poll() is None:
            self.stop("failed", f"no progress from the learner for {idle:.0f}s: no span, trajectory or step finished, "
                                f"only system samples (it hangs or a step costs too much; "
                                f"THUNDERSYNC_PROGRESS_TIMEOUT_S={settings.THUNDERSYNC_PROGRESS_TIMEOUT_S:g})")

    def stop(self, why: str, reason: str) -> None:
        """SIGTERM the group once (the learner stops at a safe point), SIGKILL after the grace."""
        if self.stopping is not None:
            return
        self.stopping, self.failure = why, reason if why == "failed" else ""
        log.info("run %s: %s, sending SIGTERM to process group %s", self.run_id, reason, self.child.pid)
        self.kill_at = time.monotonic() + settings.THUNDERSYNC_CANCEL_GRACE_S
        self.child.signal_group(signal.SIGTERM)

    def outcome(self) -> tuple[str, str]:
        """Final status and error text: the failed event, else the exit code, with stderr's tail."""
        if self.stopping == "cancelled":
            return Run.Status.CANCELLED, ""
        child, ingestor = self.child, self.ingestor
        code = child.proc.returncode
        if self.failure:
            reason = self.failure
        elif getattr(child.proc, "lost", ""):  # a warm-runner run whose runner died (controller/supervision/warm.py)
            reason = child.proc.lost
        elif ingestor.failure:
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
