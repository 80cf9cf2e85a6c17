"""Serve the plotly.js bundle that the plotly Python package ships, as ``vendor/plotly.min.js``.

The dashboard loads nothing from the internet, and copying a 4.6 MB minified file into the
repository would drift from the pinned package; a static finder keeps one source of truth and
still works with ``collectstatic``.
"""

from __future__ import annotations

from pathlib import Path

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_DIR = Path(plotly.__file__).resolve().parent / "package_data"
PUBLIC_NAME = "vendor/plotly.min.js"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=str(PLOTLY_DIR))
        self.storage.prefix = "vendor"

    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        match = str(PLOTLY_DIR / "plotly.min.js") if path == PUBLIC_NAME else None
        if find_all:
            return [match] if match else []
        return match

    def list(self, ignore_patterns):
        yield "plotly.min.js", self.storage
