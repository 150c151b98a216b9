"""Images as the ImageNet training recipe feeds them: decoded, randomly resized-cropped, flipped.

Three sources, one augmentation:

- synthetic (default): a pool of JPEGs of ImageNet's most common size (500x375), made once from a seeded generator
  and decoded again for every sample, so the host pays what real ImageNet costs it (a JPEG decode, a crop, a
  resize) while the benchmark stays offline;
- an image folder in torchvision's ImageFolder layout (``root/<class>/<image>``, classes numbered in sorted
  order);
- WebDataset-style tar shards (``<key>.jpg`` + ``<key>.cls`` members; uncompressed ``.tar`` files), indexed once
  and read by offset, one seek and one read per image from a few large files instead of a file per image.

The augmentation is the reference recipe's: RandomResizedCrop (scale 0.08..1, aspect ratio 3/4..4/3, bilinear;
torchvision's algorithm, written here with the sample's own generator) and a horizontal flip with probability 1/2.
The result stays uint8: normalisation to ImageNet's mean and standard deviation is the model's first operation,
on the device, as NVIDIA's ResNet-50 reference (the one seed 004 ran on GPUs) does, so a quarter of the bytes
cross to the device.
"""

from __future__ import annotations

import io
import math
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from accelbench.errors import ConfigError
from accelbench.workloads.pipeline import sample_rng
from accelbench.workloads.vision import IMAGE_SUFFIXES, IMAGENET_TRAIN_IMAGES

SYNTHETIC_SIZE = (500, 375)  # width, height: ImageNet's most common training image size
SYNTHETIC_POOL = 64  # distinct synthetic JPEGs, decoded again for every sample
SYNTHETIC_QUALITY = 90
# weight of the class colour in a synthetic image (the rest: its own random colour field)
SYNTHETIC_TINT = 0.5
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
VERIFIED_AT_BUILD = 16  # images decoded when the data is opened, so a bad folder is refused before training


def crop_box(rng: np.random.Generator, width: int, height: int) -> tuple[int, int, int, int]:
    """(left, top, width, height) of a RandomResizedCrop: torchvision's ``get_params``, with ``rng``."""
    area = width * height
    log_ratio = (math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1]))
    for _ in range(10):
        target = area * rng.uniform(*CROP_SCALE)
        ratio = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    # fallback: a central crop at the nearest allowed aspect ratio
    ratio = width / height
    if ratio < CROP_RATIO[0]:
        w, h = width, int(round(width / CROP_RATIO[0]))
    elif ratio > CROP_RATIO[1]:
        w, h = int(round(height * CROP_RATIO[1])), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def augment(image: Any, rng: np.random.Generator, size: int) -> torch.Tensor:
    """A decoded PIL image -> the recipe's crop, resized to ``size`` x ``size`` (bilinear, antialiased as PIL
    does), flipped with probability 1/2, as a (3, size, size) uint8 tensor."""
    from PIL import Image

    left, top, w, h = crop_box(rng, image.width, image.height)
    image = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def decode(data: bytes | Path, where: str) -> Any:
    """An encoded image (bytes or a file) as an RGB PIL image; a clear error naming ``where`` if it is not one."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise ValueError(f"cannot decode image {where}: {exc}; remove or replace it") from exc


class ImageSamples:
    """Encoded images with labels, augmented per sample: the dataset a :class:`~accelbench.workloads.pipeline.
    LoaderSource` reads by ``(epoch, index)``."""

    source = ""

    def __init__(self, image_size: int, seed: int) -> None:
        self.image_size = image_size
        self.seed = seed

    def __len__(self) -> int:
        raise NotImplementedError

    def encoded(self, index: int) -> tuple[bytes | Path, str]:
        """Image ``index`` as bytes or a file, and how to name it in an error."""
        raise NotImplementedError

    def label(self, index: int) -> int:
        raise NotImplementedError

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = key
        data, where = self.encoded(index)
        image = augment(decode(data, where), sample_rng(self.seed, epoch, index), self.image_size)
        return image, torch.tensor(self.label(index), dtype=torch.long)

    def verify(self, count: int = VERIFIED_AT_BUILD) -> None:
        """Decode up to ``count`` images spread over the dataset; ConfigError naming the first that fails."""
        n = len(self)
        for index in sorted({int(i) for i in np.linspace(0, n - 1, num=min(count, n))}):
            data, where = self.encoded(index)
            try:
                decode(data, where)
            except ValueError as exc:
                raise ConfigError(f"--data: {exc}") from None

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "images": len(self),
            "image_size": self.image_size,
            "augmentation": "RandomResizedCrop(scale 0.08-1, ratio 3/4-4/3, bilinear) + horizontal flip 0.5 "
            "per sample, seeded by (seed, epoch, index); uint8, normalised on the device",
        }


class SyntheticImages(ImageSamples):
    """``samples`` images drawn from a pool of seeded JPEGs (smooth colour fields with noise, so that they
    compress and decode like photographs), with labels spread over ``num_classes``."""

    def __init__(self, samples: int, num_classes: int, image_size: int, seed: int) -> None:
        super().__init__(image_size, seed)
        self.samples = samples
        self.pool_labels = [synthetic_label(image, num_classes, seed) for image in range(SYNTHETIC_POOL)]
        self.pool = synthetic_jpegs(self.pool_labels, num_classes, seed)
        width, height = SYNTHETIC_SIZE
        self.source = (
            f"synthetic: {SYNTHETIC_POOL} seeded {width}x{height} JPEGs (quality {SYNTHETIC_QUALITY}), each "
            "sample decoded and augmented on the host"
        )

    def __len__(self) -> int:
        return self.samples

    def encoded(self, index: int) -> tuple[bytes | Path, str]:
        return self.pool[index % len(self.pool)], f"synthetic #{index % len(self.pool)}"

    def label(self, index: int) -> int:
        return self.pool_labels[index % len(self.pool)]


def synthetic_label(image: int, num_classes: int, seed: int) -> int:
    """The class of the pool's ``image``: fixed per image and spread out over ``num_classes``."""
    return (image * 2654435761 + seed) % num_classes


