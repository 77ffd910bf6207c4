"""Discrete-event simulator of the four schedules (``thundersync simulate``)."""
