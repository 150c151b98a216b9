"""The project's root conftest: the extended tier's marks, which must reach every test path (tests/ and plugins/)."""

from __future__ import annotations

import pytest

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
    # 2026-12-07, for a full tier inside 30 minutes: each subject below the full tier trains another way
    # a two-node job: test_srun_trains_one_ddp_job_across_two_nodes; the documented script: its one-node run
    "tests/test_real_launchers.py::test_the_documented_two_node_batch_script_runs_through_sbatch",
    # a cancelled array task resubmitted: test_a_slurm_sweep_survives_a_cancelled_job_and_resubmits_only_the_missing_point
    "tests/test_sweep_slurm.py::test_a_cancelled_array_task_is_resubmitted_alone_and_followed_while_queued",
    # the fleet on Slurm: test_salloc_runs_the_fleet_one_record_per_node_and_compares_them
    "tests/test_fleet_command.py::test_sbatch_on_two_nodes_runs_two_independent_runs",
    # checkpointing's losses on two processes: its ddp case (and pp's in-process parity in the fast tier)
    "tests/test_activation_checkpointing.py::test_two_gloo_processes_train_the_same_losses_with_it[pp]",
)
# Every vendor plugin's stand-in trains each workload in the extended tier only: the full tier trains every plugin
# once (its kit's test_short_training_run and gradient-accumulation run) and every workload once (the CPU backend's
# kit, tests/test_conformance.py); 42 runs of the same workloads through stand-ins of other devices moved out.
EXTENDED_IN_PLUGINS = "::test_short_training_run_of_each_workload["


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the mark is there to select on
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the extended tier's tests (a node id, or a test function's id for all its parameters) ``extended``."""
    for item in items:
        if (
            item.nodeid in EXTENDED
            or item.nodeid.split("[")[0] in EXTENDED
            or (item.nodeid.startswith("plugins/") and EXTENDED_IN_PLUGINS in item.nodeid)
        ):
            item.add_marker(pytest.mark.extended)
