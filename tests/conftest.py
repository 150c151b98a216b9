"""Fixtures for the core tests (helpers live in core_support.py).

Tests that need a vendor plugin installed carry ``@pytest.mark.needs_plugin(DISTRIBUTION, ..., why=...)`` and are
skipped, saying so, where it is not (:func:`pytest_runtest_setup`).

The real records several test modules read are made here, once a session (:func:`real_runs`, :func:`tiny_run`):
read them, and copy a record before changing it. So is the one-node Slurm the launcher and ``sweep --submit slurm``
tests share (:func:`slurm`): one cluster a session, never two on one host.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cluster_support import ClusterUnavailable, SlurmCluster, start_slurm
from core_support import RealRuns, Site

from accelbench.estimate.peak import CACHE_ENV

if TYPE_CHECKING:
    from accelbench.results import ResultRecord


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# The extended tier: slow tests whose subject the CI's full tier already trains another way (the same strategy's
# parity with a mixed precision, a workload's reference at a second seed, a composition of three parallelisms where
# each pair is tested). `.ci/run` leaves them out (`-m "slow and not extended"`), so the full tier fits a 2-core CI
# host half as fast as these VMs; `python -m pytest -m slow` runs them with the rest, `-m extended` alone.
EXTENDED = (
    "tests/test_quality.py::test_a_seed_the_reference_was_not_made_with_trains_within_each_workloads_reference",
    "tests/test_quality.py::test_each_precision_and_strategy_trains_as_single_device_fp32[fp16-mixed]",
    "tests/test_quality.py::test_each_precision_and_strategy_trains_as_single_device_fp32[bf16-mixed]",
    "tests/test_quality.py::test_each_precision_and_strategy_trains_as_single_device_fp32[deepspeed-zero1]",
    "tests/test_quality.py::test_each_precision_and_strategy_trains_as_single_device_fp32[deepspeed-zero2]",
    "tests/test_quality.py::test_each_precision_and_strategy_trains_as_single_device_fp32[lightning]",
    "tests/test_quality.py::test_each_precision_and_strategy_trains_as_single_device_fp32[tp]",
    "tests/test_quality.py::test_each_precision_and_strategy_trains_as_single_device_fp32[ep]",
    "tests/test_quality.py::test_every_stack_evaluates_and_probes_as_its_plain_equivalent[lightning]",
    "tests/test_quality.py::test_every_stack_evaluates_and_probes_as_its_plain_equivalent[lightning-ddp]",
    "tests/test_mlperf_proxy.py::test_the_tiny_suite_runs_and_compares_in_tokens_and_routing_balance",
    "plugins/example/tests/test_example_contract.py::TestExampleContract::test_short_training_run_of_each_workload",
    "plugins/ipu/tests/test_contract.py::TestIpuContract::test_short_training_run_of_each_workload",
    "tests/test_moe_parallel.py::test_expert_parallelism_composes_with_tensor_parallelism[moe-tiny-fsdp=2,tp=2,ep=2-4]",
    "tests/test_moe_parallel.py::test_expert_parallelism_composes_with_tensor_parallelism[moe-tiny-ddp=2,tp=2,ep=2-4]",
    "tests/test_moe_parallel.py::test_expert_parallelism_composes_with_a_pipeline[deepseek-tiny-fsdp=2,pp=2,ep=2-4]",
    "tests/test_moe_parallel.py::test_expert_parallelism_composes_with_a_pipeline[deepseek-tiny-ddp=2,pp=2,ep=2-4]",
    "tests/test_moe.py::test_expert_parallel_training_is_one_process_training_on_the_global_batch[fsdp=2,ep=2]",
    "tests/test_moe.py::test_expert_parallel_training_is_one_process_training_on_the_global_batch[ddp=2,ep=2]",
    "tests/test_activation_checkpointing.py::test_two_gloo_processes_train_the_same_losses_with_it[deepspeed-zero3]",
    "tests/test_activation_checkpointing.py::test_two_gloo_processes_train_the_same_losses_with_it[fsdp]",
    "tests/test_activation_checkpointing.py::test_two_gloo_processes_train_the_same_losses_with_it[tp]",
    "tests/test_vision.py::test_two_processes_with_gradient_accumulation[resnet50-deepspeed-zero2]",
    "tests/test_vision.py::test_two_processes_with_gradient_accumulation[efficientnet-b0-fsdp]",
    "tests/test_vision.py::test_two_processes_with_gradient_accumulation[efficientnet-b0-ddp]",
    "tests/test_vision.py::test_two_processes_with_gradient_accumulation[mobilenet-v3-large-ddp]",
    "tests/test_distributed.py::test_deepspeed_bf16_records_what_really_ran",
    "tests/test_distributed.py::test_two_process_strategy_trains_and_gathers_every_rank[deepspeed-zero1]",
    "tests/test_distributed.py::test_two_process_strategy_trains_and_gathers_every_rank[deepspeed-zero2]",
    "tests/test_float8.py::test_fp8_trains_on_two_processes[ddp-DDPExecutor]",
    "tests/test_parallel.py::test_three_dimensional_mesh_matches_data_parallel_training",
    "tests/test_parallel.py::test_two_dimensional_meshes_match_the_same_training_without_them[tp=2,pp=2-reference0]",
    "tests/test_parallel.py::test_two_dimensional_meshes_match_the_same_training_without_them[dp=2,pp=2-reference2]",
    "tests/test_tensor_peak.py::test_deepspeed_zero_ranks_measure_the_peak_the_estimate_predicts[1]",
    "tests/test_tensor_peak.py::test_deepspeed_zero_ranks_measure_the_peak_the_estimate_predicts[2]",
    "tests/test_bert.py::test_tensor_and_pipeline_parallel_bert_train_the_same_model",
    "tests/test_bert.py::test_fsdp_on_two_processes_with_gradient_accumulation",
    "tests/test_llama.py::test_llama_trains_data_parallel_on_two_processes",
    "tests/test_precise_bn.py::test_precise_bn_gives_a_short_run_a_held_out_loss_that_falls_and_trains_the_same",
    "tests/test_quality.py::test_two_seeds_of_a_run_are_tested_together_and_a_broken_plan_is_flagged_after_its_first_bad_epoch",
    "tests/test_quality.py::test_every_stack_evaluates_and_probes_as_its_plain_equivalent[deepspeed-zero3]",
    "tests/test_moe_parallel.py::test_expert_parallelism_composes_with_tensor_parallelism[deepseek-tiny-pp=2,tp=2,ep=2-2]",
    "tests/test_moe_parallel.py::test_tensor_and_pipeline_parallel_moe_train_the_one_process_model[tp-moe-tiny]",
    "tests/test_vision.py::test_two_processes_with_gradient_accumulation[mobilenet-v3-small-ddp-lightning]",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark is there to select on
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the extended tier's tests (a node id, or a test function's id for all its parameters) ``extended``."""
    for item in items:
        if item.nodeid in EXTENDED or item.nodeid.split("[")[0] in EXTENDED:
            item.add_marker(pytest.mark.extended)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``needs_plugin("accelbench-cuda", why=...)`` reads what a vendor plugin brings (its peak table,
    its backend's refusals): where that plugin is not installed it is skipped, naming the plugin and why, so the core
    suite runs with the core alone."""
    for mark in item.iter_markers("needs_plugin"):
        missing = [name for name in mark.args if not _installed(name)]
        if missing:
            plugins = f"plugin{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
            paths = " ".join(f"./plugins/{name.removeprefix('accelbench-')}" for name in missing)
            pytest.skip(f"needs the vendor {plugins} installed ({mark.kwargs['why']}): pip install {paths}")


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's own ``$ACCELBENCH_CACHE_DIR`` (calibrations, measured peaks, the corpus, tokenizers), which
    every run a test starts inherits: tests never write the user's cache. They did: stand-in devices' entries, and a
    calibration measured beside the tests' jobs, 20 to 1,000 times too slow, that the user's next run priced its
    step with. A ``$ACCELBENCH_CACHE_DIR`` set before the session is kept."""
    if os.environ.get(CACHE_ENV):
        yield Path(os.environ[CACHE_ENV])
        return
    folder = tmp_path_factory.mktemp("accelbench-cache")
    os.environ[CACHE_ENV] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop(CACHE_ENV, None)


@pytest.fixture
def site(tmp_path: Path) -> Site:
    path = tmp_path / "site"
    path.mkdir()
    return Site(path)


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> RealRuns:
    return RealRuns(tmp_path_factory.mktemp("real-runs"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ResultRecord, Path]:
    """One real record, in this process: the conformance kit's tiny model, 2 epochs of 2 steps; the record as the
    run returned it, and its file."""
    from accelbench.engine.runner import run
    from accelbench.plugins import get_host
    from accelbench.testing import tiny_config

    out = tmp_path_factory.mktemp("tiny-run")
    record, path, _ = run(tiny_config(epochs=2, steps_per_epoch=2, output_dir=out), get_host())
    return record, path


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm for the session (munge, slurmctld, slurmd), stopped by process id at the end; skipped,
    saying why, where it cannot start (tests/cluster_support.py)."""
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as exc:
        pytest.skip(f"no real Slurm here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two Slurm nodes on this host (a slurmd each, ``slurmd -N``), for a real 2-node job; skipped as ``slurm``."""
    try:
        cluster = start_slurm(tmp_path_factory.mktemp("slurm2"), nodes=2)
    except ClusterUnavailable as exc:
        pytest.skip(f"no real 2-node Slurm here: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
