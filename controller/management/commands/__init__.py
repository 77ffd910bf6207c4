"""``manage.py`` commands: ``demo`` (the demo experiments and their comparisons)."""
