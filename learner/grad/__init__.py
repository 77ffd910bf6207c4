"""The gradient math: accumulators, objectives, micro-batches, the drain policy, the learners and
the reference gradient every exactness check measures against (docs/learner.md, docs/math.md)."""
