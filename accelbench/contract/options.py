"""Run options a backend or workload declares: ``--FLAG VALUE`` checked against its type and bounds."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from accelbench.errors import ConfigError

Scalar = str | int | float | bool


class RunOption(BaseModel):
    """A ``run`` option a workload or backend plugin declares (``Workload.options``, ``Backend.run_options``).

    ``--FLAG VALUE`` lands in ``RunConfig.workload_options[name]`` or ``RunConfig.backend_options[name]``. The
    option's type, default and bounds are checked here (:meth:`check`) before a run starts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Key in workload_options/backend_options, e.g. 'n_layer', 'replicas'.")
    flag: str | None = Field(
        default=None,
        description="Command-line spelling without dashes if not the name's ('layers' for n_layer).",
    )
    type: Literal["str", "int", "float", "bool"] = "str"
    default: Scalar | None = None
    help: str = ""
    choices: tuple[Scalar, ...] | None = None
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    backend: str = Field(default="", description="The backend that reads it (backend options).")
    workload: str = Field(default="", description="The workload that reads it (workload options).")

    @property
    def cli_flag(self) -> str:
        return (self.flag or self.name).replace("_", "-")

    @property
    def owner(self) -> str:
        return self.workload or self.backend

    def check(self, value: Any) -> Scalar:
        """``value`` converted to this option's type and checked against its bounds; ConfigError otherwise."""
        where = f"--{self.cli_flag}"
        try:
            if self.type == "bool":
                converted: Scalar = _as_bool(value)
            elif self.type == "int":
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                converted = int(value)
            elif self.type == "float":
                if isinstance(value, bool):
                    raise ValueError
                converted = float(value)
            else:
                converted = str(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: Input should be {_A[self.type]} (got {value!r})") from None
        if self.choices is not None and converted not in self.choices:
            raise ConfigError(
                f"{where}: Input should be one of {', '.join(map(str, self.choices))} (got {value!r})"
            )
        if isinstance(converted, (int, float)) and not isinstance(converted, bool):
            number = float(converted)
            for bound, ok, words in (  # worded as pydantic words the core options' bounds
                (self.gt, number > (self.gt or 0.0), "greater than"),
                (self.ge, number >= (self.ge or 0.0), "greater than or equal to"),
                (self.lt, number < (self.lt or 0.0), "less than"),
                (self.le, number <= (self.le or 0.0), "less than or equal to"),
            ):
                if bound is not None and not ok:
                    shown = f"{int(bound)}" if float(bound).is_integer() else f"{bound:g}"
                    raise ConfigError(f"{where}: Input should be {words} {shown} (got {value!r})")
        return converted


_A = {"bool": "a valid boolean", "int": "a valid integer", "float": "a valid number", "str": "text"}


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(value)


def resolve_options(
    given: Mapping[str, Any], declared: Iterable[RunOption], owner: str, kind: str
) -> dict[str, Scalar]:
    """``given`` checked against ``declared`` options, with their defaults filled in (what the record keeps).

    An unknown name is refused with the close matches; ``kind`` is 'workload' or 'backend' for the messages.
    """
    options = {o.name: o for o in declared}
    unknown = [name for name in given if name not in options]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, list(options), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(options)) or "none"
        raise ConfigError(f"{kind} {owner!r} has no option {name!r}{hint} (its options: {known})")
    out: dict[str, Scalar] = {}
    for name, option in options.items():
        if name in given and given[name] is not None:
            out[name] = option.check(given[name])
        elif option.default is not None:
            out[name] = option.default
    return out
