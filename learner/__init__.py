"""The trainer: config, driver, learners, rollout fleet, tasks and models; pure Python and torch, never Django."""
