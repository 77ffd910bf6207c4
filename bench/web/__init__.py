"""The web app's probes: what the app, its live stream and its pages cost and how fast they answer (docs/bench-web.md)."""
