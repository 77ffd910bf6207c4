"""Serve ``plotly.min.js`` from the installed plotly package (no CDN, no copy in the repo)."""

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_JS = "plotly.min.js"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=Path(plotly.__file__).parent / "package_data")

    def find(self, path, find_all=False, **kwargs):
        if path != PLOTLY_JS:
            return [] if find_all else None
        found = self.storage.path(PLOTLY_JS)
        return [found] if find_all else found

    def list(self, ignore_patterns):
        yield PLOTLY_JS, self.storage
