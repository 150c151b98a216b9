"""Real 2-process jobs over gloo: every strategy trains, per-rank metrics are gathered, faults end cleanly."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from core_support import TINY, Site, accelbench

from accelbench.results import read_record

SHORT = [*TINY, "--epochs", "2", "--steps-per-epoch", "3", "-q"]

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed not installed (pip install 'accelbench[deepspeed]')",
)


def only_record(directory: Path):
    files = sorted(directory.glob("*.json"))
    assert len(files) == 1, files
    return read_record(files[0])


@pytest.mark.parametrize(
    "strategy",
    [
        "ddp",
        "fsdp",
        pytest.param("deepspeed-zero1", marks=needs_deepspeed),
        pytest.param("deepspeed-zero2", marks=needs_deepspeed),
        pytest.param("deepspeed-zero3", marks=needs_deepspeed),
    ],
)
@pytest.mark.slow
def test_two_process_strategy_trains_and_gathers_every_rank(strategy: str, tmp_path: Path) -> None:
    proc = accelbench("run", *SHORT, "--strategy", strategy, "--devices", "2", "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    m = record.metrics
    assert record.outcome.status == "ok"
    assert (record.world_size, record.launcher, record.nodes) == (2, "torchrun", 1)
    assert record.backend.collective_backend == "gloo" and record.backend.devices_used == 2
    assert [r.rank for r in m.ranks] == [0, 1]
    assert all(r.epoch_samples == [24, 24] for r in m.ranks)  # 3 steps of 8 samples on each rank
    # global figures: all ranks' samples over the slowest rank's time
    for e in range(2):
        slowest = max(r.epoch_wall_s[e] for r in m.ranks)
        assert m.epochs[e].wall_s == slowest
        assert m.epochs[e].samples == 48
        assert m.epochs[e].samples_per_s == pytest.approx(48 / slowest)
    peaks = [r.peak_memory_bytes for r in m.ranks]
    assert m.peak_memory_max_bytes == max(peaks) and m.peak_memory_mean_bytes == pytest.approx(sum(peaks) / 2)
    assert record.executor["strategy"] == strategy
    # same seed, same data: every strategy computes the same first-epoch loss as plain DDP would
    assert m.epochs[0].loss == pytest.approx(4.1744, abs=0.05)


@needs_deepspeed
@pytest.mark.slow
def test_deepspeed_bf16_records_what_really_ran(tmp_path: Path) -> None:
    proc = accelbench("run", *SHORT, "--strategy", "deepspeed-zero2", "--devices", "2", "--precision", "bf16-mixed",
                      "--output-dir", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.precision.param_dtype == "bfloat16" and record.precision.autocast_dtype is None
    assert "fp32 master weights" in record.precision.notes
    assert record.executor["deepspeed_config"]["bf16"] == {"enabled": True}


@pytest.mark.slow
def test_the_workers_accelbench_starts_size_their_openmp_threads_and_keep_the_users(tmp_path: Path) -> None:
    """Without OMP_NUM_THREADS each worker's OpenMP runtime sizes its threads for every core (torchrun exports 1,
    elastic_launch does not): the workers get the node's usable cores shared out, and a user's setting is kept."""
    from accelbench.hostinfo import usable_cores

    unset = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for env, expected in (
        (unset, str(max(1, usable_cores() // 2))),
        ({**unset, "OMP_NUM_THREADS": "3"}, "3"),
    ):
        out = tmp_path / expected
        proc = accelbench(
            "run", *SHORT, "--strategy", "ddp", "--devices", "2", "--output-dir", str(out), env=env
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert only_record(out).system.environment.get("OMP_NUM_THREADS") == expected


@pytest.mark.slow
def test_ddp_on_one_device_needs_no_launcher(tmp_path: Path) -> None:
    proc = accelbench("run", *SHORT, "--strategy", "ddp", "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert (record.world_size, record.launcher, record.backend.collective_backend) == (1, "none", "gloo")


FAULTY = """
import os, time
import torch
from accelbench.contract import Backend, BackendInfo, DeviceInfo, RunOption, hookimpl
from accelbench.engine.distributed import DDPExecutor
accelbench_contract = "3.0"

@hookimpl
def accelbench_register_backends(register):
    register(FaultyBackend)

