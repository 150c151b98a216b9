"""Energy at scale: a node's RAPL counters read once per node (by its local rank 0) and apportioned over its ranks
by their CPU seconds, and the idle baseline read the same way before training; tested with the counters faked at
the file level (ACCELBENCH_POWERCAP_DIR)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from core_support import accelbench
from test_energy_and_build import rapl_zone

from accelbench.backends.cpu import POWERCAP_ENV, CpuBackend
from accelbench.contract import World
from accelbench.engine.idle import read_idle_power
from accelbench.engine.metrics import (
    RankLog,
    WorkCounts,
    apportion_energy,
    build_metrics,
    check_energy_counters,
    epoch_energy,
    idle_baseline,
)
from accelbench.results import read_record

WATTS = 100.0  # the fake package's power draw


def log(rank: int, joules: float | None, domain: str | None, cpu_s: float) -> RankLog:
    return RankLog(rank=rank, host="n", epoch_energy_j=[joules], energy_domain=domain, epoch_cpu_s=[cpu_s])


def test_a_shared_node_counter_counts_once_and_is_shared_by_cpu_seconds() -> None:
    """Two ranks on node a (rank 0 read 30 J for the node, rank 1 reports the counter with none of its own),
    one rank with a device counter of its own: the node counts once and splits 3:1 by CPU seconds."""
    logs = [log(0, 30.0, "rapl:a", 3.0), log(1, 0.0, "rapl:a", 1.0), log(2, 12.0, "gpu:uuid-2", 5.0)]
    assert epoch_energy(0, logs) == 42.0
    assert apportion_energy(0, logs) == [22.5, 7.5, 12.0]
    logs[1] = log(1, 0.0, "rapl:a", 0.0)  # CPU seconds unknown (0): an equal split
    assert apportion_energy(0, logs)[:2] == [15.0, 15.0]
    logs[2] = log(2, None, None, 5.0)  # no readable counter: no share, and the epoch's total is unknown
    assert apportion_energy(0, logs)[2] is None and epoch_energy(0, logs) is None


def test_a_stuck_or_jumping_counter_is_flagged_and_its_epochs_energy_is_unknown() -> None:
    def timed(rank: int, joules: list[float | None], domain: str, walls: list[float]) -> RankLog:
        return RankLog(rank=rank, host="n", epoch_wall_s=walls, epoch_energy_j=joules, energy_domain=domain,
                       epoch_cpu_s=[1.0] * len(walls), epoch_samples=[8] * len(walls), epoch_steps=[2] * len(walls),
                       epoch_loss=[1.0] * len(walls), epoch_peak_bytes=[None] * len(walls),
                       epoch_telemetry=[{}] * len(walls), epoch_cpu_wait_s=[None] * len(walls),
                       epoch_load=[None] * len(walls))  # fmt: skip

    walls = [1.0, 1.0, 1.0, 0.1]
    node = timed(
        0, [50.0, 0.0, 60_000.0, 0.0], "rapl:a", walls
    )  # fine; stuck; 60 kW; 0 J in 0.1 s (too short)
    peer = timed(1, [0.0] * 4, "rapl:a", walls)  # the node's other rank: none of its own, not a stuck counter
    problems, bad = check_energy_counters([node, peer], 4)
    assert bad == {1, 2}
    assert problems == [
        "epoch 2: counter rapl:a did not advance in 1.00 s",
        "epoch 3: counter rapl:a jumped by 6e+04 J in 1.00 s (6e+04 W, above 5000 W)",
    ]
    work = WorkCounts(tokens_per_sample=16, flops_per_sample=1.0, flops_formula="f")
    metrics = build_metrics([node, peer], work, None, 2, 0.0, None, None)
    assert [e.energy_j for e in metrics.epochs] == [50.0, None, None, 0.0]
    assert metrics.energy_problems == problems
    assert metrics.ranks[0].energy_j[1] is None and metrics.ranks[1].energy_j[0] == 25.0


def test_only_local_rank_0_reads_the_nodes_counters(tmp_path: Path) -> None:
    counter = rapl_zone(tmp_path, "intel-rapl:0", 1_000_000)
    cpu = torch.device("cpu")
    reader, peer = CpuBackend(powercap=tmp_path), CpuBackend(powercap=tmp_path)
    reader.setup_device(World(rank=2, local_rank=0, world_size=4, local_world_size=2, nnodes=2), {})
    peer.setup_device(World(rank=3, local_rank=1, world_size=4, local_world_size=2, nnodes=2), {})
    reader.epoch_start(cpu)
    peer.epoch_start(cpu)
    counter.write_text("9000000\n")  # +8 J
    mine, theirs = reader.epoch_end(cpu).energy, peer.epoch_end(cpu).energy
    assert mine is not None and theirs is not None
    assert (mine.joules, theirs.joules) == (8.0, 0.0) and mine.domain == theirs.domain
    assert "read once per node, by its local rank 0" in theirs.source


@pytest.fixture
def fake_rapl(tmp_path: Path) -> Iterator[Path]:
    """A powercap folder whose package counter advances as a 100 W package's would, from the clock, until the
    test ends (rewritten every 5 ms, atomically)."""
    root = tmp_path / "powercap"
    counter = rapl_zone(root, "intel-rapl:0", 0)
    start, stop = time.monotonic(), threading.Event()

    def advance() -> None:
        while not stop.is_set():
            tmp = counter.with_suffix(".tmp")
            tmp.write_text(f"{int((time.monotonic() - start) * WATTS * 1e6)}\n")
            os.replace(tmp, counter)
            stop.wait(0.005)

    writer = threading.Thread(target=advance, daemon=True)
    writer.start()
    try:
        yield root
    finally:
        stop.set()
        writer.join()


@pytest.mark.slow
def test_two_ranks_on_one_node_count_its_energy_once(fake_rapl: Path, tmp_path: Path) -> None:
    """A real 2-rank gloo DDP run on one node whose RAPL counter is faked at 100 W: each epoch's energy is the
    node's (~100 W x the epoch), not twice it, and the ranks' shares add up to it."""
    env = {**os.environ, POWERCAP_ENV: str(fake_rapl)}
    out = tmp_path / "out"
    proc = accelbench(
        "run", "--backend", "cpu", "--model", "gpt-nano", "--strategy", "ddp", "--devices", "2", "--epochs", "2",
        "--steps-per-epoch", "3", "--batch-size", "4", "-q", "--output-dir", str(out), env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("*.json")
    metrics = read_record(path).metrics
    assert (
        metrics is not None and metrics.energy_source is not None and str(fake_rapl) in metrics.energy_source
    )
    for e, epoch in enumerate(metrics.epochs):
        assert epoch.energy_j is not None
        # the epoch's window on rank 0 is within its wall time (plus the 5 ms the file may lag): once, not twice
        assert 0.5 * WATTS * epoch.wall_s < epoch.energy_j < 1.2 * WATTS * epoch.wall_s + 1.0
        shares = [r.energy_j[e] for r in metrics.ranks]
        assert all(s is not None and s > 0 for s in shares)
        assert sum(s for s in shares if s is not None) == pytest.approx(epoch.energy_j)
    # priced: the node's energy (once) x $ per kWh plus 2 device-hours' worth of time, per run and per token
    prices = tmp_path / "prices.toml"
    prices.write_text("kwh = 0.25\n[device_hour]\ndefault = 0.10\n")
    compared = accelbench("compare", str(out), "--prices", str(prices), "--format", "json")
    assert compared.returncode == 0, compared.stderr
    (cell,) = json.loads(compared.stdout)["groups"][0]["cells"]
    assert cell["usd_per_run"]["median"] > 0 and cell["usd_per_mtok"]["median"] > 0


def idle_log(rank: int, joules: float | None, domain: str | None, window: float = 2.0) -> RankLog:
    return RankLog(rank=rank, host="n", energy_domain=domain, idle_window_s=window if joules is not None else None,
                   idle_energy_j=joules, idle_domain=domain if joules is not None else None)  # fmt: skip


def test_the_idle_baseline_counts_a_nodes_counter_once_and_a_still_counter_is_unknown_not_zero() -> None:
    """Rank 0 read the node's RAPL (8 J in 2 s), rank 1 reports it with none of its own, rank 2 its device (3 J)."""
    logs = [idle_log(0, 8.0, "rapl:a"), idle_log(1, 0.0, "rapl:a"), idle_log(2, 3.0, "gpu:uuid-2")]
    idle = idle_baseline(logs)
    assert idle is not None and idle.window_s == 2.0 and idle.problems == []
    assert idle.watts == 5.5 and [(c.domain, c.watts) for c in idle.counters] == [
        ("rapl:a", 4.0),
        ("gpu:uuid-2", 1.5),
    ]
    logs[2] = idle_log(2, 0.0, "gpu:uuid-2")  # a device counter that did not advance in the window
    still = idle_baseline(logs)
    assert still is not None and still.watts is None and still.counters[1].watts is None
    assert still.problems == ["idle baseline: counter gpu:uuid-2 did not advance in 2.00 s"]
    logs[2] = idle_log(2, None, "gpu:uuid-2")  # its counter read for the epochs but not in the window
    unread = idle_baseline(logs)
    assert unread is not None and unread.watts is None
    assert unread.problems == ["idle baseline: counter gpu:uuid-2 was not read in the window"]
    assert idle_baseline([log(0, 1.0, "rapl:a", 1.0)]) is None  # no window read (skipped, or an older run)


