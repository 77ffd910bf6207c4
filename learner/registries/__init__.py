"""The seams of the system as registries: objectives, rollout and learner engines, schedules.

Each entry says what the rest of the code needs to know about a name (does this objective's
signal arrive per trajectory or per scored turn? does this engine count workers or replicas?
does this schedule learn on arrival?), so no module outside these files compares a name
string (``tests/learner/test_registries.py`` greps for it). Adding an objective, an engine or a
schedule starts here (docs/architecture.md, "Adding an objective"). No torch, no Ray: the
config imports them.
"""
