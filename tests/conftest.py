"""Fixtures for every test."""

import os

import pytest

from learner.rollout.cores import set_process_affinity


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


def pytest_collection_modifyitems(config, items):
    """The modules that hold slow tests (real runs, servers, browsers) go first, each still in
    one piece and in its own order (module fixtures are set up once): on two xdist workers a
    minutes-long module started last would leave the other worker idle at the end."""
    heavy = {item.module.__name__ for item in items
             if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.module.__name__ not in heavy)  # stable: order kept within each part
