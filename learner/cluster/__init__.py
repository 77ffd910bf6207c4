"""Runs placed on a Ray cluster (the ``cluster`` section; docs/distributed-nodes.md, "Running on a cluster").

The section's schema is ``learner.cluster_config`` (beside ``learner.config``, which imports it);
``plan`` (placement -> bundles, rank layout) imports neither Ray nor torch, so a single-machine
run never loads Ray. Only ``launcher`` imports Ray, and only a run with a ``cluster`` section
reaches it.
"""