def class_colour(label: int, num_classes: int) -> np.ndarray:
    """The colour that marks ``label``'s images: hues evenly spaced around the colour wheel, one per class."""
    import colorsys

    return np.array(colorsys.hsv_to_rgb(label / num_classes, 1.0, 1.0)) * 255


def synthetic_jpegs(labels: list[int], num_classes: int, seed: int) -> list[bytes]:
    """A JPEG of :data:`SYNTHETIC_SIZE` per label: an upsampled random colour grid plus noise, tinted with the
    label's :func:`class_colour` (weight :data:`SYNTHETIC_TINT`) so that any crop of it shows its class: held-out
    crops can then be classified from what training saw, and a run's held-out loss falls as a real one would."""
    from PIL import Image

    rng = np.random.default_rng([seed, 424242])
    width, height = SYNTHETIC_SIZE
    out = []
    for label in labels:
        grid = Image.fromarray(rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8))
        smooth = np.asarray(grid.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float32)
        tinted = (1 - SYNTHETIC_TINT) * smooth + SYNTHETIC_TINT * class_colour(label, num_classes)
        noisy = np.clip(tinted + rng.normal(0, 12, size=smooth.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(noisy).save(buffer, format="JPEG", quality=SYNTHETIC_QUALITY)
        out.append(buffer.getvalue())
    return out


class FolderImages(ImageSamples):
    """An ImageFolder layout: every image file under ``root/<class>/`` (symbolic links followed), classes
    numbered in sorted order."""

    def __init__(self, root: Path, num_classes: int, image_size: int, seed: int) -> None:
        super().__init__(image_size, seed)
        self.root = root
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not self.classes:
            raise ConfigError(
                f"--data {root}: no class folders; an image folder holds one folder per class (root/<class>/<image>)"
            )
        if len(self.classes) > num_classes:
            raise ConfigError(
                f"--data {root}: {len(self.classes)} class folders, more than --num-classes {num_classes}"
            )
        self.files: list[tuple[str, int]] = []
        for label, name in enumerate(self.classes):
            for folder, _, names in sorted(os.walk(root / name, followlinks=True)):
                self.files += [(os.path.join(folder, f), label) for f in sorted(names) if _is_image(f)]
        if not self.files:
            raise ConfigError(
                f"--data {root}: no images in its {len(self.classes)} class folder(s) (looked for "
                f"{', '.join(IMAGE_SUFFIXES)})"
            )
        self.source = f"image folder ({len(self.classes)} classes)"

    def __len__(self) -> int:
        return len(self.files)

    def encoded(self, index: int) -> tuple[bytes | Path, str]:
        path = Path(self.files[index][0])
        return path, str(path)

    def label(self, index: int) -> int:
        return self.files[index][1]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": str(self.root), "classes": len(self.classes)}


@dataclass(frozen=True)
class ShardMember:
    shard: int
    offset: int
    size: int
    label: int
    key: str


class ShardImages(ImageSamples):
    """WebDataset-style tar shards: each sample is ``<key>.<image suffix>`` with its label in ``<key>.cls`` (the
    class number as text). Indexed once (member offsets); each image is then one seek and one read."""

    def __init__(self, shards: list[Path], num_classes: int, image_size: int, seed: int) -> None:
        super().__init__(image_size, seed)
        self.shards = shards
        self.members: list[ShardMember] = []
        for number, shard in enumerate(shards):
            self.members += _index_shard(number, shard, num_classes)
        if not self.members:
            raise ConfigError(
                f"--data: no images in {len(shards)} tar shard(s); a sample is <key>.jpg with <key>.cls beside it"
            )
        self._files: dict[int, BinaryIO] = {}
        self._pid = os.getpid()
        self.source = f"tar shards ({len(shards)} file(s), read by offset)"

    def __len__(self) -> int:
        return len(self.members)

    def encoded(self, index: int) -> tuple[bytes | Path, str]:
        member = self.members[index]
        if self._pid != os.getpid():  # a forked DataLoader worker: its own files, never its parent's offsets
            self._files, self._pid = {}, os.getpid()
        handle = self._files.get(member.shard)
        if handle is None:  # opened once per process
            handle = self._files[member.shard] = open(self.shards[member.shard], "rb")  # noqa: SIM115
        handle.seek(member.offset)
        return handle.read(member.size), f"{member.key} in {self.shards[member.shard]}"

    def label(self, index: int) -> int:
        return self.members[index].label

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = {}  # open files stay in the process that opened them
        return state

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "shards": [str(s) for s in self.shards]}


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def _index_shard(number: int, shard: Path, num_classes: int) -> list[ShardMember]:
    images: dict[str, tarfile.TarInfo] = {}
    labels: dict[str, int] = {}
    try:
        with tarfile.open(shard, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                folder, _, base = info.name.rpartition("/")
                stem, dot, suffix = base.partition(".")
                key = f"{folder}/{stem}" if folder else stem
                if _is_image(base) and "." not in suffix:
                    images[key] = info
                elif dot and suffix == "cls":
                    text = tar.extractfile(info).read().decode().strip()  # type: ignore[union-attr]
                    if not text.isdigit() or int(text) >= num_classes:
                        raise ConfigError(
                            f"--data {shard}: {info.name} holds {text!r}, not a class number below --num-classes "
                            f"{num_classes}"
                        )
                    labels[key] = int(text)
    except tarfile.ReadError as exc:
        raise ConfigError(
            f"--data {shard}: not an uncompressed tar file ({exc}); shards are read by offset, so they cannot be "
            "compressed"
        ) from None
    unlabelled = sorted(set(images) - set(labels))
    if unlabelled:
        raise ConfigError(
            f"--data {shard}: image {unlabelled[0]!r} has no {unlabelled[0]}.cls label beside it"
        )
    return [ShardMember(number, images[k].offset_data, images[k].size, labels[k], k) for k in sorted(images)]


def open_images(
    path: Path | None, synthetic_samples: int | None, num_classes: int, image_size: int, seed: int
) -> ImageSamples:
    """The dataset for ``--data`` (an image folder, a folder of tar shards or one shard), or the synthetic one;
    a few of its images decoded now, so that a folder of broken files is refused before training."""
    if path is None:
        return SyntheticImages(synthetic_samples or IMAGENET_TRAIN_IMAGES, num_classes, image_size, seed)
    if path.is_file():
        dataset: ImageSamples = ShardImages([path], num_classes, image_size, seed)
    else:
        shards = sorted(path.glob("*.tar"))
        dataset = (
            ShardImages(shards, num_classes, image_size, seed)
            if shards
            else FolderImages(path, num_classes, image_size, seed)
        )
    dataset.verify()
    return dataset


def random_images(image_size: int, num_classes: int) -> Any:
    """The batch maker of ``--synthetic device``: uint8 images and labels drawn on the device."""

    def make(
        generator: torch.Generator, size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.randint(
            0, 256, (size, 3, image_size, image_size), generator=generator, device=device, dtype=torch.uint8
        )
        labels = torch.randint(0, num_classes, (size,), generator=generator, device=device)
        return images, labels

    return make
