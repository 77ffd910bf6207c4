"""Measurement scripts beside ``thundersync bench``, each run from the repository root as
``python -m bench.NAME`` (the tools a user runs: the README table, the GPU checks, the engine
bench, the arrival bound), ``python -m bench.web.NAME`` (the web app's probes) or
``python -m bench.decisions.NAME`` (one-off measurements, each backing one decision of the docs);
docs/bench-scripts.md lists them all. Their shared helpers live in ``learner/bench/`` (what the
CLI also uses) or here (``load_report``, ``variants``: used only by these scripts)."""
