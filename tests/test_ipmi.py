"""The node's power from its BMC (IPMI DCMI): ``ipmitool dcmi power reading`` parsed, read by rank 0 during each
epoch into its telemetry, only where ipmitool is installed and the reading succeeds.

No BMC here: a stand-in ``ipmitool`` on PATH prints what ipmitool 1.8.18 prints (the layout of ``lib/ipmi_dcmi.c``,
as OpenBMC's test suite and vendors' forums quote it), or fails as it does without ``/dev/ipmi0``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from accelbench.ipmi import NodePower, NodePowerReader, parse_dcmi_power, read_node_power

ACTIVATED = """
    Instantaneous power reading:                   235 Watts
    Minimum during sampling period:                 64 Watts
    Maximum during sampling period:                612 Watts
    Average power reading over sample period:      218 Watts
    IPMI timestamp:                           Thu Feb 15 08:36:01 2024
    Sampling period:                          00000001 Seconds.
    Power reading state is:                   activated

"""
# a BMC whose power measurement is off: zeros and a 1970 timestamp, not a reading
DEACTIVATED = ACTIVATED.replace("235", "0").replace("218", "0").replace("activated", "deactivated")
# the layout of later builds (and of ipmitool-compatible tools): the period in milliseconds
MILLISECONDS = """
    Instantaneous power reading              : 214      Watts
    Minimum during sampling period           : 2        Watts
    Maximum during sampling period           : 468      Watts
    Average power reading over sample period : 184      Watts
    IPMI timestamp                           : 2024-05-05 13:06:44 UTC
    Sampling period                          : 1000 Milliseconds
    Power reading state is                   : activated
"""
NO_DEVICE = (
    "Could not open device at /dev/ipmi0 or /dev/ipmi/0 or /dev/ipmidev/0: No such file or directory\n"
    "Error: Unable to establish IPMI v2 / RMCP+ session\n"
)


def test_the_reading_is_parsed_as_ipmitool_prints_it() -> None:
    assert parse_dcmi_power(ACTIVATED) == NodePower(235.0, 218.0, 1.0)
    assert parse_dcmi_power(MILLISECONDS) == NodePower(214.0, 184.0, 1.0)
    assert parse_dcmi_power(ACTIVATED).telemetry() == {  # type: ignore[union-attr]
        "node_power_w": 235.0, "node_power_avg_w": 218.0, "node_power_sampling_s": 1.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    "text", [DEACTIVATED, NO_DEVICE, "", ACTIVATED.replace("Instantaneous", "Momentary")]
)
def test_what_is_not_an_activated_reading_is_none(text: str) -> None:
    assert parse_dcmi_power(text) is None


def stand_in(folder: Path, output: str, status: int = 0) -> Path:
    """An ``ipmitool`` that answers ``dcmi power reading`` with ``output`` (stdout, or stderr when failing) and
    counts its calls in ``calls``; anything else is an error, as with the real one."""
    folder.mkdir(exist_ok=True)
    (folder / "reading.txt").write_text(output)
    script = folder / "ipmitool"
    stream = ">&2" if status else ""
    script.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{folder / "calls"}"\n'
        '[ "$*" = "dcmi power reading" ] || { echo "Invalid command: $*" >&2; exit 1; }\n'
        f'cat "{folder / "reading.txt"}" {stream}\n'
        f"exit {status}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def calls(folder: Path) -> int:
    path = folder / "calls"
    return len(path.read_text().split()) if path.exists() else 0


def test_the_reader_uses_ipmitool_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{stand_in(tmp_path / 'bin', ACTIVATED)}{os.pathsep}{os.environ['PATH']}")
    assert read_node_power() == NodePower(235.0, 218.0, 1.0)


def test_without_ipmitool_nothing_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no ipmitool there
    assert read_node_power() is None
    reader = NodePowerReader()
    reader.begin()
    assert not reader.readable and reader.end() == {}


def epochs(reader: NodePowerReader, count: int) -> list[dict[str, float]]:
    out = []
    for _ in range(count):
        reader.begin()
        out.append(reader.end())
    return out


def test_a_failing_bmc_is_tried_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = stand_in(tmp_path / "bin", NO_DEVICE, status=1)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert epochs(NodePowerReader(), 3) == [{}, {}, {}]
    assert calls(folder) == 1


def test_a_reading_slower_than_its_epoch_is_left_out_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epoch's end waits JOIN_S at most; a reading still under way is no epoch's, and none other starts
    until it ends; the next epoch after it gets its own."""
    import accelbench.ipmi

    folder = stand_in(tmp_path / "bin", ACTIVATED)
    script = folder / "ipmitool"
    quick = script.read_text()
    script.write_text(quick.replace("#!/bin/sh\n", "#!/bin/sh\nsleep 1.5\n", 1))  # 30 x JOIN_S below
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(accelbench.ipmi, "JOIN_S", 0.05)
    reader = NodePowerReader()
    assert epochs(reader, 2) == [{}, {}]  # the first reading, still under way at both ends
    assert reader._thread is not None
    reader._thread.join(10)
    script.write_text(quick)
    monkeypatch.setattr(accelbench.ipmi, "JOIN_S", 10.0)
    assert epochs(reader, 1) == [
        {"node_power_w": 235.0, "node_power_avg_w": 218.0, "node_power_sampling_s": 1.0}
    ]
    assert calls(folder) == 2


@pytest.mark.slow
def test_a_run_records_the_nodes_power_in_each_epochs_telemetry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real tiny run on the CPU with the stand-in BMC: every epoch's telemetry (rank 0's) has the node's power,
    read once per epoch, while it runs."""
    from accelbench.engine.runner import run
    from accelbench.plugins import get_host
    from accelbench.testing import tiny_config

    folder = stand_in(tmp_path / "bin", ACTIVATED)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    record, _, status = run(tiny_config(epochs=2, steps_per_epoch=2, output_dir=tmp_path / "out"), get_host())
    assert status == "ok" and record is not None and record.metrics is not None
    assert [e.telemetry.get("node_power_w") for e in record.metrics.epochs] == [235.0, 235.0]
    assert record.metrics.epochs[-1].telemetry["node_power_avg_w"] == 218.0
    assert calls(folder) == 2
