"""Data-parallel streaming learner: W ranks, group affinity, one exact barrier (docs/distributed.md).

    assignment   which rank owns which group (every rank computes the same answer)
    barrier      the rank's own check, then one integer all-reduce of the batch counts
    engines      one gradient reduction, clipping of the reduced gradient, one optimizer step
                 (``torch``: torch.distributed, float64 too; ``deepspeed``: ZeRO 0/1/2)
    rank         ``RankLearner``: the streaming learner on one rank's groups, then the barrier
    ranks        process groups: free port, rendezvous, spawning W rank processes with timeouts
    front        ``DataParallelLearner``: rank 0 (the driver process) routing items to owners, the step
    peers        ``RankPeers``: rank 0's handle on ranks 1..W−1 (queues, reports, stopping them)
    worker       what ranks 1..W−1 run: build their learner, serve rank 0's commands
    exactness    ``thundersync check-exactness --world-size``: reduced vs single-process gradient
"""
