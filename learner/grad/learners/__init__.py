"""The learners: on-policy streaming/sync, off-policy async, deterministic; their protocol."""
