"""The report as one self-contained HTML page: figures embedded as PNG, no script, no link out."""

from __future__ import annotations

import html
from pathlib import Path

from .build import Report
from .sections import section_html

__all__ = ["report_html", "write_report"]

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { padding: 0.2rem 0.6rem; text-align: right; border-bottom: 1px solid #eee; }
th { background: #f4f4f4; } img { max-width: 100%; }
code { background: #f4f4f4; padding: 0 0.2rem; } .glance th { text-align: left; }
"""


def report_html(report: Report) -> str:
    """The whole page."""
    glance = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
        for k, v in report.glance.items()
    )
    body = "\n".join(section_html(s) for s in report.sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Trace report: {html.escape(report.source)}</title><style>{STYLE}</style></head>"
        f"<body><h1>Trace report</h1><p>{html.escape(report.source)}</p>"
        f'<h2>The job at a glance</h2><table class="glance">{glance}</table>\n{body}</body></html>\n'
    )


def write_report(report: Report, out: str | Path) -> Path:
    """Write the page to ``out`` (its folder made if needed); returns the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_html(report), encoding="utf-8")
    return out
