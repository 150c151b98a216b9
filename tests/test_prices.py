"""``--prices FILE``: $ per million tokens and $ per run in compare and report, from $ per device-hour and per kWh."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from accelbench.cli import main
from accelbench.compare.prices import read_prices
from accelbench.errors import ConfigError
from accelbench.results import ResultRecord

JOULES_PER_SAMPLE = 0.5


def priced_record(base: ResultRecord, folder: Path, energy: bool = True) -> dict:
    """The real tiny record, with energy per sample on every epoch (as a device counter would give)."""
    raw = json.loads(base.to_json())
    for epoch in raw["metrics"]["epochs"]:
        epoch["joules_per_sample"] = JOULES_PER_SAMPLE if energy else None
    folder.mkdir(exist_ok=True)
    (folder / "run.json").write_text(json.dumps(raw))
    return raw


def prices_file(folder: Path, body: str, name: str = "prices.toml") -> Path:
    path = folder / name
    path.write_text(body)
    return path


def cell(out: str) -> dict:
    (group,) = json.loads(out)["groups"]
    (only,) = group["cells"]
    return only


def test_dollars_per_million_tokens_and_per_run_from_device_hours_and_kwh(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = priced_record(tiny_run[0], tmp_path / "runs")
    device = raw["backend"]["devices"][0]["name"]
    prices = prices_file(tmp_path, f'kwh = 0.30\n[device_hour]\n"{device}" = 3.60\ndefault = 99\n')
    assert main(["compare", str(tmp_path / "runs"), "--prices", str(prices), "--format", "json"]) == 0
    got = cell(capsys.readouterr().out)
    steady = raw["metrics"]["epochs"][1:]
    devices = raw["backend"]["devices_used"]
    expected = [
        (devices * 3.60 / 3600 + JOULES_PER_SAMPLE * e["samples_per_s"] * 0.30 / 3.6e6)
        / e["tokens_per_s"]
        * 1e6
        for e in steady
    ]
    assert got["usd_per_mtok"]["median"] == pytest.approx(statistics.median(expected))
    seconds = sum(e["wall_s"] for e in raw["metrics"]["epochs"])
    watts = statistics.median(JOULES_PER_SAMPLE * e["samples_per_s"] for e in steady)
    assert got["usd_per_run"]["median"] == pytest.approx(
        (devices * 3.60 / 3600 + watts * 0.30 / 3.6e6) * seconds
    )
    assert main(["compare", str(tmp_path / "runs"), "--prices", str(prices)]) == 0
    table = capsys.readouterr().out
    assert "$/M tokens" in table and "$/run" in table and "$ per device-hour" in table


def test_without_energy_a_kwh_price_gives_no_figure_and_device_hours_alone_do(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    priced_record(tiny_run[0], tmp_path / "runs", energy=False)
    with_kwh = prices_file(tmp_path, "kwh = 0.3\n[device_hour]\ndefault = 1.0\n")
    assert main(["compare", str(tmp_path / "runs"), "--prices", str(with_kwh), "--format", "json"]) == 0
    got = cell(capsys.readouterr().out)
    assert got["usd_per_mtok"] is None and got["usd_per_run"] is None  # never a price that leaves energy out
    hours_only = prices_file(tmp_path, '{"device_hour": {"default": 1.0}}', "prices.json")
    assert main(["compare", str(tmp_path / "runs"), "--prices", str(hours_only), "--format", "json"]) == 0
    got = cell(capsys.readouterr().out)
    assert got["usd_per_mtok"]["median"] > 0 and got["usd_per_run"]["median"] > 0


def test_the_report_shows_the_costs(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    priced_record(tiny_run[0], tmp_path / "runs")
    prices = prices_file(tmp_path, "kwh = 0.3\n[device_hour]\ndefault = 1.0\n")
    html = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "runs"), "--prices", str(prices), "-o", str(html)]) == 0
    assert "$/M tokens" in html.read_text()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("kwh = 0.3\n", r"give a \[device_hour\] table"),
        ("[device_hour]\nH100 = -1\n", r"device_hour.H100 = -1; give a price in \$"),
        ("kwh = 'cheap'\n[device_hour]\ndefault = 1\n", "kwh = 'cheap'; give a price"),
        ("[device_hour\n", "not valid TOML"),
        ("currency = 'EUR'\n[device_hour]\ndefault = 1\n", "holds currency, device_hour"),
    ],
)
def test_a_bad_prices_file_is_refused_naming_the_flag(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=rf"--prices .*prices.toml.*{message}"):
        read_prices(prices_file(tmp_path, body))


def test_a_device_without_a_price_is_named(
    tiny_run: tuple[ResultRecord, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    priced_record(tiny_run[0], tmp_path / "runs")
    prices = prices_file(tmp_path, "[device_hour]\nH100 = 2.5\n")
    assert main(["compare", str(tmp_path / "runs"), "--prices", str(prices)]) == 2
    assert "no $ per device-hour for" in capsys.readouterr().err


def test_device_names_match_exactly_then_by_the_longest_part_then_default(tmp_path: Path) -> None:
    prices = read_prices(prices_file(tmp_path, '[device_hour]\nH100 = 2\n"H100 NVL" = 3\ndefault = 1\n'))
    assert prices.per_device_hour("NVIDIA H100 NVL") == 3
    assert prices.per_device_hour("NVIDIA H100 80GB HBM3") == 2
    assert prices.per_device_hour("AMD EPYC") == 1
