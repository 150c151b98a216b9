"""`accelbench report`: one self-contained HTML file with the seed study's views, from result records.

The views follow the Turing report (seeds/000): epoch time per system x precision x batch size; scaling across
device counts; peak memory against batch size and model size, with the "largest model that fits" table; strategy
comparison (DDP / FSDP / ZeRO stages) across model sizes and device counts; compile time against epoch time per
strategy (IPUs, or any run with a compile step); with ``--vs AXIS``, figure 2 along any workload field; energy per
sample where the records have it. Each view is drawn only where the records hold its data, and the report says
which views had none.

Where things are:

- :mod:`.entries`: the data of the views (cells with their workload) and how they are grouped.
- :mod:`.drawing`: matplotlib without pyplot, the style, grouped bars, figures as bytes.
- :mod:`.figures`: one function per view.
- :mod:`.bandwidth`: bus bandwidth against message size from `accelbench comm` records (the collective
  bandwidth view; a page of its own when the records are all comm records).
- :mod:`.html`: the page, escaping, writing the file and the figures.
- :mod:`.command`: the command line.
"""

from accelbench.report.command import add_report_arguments, report_command
from accelbench.report.drawing import FIGURE_FORMATS, ReportFigure
from accelbench.report.entries import Entry, entries
from accelbench.report.html import Report, build_report, esc, write_report

__all__ = [
    "FIGURE_FORMATS",
    "Entry",
    "Report",
    "ReportFigure",
    "add_report_arguments",
    "build_report",
    "entries",
    "esc",
    "report_command",
    "write_report",
]
