"""Running runs: launching, dispatch, the supervisor and its liveness, resume, nodes, the warm runner."""
