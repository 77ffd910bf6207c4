"""Comparing runs: the compare summary, pooled repeats, fairness, the runs table's figures and the schedule advisor."""
