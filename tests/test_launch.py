"""Recognising torchrun, srun and mpirun from their environment variables."""

from __future__ import annotations

import pytest

from accelbench.errors import ConfigError
from accelbench.launch import LaunchEnv, check_launch, detect_launch, first_host


def test_no_launcher() -> None:
    assert detect_launch({}) == LaunchEnv("none")


def test_torchrun() -> None:
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}  # fmt: skip
    assert detect_launch(env) == LaunchEnv("torchrun", 5, 1, 8, 4, 2, "node1", 29500)


def test_srun_step() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_JOB_ID": "123456"}  # fmt: skip
    launch = detect_launch(env)
    assert launch == LaunchEnv("slurm", 3, 1, 4, 2, 2, "gpu007", 10000 + 123456 % 10000)
    assert launch.torch_env() == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                  "MASTER_ADDR": "gpu007", "MASTER_PORT": "13456"}  # fmt: skip


def test_slurm_batch_script_is_not_a_launched_worker() -> None:
    # the batch script itself has SLURM_PROCID but no step: `accelbench run --devices 4` there launches torchrun
    assert detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "1"}).launcher == "none"


def test_open_mpi_and_intel_mpi() -> None:
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_PORT": "1234"}  # fmt: skip
    assert detect_launch(ompi) == LaunchEnv("openmpi", 1, 1, 2, 2, 1, "127.0.0.1", 1234)
    impi = {"PMI_RANK": "6", "PMI_SIZE": "8", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4",
            "MASTER_ADDR": "x1000c0s0b0n0", "MASTER_PORT": "29500"}  # fmt: skip
    assert detect_launch(impi) == LaunchEnv("mpich", 6, 2, 8, 4, 2, "x1000c0s0b0n0", 29500)


def test_multi_node_mpi_without_master_addr_is_refused() -> None:
    impi = {"PMI_RANK": "0", "PMI_SIZE": "8", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "4"}
    with pytest.raises(ConfigError, match="export MASTER_ADDR=<first node> MASTER_PORT=<free port>"):
        check_launch(detect_launch(impi), None, None)


def test_node_count_mismatch_is_refused() -> None:
    env = detect_launch({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "2",
                         "SLURM_STEP_NODELIST": "n[1-2]", "MASTER_PORT": "1"})  # fmt: skip
    with pytest.raises(ConfigError, match="--nnodes 4, but slurm reports 2 node"):
        check_launch(env, None, 4)


def test_bad_variable_is_named() -> None:
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_SIZE='two' is not an integer"):
        detect_launch({"OMPI_COMM_WORLD_SIZE": "two", "OMPI_COMM_WORLD_RANK": "0"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"RANK": "4", "LOCAL_RANK": "0", "WORLD_SIZE": "4"},
            r"torchrun environment .* rank 4 is outside 0..3",
        ),
        (
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "0"},
            "world size 0 and local size 0 must be at least 1",
        ),
        (
            {"RANK": "0", "LOCAL_RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},
            "local rank 2 is outside 0..1",
        ),
        (
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"},
            "4 processes on this node exceed the world size 2",
        ),
        (
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "70000"},
            "MASTER_PORT 70000 is not a port",
        ),
        (
            {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "-1"},
            r"openmpi environment .* rank -1 is outside",
        ),
        ({"PMI_SIZE": "2", "PMI_RANK": "2"}, r"mpich environment .* rank 2 is outside 0..1"),
        (
            {
                "SLURM_PROCID": "3",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_STEP_NODELIST": "n1",
                "MASTER_PORT": "1",
            },
            r"slurm environment .* rank 3 is outside 0..1",
        ),
    ],
)
def test_launcher_values_that_do_not_add_up_are_refused_before_anything_starts(env, message) -> None:
    """A worker started with values that cannot be (a rank beyond the world, a port out of range) is told so at
    once, naming the variables; before, it waited for peers that would never come, or died in a traceback."""
    with pytest.raises(ConfigError, match=message):
        detect_launch(env)


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node01", "node01"),
        ("gpu[003-005,010]", "gpu003"),
        ("a[1,3],b[2-4]", "a1"),
        ("c-7-[10-11]", "c-7-10"),
    ],
)
def test_first_host_of_a_slurm_node_list(nodelist: str, first: str) -> None:
    assert first_host(nodelist) == first
