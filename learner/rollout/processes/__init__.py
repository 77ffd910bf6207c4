"""The rollout fleet's processes: boot, workers, their messages, weights and tool calls (docs/processes.md)."""