# device binding, synchronisation and epoch readings: the stock Backend's, which know CPU tensors
class FaultyBackend(Backend):
    info = BackendInfo(name="faulty", device_type="cpu", device_unit="test CPU", priority=-10)

    def detect_devices(self):
        return [DeviceInfo(index=0, name="Faulty CPU")]

    def run_options(self):
        return [RunOption(name="fail_mode", backend="faulty", help="raise, exit, hang or oom"),
                RunOption(name="fail_rank", type="int", default=1, backend="faulty")]

    def executor(self, request):
        return FaultyDDP(request) if request.strategy == "ddp" else super().executor(request)


class FaultyDDP(DDPExecutor):
    steps = 0

    def train_step(self, inputs, targets):
        self.steps += 1
        options = self.request.config.backend_options
        if self.request.world.rank == options.get("fail_rank", 1) and self.steps == 5:  # second step of epoch 2
            mode = options["fail_mode"]
            if mode == "raise":
                raise RuntimeError("injected fault")
            if mode == "oom":
                raise torch.OutOfMemoryError("injected: tried to allocate 80.00 GiB")
            if mode == "exit":
                os._exit(17)
            if mode == "hang":
                time.sleep(3600)
        return super().train_step(inputs, targets)
"""


@pytest.fixture
def faulty(site: Site) -> Site:
    site.add_distribution("accelbench-faulty", {"faulty": "faulty_plugin"}, {"faulty_plugin": FAULTY})
    return site


def run_faulty(
    site: Site, out: Path, mode: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = accelbench("run", "--backend", "faulty", *TINY, "--epochs", "3", "--steps-per-epoch", "3", "-q",
                      "--strategy", "ddp", "--devices", "2", "--fail-mode", mode, "--output-dir", str(out), *extra,
                      env=site.env(), timeout=240)  # fmt: skip
    return proc, time.monotonic() - start


@pytest.mark.parametrize(("mode", "status", "exit_code"), [("raise", "error", 1), ("oom", "oom", 3)])
@pytest.mark.slow
def test_a_failing_rank_is_named_and_measured_epochs_are_kept(
    faulty, tmp_path, mode, status, exit_code
) -> None:
    proc, _ = run_faulty(faulty, tmp_path, mode)
    assert proc.returncode == exit_code, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.outcome.status == status
    expected = (
        "rank 1: error: RuntimeError: injected fault" if mode == "raise" else "rank 1: oom: OutOfMemoryError"
    )
    assert expected in record.outcome.message
    assert [e.epoch for e in record.metrics.epochs] == [1]  # epoch 1 completed on every rank before the fault
    assert "(metrics below: the epochs every rank completed)" in record.outcome.message
    assert [r.rank for r in record.metrics.ranks] == [0, 1]  # the failed rank's log came through the store
    assert record.config.backend_options["fail_mode"] == mode


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_run_with_an_error_record(faulty, tmp_path) -> None:
    proc, elapsed = run_faulty(faulty, tmp_path, "exit", "--collective-timeout", "20")
    assert proc.returncode == 1, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.outcome.status == "error"
    assert "rank 1: sent no status" in record.outcome.message
    assert "rank 1 exited with code 17" in record.outcome.message  # what the launcher saw
    # the dead rank left its log after each epoch it completed: epoch 1 is kept for both ranks
    assert "(metrics below: the epochs every rank completed)" in record.outcome.message
    assert [e.epoch for e in record.metrics.epochs] == [1]
    assert [r.rank for r in record.metrics.ranks] == [0, 1]
    assert elapsed < 90


@pytest.mark.slow
def test_a_hung_rank_times_out_instead_of_hanging_forever(faulty, tmp_path) -> None:
    proc, elapsed = run_faulty(faulty, tmp_path, "hang", "--collective-timeout", "8")
    assert proc.returncode == 1, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.outcome.status == "error"
    assert "rank 1: sent no status" in record.outcome.message
    assert [e.epoch for e in record.metrics.epochs] == [1]
    assert elapsed < 90  # 8 s collective timeout + 8 s for statuses + start-up, not an hour


@pytest.mark.slow
def test_mpi_style_environment_is_recognised_without_a_launcher(tmp_path: Path) -> None:
    """Two processes started by hand with Open MPI's variables, as mpirun would: accelbench starts nothing."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                   OMPI_COMM_WORLD_LOCAL_SIZE="2", MASTER_PORT=str(port))  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "accelbench.cli", "run", *SHORT, "--strategy", "ddp", "--output-dir", str(tmp_path),
             "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    record = json.loads(outs[0][0])  # rank 0 prints the record; --json keeps stdout clean
    assert outs[1][0] == ""  # other ranks write nothing
    assert (record["launcher"], record["world_size"]) == ("openmpi", 2)
    assert [r["rank"] for r in record["metrics"]["ranks"]] == [0, 1]


