"""The image workloads (seed 004): each trains for real on the CPU, single and 2-process DDP, from synthetic data,
an image folder or tar shards made here; the host pipeline is deterministic whatever its workers; bad data is refused
before training. Tiny sizes: 32x32 images, batches of 4."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from core_support import accelbench, accelbench_here

from accelbench.config import RunConfig
from accelbench.plugins import get_host
from accelbench.results import read_record
from accelbench.workloads.vision import MODELS

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None,
    reason="torchvision not installed (pip install 'accelbench[vision]')",
)

TINY = ["--image-size", "32", "--batch-size", "4", "--epochs", "2", "--steps-per-epoch", "2", "-q"]


def only_record(folder: Path):  # type: ignore[no-untyped-def]
    files = sorted(folder.glob("*.json"))
    assert len(files) == 1, files
    return read_record(files[0])


def make_images(root: Path, classes: int = 2, per_class: int = 3) -> list[tuple[bytes, str, int]]:
    """A real ImageFolder (JPEG and PNG, several sizes) under ``root``; returns (encoded, suffix, label) in the
    order the folder lists them."""
    from PIL import Image

    rng = np.random.default_rng(0)
    made = []
    for label in range(classes):
        (root / f"class{label}").mkdir(parents=True)
        for i in range(per_class):
            size = (48 + 8 * i, 40 + 4 * label)
            image = Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8))
            suffix = "png" if i % 2 else "jpg"
            buffer = io.BytesIO()
            image.save(buffer, format="PNG" if suffix == "png" else "JPEG")
            (root / f"class{label}" / f"img{i}.{suffix}").write_bytes(buffer.getvalue())
            made.append((buffer.getvalue(), suffix, label))
    return made


def make_shards(folder: Path, images: list[tuple[bytes, str, int]], per_shard: int = 4) -> None:
    """WebDataset-style shards of ``images``: <key>.<suffix> and <key>.cls, in the same order."""
    folder.mkdir(parents=True)
    for start in range(0, len(images), per_shard):
        with tarfile.open(folder / f"shard-{start // per_shard:03d}.tar", "w") as tar:
            for index, (data, suffix, label) in enumerate(images[start : start + per_shard], start):
                for name, payload in (
                    (f"{index:06d}.{suffix}", data),
                    (f"{index:06d}.cls", str(label).encode()),
                ):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))


@pytest.mark.parametrize("workload", ["resnet50", "mobilenet-v3-large"])  # all four: the CPU conformance run
@pytest.mark.slow
def test_an_image_workload_trains_on_the_cpu_and_records_its_work(workload: str, tmp_path: Path) -> None:
    proc = accelbench(
        "run", "--workload", workload, *TINY, "--data-workers", "0", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.outcome.status == "ok" and record.config.model == workload  # its own default size
    m = record.metrics
    assert m is not None and [e.steps for e in m.epochs] == [2, 2]
    assert all(np.isfinite(e.loss) for e in m.epochs)
    assert all(e.tokens == e.samples for e in m.epochs)  # a sample is an image: tokens_per_sample 1
    assert m.flops_per_sample == 3 * record.workload["forward_flops_per_image"] > 0
    assert record.workload_identity == {
        "model": workload, "image_size": 32, "num_classes": 1000, "channels_last": True,
        "data_source": "synthetic-host", "data_workers": 0,
    }  # fmt: skip
    assert record.data["source"].startswith("synthetic") and record.data["workers"] == 0


def test_flops_per_image_are_the_published_counts() -> None:
    from accelbench.workloads.vision.model import forward_flops

    # 2 x the multiply-accumulates torchvision's model cards give at 224 x 224
    expected = {"resnet50": 4.09e9, "efficientnet-b0": 0.386e9, "mobilenet-v3-small": 0.057e9,
                "mobilenet-v3-large": 0.217e9}  # fmt: skip
    for name, macs in expected.items():
        assert forward_flops(MODELS[name], 224, 1000) == pytest.approx(2 * macs, rel=0.02), name


def test_an_efficientnet_head_of_few_classes_starts_with_the_logits_it_has_at_imagenet_scale() -> None:
    """torchvision draws EfficientNet's classifier uniform in ±1/sqrt(classes): at 8 classes its first logits have a
    standard deviation near 5 (a loss above ln 8 before any step), and the held-out loss of the image recipe
    jumped 5-40x between epochs and seeds. build_net draws it as at 1000 classes; the rest is torchvision's."""
    from accelbench.workloads.vision.model import build_net, classifier_init, load_torchvision

    spec = MODELS["efficientnet-b0"]
    torch.manual_seed(0)
    ours = build_net(spec, 8)
    torch.manual_seed(0)
    theirs = load_torchvision().models.efficientnet_b0(weights=None, num_classes=8)
    kept = {n: t for n, t in theirs.state_dict().items() if not n.startswith("classifier")}
    assert all(torch.equal(ours.state_dict()[n], t) for n, t in kept.items())  # only the head is drawn again
    weight = ours.classifier[1].weight
    assert 0.9 * 1000**-0.5 < weight.abs().max() <= 1000**-0.5 < theirs.classifier[1].weight.abs().max() / 10
    images = torch.randn(16, 3, 32, 32)
    with torch.no_grad():  # in training mode, as the first steps see them (batch statistics)
        assert ours.train()(images).std() < 1 < 3 < theirs.train()(images).std()
    assert classifier_init(spec, 8) is not None and "1/sqrt(1000)" in classifier_init(spec, 8)  # type: ignore[operator]
    torch.manual_seed(0)
    at_imagenet = build_net(spec, 1000)  # at 1000 classes (and more) torchvision's model, untouched
    torch.manual_seed(0)
    reference = load_torchvision().models.efficientnet_b0(weights=None, num_classes=1000)
    assert all(
        torch.equal(a, b)
        for a, b in zip(at_imagenet.state_dict().values(), reference.state_dict().values(), strict=True)
    )
    assert classifier_init(spec, 1000) is None and classifier_init(MODELS["mobilenet-v3-small"], 8) is None


