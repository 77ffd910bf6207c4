"""The warm runner: one long-lived process that has torch, transformers and the trainer imported
and the cached models' files in the page cache, and forks one ``thundersync train`` per run.

A cold run spends most of its start importing (the driver and each rollout worker ~7 s on an
idle 2-core VM, 20-30 s under load; docs/processes.md). A run forked from here starts with
everything imported, and its rollout workers are forked from it in turn
(``learner.rollout.processes.boot.START_METHOD``), so neither side imports anything.

Protocol (Unix stream socket, docs/processes.md "Warm runner"): the client sends one JSON line
``{"argv": [...], "cwd": str, "env": {...}}`` with its stdin, stdout and stderr as SCM_RIGHTS
file descriptors; the runner forks, answers ``pid N`` and, when the run's process exits,
``exit C`` (C as ``subprocess.Popen.returncode``: negative for a signal). The forked run leads
its own session (its process group holds its rollout workers, as a cold run's does). If the
client's connection closes before the run ends (its supervisor died), the run's group gets
SIGTERM (it stops at a safe point), SIGKILL after a grace. If the runner dies, its runs get
SIGTERM from the kernel (PR_SET_PDEATHSIG). The runner is single-threaded (a selector over the
listening socket, the clients' connections and the runs' pidfds), so forking it is safe.

    python -m learner.warm.server --socket PATH [--warm DIR ...]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
KILL_GRACE_S = 5.0
REQUEST_TIMEOUT_S = 10.0
PAGE_CACHE_LIMIT = 2 << 30  # bytes of cached model files read at start, at most


def preload() -> None:
    """Import what a run imports before its first span: the driver, the fleet, the engine and
    the model classes transformers loads lazily."""
    from learner.cli import quiet_libraries

    quiet_libraries()
    import torch  # noqa: F401
    import tqdm  # noqa: F401
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import learner.driver.loop  # noqa: F401
    import learner.driver.resume  # noqa: F401
    import learner.rollout.engine.factory  # noqa: F401
    import learner.rollout.processes.agent_worker  # noqa: F401
    import learner.tracking  # noqa: F401


def warm_page_cache(dirs: list[Path], limit: int = PAGE_CACHE_LIMIT) -> int:
    """Read the cached model files once so a run's model load comes from memory; bytes read."""
    done = 0
    for root in dirs:
        for path in sorted(root.rglob("*")) if root.is_dir() else []:
            if done >= limit:
                return done
            if path.is_file():
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        done += len(chunk)
    return done


@dataclass
class Child:
    """One forked run: its client's connection, its pidfd, when it gets SIGKILL if asked to stop."""

    pid: int
    conn: socket.socket
    pidfd: int
    kill_at: float | None = None
    client_gone: bool = False