def test_launcher_and_request_disagreeing_is_refused(tmp_path: Path) -> None:
    env = dict(
        os.environ, PMI_RANK="0", PMI_SIZE="2", MPI_LOCALRANKID="0", MPI_LOCALNRANKS="2", MASTER_PORT="29999"
    )
    proc = accelbench(
        "run", *SHORT, "--strategy", "ddp", "--devices", "4", "--output-dir", str(tmp_path), env=env
    )
    assert proc.returncode == 2
    assert "--devices 4, but mpich started 2 process(es) on this node" in proc.stderr
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--devices", "2"], "strategy 'single' trains on one device, but 2 were asked for"),
        (
            ["--strategy", "pipelined"],
            "does not support strategy 'pipelined'; it supports: single, ddp, fsdp",
        ),
        (["--strategy", "ddp", "--devices", "2", "--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint"),
    ],
)
@pytest.mark.slow
def test_bad_distributed_requests_fail_before_launch(args, message, tmp_path: Path) -> None:
    proc = accelbench("run", *SHORT, *args, "--output-dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in " ".join(proc.stderr.split())


@pytest.mark.slow
def test_rendezvous_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = accelbench("run", *SHORT, "--strategy", "ddp", "--devices", "2", "--rdzv-endpoint",
                          f"127.0.0.1:{port}", "--output-dir", str(tmp_path))  # fmt: skip
    assert proc.returncode == 2
    assert f"rendezvous port {port} on 127.0.0.1 is not available" in proc.stderr


needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="Lightning not installed (pip install 'accelbench[lightning]')",
)


@needs_lightning
@pytest.mark.parametrize(("strategy", "devices"), [("single", "1"), ("ddp", "2")])
@pytest.mark.slow
def test_lightning_engine_runs_the_same_workload(strategy: str, devices: str, tmp_path: Path) -> None:
    proc = accelbench("run", *SHORT, "--engine", "lightning", "--strategy", strategy, "--devices", devices,
                      "--precision", "bf16-mixed", "--output-dir", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.engine == "lightning"
    assert record.executor["lightning_precision"] == "bf16-mixed"
    assert record.executor["lightning_strategy"] == {"single": "auto", "ddp": "ddp"}[strategy]
    assert record.world_size == int(devices)
    assert record.metrics.epochs[0].samples == 24 * int(devices)


@needs_lightning
@pytest.mark.slow
def test_lightning_fsdp_on_cpu_is_refused_up_front(tmp_path: Path) -> None:
    proc = accelbench(
        "run", *SHORT, "--engine", "lightning", "--strategy", "fsdp", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 2
    assert "Lightning's FSDP strategy refuses CPU" in proc.stderr


@pytest.mark.slow
def test_two_nodes_with_a_rendezvous_endpoint(tmp_path: Path) -> None:
    """Two "nodes" on this host, each started with the same torchrun-style command and its own --node-rank.

    Node 0 starts first and hosts the rendezvous, as on a cluster; on one host a node 1 that started first
    would take the rendezvous port itself, which node 0's port check then (rightly) refuses.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def start(rank: int) -> subprocess.Popen[str]:
        args = [*SHORT, "--strategy", "ddp", "--devices", "1", "--nnodes", "2", "--node-rank", str(rank),
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--output-dir", str(tmp_path)]  # fmt: skip
        return subprocess.Popen(
            [sys.executable, "-m", "accelbench.cli", "run", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    nodes = [start(0)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until node 0's rendezvous store listens
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert nodes[0].poll() is None, nodes[0].communicate()[1][-2000:]
        time.sleep(0.2)
    nodes.append(start(1))
    outs = [node.communicate(timeout=180) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    record = only_record(tmp_path)
    assert (record.world_size, record.nodes, record.launcher) == (2, 2, "torchrun")
    assert [r.rank for r in record.metrics.ranks] == [0, 1]
