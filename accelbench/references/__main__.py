"""``python -m accelbench.references [WORKLOAD ...]``: regenerate the shipped reference trajectories
(accelbench/references/<workload>.json), every workload's or only those named. Regenerating runs the engine, so it
lives here, above it; the package itself only reads the shipped files (compare and the plugin host use it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from accelbench.references import RECIPE, REFERENCE_DIR, SEEDS, WORKLOADS


def regenerate(
    workloads: tuple[str, ...] = tuple(WORKLOADS),
    folder: Path = REFERENCE_DIR,
    output_dir: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every model of each workload in ``workloads`` at the recipe for every seed of :data:`SEEDS` and write
    ``<workload>.json`` with how it was made. Returns what was written, by workload."""
    import tempfile
    import time
    from datetime import datetime, timezone

    import torch

    from accelbench import __version__
    from accelbench.config import RunConfig
    from accelbench.engine.runner import run
    from accelbench.hostinfo import usable_cores
    from accelbench.plugins import get_host

    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(
            f"no reference recipe for {', '.join(unknown)}; the workloads with one: {', '.join(WORKLOADS)}"
        )
    out = output_dir or Path(tempfile.mkdtemp(prefix="accelbench-references-"))
    written: dict[str, dict[str, Any]] = {}
    for workload in workloads:
        names, options = WORKLOADS[workload]
        recipe = {**RECIPE, "workload": workload}
        models: dict[str, Any] = {}
        start = time.perf_counter()
        for model in names:
            trajectories: dict[str, list[float]] = {}
            identity: dict[str, Any] = {}
            for seed in SEEDS:
                # one thread: deterministic, and never stalled by OpenMP barriers on a shared host
                config = RunConfig(
                    **recipe,
                    model=model,
                    seed=seed,
                    backend="cpu",
                    threads=1,
                    output_dir=out,
                    workload_options=dict(options),
                )
                record, _, status = run(config, get_host())
                if record is None or status != "ok" or record.quality is None:
                    raise RuntimeError(f"reference run {model} seed {seed} ended {status}")
                trajectories[str(seed)] = [
                    q.val_loss for q in record.quality.epochs if q.val_loss is not None
                ]
                identity = dict(record.workload_identity)
            models[model] = {"identity": identity, "trajectories": trajectories}
        made = {
            "how": "python -m accelbench.references: accelbench run at the recipe below for each model and seed, on "
            "the CPU backend (one thread), fp32, one device, generated data; trajectories are "
            "quality.epochs[].val_loss",
            "recipe": recipe,
            "workload_options": options,
            "seeds": list(SEEDS),
            "accelbench": __version__,
            "torch": torch.__version__,
            "threads": 1,
            "cores": usable_cores(),
            "seconds": round(time.perf_counter() - start, 1),
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "test": "held-out loss after the last epoch within mean ± max(t(0.995, n-1) s sqrt(1 + 1/n), 1% of mean)",
        }
        written[workload] = {"made": made, "models": models}
        (folder / f"{workload}.json").write_text(json.dumps(written[workload], indent=1) + "\n")
    return written


if __name__ == "__main__":
    asked = tuple(sys.argv[1:]) or tuple(WORKLOADS)
    unknown = [w for w in asked if w not in WORKLOADS]
    if unknown:
        sys.exit(f"no reference recipe for {', '.join(unknown)}; choose from: {', '.join(WORKLOADS)}")
    for workload, written in regenerate(asked).items():
        for model, entry in written["models"].items():
            print(
                model, {seed: [round(v, 4) for v in losses] for seed, losses in entry["trajectories"].items()}
            )
        print(f"written: {REFERENCE_DIR / (workload + '.json')} ({written['made']['seconds']} s)")
