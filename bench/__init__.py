"""Measurement scripts beside ``thundersync bench``, each run from the repository root as
``python -m bench.NAME`` (docs/bench.md and the doc each script names). Their shared helpers
live in ``learner/bench/`` (what the CLI also uses) or here (``load_report``, ``variants``:
used only by these scripts)."""
