"""Exactness harness: the independent reference checks of every learner path (``thundersync check``)."""
