"""``comm`` bandwidth graded against the ceiling of the link it crossed, from records: NVLink, xGMI and PCIe
ceilings from the device details detection records, and no invented ceiling for loopback or a network."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from accelbench.cli import main
from accelbench.comm.grade import crossed_link, grade_record
from accelbench.comm.records import CommConfig, CommMeasurement, CommRecord, write_comm_record
from accelbench.contract import BackendInfo, DeviceInfo
from accelbench.results import BackendRecord, Outcome
from accelbench.system import collect_system_info

SIZES = [2**10, 2**20, 2**28]


def comm_record(
    details: dict[str, str],
    busbw: list[float],
    backend: str = "cuda",
    arch: str | None = "sm_90",
    nodes: int = 1,
    ranks: int = 8,
) -> CommRecord:
    """A comm record of ``ranks`` devices with these details, all_reduce fp32 at three sizes."""
    devices = [DeviceInfo(index=i, name="GPU", arch=arch, details=details) for i in range(ranks)]
    measurements = [
        CommMeasurement(
            op="all_reduce",
            dtype="fp32",
            variant="in-place",
            size_bytes=size,
            count=size // 4,
            requested_bytes=size,
            status="ok",
            iters=5,
            time_us=1.0,
            algbw_gbps=b / 1.75,
            busbw_gbps=b,
            bus_factor=1.75,
        )  # fmt: skip
        for size, b in zip(SIZES, busbw, strict=True)
    ]
    return CommRecord(
        run_id="0" * 32, created_at=datetime.now(timezone.utc), outcome=Outcome(status="ok"),
        config=CommConfig(ops=["all_reduce"], dtypes=["fp32"], sizes=SIZES, warmup=1, iters=5, check=True,
                          devices=ranks, nnodes=nodes, collective_timeout=60),
        system=collect_system_info({}),
        backend=BackendRecord(
            info=BackendInfo(name=backend, device_type="cuda" if backend == "cuda" else backend, device_unit="GPU"),
            distribution=None, version=None, devices=devices, devices_used=ranks,
            collective_backend="nccl" if backend == "cuda" else "gloo", runtime_versions={},
        ),
        plugins={}, world_size=ranks * nodes, nodes=nodes, launcher="torchrun", measurements=measurements,
    )  # fmt: skip


H100 = {"nvlink_links": "18", "nvlink_version": "4", "pcie_generation": "5", "pcie_width": "16"}


def test_nvlink_is_the_link_and_a_good_bandwidth_is_said_good() -> None:
    (grade,) = grade_record(comm_record(H100, [5.0, 120.0, 360.0]))
    assert (grade.link.name, grade.link.ceiling_gbps) == ("NVLink 4 x18", 450.0)
    assert (grade.busbw_gbps, grade.size_bytes, grade.verdict) == (
        360.0,
        2**28,
        "good",
    )  # the plateau, not 1 KiB
    assert grade.share == pytest.approx(0.8)
    assert "80% of NVLink 4 x18's 450 GB/s: good" in grade.describe()


def test_a_bandwidth_far_below_its_ceiling_says_so_plainly() -> None:
    (grade,) = grade_record(comm_record(H100, [1.0, 20.0, 60.0]))
    assert grade.verdict == "far below"
    text = grade.describe()
    assert "13% of NVLink 4 x18's 450 GB/s: far below its ceiling" in text and "NCCL_DEBUG=INFO" in text


@pytest.mark.parametrize(
    ("details", "arch", "name", "ceiling"),
    [
        ({"nvlink_links": "12", "nvlink_version": "3"}, "sm_80", "NVLink 3 x12", 300.0),  # A100 SXM
        ({"nvlink_links": "18", "nvlink_version": "5"}, "sm_100", "NVLink 5 x18", 900.0),  # B200
        ({"pcie_generation": "4", "pcie_width": "16"}, "sm_89", "PCIe 4.0 x16", 31.504),  # no NVLink: PCIe
        ({"pcie_generation": "5", "pcie_width": "8"}, "sm_90", "PCIe 5.0 x8", 31.504),
        ({"xgmi_links": "7"}, "gfx942", "xGMI x7", 448.0),  # MI300X
    ],
)
def test_each_link_kind_has_its_ceiling(
    details: dict[str, str], arch: str, name: str, ceiling: float
) -> None:
    link = crossed_link(comm_record(details, [1, 2, 3], arch=arch))
    assert link.name == name and link.ceiling_gbps == pytest.approx(ceiling)


def test_the_slowest_device_bounds_the_link() -> None:
    """One GPU of the job with fewer active NVLinks (a link down): the ring runs at its pace."""
    record = comm_record(H100, [1, 2, 3])
    record.backend.devices[3] = record.backend.devices[3].model_copy(
        update={"details": {**H100, "nvlink_links": "16"}}
    )
    assert crossed_link(record).name == "NVLink 4 x16"


@pytest.mark.parametrize(
    ("record", "name", "why"),
    [
        (comm_record({}, [0.1, 1, 2], backend="cpu", arch=None, ranks=2), "loopback and shared memory on one host",
         "not a link"),
        (comm_record(H100, [1, 2, 3], nodes=2), "the network between nodes", "does not read the network's speed"),
        (comm_record({}, [1, 2, 3]), "an unknown link", "recorded no NVLink, xGMI or PCIe facts"),
        (comm_record({"nvlink_links": "4", "nvlink_version": "9"}, [1, 2, 3]), "NVLink x4", "not in the ceiling"),
    ],
)  # fmt: skip
def test_no_ceiling_is_invented(record: CommRecord, name: str, why: str) -> None:
    (grade,) = grade_record(record)
    assert grade.link.name == name and grade.share is None and grade.verdict == "no ceiling known"
    assert why in grade.describe()


def test_compare_grades_each_systems_best_bandwidth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two records of one system: compare grades the better one, in the table and in Markdown."""
    write_comm_record(comm_record(H100, [1.0, 20.0, 60.0]), tmp_path)
    write_comm_record(comm_record(H100, [1.0, 20.0, 90.0]).model_copy(update={"run_id": "1" * 32}), tmp_path)
    assert main(["compare", str(tmp_path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "## Against the link's ceiling" in out
    assert (
        "peak bus bandwidth 90 GB/s at 256 MiB = 20% of NVLink 4 x18's 450 GB/s: far below its ceiling" in out
    )
    assert "60 GB/s" not in out.split("## Against")[1]
