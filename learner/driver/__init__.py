"""The driver: one training loop over the rollout fleet and the learner (docs/architecture.md)."""
