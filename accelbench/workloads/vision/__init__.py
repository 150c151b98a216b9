"""Image classification as seed 004 trained it: ResNet-50 v1.5, EfficientNet-B0, MobileNetV3 small and large.

The models are torchvision's definitions, built from initialisation (no weights are downloaded), behind the
``vision`` extra (``pip install 'accelbench[vision]'``). Each is a registered workload of its own
(``--workload resnet50``, ``efficientnet-b0``, ``mobilenet-v3-small``, ``mobilenet-v3-large``) with the optimizer of
its usual recipe. What a sample is and what it costs:

- a sample is one image (``tokens_per_sample`` = 1);
- FLOPs per image = 3 x the forward FLOPs, the forward counted by ``torch.utils.flop_counter`` on one image of the
  run's size (2 FLOPs per multiply-accumulate of every convolution and matmul; ResNet-50 at 224: 8.18 GFLOP).

This module is what the plugin host and the command line see (options, sizes, identity, units) and imports no
torch; the models are in :mod:`accelbench.workloads.vision.model` and the data in
:mod:`accelbench.workloads.vision.data`, imported when a run builds them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from accelbench.config import RunConfig
from accelbench.contract import RunOption, Scalar
from accelbench.errors import ConfigError
from accelbench.workloads import ModelUnits
from accelbench.workloads.dataoptions import check_data_options, data_label, data_options

if TYPE_CHECKING:
    from accelbench.workloads import TrainingJob

IMAGENET_TRAIN_IMAGES = 1_281_167  # an epoch of synthetic images is an ImageNet-1k training epoch by default
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")  # ImageFolder's
MIN_IMAGE_SIZE = 32  # the networks downsample by 32
MAX_IMAGE_SIZE = (
    8192  # far above any training crop in use (ImageNet: 224; high-resolution fine-tuning: ~1024)
)
MAX_CLASSES = 1_000_000  # far above any classifier head in use (ImageNet-21k: 21,841 classes)
MAX_PRECISE_BN = 10_000  # training batches averaged for precise batch norm: far above the hundreds it needs
FLOPS_FORMULA = (
    "3 x forward FLOPs per image (forward: 2 per multiply-accumulate of every convolution and matmul, counted by "
    "torch.utils.flop_counter on one image of the run's size)"
)


@dataclass(frozen=True)
class Optimizer:
    """An optimizer recipe: what the reference trains the model with (the learning rate is ``--lr``)."""

    name: Literal["sgd", "rmsprop"]
    text: str


SGD = Optimizer(
    "sgd",
    "SGD, momentum 0.9, weight decay 1e-4 (torchvision's ResNet reference recipe; fused where available)",
)
RMSPROP = Optimizer(
    "rmsprop",
    "RMSprop, alpha 0.9, eps 0.0316, momentum 0.9, weight decay 1e-5 (torchvision's MobileNetV3 / EfficientNet "
    "reference recipe)",
)


@dataclass(frozen=True)
class VisionModel:
    """One torchvision architecture: its builder, its parts and its recipe's optimizer."""

    workload: str  # the workload and size name, e.g. resnet50
    builder: str  # torchvision.models.<builder>
    description: str
    stem: tuple[str, ...]
    blocks: tuple[str, ...]  # the repeated units in execution order
    head: tuple[str, ...]
    optimizer: Optimizer
    # the classifier's weights drawn uniform in ±1/sqrt(classes) (TensorFlow's fan-out rule, which torchvision's
    # EfficientNet keeps): sized for ImageNet's 1000 classes, it starts a head of few classes with large logits
    fan_out_classifier: bool = False


def _stages(prefix: str, counts: tuple[int, ...], first: int = 0) -> tuple[str, ...]:
    """Paths of the blocks of consecutive stages: ``prefix.<stage>.<block>``."""
    return tuple(f"{prefix}.{first + s}.{b}" for s, count in enumerate(counts) for b in range(count))