def run_child(request: dict, fds: list[int], close: list[int]) -> None:
    """In the forked process: become the run (``thundersync`` with ``argv``), never return."""
    code = 1
    try:
        for fd in close:
            os.close(fd)
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from learner.cli import main
        from learner.rollout.processes import boot

        boot.START_METHOD = "fork"  # the workers fork from this warm process too
        sys.argv = ["thundersync", *request["argv"]]
        print(f"boot: forked from the warm runner (pid {os.getppid()})", file=sys.stderr, flush=True)
        code = main(request["argv"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever happens, this process must end here
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            from learner import stopping

            stopping.exit_within(code if isinstance(code, int) else 1)
            atexit._run_exitfuncs()  # what a cold process runs at exit (multiprocessing's clean-up)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


class Runner:
    """The accept loop: fork per request, report pids and exit codes, stop orphaned runs."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, ("accept", None))
        self.children: dict[int, Child] = {}
        self.stop_requested = self.stopping = False

    def serve(self) -> None:
        while not (self.stopping and not self.children):
            if self.stop_requested and not self.stopping:
                self.shut_down()
            for key, _ in self.selector.select(timeout=0.5):
                what, child = key.data
                if what == "accept":
                    self.accept()
                elif what == "exit":
                    self.reap(child)
                else:
                    self.client_readable(child)
            self.escalate()

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(REQUEST_TIMEOUT_S)
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while not data.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    raise OSError("the client closed before its request was complete")
                data += more
            request = json.loads(data)
            if len(fds) != 3:
                raise OSError(f"expected stdin, stdout and stderr, got {len(fds)} file descriptors")
        except (OSError, ValueError) as err:
            print(f"warm runner: bad request: {err}", file=sys.stderr, flush=True)
            conn.close()
            return
        close = [self.listener.fileno(), self.selector.fileno(), conn.fileno(),
                 *(c.conn.fileno() for c in self.children.values()), *(c.pidfd for c in self.children.values())]
        try:
            pid = os.fork()
        except OSError as err:  # no memory, too many processes: the client starts the run cold
            print(f"warm runner: cannot fork: {err}", file=sys.stderr, flush=True)
            pid = None
        if pid == 0:
            run_child(request, fds, close)
        for fd in fds:
            os.close(fd)
        if pid is None:
            conn.close()
            return
        child = Child(pid, conn, os.pidfd_open(pid))
        self.children[pid] = child
        conn.sendall(f"pid {pid}\n".encode())
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, ("client", child))
        self.selector.register(child.pidfd, selectors.EVENT_READ, ("exit", child))

    def client_readable(self, child: Child) -> None:
        try:
            data = child.conn.recv(4096)
        except OSError:
            data = b""
        if data:
            return  # clients send nothing after the request
        self.selector.unregister(child.conn)
        child.client_gone = True
        self.terminate(child)

    def terminate(self, child: Child) -> None:
        """Stop a run nobody supervises: SIGTERM its group, SIGKILL after the grace."""
        if child.kill_at is None:
            child.kill_at = time.monotonic() + KILL_GRACE_S
            self.signal(child, signal.SIGTERM)

    def signal(self, child: Child, sig: signal.Signals) -> None:
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def escalate(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.kill_at is not None and now >= child.kill_at:
                self.signal(child, signal.SIGKILL)
                child.kill_at = now + KILL_GRACE_S

    def reap(self, child: Child) -> None:
        _, status = os.waitpid(child.pid, 0)
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        del self.children[child.pid]
        if not child.client_gone:
            self.selector.unregister(child.conn)
            try:
                child.conn.setblocking(True)
                child.conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
        child.conn.close()

    def request_stop(self, *_) -> None:
        """SIGTERM (the controller stops its worker); the loop stops at its next turn."""
        self.stop_requested = True

    def shut_down(self) -> None:
        """Accept nothing more, stop every run, exit once they are gone."""
        self.stopping = True
        self.selector.unregister(self.listener)
        self.listener.close()
        for child in self.children.values():
            self.terminate(child)


def listen(path: Path) -> socket.socket:
    """Bind under a temporary name and rename: the socket appears only once the runner is warm."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)  # only this user may have runs forked
    listener.listen(16)
    os.replace(tmp, path)
    return listener


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fork thundersync runs from a warm process")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--warm", action="append", type=Path, default=[], help="model directory to read at start")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of the demo reaches its runs through the controller
    t0 = time.monotonic()
    preload()
    from learner.models.loading import default_cache_dir

    warmed = warm_page_cache([default_cache_dir() / "models", *args.warm])  # the built-in models' cache
    gc.collect()
    gc.freeze()  # forked runs share these pages instead of copying them when the collector runs
    runner = Runner(listen(args.socket))
    signal.signal(signal.SIGTERM, runner.request_stop)
    print(f"warm runner ready in {time.monotonic() - t0:.1f}s ({warmed / 2**20:.1f} MiB of models read); "
          f"socket {args.socket}", file=sys.stderr, flush=True)
    try:
        runner.serve()
    finally:
        args.socket.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
