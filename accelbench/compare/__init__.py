"""`accelbench compare`: result records from many systems, side by side.

An HPC centre runs the same suite on each system and copies the result records to one place; this package reads
them (only records: it never needs a device, and never imports torch), groups the runs by workload, and puts the
systems side by side: steady epoch time, throughput, peak memory, MFU, energy per sample, compile time, the ratio
against a baseline system, scaling over device counts, and whether a difference is larger than the run-to-run
noise. It also lists what differs between the environments, so an unfair comparison is visible. ``--vs AXIS``
compares along one workload field instead (precisions, batch sizes, strategies, models side by side).

Where things are:

- :mod:`.records`: finding and reading result files fast; malformed ones named and skipped (``--strict``).
- :mod:`.summary`: what is kept of a record (the fields compare uses, validated; a small summary per run).
- :mod:`.keys`: system labels, the workload key, the axes ``--vs`` can run along and their values' order.
- :mod:`.stats`: median and range of measurements, the Mann-Whitney noise test.
- :mod:`.cells`: building the comparison: cells, baselines, ratios, noise verdicts, scaling.
- :mod:`.environment`: what differs between the systems' environments.
- :mod:`.columns`: every column in one registry (header, formatting, when shown, its CSV and JSON fields, its
  note): the table, Markdown, CSV, JSON and the report read it; adding a metric is one entry there.
- :mod:`.render`: the comparison as a terminal table, Markdown, CSV or JSON.
- :mod:`.command`: the command line (``compare`` and the selection options ``report`` shares).
- :mod:`.bandwidth`: `accelbench comm` records (collective bandwidth) side by side: bus bandwidth per message size
  and system, ratios against the baseline, peaks; read with the result records, never skipped as foreign files.
"""

from accelbench.compare.cells import (
    BaselineRatio,
    Cell,
    Comparison,
    Filters,
    Scaling,
    WorkloadGroup,
    choose_baseline,
    compare,
)
from accelbench.compare.command import (
    add_compare_arguments,
    add_selection_arguments,
    compare_command,
    comparison_from_args,
)
from accelbench.compare.environment import environment_differences
from accelbench.compare.keys import (
    CORE_AXES,
    DEFAULT_LABEL_BY,
    SYSTEM_FIELDS,
    WorkloadKey,
    parse_label_by,
    system_label,
)
from accelbench.compare.records import RecordSet, find_result_files, load_records
from accelbench.compare.render import (
    COLUMNS,
    CSV_FIELDS,
    FORMATS,
    cell_row,
    columns,
    render,
    render_table,
    to_csv,
    to_json,
    to_markdown,
)
from accelbench.compare.stats import DEFAULT_ALPHA, Spread, mann_whitney_p, smallest_p
from accelbench.compare.summary import RunSummary

__all__ = [
    "COLUMNS",
    "CORE_AXES",
    "CSV_FIELDS",
    "DEFAULT_ALPHA",
    "DEFAULT_LABEL_BY",
    "FORMATS",
    "SYSTEM_FIELDS",
    "BaselineRatio",
    "Cell",
    "Comparison",
    "Filters",
    "RecordSet",
    "RunSummary",
    "Scaling",
    "Spread",
    "WorkloadGroup",
    "WorkloadKey",
    "add_compare_arguments",
    "add_selection_arguments",
    "cell_row",
    "choose_baseline",
    "columns",
    "compare",
    "compare_command",
    "comparison_from_args",
    "environment_differences",
    "find_result_files",
    "load_records",
    "mann_whitney_p",
    "parse_label_by",
    "render",
    "render_table",
    "smallest_p",
    "system_label",
    "to_csv",
    "to_json",
    "to_markdown",
]
