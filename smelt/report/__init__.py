"""The compile report: one HTML page of what smelt compiled for a program and where its time went.

    python -m smelt report SCRIPT.py [--out smelt_report.html] [-- script arguments]

or, in a notebook or a script:

    with smelt.report.capture("my model") as c:
        model(x)
    c.report.write("report.html")
"""
from __future__ import annotations

import runpy
import sys

from .capture import Capture, Report, capture

__all__ = ["Capture", "Report", "capture", "run_script"]


def run_script(path: str, argv: list[str], out: str) -> Report:
    """Runs the script at `path` (as `python path argv...`) inside a capture; writes the page to `out`."""
    saved = sys.argv
    sys.argv = [path, *argv]
    try:
        with capture(f"smelt compile report: {path}") as c:
            runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = saved
    c.report.write(out)
    return c.report
