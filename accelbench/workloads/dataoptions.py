"""The data options the image and BERT workloads share (one ``--flag`` serves both), and what they cannot be
together. No torch: the command line and the plugin host read them."""

from __future__ import annotations

from accelbench.config import RunConfig
from accelbench.contract import RunOption
from accelbench.errors import ConfigError


def data_options(workload: str, synthetic_default: str) -> list[RunOption]:
    """The data-pipeline options the image and BERT workloads share (one flag serves both)."""
    return [
        RunOption(
            name="data_workers",
            type="int",
            ge=0,
            help="DataLoader worker processes per training process (0: in the training process; default: on an "
            "accelerator the process's cores less one, at most 8; on the CPU device 0)",
            workload=workload,
        ),
        RunOption(
            name="synthetic",
            type="str",
            default="host",
            choices=("host", "device"),
            help="without --data: host = synthetic data through the host pipeline (decode, augment or mask, "
            "copy); device = batches generated on the device (the model alone, no host work)",
            workload=workload,
        ),
        RunOption(
            name="synthetic_samples",
            type="int",
            gt=0,
            help=f"samples in an epoch of synthetic data (default: {synthetic_default})",
            workload=workload,
        ),
    ]


def check_data_options(config: RunConfig) -> None:
    """What the shared data options cannot be together (before anything is built)."""
    options = config.workload_options
    synthetic = options.get("synthetic", "host")
    if config.data is not None and synthetic == "device":
        raise ConfigError(
            "--synthetic device generates data on the device; drop --data, or --synthetic device"
        )
    if config.data is not None and options.get("synthetic_samples") is not None:
        raise ConfigError("--synthetic-samples sizes synthetic data; with --data the epoch is the dataset")
    if synthetic == "device" and config.data_placement == "host":
        raise ConfigError("--synthetic device makes batches on the device, but --data-placement host asks for "
                          "host batches; drop one")  # fmt: skip
    if synthetic == "host" and config.data_placement == "device":
        raise ConfigError(
            "--data-placement device: this workload's host pipeline has no device-resident form; --synthetic "
            "device generates batches on the device"
        )


def data_label(config: RunConfig) -> str:
    """How the data was made, for the identity: 'synthetic-host', 'synthetic-device' or 'dataset'."""
    if config.data is not None:
        return "dataset"
    return f"synthetic-{config.workload_options.get('synthetic', 'host')}"
