"""The prediction as data: what the runner stores in a record (through :class:`accelbench.results.RunPrediction`)
and ``accelbench estimate --json`` prints: memory per device by kind, the collectives, the step's time and the
scaling to other device counts."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from accelbench.contract import PeakFigures

# Megatron-LM's FLOPs per iteration of B sequences, as the estimate labels them. Seed 002 (Narayanan et al. 2021,
# "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM") counts full activation
# recomputation, 4 forward passes; accelbench's runs recompute nothing, 3 passes.
MEGATRON_NO_RECOMPUTE = (
    "72 B s l h^2 (1 + s/6h + V/12lh), no activation recomputation (3 passes: seed 002's count without its "
    "recomputed forward)"
)
MEGATRON_RECOMPUTE = (
    "96 B s l h^2 (1 + s/6h + V/16lh), full activation recomputation (4 passes: seed 002's formula, Narayanan et al. "
    "2021)"
)

SCHEMA_NAME = "accelbench.estimate"
SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryBreakdown(_Model):
    """Predicted peak memory of one device, by kind, in bytes. ``None`` where the model has no formula."""

    weights_bytes: float = Field(description="Parameters this device holds (its shard under FSDP/ZeRO-3).")
    master_weights_bytes: float = Field(description="fp32 master copy beside 16-bit parameters (DeepSpeed).")
    gradients_bytes: float = Field(description="Gradients held (sharded under ZeRO-2/3 and FSDP).")
    optimizer_bytes: float = Field(description="AdamW's two moments (sharded from ZeRO-1 on).")
    activations_bytes: float | None = Field(
        description="Activations kept for backward at the end of forward (transformers: Korthikanti et al.)."
    )
    transient_bytes: float = Field(
        description="Live while computing (forward and backward): full parameters gathered by FSDP/ZeRO-3, "
        "autocast's 16-bit weight copies."
    )
    buffer_bytes: float = Field(
        default=0.0,
        description="Buffers held for the whole step beside the state: DeepSpeed's gradient bucket, DDP's buckets "
        "when they are not the gradients (gradient_as_bucket_view off), a pipeline stage's receive buffers (one a "
        "microbatch for its inputs and one for its outputs' gradients).",
    )
    backward_transient_bytes: float = Field(
        default=0.0,
        description="Live in backward beside the activations, at its high point: the loss's gradients with "
        "respect to the log-probabilities and the logits (fp32); with activation checkpointing the last layer "
        "rebuilt (without a pipeline the larger of the two); on a pipeline rank the layer backpropagated's "
        "gradients' temporaries.",
    )
    optimizer_transient_bytes: float = Field(
        default=0.0,
        description="Live during the optimizer step beside the state: foreach AdamW's temporary the size of the "
        "parameters it steps, a plain loop's one tensor's, none for fused kernels.",
    )
    runtime_bytes: float = Field(
        default=0.0,
        description="What the process holds before the model (given, e.g. measured: the CPU backend's resident-set "
        "peak counts the interpreter and libraries; a GPU allocator's peak does not).",
    )

    end_of_backward_bytes: float | None = Field(
        default=None,
        description="The last backward of a step, beside the state and every gradient, where it can be the "
        "high point: on a pipeline rank the first stage's microbatches still in flight and the layer "
        "backpropagated (rebuilt under activation checkpointing, with its gradients' temporaries); checkpointed "
        "without a pipeline, the first layer's backward (the layer rebuilt, the later layers' inputs freed), less "
        "the gradients not made by then. None elsewhere.",
    )
    gradients_freed_each_step: bool = Field(
        default=False,
        description="True where no gradient is held between steps (zero_grad(set_to_none=True) where they are "
        "not views into DDP's buckets; DeepSpeed ZeRO-1/2, which drop them after the step): they are then "
        "allocated during backward as the activations are freed, and the peak holds the larger of the two, not both.",
    )

    def phases(self) -> dict[str, float] | None:
        """Tensor memory (the runtime left out) at the high point of each phase of a step; the peak is the largest.

        - ``forward``: the state (weights, master copy, moments, buffers), the gradients where they persist, the
          activations kept for backward and the compute transients (gathered parameters, autocast copies);
        - ``backward``: from its start (the activations and the loss's gradients) while the gradients are made and
          the activations freed: where the gradients are freed each step the two trade places and the high point
          holds the larger, else both; on a pipeline rank the larger of that and its last backward (every
          gradient made, ``end_of_backward_bytes`` beside them);
        - ``optimizer``: the state, every gradient and the optimizer's temporaries.
        """
        if self.activations_bytes is None:
            return None
        state = self.weights_bytes + self.master_weights_bytes + self.optimizer_bytes + self.buffer_bytes
        grads, acts = self.gradients_bytes, self.activations_bytes
        persistent_grads = 0.0 if self.gradients_freed_each_step else grads
        start_of_backward = acts + self.backward_transient_bytes
        backward = (
            max(start_of_backward, grads) if self.gradients_freed_each_step else grads + start_of_backward
        )
        if self.end_of_backward_bytes is not None:
            backward = max(backward, grads + self.end_of_backward_bytes)
        return {
            "forward": state + persistent_grads + acts + self.transient_bytes,
            "backward": state + backward + self.transient_bytes,
            "optimizer": state + grads + self.optimizer_transient_bytes,
        }

    @property
    def peak_phase(self) -> str | None:
        """The phase whose high point is the peak (the first of equals, in step order)."""
        phases = self.phases()
        return None if phases is None else max(phases, key=lambda name: phases[name])

    @property
    def total_bytes(self) -> float | None:
        """The peak: the largest phase's tensors, plus the runtime."""
        phases = self.phases()
        return None if phases is None else max(phases.values()) + self.runtime_bytes


class CommOp(_Model):
    """One kind of collective a device takes part in each step."""

    op: str = Field(description="all_reduce, all_gather, reduce_scatter, sendrecv (nccl-tests' names).")
    dtype: str = Field(description="Element type moved: fp32, bf16 or fp16 (as accelbench comm names them).")
    axis: str = Field(description="The group it runs over: dp (data), tp or pp.")
    ranks: int = Field(description="Ranks in that group.")
    what: str = Field(description="What is moved, in words.")
    count: int = Field(description="Operations per step.")
    message_bytes: float = Field(
        description="Bytes of one operation's whole array (the size bandwidth is read at)."
    )
    bus_bytes: float = Field(description="Bus bytes this device moves per step over all `count` operations.")
    overlappable: bool = Field(description="Whether the engine can overlap it with compute.")
    burst: bool = Field(
        default=False,
        description="Whether its `count` calls are issued back to back, no compute between them (ZeRO-3's gather "
        "of its persistent tensors): priced at a call's time in a burst where the comm records measured that "
        "(accelbench comm --burst), else as calls timed alone; where collectives are priced as a step meets them, "
        "only the first meets the step.",
    )
    busbw_bytes_per_s: float | None = None
    time_s: float | None = None
    bandwidth_source: str | None = None


class ScalingPrediction(_Model):
    """Predicted speedup from g to n devices (seed 001, "Speedup formulation"), weak scaling: each device keeps its
    batch, so the job's throughput grows with n while each step's compute stays the same."""

    devices_from: int
    devices_to: int
    step_s_from: float
    comm_s_from: float
    comm_s_to: float
    step_s_to: float = Field(description="t_compute(g) + t_comm(n).")
    network_efficiency: float | None = Field(
        description="eff = t_comm(g) / t_comm(n); None when g has no communication (one device)."
    )
    step_ratio: float = Field(
        description="t_iter(g) / t_iter(n) = (r_compute + r_comm) / (r_compute + r_comm / eff)."
    )
    throughput_speedup: float = Field(description="(n / g) x step_ratio: samples per second at n over at g.")
    time_model: str | None = Field(
        default=None,
        description="Where the step at g (and so the compute kept at n) comes from: a measured record, the "
        "calibrated operators, or the fixed efficiency of the peak FLOP/s (absent in files from before it was said).",
    )


class Prediction(_Model):
    """What ``accelbench estimate`` predicts for one configuration on one kind of device, per device and step."""

    schema_name: Literal["accelbench.estimate"] = Field(default="accelbench.estimate", alias="schema")
    schema_version: int = SCHEMA_VERSION
    workload: str
    model: str
    strategy: str
    precision: str
    devices: int = Field(description="Devices in the job (all nodes).")
    batch_size: int = Field(description="Samples per device (per replica for tp/pp/mesh) per step.")
    device: str = Field(description="The device the prediction is for, and where its figures come from.")
    device_memory_bytes: int | None = None
    matmul_math: str | None = Field(
        default=None,
        description="The math the matmuls run in by the backend's precision plan, its run options applied "
        "(ieee-fp32, tf32, an IPU AMP mode, ...); None where no plan was made.",
    )
    parameters: int = Field(description="The workload's parameter count.")
    stored_parameters: int = Field(description="Parameter elements allocated (padding included, tied once).")
    active_parameters: int | None = Field(
        default=None,
        description="A mixture of experts: the parameters one token is computed with (top-k routed experts, "
        "shared expert, attention, router, embedding row and head); None for dense models.",
    )
    expert_parameters: int = Field(
        default=0, description="A mixture of experts: its routed experts' parameters, all layers (0: none)."
    )
    flops_per_step: float = Field(
        description="FLOPs one device computes per step, by the workload's formula."
    )
    flops_formula: str
    megatron_flops_per_step: float | None = Field(
        default=None,
        description="The same by Megatron-LM's count without activation recomputation (what runs): "
        + MEGATRON_NO_RECOMPUTE
        + ".",
    )
    megatron_recompute_flops_per_step: float | None = Field(
        default=None,
        description="The same by Megatron-LM's count with full activation recomputation: "
        + MEGATRON_RECOMPUTE
        + ".",
    )
    memory: MemoryBreakdown
    peak_memory_bytes: float | None = Field(
        description="The largest phase's tensor memory plus the runtime; None when a part is unknown."
    )
    phase_bytes: dict[str, float] | None = Field(
        default=None,
        description="Tensor memory at the high point of each phase of a step (forward, backward, optimizer), the "
        "runtime left out (MemoryBreakdown.phases).",
    )
    peak_phase: str | None = Field(default=None, description="The phase whose high point is the peak.")
    stack: dict[str, object] = Field(
        default_factory=dict,
        description="The implementation choices the memory model assumed (accelbench.estimate.stack.Stack, as "
        "resolved for the device): attention kernel, optimizer kernels, DDP bucket view, DeepSpeed buckets, FSDP "
        "parameter dtype, activation checkpointing, dropout masks.",
    )
    fits: bool | None = Field(description="Whether the peak fits the device's memory; None when unknown.")
    sharing_memory: int = Field(
        default=1,
        ge=1,
        description="Processes that share the device's memory: a CPU node's worker processes share the host's, so "
        "`fits` compares their peaks together; 1 on an accelerator.",
    )
    comm: list[CommOp]
    comm_bytes_per_step: float = Field(
        description="Bus bytes one device moves per step (nccl-tests' convention)."
    )
    peak_flops_per_s: float | None
    peak_source: str | None
    efficiency: float = Field(description="Assumed fraction of the peak a step reaches.")
    compute_s: float | None = Field(
        description="Forward and backward: FLOPs / (peak x efficiency), or calibrated (time_model); and the "
        "pipeline bubble."
    )
    optimizer_s: float | None = Field(
        default=None, description="AdamW's update, memory-bound: bytes it streams / memory bandwidth."
    )
    time_model: str | None = Field(
        default=None,
        description="How compute_s and optimizer_s were made: 'efficiency E of the peak ...' or 'calibrated: N "
        "operators ... at RATES' (each traced operator's roofline time at this device's calibrated rates, plus "
        "its dispatch cost).",
    )
    rates_source: str | None = Field(
        default=None,
        description="Where the step's rates come from: 'measured here' (a calibration of this device), 'file' "
        "(--profile), 'shipped' (a profile measured on the device, shipped by its plugin), 'datasheet' (derived "
        "from its datasheet figures) or 'efficiency' (FLOPs at a fraction of the peak); None in older predictions.",
    )
    rates: str | None = Field(default=None, description="The rates' source in words, with its provenance.")
    error_band: str | None = Field(
        default=None,
        description="The step-time error measured for predictions from this source against published "
        "measurements (benchmarks/published), in words.",
    )
    forward_s: float | None = Field(
        default=None, description="Calibrated: the forward passes (and the loss)."
    )
    backward_s: float | None = Field(default=None, description="Calibrated: the backward passes.")
    dispatch_s: float | None = Field(
        default=None, description="Calibrated: of the step's compute, the operators' dispatch cost."
    )
    engine_s: float | None = Field(
        default=None,
        description="Calibrated, DeepSpeed ZeRO-3 on a CPU: its engine's cost beyond the traced operators and the "
        "collectives (module hooks, per-tensor gradient partitioning), from this host's measured cost per module, "
        "per parameter tensor and per step.",
    )
    comm_s: float | None = Field(description="Sum of the collectives' times at their bus bandwidth.")
    comm_exposed_s: float | None = Field(description="The part of comm_s not hidden behind compute.")
    overlap: str = Field(description="What is assumed to overlap with compute, in words.")
    step_time_s: float | None = Field(
        description="compute + optimizer + exposed communication (+ ZeRO-3's engine, where priced)."
    )
    samples_per_s: float | None = Field(description="Samples per second of the whole job.")
    bubble: float | None = None
    assumptions: list[str] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    measured_peaks: dict[str, PeakFigures] = Field(
        default_factory=dict,
        description="Dense-matmul rates measured on this device, by precision (--measure-peak).",
    )
    scaling: list[ScalingPrediction] = Field(
        default_factory=list, description="Predicted speedups to other device counts (seed 001; --scale-to)."
    )
    traced_peak_bytes: float | None = Field(
        default=None,
        description="--trace: the live tensor peak of one training step traced without storage (FakeTensorMode, "
        "MemTracker), the runtime not included; None without --trace.",
    )
    traced_memory_bytes: dict[str, float] = Field(
        default_factory=dict,
        description="--trace: the traced peak by kind (parameters, gradients, activations, temporaries, optimizer, "
        "...), at the moment of the peak.",
    )
    traced_fits: bool | None = Field(
        default=None,
        description="--trace: whether the traced peak plus the runtime fits the device's memory; None when unknown.",
    )
    traced_source: str | None = Field(
        default=None, description="--trace: how the step was traced, and its limits."
    )

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2)
