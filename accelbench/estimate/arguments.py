"""The ``accelbench estimate`` flags beside the ``run`` options: cheap to import (no model, no torch), since the
command line builds every subcommand's parser at start-up."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelbench.config import RunConfig
    from accelbench.estimate.stack import Stack

# Fraction of the peak FLOP/s a training step reaches. 0.4: the public figures for a tuned GPT-2 loop reach 40-50%
# MFU on an A100 or H100 (nanoGPT's and llm.c's published figures); override with --efficiency.
DEFAULT_EFFICIENCY = 0.4


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``estimate`` has beside the ``run`` options."""
    group = parser.add_argument_group("estimate")
    group.add_argument(
        "--device",
        dest="estimate_device",
        metavar="NAME",
        help="predict for a device from the installed plugins' peak tables (e.g. H100, MI250X, 'Max 1550 tile') "
        "instead of the one detected here; an unknown name lists the known ones",
    )
    group.add_argument(
        "--comm",
        nargs="+",
        action="extend",
        type=Path,
        metavar="DIR_OR_FILE",
        help="comm records (schema accelbench.comm, from `accelbench comm`) giving bus bandwidth by collective and "
        "message size, measured on the system predicted for",
    )
    group.add_argument(
        "--bus-bandwidth",
        type=float,
        metavar="GB_PER_S",
        help="one bus bandwidth (GB/s, nccl-tests' busbw) for every collective, instead of --comm",
    )
    group.add_argument(
        "--device-profile",
        type=Path,
        metavar="FILE",
        help="price the step with this device profile (from `accelbench calibrate --export FILE` on the device "
        "predicted for) instead of the one its plugin ships or the datasheet's",
    )
    group.add_argument(
        "--efficiency",
        type=float,
        default=None,
        help="price compute as FLOPs at this fraction of the peak FLOP/s instead of the device profile's "
        f"operator-by-operator model (where no profile can be made: {DEFAULT_EFFICIENCY}, a tuned GPT-2 loop's "
        "MFU on an A100/H100)",
    )
    group.add_argument(
        "--overlap",
        choices=("auto", "none", "backward"),
        default="auto",
        help="which collectives hide behind compute: none; backward (DDP's buckets, FSDP and ZeRO-3 prefetch, up "
        "to the backward pass); auto: backward on accelerators, none on CPUs (default: auto)",
    )
    group.add_argument(
        "--measure-peak",
        action="store_true",
        help="time dense matrix multiplies in each precision on this backend's device (a few seconds; cached per "
        "host, device, torch version and thread count) and predict with the measured rate",
    )
    group.add_argument(
        "--refresh-peak", action="store_true", help="with --measure-peak: measure again, ignoring the cache"
    )
    group.add_argument(
        "--calibrate",
        action="store_true",
        help="predict the step time from this device's calibration (matmul rates by shape, elementwise bandwidth, "
        "per-operator dispatch cost; measured once in seconds, cached per host, device, torch version, dtype and "
        "thread count) summed over the step's traced operators, instead of a fixed efficiency",
    )
    group.add_argument(
        "--refresh-calibration",
        action="store_true",
        help="with --calibrate: measure the calibration again, ignoring the cache",
    )
    group.add_argument(
        "--from-profile",
        type=Path,
        metavar="RECORD",
        help="with --calibrate: a result record of this configuration made with `accelbench run --profile`; the "
        "operators it measured (its top operators' kernel time) replace their calibrated times",
    )
    group.add_argument(
        "--runtime-mib",
        type=float,
        default=0.0,
        metavar="MIB",
        help="memory a process holds before the model, added to the peak (a CPU run's resident-set peak counts "
        "the interpreter and libraries, a GPU allocator's does not; default: 0)",
    )
    group.add_argument(
        "--scale-to",
        nargs="+",
        action="extend",
        type=int,
        metavar="N",
        help="also predict the speedup to N devices (seed 001's formula; needs --comm or --bus-bandwidth)",
    )
    group.add_argument(
        "--measured",
        type=Path,
        metavar="RECORD",
        help="with --scale-to: start from this result record's measured step time (a record of this configuration)",
    )
    group.add_argument(
        "--trace",
        action="store_true",
        help="a second opinion on 'fits': trace one training step of the model built without storage (torch "
        "FakeTensorMode) and report its live tensor peak beside the formula's (seconds, no memory; strategies "
        "single and ddp)",
    )
    group.add_argument("--json", action="store_true", help="print the prediction as JSON on stdout")
    add_stack_arguments(parser)


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """The training stack's options (attention, AdamW's kernels, DDP's bucket view, DeepSpeed's buckets, FSDP's
    parameter dtype): `estimate` and `plan` take the same."""
    stack = parser.add_argument_group(
        "the training stack predicted for (memory: where stacks differ; default: what `accelbench run` does here)"
    )
    stack.add_argument(
        "--attention",
        choices=("auto", "keeps-scores", "drops-scores"),
        default="auto",
        help="whether attention keeps its a*s^2 scores for backward: keeps-scores (the math path, an explicit "
        "softmax as minGPT's), drops-scores (flash / memory-efficient kernels); auto: what torch's SDPA picks on "
        "the device (default)",
    )
    stack.add_argument(
        "--optimizer-kernels",
        choices=("fused", "foreach", "plain"),
        help="AdamW's kernels: foreach holds a temporary the size of the parameters while stepping (torch's "
        "default where fused=True is not asked); default: the backend's choice (fused on CPUs and GPUs)",
    )
    stack.add_argument(
        "--ddp-bucket-view",
        choices=("on", "off"),
        help="DDP's gradient_as_bucket_view; off: the buckets are a second copy of the gradients (default: as the "
        "run does: on for accelbench's DDP, off under --engine lightning, whose DDP strategy keeps torch's default)",
    )
    stack.add_argument(
        "--ds-reduce-bucket",
        type=int,
        metavar="ELEMENTS",
        help="DeepSpeed's reduce_bucket_size (default 5e8)",
    )
    stack.add_argument(
        "--ds-allgather-bucket",
        type=int,
        metavar="ELEMENTS",
        help="DeepSpeed's allgather_bucket_size (default 5e8)",
    )
    stack.add_argument(
        "--ds-prefetch-bucket",
        type=int,
        metavar="ELEMENTS",
        help="DeepSpeed's stage3_prefetch_bucket_size (default 5e7)",
    )
    stack.add_argument(
        "--fsdp-param-dtype",
        choices=("fp32", "bf16", "fp16"),
        help="FSDP2's MixedPrecisionPolicy param_dtype: what units are gathered and computed in (default: the "
        "run's parameter dtype, as accelbench's FSDP runs)",
    )


def stack_of(args: argparse.Namespace, config: RunConfig) -> Stack:
    """The stack the flags of :func:`add_stack_arguments` describe for ``config`` (its activation checkpointing
    and engine), checked: a ConfigError names a flag out of range. `estimate` and `plan` read it alike."""
    from accelbench.estimate.stack import stack_from_flags

    return stack_from_flags(
        attention=args.attention,
        optimizer=args.optimizer_kernels,
        ddp_bucket_view=args.ddp_bucket_view,
        ds_reduce_bucket=args.ds_reduce_bucket,
        ds_allgather_bucket=args.ds_allgather_bucket,
        ds_prefetch_bucket=args.ds_prefetch_bucket,
        fsdp_param_dtype=args.fsdp_param_dtype,
        activation_checkpointing=config.activation_checkpointing,
        engine=config.engine,
    )