def test_energy_per_sample_states_the_energy_above_idle() -> None:
    walls = [1.0, 2.0, 2.0]
    logs = [
        RankLog(rank=0, host="n", epoch_wall_s=walls, epoch_energy_j=[50.0, 90.0, 100.0], energy_domain="rapl:a",
                epoch_cpu_s=[1.0] * 3, epoch_samples=[10] * 3, epoch_steps=[2] * 3, epoch_loss=[1.0] * 3,
                epoch_peak_bytes=[None] * 3, epoch_telemetry=[{}] * 3, epoch_cpu_wait_s=[None] * 3,
                epoch_load=[None] * 3, idle_window_s=1.0, idle_energy_j=20.0, idle_domain="rapl:a"),
    ]  # fmt: skip
    work = WorkCounts(tokens_per_sample=16, flops_per_sample=1.0, flops_formula="f")
    metrics = build_metrics(logs, work, None, 1, 0.0, None, None)
    assert metrics.idle is not None and metrics.idle.watts == 20.0
    assert [e.energy_above_idle_j for e in metrics.epochs] == [30.0, 50.0, 60.0]  # energy - 20 W x wall
    assert [e.joules_per_sample_above_idle for e in metrics.epochs] == [3.0, 5.0, 6.0]
    assert metrics.steady is not None and metrics.steady.joules_per_sample == 9.5
    assert metrics.steady.joules_per_sample_above_idle == 5.5
    logs[0].idle_energy_j = 0.0  # a still counter: the total stands, the split is unknown
    still = build_metrics(logs, work, None, 1, 0.0, None, None)
    assert still.epochs[0].energy_j == 50.0 and still.epochs[0].energy_above_idle_j is None
    assert still.steady is not None and still.steady.joules_per_sample_above_idle is None


