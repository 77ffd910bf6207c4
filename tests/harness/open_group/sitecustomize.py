"""Test fault, only where a test puts this directory on PYTHONPATH: the learner rank named by
THUNDERSYNC_TEST_OPEN_GROUP_RANK drops the first trajectory rank 0 hands it, so one of its
groups stays open at the barrier (tests/learner/test_distributed_train.py). Every Python
process of the run loads this file (``site``); only a rank process that imports
``learner.distributed.rank`` is changed, after that module has loaded."""

import importlib.abc
import importlib.machinery
import os
import sys

TARGET = "learner.distributed.rank"
RANK = os.environ.get("THUNDERSYNC_TEST_OPEN_GROUP_RANK")


def _drop_one_trajectory(module) -> None:
    learn = module.RankLearner.learn
    dropped = []

    def learn_but_drop_one(self, items, on_phase=None):
        if self.rank == int(RANK) and not dropped and items:
            dropped.append(items[0])  # that member of its group never arrives
            items = list(items[1:])
        return learn(self, items, on_phase)

    module.RankLearner.learn = learn_but_drop_one


class _AfterLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _drop_one_trajectory(module)

        spec.loader.exec_module = exec_then_patch
        return spec


if RANK is not None:
    sys.meta_path.insert(0, _AfterLoad())
