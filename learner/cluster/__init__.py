"""Runs placed on a Ray cluster (the ``cluster`` section; docs/distributed-nodes.md, "Running on a cluster").

``config`` (the section) and ``plan`` (placement -> bundles, rank layout) import neither Ray nor
torch: ``learner.config`` imports the section, so a single-machine run never loads Ray. Only
``launcher`` and ``actors`` import Ray, and only a run with a ``cluster`` section reaches them.
"""
