"""Fixtures for every test."""

import os

import pytest

from learner.rollout.processes.cores import set_process_affinity
from tests.harness.web_harness import asgi_servers  # noqa: F401 (one daphne per pytest process, for live_url)

SHARED_SCOPES = ("module", "class", "package")


@pytest.fixture(autouse=True)
def _process_cores_and_threads_restored():
    """A test that trains in this process pins it to the learner's core with one torch thread
    (``learner.driver.setup``); the next test in the same pytest process gets every core and its
    torch threads back, instead of running pinned (and a core-plan test seeing one core)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    import torch

    threads = torch.get_num_threads()
    yield
    if cores is not None and os.sched_getaffinity(0) != cores:
        set_process_affinity(cores)  # every thread: pinning moved them all
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def shares_setup(item) -> bool:
    """Whether the test uses a fixture of this test tree set up once for its module or class (a
    trained run, a bench, an engine): split across two workers, that setup would run on both.
    Plugins' fixtures (an empty baseid, e.g. pytest-django's class-scoped autouse one) do no
    such work."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(defs.get(name) and defs[name][-1].scope in SHARED_SCOPES and defs[name][-1].baseid
               for name in getattr(item, "fixturenames", ()))


def pytest_itemcollected(item):
    """``./run test`` schedules with ``--dist loadgroup``: each test goes to whichever worker is
    free, except that the tests using one of their module's module- or class-scoped fixtures go
    to one worker together (an xdist_group per such module, marked here, before pytest-xdist
    reads the marks). The default ``load`` scheduling handed each worker a fixed first chunk of a quarter
    of its share of consecutive tests: with the slow modules first, one worker's chunk held
    every slow controller test while the other ran out of work."""
    if shares_setup(item):
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_collection_modifyitems(config, items):
    """The modules that hold slow tests (real runs, servers, browsers) go first, each in its
    own order, so that no minutes-long test is left for the end of a worker."""
    heavy = {item.module.__name__ for item in items
             if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.module.__name__ not in heavy)  # stable: order kept within each part
