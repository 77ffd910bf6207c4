"""The tasks a policy is trained on: environments, rewards, the tool sandbox, task data (docs/tasks.md)."""
