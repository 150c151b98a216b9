"""The image models: torchvision's definitions behind a loss-returning wrapper, their optimizers and FLOPs
(imported when a run builds the job)."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from accelbench.config import RunConfig
from accelbench.contract.strategies import Strategy
from accelbench.workloads import ModelUnits, TrainingJob
from accelbench.workloads.dataoptions import data_label
from accelbench.workloads.vision import FLOPS_FORMULA, IMAGENET_TRAIN_IMAGES, VisionModel
from accelbench.workloads.vision.library import TORCHVISION_NOTES, load_torchvision

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# strategies that keep whole parameters on each rank; the sharding ones (FSDP, ZeRO, tensor and pipeline parallelism,
# the IPU's) flatten or split parameters and need them contiguous
WHOLE_PARAMETER_STRATEGIES = (Strategy.SINGLE, Strategy.DDP)


class ImageClassifier(nn.Module):
    """``forward(images, labels) -> mean cross-entropy``. Images arrive as uint8 (N, 3, H, W) and are normalised
    here, on the device, with ImageNet's mean and standard deviation; ``net`` is the torchvision model.

    ``channels_last``: the inputs go channels-last, so every convolution's activations do (cuDNN and oneDNN follow
    the input's format); ``channels_last_weights``: the weights too, which saves reordering them each step but
    only strategies that keep whole parameters accept (sharding flattens them)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, net: nn.Module, channels_last: bool, channels_last_weights: bool = False) -> None:
        super().__init__()
        self.net = net
        self.channels_last = channels_last
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255, persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255, persistent=False)
        if channels_last and channels_last_weights:
            self.net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = (images.to(self.mean.dtype) - self.mean) / self.std
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(self.net(x), labels)


IMAGENET_CLASSES = 1000


def build_net(spec: VisionModel, num_classes: int) -> nn.Module:
    """torchvision's model from initialisation. A head that draws its weights by fan-out
    (:attr:`VisionModel.fan_out_classifier`) and has fewer than ImageNet's 1000 classes is drawn again as at 1000
    (see :func:`classifier_init`)."""
    models = load_torchvision().models
    net: nn.Module = getattr(models, spec.builder)(weights=None, num_classes=num_classes)
    if classifier_init(spec, num_classes) is not None:
        linear = [m for m in net.get_submodule("classifier").modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():
            bound = IMAGENET_CLASSES**-0.5
            linear.weight.uniform_(-bound, bound)
    return net


def classifier_init(spec: VisionModel, num_classes: int) -> str | None:
    """What :func:`build_net` changed of torchvision's initialisation, in words (None: nothing)."""
    if not (spec.fan_out_classifier and num_classes < IMAGENET_CLASSES):
        return None
    return (
        f"classifier weights uniform in ±1/sqrt({IMAGENET_CLASSES}), as at ImageNet's classes, not torchvision's "
        f"±1/sqrt({num_classes}): a head of few classes drawn by fan-out starts with logits of standard deviation "
        "~5, and its held-out loss jumped 5-40x between epochs and seeds (docs/quality.md)"
    )


@functools.lru_cache(maxsize=16)
def forward_flops(spec: VisionModel, image_size: int, num_classes: int) -> int:
    """Forward FLOPs of one image: the model built on the meta device (no memory, no compute) and counted by
    ``torch.utils.flop_counter`` (2 per multiply-accumulate of convolutions and matmuls)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        net = build_net(spec, num_classes).eval()  # one image: batch norm cannot train on it (same FLOPs)
        counter = FlopCounterMode(display=False)
        with counter:
            net(torch.empty(1, 3, image_size, image_size))
    return int(counter.get_total_flops())


def make_optimizer(
    spec: VisionModel, model: nn.Module, implementation: str, lr: float
) -> torch.optim.Optimizer:
    """The recipe's optimizer over every parameter (torchvision's reference applies weight decay to all), with the
    backend's kernels (``implementation``: fused, foreach, plain; RMSprop has no fused kernel: foreach then)."""
    from accelbench.workloads import optimizer_kernels

    params = list(model.parameters())
    if spec.optimizer.name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=0.9, weight_decay=1e-4, **optimizer_kernels(implementation)
        )
    kernels = optimizer_kernels("foreach" if implementation == "fused" else implementation)
    return torch.optim.RMSprop(
        params, lr=lr, alpha=0.9, eps=0.0316, momentum=0.9, weight_decay=1e-5, **kernels
    )


