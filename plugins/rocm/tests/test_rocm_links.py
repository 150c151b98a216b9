"""xGMI links read through amdsmi (against its stand-in), and ``accelbench comm`` grading a bus bandwidth measured
over them against their ceiling."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from accelbench_rocm import detect
from rocm_standins import install_gpus, mi250x_gcds, mi300x, mi300x_platform

from accelbench.comm.grade import crossed_link, grade_record
from accelbench.comm.records import CommConfig, CommMeasurement, CommRecord
from accelbench.contract import BackendInfo, DeviceInfo
from accelbench.results import BackendRecord, Outcome
from accelbench.system import collect_system_info


def comm_record(devices: list[DeviceInfo], busbw_gbps: float, ranks: int) -> CommRecord:
    """A one-node RCCL job over the first ``ranks`` of ``devices``: all_reduce fp32 at 256 MiB."""
    size = 2**28
    measurement = CommMeasurement(
        op="all_reduce", dtype="fp32", variant="in-place", size_bytes=size, count=size // 4, requested_bytes=size,
        status="ok", iters=5, time_us=1.0, algbw_gbps=busbw_gbps / 1.75, busbw_gbps=busbw_gbps, bus_factor=1.75,
    )  # fmt: skip
    return CommRecord(
        run_id="0" * 32, created_at=datetime.now(timezone.utc), outcome=Outcome(status="ok"),
        config=CommConfig(ops=["all_reduce"], dtypes=["fp32"], sizes=[size], warmup=1, iters=5, check=True,
                          devices=ranks, nnodes=1, collective_timeout=60),
        system=collect_system_info({}),
        backend=BackendRecord(
            info=BackendInfo(name="rocm", device_type="cuda", device_unit="GPU"), distribution=None, version=None,
            devices=devices, devices_used=ranks, collective_backend="nccl", runtime_versions={},
        ),
        plugins={}, world_size=ranks, nodes=1, launcher="torchrun", measurements=[measurement],
    )  # fmt: skip


def test_an_mi300x_platform_has_seven_xgmi_links_per_gpu_and_its_bandwidth_is_graded_against_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_gpus(monkeypatch, mi300x_platform())
    devices = detect.detect_devices()
    assert [d.details["xgmi_links"] for d in devices] == ["7"] * 8
    assert devices[2].details["xgmi_peers"] == "0:1,1:1,3:1,4:1,5:1,6:1,7:1"
    (grade,) = grade_record(comm_record(devices, 350.0, ranks=8))
    assert (grade.link.name, grade.link.ceiling_gbps) == ("xGMI x7", 448.0)  # 7 x 64 GB/s a direction
    assert grade.verdict == "good" and "78% of xGMI x7's 448 GB/s" in grade.describe()
    (slow,) = grade_record(comm_record(devices, 90.0, ranks=8))
    assert slow.verdict == "far below"


def test_two_of_eight_mi300x_share_one_link(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, mi300x_platform())
    devices = detect.detect_devices()
    link = crossed_link(comm_record(devices, 50.0, ranks=2))  # a job on the first two GPUs only
    assert (link.name, link.ceiling_gbps) == ("xGMI x1", 64.0)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "3,6")  # only the visible peers are counted
    assert [(d.details["xgmi_links"], d.details["xgmi_peers"]) for d in detect.detect_devices()] == [
        ("1", "1:1"), ("1", "0:1"),
    ]  # fmt: skip


def test_the_two_gcds_of_an_mi250x_are_joined_by_four_links(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, mi250x_gcds())
    devices = detect.detect_devices()
    assert [d.details["xgmi_links"] for d in devices] == ["4", "4"]  # max / min io-link bandwidth
    link = crossed_link(comm_record(devices, 150.0, ranks=2))
    assert (link.name, link.ceiling_gbps) == ("xGMI x4", 200.0)


def test_without_the_drivers_bandwidth_a_direct_peer_counts_one_link(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = mi250x_gcds()
    for gpu in gpus:
        gpu.xgmi_bandwidth = False
    install_gpus(monkeypatch, gpus)
    assert [d.details["xgmi_links"] for d in detect.detect_devices()] == ["1", "1"]


def test_gpus_without_xgmi_record_no_xgmi_links(monkeypatch: pytest.MonkeyPatch) -> None:
    install_gpus(monkeypatch, [mi300x("0000:05:00.0"), mi300x("0000:15:00.0")])  # PCIe cards, no bridge
    devices = detect.detect_devices()
    assert not any({"xgmi_links", "xgmi_peers"} & set(d.details) for d in devices)
    assert crossed_link(comm_record(devices, 20.0, ranks=2)).ceiling_gbps is None
