"""Collectives on a device named from a catalogue: alpha-beta over its plugin's link table (a latency a call plus
bus bytes over the level's bandwidth, NCCL's ring steps and protocols), and an engine's host hooks on an
accelerator's step (the longer of the device's work and the host's)."""

from __future__ import annotations

import pytest

from accelbench.estimate.links import BASE_LATENCY_US, STEP_LATENCY_US, LinkTable, bus_factor, link_table
from accelbench.estimate.notes import Notes
from accelbench.estimate.schema import Prediction
from accelbench.estimate.step_time import host_bound

H100 = {"link": "nvlink", "link_gbps": "450", "link_name": "NVLink 4", "network_gbps": "50",
        "network_name": "NDR InfiniBand", "node_devices": "8"}  # fmt: skip


def test_a_call_costs_its_latency_small_and_its_bus_bytes_large() -> None:
    table = link_table(H100, devices=8)
    assert table is not None and table.devices_per_node == 8
    # 8 bytes over 8 GPUs: the LL protocol's base latency and 2 x 7 steps over NVLink
    seconds, protocol = table.call_time("all_reduce", 8, 8.0)
    assert protocol == "LL"
    assert seconds == pytest.approx(
        (BASE_LATENCY_US["LL"] + 14 * STEP_LATENCY_US["nvlink"]["LL"]) * 1e-6, rel=1e-3
    )
    # 1 GiB: Simple, its latency and the bus bytes over 450 GB/s
    big, protocol = table.call_time("all_reduce", 8, 2**30)
    assert protocol == "Simple"
    latency = (BASE_LATENCY_US["Simple"] + 14 * STEP_LATENCY_US["nvlink"]["Simple"]) * 1e-6
    assert big == pytest.approx(latency + bus_factor("all_reduce", 8) * 2**30 / 450e9)
    # the effective bus bandwidth a lookup answers turns the bus bytes back into the call's time
    found = table.lookup("all_gather", 8, 2**20, "bf16")
    assert found is not None and "NVLink 4" in found[1] and "alpha-beta" in found[1]
    call, _ = table.call_time("all_gather", 8, 2**20)
    assert bus_factor("all_gather", 8) * 2**20 / found[0] == pytest.approx(call)


def test_a_group_larger_than_a_node_crosses_the_network() -> None:
    one_node = link_table(H100, devices=8)
    two_nodes = link_table(H100, devices=8, nnodes=2)
    assert one_node is not None and two_nodes is not None
    inside, _ = one_node.call_time("all_reduce", 8, 2**28)
    across, _ = two_nodes.call_time("all_reduce", 16, 2**28)
    # the node's network (8 NICs x 50 GB/s = 400 GB/s) below NVLink's 450 and more steps' latency
    assert two_nodes.bus_bytes_per_s(2) == 400e9
    assert across > inside
    found = two_nodes.lookup("all_reduce", 16, 2**28, "bf16")
    assert found is not None and "across 2 nodes" in found[1]
    # one node asked: the reference system's 8 GPUs are the node, so 16 (--scale-to) cross the network
    single = link_table(H100, devices=1)
    assert single is not None and single.devices_per_node == 8
    assert link_table({**H100, "network_gbps": "50"}, devices=4, nnodes=4) == LinkTable(
        "nvlink", 450e9, 4, 50e9, "NVLink 4", "NDR InfiniBand"
    )
    # no network figure: a multi-node call is unknown, never priced at the link's speed
    pcie = link_table({"link": "pcie", "link_gbps": "32"}, devices=2, nnodes=2)
    assert pcie is not None and pcie.lookup("all_reduce", 4, 2**20, "fp32") is None
    assert pcie.lookup("all_reduce", 2, 2**20, "fp32") is not None


def test_a_link_table_no_link_has_is_refused() -> None:
    assert link_table({}, devices=8) is None
    with pytest.raises(ValueError, match="'nvlink' or 'pcie'"):
        link_table({"link": "carrier-pigeon", "link_gbps": "1"}, devices=2)
    with pytest.raises(ValueError, match="no link has them"):
        link_table({"link": "nvlink", "link_gbps": "450000"}, devices=2)


def test_the_cuda_catalogue_gives_each_sxm_gpu_its_nvlink_and_its_reference_network() -> None:
    from accelbench_cuda.peaks import known_devices

    by_name = {d.name: d for d in known_devices()}
    h100 = link_table(by_name["NVIDIA H100 80GB HBM3"].details, devices=8)
    a100 = link_table(by_name["NVIDIA A100-SXM4-40GB"].details, devices=8)
    pcie = link_table(by_name["NVIDIA H100 PCIe"].details, devices=2)
    assert h100 is not None and h100.link_bytes_per_s == 450e9 and h100.network_bytes_per_s == 50e9
    assert a100 is not None and a100.link_bytes_per_s == 300e9 and a100.network_bytes_per_s == 25e9
    assert pcie is not None and pcie.link == "pcie" and pcie.network_bytes_per_s is None


def estimate(capsys: pytest.CaptureFixture[str], *args: str) -> Prediction:
    from accelbench.cli import main

    assert main(["estimate", "--device", "H100", "--model", "gpt-micro", "--precision", "bf16-mixed", *args,
                 "--json"]) == 0  # fmt: skip
    return Prediction.model_validate_json(capsys.readouterr().out)


def test_a_catalogued_device_prices_its_collectives_from_its_links(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --comm or --bus-bandwidth a named device's collectives are priced from its link table, and said so;
    across nodes they cost more; ZeRO-3's hundreds of calls cost at least their latency each."""
    ddp = estimate(capsys, "--strategy", "ddp", "--devices", "8", "--batch-size", "64")
    assert ddp.comm and all(op.time_s is not None for op in ddp.comm)
    assert all("link table: NVLink 4" in (op.bandwidth_source or "") for op in ddp.comm)
    assert any("alpha-beta over the device table's links (NVLink 4)" in a for a in ddp.assumptions)
    assert ddp.step_time_s is not None
    across = estimate(capsys, "--strategy", "ddp", "--devices", "8", "--nnodes", "2", "--batch-size", "64")
    assert across.comm_s is not None and ddp.comm_s is not None and across.comm_s > ddp.comm_s
    zero3 = estimate(capsys, "--strategy", "deepspeed-zero3", "--devices", "8", "--batch-size", "64")
    floor = sum(op.count for op in zero3.comm) * BASE_LATENCY_US["LL"] * 1e-6
    assert zero3.comm_s is not None and zero3.comm_s >= floor
    # given figures still win over the table
    given = estimate(
        capsys, "--strategy", "ddp", "--devices", "8", "--batch-size", "64", "--bus-bandwidth", "10"
    )
    assert all("--bus-bandwidth" in (op.bandwidth_source or "") for op in given.comm)
    # --scale-to needs no bandwidth flag for a device whose table has its links
    scaled = estimate(capsys, "--strategy", "ddp", "--devices", "8", "--batch-size", "64", "--scale-to", "16")
    assert scaled.scaling and scaled.scaling[0].step_s_to > 0


def test_an_engines_host_hooks_cost_an_accelerators_step_only_past_the_devices_work() -> None:
    notes = Notes()
    assert host_bound(device_s=0.050, dispatch_s=0.020, engine_s=0.010, notes=notes) == 0.0
    assert "cost the step nothing" in notes.assumptions[-1]
    assert host_bound(device_s=0.020, dispatch_s=0.015, engine_s=0.010, notes=notes) == pytest.approx(0.005)
    assert "waits 5 ms for the host" in notes.assumptions[-1]
