"""A Celery worker running in a thread of the current process.

The embedded default (``manage.py demo``) uses it with the in-memory broker, which only
reaches consumers inside the same process; tests use it with the Redis broker. The solo
pool runs one task at a time in the worker thread; the run's learner is a child process.
"""

import threading

from celery import Celery
from celery._state import _set_task_join_will_block
from celery.utils.nodenames import anon_nodename
from celery.worker import WorkController, state
from django.db import connections

from controller import sandbox_hosts
from controller.supervision import warm


class ThreadWorker(WorkController):
    """A worker whose start-up can be awaited and which stops when asked."""

    def __init__(self, *args, **kwargs):
        self.ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer):
        self.ready.set()


class EmbeddedWorker:
    def __init__(self, app: Celery, queues: list[str], loglevel: str = "WARNING"):
        self.worker = ThreadWorker(
            app=app, hostname=anon_nodename(hostname="embedded"), pool="solo", concurrency=1,
            queues=queues, loglevel=loglevel, without_heartbeat=True, without_mingle=True, without_gossip=True,
        )
        self.thread = threading.Thread(target=self._work, name="celery-embedded-worker", daemon=True)

    def _work(self) -> None:
        try:
            self.worker.start()
        finally:
            connections.close_all()  # this thread's database connections die with it

    def start(self, timeout: float = 30.0) -> "EmbeddedWorker":
        sandbox_hosts.report()  # can this host confine the python-sandbox tool (launches read it)
        warm.start()  # imports torch in the background while the user logs in (THUNDERSYNC_WARM_RUNNER)
        self.thread.start()
        if not self.worker.ready.wait(timeout):
            raise RuntimeError(f"the embedded Celery worker did not start within {timeout:.0f}s")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown: the task in progress finishes first (cancel runs before stopping)."""
        state.should_stop = 0
        self.thread.join(timeout)
        state.should_stop = None
        # The worker's pool component marks the whole process as "inside a worker" (a join would
        # block it); the flag outlives the thread, and any later eager ``.get()`` in this process
        # (a test, a management command) would then refuse to run.
        _set_task_join_will_block(False)
        warm.stop()
        if self.thread.is_alive():
            raise RuntimeError(f"the embedded Celery worker did not stop within {timeout:.0f}s")
