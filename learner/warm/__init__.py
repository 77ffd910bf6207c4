"""The warm runner: a process with everything imported that forks one run at a time (docs/processes.md)."""
