"""Management commands of the app."""
