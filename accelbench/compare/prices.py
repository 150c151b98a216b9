"""``--prices FILE``: what a run cost, from $ per device-hour and $ per kWh, as $ per million tokens and $ per run.

The file (TOML, or JSON of the same shape)::

    kwh = 0.15                       # $ per kWh (optional: without it, device-hours alone are priced)
    [device_hour]                    # $ per device-hour, by the device name records give (or a part of it)
    "H100" = 2.49
    "AMD EPYC" = 0.04
    default = 1.00                   # any other device (optional)

A run's cost rate is its devices x their hourly price / 3600, plus, with ``kwh``, its power (joules per sample x
samples per second: the devices' own counters, a node's counters apportioned) x the price of a joule. Per steady
epoch, $ per million tokens = the rate / tokens per second x 10^6; $ per run = the rate x the run's timed epochs
(warm-up included). A run whose energy is unknown gets no figure when ``kwh`` is given: a price that leaves out
the energy would look cheaper than it is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelbench.compare.summary import RunSummary
from accelbench.errors import ConfigError

JOULES_PER_KWH = 3.6e6
MAX_PRICE = 1e6  # $ per device-hour or per kWh: beyond any real price (a typo in the file)


@dataclass(frozen=True)
class Prices:
    device_hour: tuple[tuple[str, float], ...]  # (device name or part of one, $), longest name first
    default: float | None
    kwh: float | None
    source: str

    def per_device_hour(self, device: str) -> float | None:
        """The hourly price of ``device``: an exact name, else the longest name it contains, else the default."""
        for name, price in self.device_hour:
            if name.lower() == device.lower():
                return price
        for name, price in self.device_hour:
            if name.lower() in device.lower():
                return price
        return self.default


def _price(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_PRICE:
        raise ConfigError(f"{where} = {value!r}; give a price in $, a number from 0 to {MAX_PRICE:g}")
    return float(value)


def read_prices(path: Path) -> Prices:
    """The prices file, checked: a ConfigError names ``--prices``, the file and what is wrong."""
    where = f"--prices {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read it ({exc}); give a TOML or JSON prices file") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef,unused-ignore]

            data = tomllib.loads(text)
    except ValueError as exc:  # JSONDecodeError, TOMLDecodeError
        raise ConfigError(
            f"{where}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}"
        ) from None
    if not isinstance(data, dict) or not data.keys() <= {"kwh", "device_hour"} or "device_hour" not in data:
        keys = ", ".join(sorted(data)) if isinstance(data, dict) else type(data).__name__
        raise ConfigError(
            f"{where}: holds {keys}; give a [device_hour] table ($ per device-hour by device name, and optionally "
            "default) and optionally kwh ($ per kWh)"
        )
    table = data["device_hour"]
    if not isinstance(table, Mapping) or not table:
        raise ConfigError(f"{where}: device_hour must be a table of device name = $ per device-hour")
    prices = {str(k): _price(v, f"{where}: device_hour.{k}") for k, v in table.items()}
    default = prices.pop("default", None)
    kwh = _price(data["kwh"], f"{where}: kwh") if "kwh" in data else None
    ordered = tuple(sorted(prices.items(), key=lambda item: (-len(item[0]), item[0])))
    return Prices(ordered, default, kwh, str(path))


def _watts(run: RunSummary) -> list[float | None]:
    figures = run.figures
    assert figures is not None
    return [
        j * s if j is not None else None
        for j, s in zip(figures.joules_per_sample, figures.samples_per_s, strict=True)
    ]


def priced(runs: Sequence[RunSummary], prices: Prices) -> list[RunSummary]:
    """``runs`` with their ``usd_per_mtok`` (per steady epoch) and ``usd_per_run`` figures; a ConfigError naming
    a device the file has no price for (and no default)."""
    unpriced = sorted(
        {r.system.device for r in runs if r.ok and prices.per_device_hour(r.system.device) is None}
    )
    if unpriced:
        raise ConfigError(
            f"--prices {prices.source}: no $ per device-hour for {', '.join(map(repr, unpriced))}; add it (or a part "
            "of its name) under [device_hour], or a default"
        )
    out = []
    for run in runs:
        figures = run.figures
        hourly = prices.per_device_hour(run.system.device)
        if not run.ok or figures is None or hourly is None:
            out.append(run)
            continue
        device_rate = run.devices * hourly / 3600  # $ per second
        watts = _watts(run)
        per_mtok: list[float | None] = []
        for w, tokens in zip(watts, figures.tokens_per_s, strict=True):
            if prices.kwh is not None and w is None or not tokens:
                per_mtok.append(None)
                continue
            rate = device_rate + (w or 0.0) * (prices.kwh or 0.0) / JOULES_PER_KWH
            per_mtok.append(rate / tokens * 1e6)
        known = [w for w in watts if w is not None]
        seconds = sum(figures.epoch_s) + (figures.warmup_s or 0.0)
        if prices.kwh is not None and (not known or len(known) < len(watts)):
            per_run = None
        else:
            power = statistics.median(known) if known else 0.0
            per_run = (device_rate + power * (prices.kwh or 0.0) / JOULES_PER_KWH) * seconds
        figures = dataclasses.replace(
            figures,
            usd_per_mtok=tuple(v if v is None or math.isfinite(v) else None for v in per_mtok),
            usd_per_run=per_run,
        )
        out.append(dataclasses.replace(run, figures=figures))
    return out
