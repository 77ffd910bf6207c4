"""The rollout fleet: the engines that sample, speculation, and the worker processes that run agent loops."""