def top1(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 accuracy's counts: the classifier's logits (N, classes) whose largest is the label, and N."""
    return (logits.argmax(-1) == labels).sum(), torch.tensor(labels.numel())


def build_job(spec: VisionModel, config: RunConfig, units: ModelUnits) -> TrainingJob:
    from accelbench.workloads.pipeline import (
        GeneratedBatches,
        HeldOutGenerated,
        LoaderSource,
        held_out_loader,
        split_held_out,
    )
    from accelbench.workloads.vision.data import open_images, random_images

    options = config.workload_options
    image_size, num_classes = int(options["image_size"]), int(options["num_classes"])
    torchvision = load_torchvision()
    samples = options.get("synthetic_samples")
    data: Any
    if data_label(config) == "synthetic-device":
        data = GeneratedBatches(
            random_images(image_size, num_classes),
            int(samples or IMAGENET_TRAIN_IMAGES),
            config.batch_size,
            config.seed,
            config.steps_per_epoch,
            f"uint8 {image_size}x{image_size} images, {num_classes} classes",
        )
        validation: Any = HeldOutGenerated(data)
    else:
        dataset, held_out = split_held_out(
            open_images(config.data, int(samples) if samples else None, num_classes, image_size, config.seed)
        )
        validation = held_out_loader(held_out, config.batch_size, config.seed) if held_out else None
        given = options.get("data_workers")
        workers = int(given) if given is not None else None
        data = LoaderSource(
            dataset, config.batch_size, config.seed, config.steps_per_epoch, workers, config.devices
        )
    torch.manual_seed(config.seed)
    channels_last = bool(options["channels_last"])
    whole = config.strategy in WHOLE_PARAMETER_STRATEGIES
    model = ImageClassifier(build_net(spec, num_classes), channels_last, channels_last_weights=whole)
    parameters = sum(p.numel() for p in model.parameters())
    forward = forward_flops(spec, image_size, num_classes)
    lr = config.learning_rate
    return TrainingJob(
        model=model,
        data=data,
        validation=validation,
        accuracy=top1,
        norm_statistics_batches=int(options.get("precise_bn") or 0),
        make_optimizer=lambda m, device, kernels: make_optimizer(spec, m, kernels, lr),
        flops_per_sample=3.0 * forward,
        flops_formula=FLOPS_FORMULA,
        tokens_per_sample=1,  # a sample is one image
        units=units,
        grad_clip_norm=None,  # the reference recipes do not clip
        summary={
            "name": spec.workload,
            "architecture": spec.description,
            "source": f"torchvision {torchvision.__version__} models.{spec.builder}(weights=None): from "
            "initialisation, nothing downloaded",
            "torchvision_notes": list(TORCHVISION_NOTES),
            **({"initialisation": init} if (init := classifier_init(spec, num_classes)) else {}),
            "parameters": parameters,
            "image_size": image_size,
            "num_classes": num_classes,
            "forward_flops_per_image": forward,
            "flops_per_image": 3.0 * forward,
            "tokens_per_sample": "1 (a sample is an image)",
            "optimizer": spec.optimizer.text,
            "loss": "cross-entropy",
            "normalisation": "on the device, the model's first operation (uint8 batches cross to the device)",
            "memory_format": (
                (
                    "channels_last (inputs and weights)"
                    if whole
                    else "channels_last inputs, contiguous weights (the "
                    f"{config.strategy} strategy shards parameters)"
                )
                if channels_last
                else "contiguous (NCHW)"
            ),
        },
    )