def test_the_idle_window_reads_the_counters_file_once_per_node(fake_rapl: Path, tmp_path: Path) -> None:
    """The 100 W fake package read over a 0.2 s window by local rank 0; its node's other rank reads none of its
    own; a package whose counter file never moves has no idle figure."""
    cpu = torch.device("cpu")
    reader, peer = CpuBackend(powercap=fake_rapl), CpuBackend(powercap=fake_rapl)
    reader.setup_device(World(rank=0, local_rank=0, world_size=2, local_world_size=2, nnodes=1), {})
    peer.setup_device(World(rank=1, local_rank=1, world_size=2, local_world_size=2, nnodes=1), {})
    logs = [RankLog(rank=0, host="n"), RankLog(rank=1, host="n")]
    read_idle_power(reader, cpu, 0.2, logs[0])
    read_idle_power(peer, cpu, 0.2, logs[1])
    assert logs[1].idle_energy_j == 0.0 and logs[1].idle_domain == logs[0].idle_domain
    idle = idle_baseline(logs)
    assert idle is not None and idle.watts is not None and len(idle.counters) == 1
    assert 0.8 * WATTS < idle.watts < 1.2 * WATTS  # the node's 100 W, once

    still = tmp_path / "still"
    rapl_zone(still, "intel-rapl:0", 5_000_000)  # never advances
    backend = CpuBackend(powercap=still)
    backend.setup_device(World(rank=0, local_rank=0, world_size=1, local_world_size=1, nnodes=1), {})
    alone = RankLog(rank=0, host="n")
    read_idle_power(backend, cpu, 0.05, alone)
    stuck = idle_baseline([alone])
    assert stuck is not None and stuck.watts is None and "did not advance" in stuck.problems[0]

    nothing = RankLog(rank=0, host="n")  # no counter at all: the window is skipped and records nothing
    empty = CpuBackend(powercap=tmp_path / "none")
    empty.setup_device(World(rank=0, local_rank=0, world_size=1, local_world_size=1, nnodes=1), {})
    read_idle_power(empty, cpu, 30.0, nothing)
    assert nothing.idle_window_s is None and idle_baseline([nothing]) is None


@pytest.mark.slow
def test_two_ranks_measure_the_idle_baseline_once_per_node_before_training(
    fake_rapl: Path, tmp_path: Path
) -> None:
    """A real 2-rank gloo run on one node at a faked 100 W with a 1 s idle window: the idle power is the node's
    (~100 W, not 200), the window is in no epoch's energy, and above-idle energy is what is left (about 0 here,
    since the fake package draws the same 100 W training or not)."""
    env = {**os.environ, POWERCAP_ENV: str(fake_rapl)}
    out = tmp_path / "out"
    proc = accelbench(
        "run", "--backend", "cpu", "--model", "gpt-nano", "--strategy", "ddp", "--devices", "2", "--epochs", "2",
        "--steps-per-epoch", "3", "--batch-size", "4", "-q", "--idle-baseline-s", "1", "--output-dir", str(out),
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("*.json")
    metrics = read_record(path).metrics
    assert metrics is not None and metrics.idle is not None and metrics.idle.watts is not None
    assert metrics.idle.window_s >= 1.0 and 0.8 * WATTS < metrics.idle.watts < 1.2 * WATTS
    for epoch in metrics.epochs:
        assert epoch.energy_j is not None and epoch.energy_above_idle_j is not None
        assert epoch.energy_j < 1.2 * WATTS * epoch.wall_s + 1.0  # the idle window's 100 J is not in it
        assert abs(epoch.energy_above_idle_j) < 0.3 * WATTS * epoch.wall_s + 1.0
    assert metrics.steady is not None and metrics.steady.joules_per_sample_above_idle is not None
