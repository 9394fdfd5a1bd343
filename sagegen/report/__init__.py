"""Side-by-side reports of a run directory: a self-contained report.html with synchronised frame players,
amplified-difference views, metrics and timings; a labelled side-by-side MP4 per prompt; a contact sheet.

Entry point: :func:`sagegen.report.builder.build_report` (used by ``sagegen report``).
"""
