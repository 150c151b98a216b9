"""Which run option a name in a sweep file or ``--set`` means.

A sweep names run options the way `accelbench run` users know them: the field name (``learning_rate``,
``n_layer``), the flag (``lr``, ``layers``, ``block-size``) or the flag with ``_`` (``block_size``). The spellings
come from where the options are defined, :mod:`accelbench.config` (``cli_fields``, ``flag_of``) for core fields
and each workload's and backend's :class:`~accelbench.config.RunOption`, so an option added there is sweepable
without a change here.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from accelbench.config import cli_fields, flag_of
from accelbench.contract import RunOption
from accelbench.errors import AccelbenchError

OWNED = {"output_dir"}  # fields the sweep sets itself (from its --output-dir), so a file must not


def field_names() -> dict[str, str]:
    """Every spelling a sweep file may use for a core field (field name, flag, flag with _) -> field name."""
    names = {}
    for name in cli_fields():
        names[name] = name
        names[flag_of(name).replace("-", "_")] = name
    return names


def option_name(name: str, plugins: Mapping[str, RunOption] | None = None) -> str:
    """The field or plugin option name that ``name`` spells; an unknown name comes back with ``_`` for ``-``."""
    name = name.replace("-", "_")
    for option in (plugins or {}).values():  # declared options by their flag spelling (layers -> n_layer)
        if option.cli_flag.replace("-", "_") == name:
            return option.name
    return field_names().get(name, name)


def check_options(
    table: Any, plugins: Mapping[str, RunOption], where: str, allow_lists: bool
) -> dict[str, Any]:
    """A table of run options keyed by their names, checked: known names (RunConfig fields or plugin options),
    lists only where they are axes (``allow_lists``). ``where`` starts every message (the file and its table)."""
    if not isinstance(table, dict):
        raise AccelbenchError(f"{where}: expected a table of run options, got {table!r}")
    fields = set(cli_fields())
    known = sorted((fields - OWNED) | set(plugins) | set(field_names()))
    options: dict[str, Any] = {}
    for key, value in table.items():
        name = option_name(str(key), plugins)
        if name in OWNED:
            raise AccelbenchError(
                f"{where}: {key!r} is set by the sweep (--output-dir); remove it from the file"
            )
        if name not in fields and name not in plugins:
            close = difflib.get_close_matches(str(key).replace("-", "_"), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise AccelbenchError(f"{where}: unknown run option {key!r}{hint} (see `accelbench run --help`)")
        if isinstance(value, list):
            if not allow_lists:
                raise AccelbenchError(
                    f"{where}: {key} = {value!r}: a list is an axis; put it in a grid table"
                )
            if not value:
                raise AccelbenchError(f"{where}: axis {key!r} is empty; give at least one value")
        elif isinstance(value, dict):
            raise AccelbenchError(f"{where}: {key!r} must be a value or a list of values, not a table")
        options[name] = value
    return options