@pytest.mark.parametrize("workload", list(MODELS))
def test_units_are_the_models_parts_in_order(workload: str) -> None:
    from accelbench.workloads.vision.model import ImageClassifier, build_net

    spec = MODELS[workload]
    model = ImageClassifier(build_net(spec, 10), channels_last=False)
    units = get_host().workload(workload).units(RunConfig(workload=workload, model=workload))
    modules = dict(model.named_modules())
    parts = [*units.stem, *units.units, *units.head]
    assert all(p in modules for p in parts), [p for p in parts if p not in modules]
    covered = {id(p) for path in parts for p in modules[path].parameters()}
    assert covered == {id(p) for p in model.parameters()}  # every parameter belongs to one part
    assert len(units.units) == {"resnet50": 16, "efficientnet-b0": 16, "mobilenet-v3-small": 11,
                                "mobilenet-v3-large": 15}[workload]  # fmt: skip


def test_batches_do_not_depend_on_the_workers_and_split_over_ranks(tmp_path: Path) -> None:
    from accelbench.workloads.pipeline import LoaderSource
    from accelbench.workloads.vision.data import SyntheticImages

    dataset = SyntheticImages(samples=24, num_classes=10, image_size=32, seed=3)
    serial = LoaderSource(dataset, batch_size=4, seed=3, max_steps=None, workers=0)
    parallel = LoaderSource(dataset, batch_size=4, seed=3, max_steps=None, workers=2)
    for epoch in (0, 1):
        a, b = list(serial.batches(epoch)), list(parallel.batches(epoch))
        assert len(a) == 6 and all(
            torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True)
        )
        assert a[0][0].dtype == torch.uint8 and a[0][0].shape == (4, 3, 32, 32)
    assert not torch.equal(next(serial.batches(0))[0], next(serial.batches(1))[0])  # a new order every epoch
    # two ranks take disjoint halves of the epoch's permutation
    labels = [torch.cat([y for _, y in serial.batches(0, rank, 2)]) for rank in (0, 1)]
    assert [len(x) for x in labels] == [12, 12] and serial.steps(0, 2) == 3
    assert len(serial.waits) >= 2 and serial.describe()["rank0_wait_fraction"]
    # without --data-workers: none on the CPU device; for an accelerator, pinned and fed by workers
    default = LoaderSource(dataset, batch_size=4, seed=3, max_steps=None, workers=None)
    placed = default.to_device(torch.device("cpu"), "auto")
    assert default.workers == 0 and default.describe()["workers_source"].startswith("default on the CPU")
    assert (
        placed.pin_memory
        and placed.workers >= 1
        and placed.describe()["workers_source"].startswith("default on an")
    )


def test_an_image_folder_and_its_tar_shards_give_the_same_batches(tmp_path: Path) -> None:
    from accelbench.workloads.vision.data import FolderImages, ShardImages, open_images

    images = make_images(tmp_path / "folder")
    make_shards(tmp_path / "shards", images)
    folder = open_images(tmp_path / "folder", None, 10, 32, seed=1)
    shards = open_images(tmp_path / "shards", None, 10, 32, seed=1)
    assert isinstance(folder, FolderImages) and isinstance(shards, ShardImages)
    assert len(folder) == len(shards) == 6 and len(shards.shards) == 2
    for index in range(6):
        x, y = folder[(0, index)], shards[(0, index)]
        assert torch.equal(x[0], y[0]) and int(x[1]) == int(y[1]) == images[index][2]


