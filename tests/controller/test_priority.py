"""The app's per-run threads yield the CPU to the run (controller/supervision/priority.py); the learner it
starts keeps the priority of the app's supervisor, never the lowered one."""

import os
import sys
import threading

import pytest

from controller.supervision.priority import yield_to_runs
from controller.supervision.supervisor import LearnerProcess


def thread_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_only_the_calling_thread_is_lowered(settings):
    settings.THUNDERSYNC_APP_NICE = 7
    before, seen = thread_nice(), {}

    def lowered():
        seen["value"] = yield_to_runs()
        seen["now"] = thread_nice()

    worker = threading.Thread(target=lowered)
    worker.start()
    worker.join(10)
    assert seen["value"] == seen["now"] == max(before, 7)
    assert thread_nice() == before  # the caller (a supervisor, which starts learners) is untouched


def test_a_cold_learner_keeps_the_supervisors_priority_while_its_readers_yield(settings, tmp_path):
    settings.THUNDERSYNC_APP_NICE = 9
    supervisor_nice, reader_nice = thread_nice(), []

    def parse(line: str) -> str:  # runs in the stdout reader thread
        reader_nice.append(thread_nice())
        return line.strip()

    child = LearnerProcess([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                           tmp_path, stderr_lines=5, parse=parse)
    lines = []
    while (line := child.next_line(timeout=10)) is not None:
        lines.append(line)
        if not line:
            pytest.fail("the child printed nothing within 10s")
    assert lines == [str(supervisor_nice)]  # the learner: the supervisor's nice, not the readers'
    assert reader_nice == [max(supervisor_nice, 9)]
    assert thread_nice() == supervisor_nice


def test_a_bad_nice_value_is_refused_with_its_name():
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import controller.settings.base"], capture_output=True, text=True,
                          env={**os.environ, "THUNDERSYNC_APP_NICE": "high"}, timeout=60)
    assert done.returncode != 0 and "THUNDERSYNC_APP_NICE: expected a nice value 0-19, got 'high'" in done.stderr


LOWER_SESSION = """
import subprocess, sys
from django.conf import settings
settings.configure(THUNDERSYNC_APP_NICE=11)
from controller.supervision.priority import AUTOGROUP, lower_session
restore = lower_session()
print(AUTOGROUP.read_text().split()[-1])
run = [sys.executable, "-c", "print(open('/proc/self/autogroup').read().split()[-1])"]
print(subprocess.run(run, start_new_session=True, capture_output=True, text=True, timeout=60).stdout.strip())
restore()
print(AUTOGROUP.read_text().split()[-1])
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no scheduler autogroups here")
def test_the_apps_session_is_lowered_and_restored_while_a_run_session_starts_at_zero():
    import subprocess

    done = subprocess.run([sys.executable, "-c", LOWER_SESSION], capture_output=True, text=True, timeout=120,
                          start_new_session=True)  # a session of its own: the test's is left alone
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["11", "0", "0"]  # the app's session, a run's new session, after restore


def test_a_celery_worker_lowers_its_session_when_ready_and_restores_it_at_shutdown(monkeypatch):
    """The worker_ready handler starts the reaper and the warm runner, then lowers the session;
    worker_shutdown restores it (the handlers run inside Celery, which only logs what they raise)."""
    from controller.supervision import ownership
    from controller.supervision import priority
    from controller import tasks
    from controller.supervision import warm

    calls = []
    from controller.supervision import nodes

    monkeypatch.setattr(ownership, "start_reaper", lambda each_pass=None: threading.Event())
    monkeypatch.setattr(nodes, "stamp_quietly", lambda queues: calls.append("stamped"))
    monkeypatch.setattr(warm, "start", lambda: calls.append("warm"))
    monkeypatch.setattr(warm, "stop", lambda: calls.append("warm stopped"))
    monkeypatch.setattr(priority, "lower_session", lambda: (calls.append("lowered"), lambda: calls.append("restored"))[1])
    tasks.start_reaping()
    tasks.stop_reaping()
    assert calls == ["stamped", "warm", "lowered", "warm stopped", "restored"]