# Paths are inside the training wrapper (its torchvision model is ``net``).
MODELS: dict[str, VisionModel] = {
    m.workload: m
    for m in (
        VisionModel(
            "resnet50",
            "resnet50",
            "ResNet-50 v1.5 (torchvision; stride on the 3x3 convolutions), 1000 classes",
            stem=("net.conv1", "net.bn1", "net.relu", "net.maxpool"),
            blocks=tuple(f"net.layer{s + 1}.{b}" for s, n in enumerate((3, 4, 6, 3)) for b in range(n)),
            head=("net.avgpool", "net.fc"),
            optimizer=SGD,
        ),
        VisionModel(
            "efficientnet-b0",
            "efficientnet_b0",
            "EfficientNet-B0 (torchvision; stochastic depth 0.2, dropout 0.2)",
            stem=("net.features.0",),
            blocks=_stages("net.features", (1, 2, 2, 3, 3, 4, 1), first=1),
            head=("net.features.8", "net.avgpool", "net.classifier"),
            optimizer=RMSPROP,
            fan_out_classifier=True,
        ),
        VisionModel(
            "mobilenet-v3-small",
            "mobilenet_v3_small",
            "MobileNetV3-Small (torchvision; dropout 0.2)",
            stem=("net.features.0",),
            blocks=tuple(f"net.features.{i}" for i in range(1, 12)),
            head=("net.features.12", "net.avgpool", "net.classifier"),
            optimizer=RMSPROP,
        ),
        VisionModel(
            "mobilenet-v3-large",
            "mobilenet_v3_large",
            "MobileNetV3-Large (torchvision; dropout 0.2)",
            stem=("net.features.0",),
            blocks=tuple(f"net.features.{i}" for i in range(1, 16)),
            head=("net.features.16", "net.avgpool", "net.classifier"),
            optimizer=RMSPROP,
        ),
    )
}


def check_image_data(path: Path) -> None:
    """A quick look at ``--data`` before anything starts (the full index is built with the run): a tar shard, a
    folder of shards, or a folder with class folders holding at least one image."""
    if path.is_file():
        if not path.name.endswith(".tar"):
            raise ConfigError(
                f"--data {path}: give an image folder, a folder of .tar shards or one .tar shard"
            )
        return
    if any(path.glob("*.tar")):
        return
    classes = [e for e in os.scandir(path) if e.is_dir()]
    if not classes:
        raise ConfigError(
            f"--data {path}: no class folders and no .tar shards; an image folder holds one folder per class "
            "(root/<class>/<image>)"
        )
    for entry in classes:
        for _, _, names in os.walk(entry.path, followlinks=True):
            if any(n.lower().endswith(IMAGE_SUFFIXES) for n in names):
                return
    raise ConfigError(
        f"--data {path}: no images in its {len(classes)} class folder(s) (looked for {', '.join(IMAGE_SUFFIXES)})"
    )


class VisionWorkload:
    """One image-classification model, registered by the core as workload ``<model>`` (``resnet50``, ...)."""

    def __init__(self, spec: VisionModel) -> None:
        self.spec = spec
        self.name = spec.workload
        self.description = f"{spec.description}, ImageNet-shaped images, {spec.optimizer.name.upper()}"

    def options(self) -> list[RunOption]:
        name = self.name
        return [
            RunOption(name="image_size", type="int", default=224, ge=MIN_IMAGE_SIZE, le=MAX_IMAGE_SIZE,
                      help="training crop size in pixels (square)", workload=name),
            RunOption(name="num_classes", type="int", default=1000, gt=0, le=MAX_CLASSES,
                      help="classes of the classifier head (ImageNet-1k: 1000)", workload=name),
            RunOption(name="channels_last", type="bool", default=True,
                      help="channels-last memory format for the model and its inputs (faster convolutions on "
                      "tensor cores and oneDNN)", workload=name),
            RunOption(name="precise_bn", type="int", default=0, ge=0, le=MAX_PRECISE_BN,
                      help="precise batch norm: before each held-out evaluation, recompute the batch-norm "
                      "statistics over this many training batches (untimed; the training's own are kept for "
                      "training). Short runs need it: MobileNetV3's statistics (momentum 0.01) are still mostly "
                      "their initial values after hundreds of steps. 0: evaluate with the training's own",
                      workload=name),
            *data_options(name, f"ImageNet-1k's {IMAGENET_TRAIN_IMAGES:,} training images"),
        ]  # fmt: skip

    def model_names(self) -> list[str]:
        return [self.name]

    def check(self, config: RunConfig) -> None:
        check_data_options(config)
        if config.data is not None:
            check_image_data(config.data)

    def identity(self, config: RunConfig) -> dict[str, Scalar]:
        options = config.workload_options
        return {
            "model": self.name,
            "image_size": options["image_size"],
            "num_classes": options["num_classes"],
            "channels_last": options["channels_last"],
            "data_source": data_label(config),
            "data_workers": options.get("data_workers", "auto"),
            # only where asked: a run evaluated with the training's statistics keeps the identity it always had
            **({"precise_bn": options["precise_bn"]} if options.get("precise_bn") else {}),
        }

    def units(self, config: RunConfig) -> ModelUnits:
        return ModelUnits(stem=self.spec.stem, units=self.spec.blocks, head=self.spec.head)

    def build(self, config: RunConfig) -> TrainingJob:
        from accelbench.workloads.vision.model import build_job

        return build_job(self.spec, config, self.units(config))