@pytest.mark.parametrize("layout", ["folder", "shards"])
@pytest.mark.slow
def test_a_run_on_real_images_with_workers(layout: str, tmp_path: Path) -> None:
    images = make_images(tmp_path / "folder", per_class=4)
    if layout == "shards":
        make_shards(tmp_path / "shards", images)
    out = tmp_path / "out"
    proc = accelbench("run", "--workload", "mobilenet-v3-small", *TINY, "--data", str(tmp_path / layout),
                      "--data-workers", "2", "--output-dir", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(out)
    assert record.outcome.status == "ok"
    # 8 images, one held out for validation (the last 10%, at least one): 7 train
    assert record.data["workers"] == 2 and record.data["samples_per_epoch"] == 7
    assert record.data["source"].startswith("image folder" if layout == "folder" else "tar shards")
    assert record.workload_identity["data_source"] == "dataset"
    assert record.system.cpu_affinity and record.system.numa_nodes  # the host's layout, from the OS


@pytest.mark.slow
def test_synthetic_device_generates_batches_where_the_model_runs(tmp_path: Path) -> None:
    proc = accelbench(
        "run", "--workload", "resnet50", *TINY, "--synthetic", "device", "--output-dir", str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.data["placement"].startswith("device (batches generated on cpu")
    assert record.workload_identity["data_source"] == "synthetic-device" and record.data["bottleneck"] is None


def test_bad_image_data_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelbench.errors import ConfigError

    (tmp_path / "no-classes").mkdir()
    (tmp_path / "no-images" / "class0").mkdir(parents=True)
    for folder, message in (("no-classes", "no class folders and no .tar shards"),
                            ("no-images", "no images in its 1 class folder")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):  # checked with the options, before anything starts
            get_host().resolve(RunConfig(workload="resnet50", data=tmp_path / folder))
    make_images(tmp_path / "corrupt")
    (tmp_path / "corrupt" / "class1" / "broken.jpg").write_bytes(b"not a JPEG")
    code, stderr = accelbench_here(capsys, "run", "--workload", "resnet50", *TINY, "--data",
                                   str(tmp_path / "corrupt"), "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert code == 2, stderr[-3000:]
    assert "cannot decode image" in stderr and "broken.jpg" in stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.json"))


def test_image_options_are_checked(tmp_path: Path) -> None:
    from accelbench.errors import ConfigError

    host = get_host()
    for values, message in (
        ({"model": "resnet101"}, "unknown model 'resnet101' for workload 'resnet50'"),
        (
            {"workload_options": {"image_size": 16}},
            "--image-size: Input should be greater than or equal to 32",
        ),
        (
            {"data": tmp_path, "workload_options": {"synthetic": "device"}},
            "--synthetic device generates data",
        ),
        ({"data_placement": "device"}, "has no device-resident form"),
    ):
        with pytest.raises(ConfigError, match=message):
            host.resolve(RunConfig(workload="resnet50", **values))  # type: ignore[arg-type]


needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed not installed (pip install 'accelbench[deepspeed]')",
)
needs_lightning = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="Lightning not installed (pip install 'accelbench[lightning]')",
)


@pytest.mark.parametrize(
    "workload, args",
    [
        # multi-process jobs: the full tier (pytest -m slow), which CI runs
        # precise batch norm: the micro-batch of 2 at 32 pixels leaves the last stage's batch norms 2 values a
        # channel, whose running statistics after 2 steps make evaluation overflow (a non-finite held-out loss)
        pytest.param("resnet50", ["--strategy", "ddp", "--precise-bn", "4"], marks=pytest.mark.slow),
        # sharded parameters: contiguous weights, channels-last inputs
        pytest.param("efficientnet-b0", ["--strategy", "fsdp"], marks=pytest.mark.slow),
        pytest.param("efficientnet-b0", ["--strategy", "ddp"], marks=pytest.mark.slow),
        pytest.param("mobilenet-v3-small", ["--strategy", "ddp"], marks=pytest.mark.slow),
        pytest.param("mobilenet-v3-large", ["--strategy", "ddp"], marks=pytest.mark.slow),
        pytest.param("resnet50", ["--strategy", "deepspeed-zero2"], marks=[pytest.mark.slow, needs_deepspeed]),
        pytest.param("mobilenet-v3-small", ["--strategy", "ddp", "--engine", "lightning"],
                     marks=[pytest.mark.slow, needs_lightning]),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(a for a in v if not a.startswith("--")),
)  # fmt: skip
def test_two_processes_with_gradient_accumulation(workload: str, args: list[str], tmp_path: Path) -> None:
    proc = accelbench("run", "--workload", workload, *TINY, *args, "--devices", "2", "--grad-accum", "2",
                      "--data-workers", "1", "--output-dir", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = only_record(tmp_path)
    assert record.outcome.status == "ok" and record.world_size == 2
    assert [r.epoch_samples for r in record.metrics.ranks] == [[8, 8], [8, 8]]
    assert record.executor["grad_accum"] == 2 and record.workload_identity["grad_accum"] == 2
    assert json.loads(record.model_dump_json())["config"]["grad_accum"] == 2
