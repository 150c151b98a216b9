"""``python -m accelbench.references [NAME ...]``: regenerate the shipped reference trajectories
(accelbench/references/<name>.json, :data:`~accelbench.references.REFERENCES`), every file or only those named.
Regenerating runs the engine, so it lives here, above it; the package itself only reads the shipped files (compare and the plugin host use it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from accelbench.references import REFERENCE_DIR, REFERENCES


def regenerate(
    names: tuple[str, ...] = tuple(REFERENCES),
    folder: Path = REFERENCE_DIR,
    output_dir: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every model of each reference file in ``names`` at its recipe for each of its seeds and
    write ``<name>.json`` with how it was made. Returns what was written, by name."""
    import tempfile
    import time
    from datetime import datetime, timezone

    import torch

    from accelbench import __version__
    from accelbench.config import RunConfig
    from accelbench.engine.runner import run
    from accelbench.hostinfo import usable_cores
    from accelbench.plugins import get_host
    from accelbench.results import write_output

    unknown = [n for n in names if n not in REFERENCES]
    if unknown:
        raise ValueError(
            f"no reference recipe named {', '.join(unknown)}; the names: {', '.join(REFERENCES)}"
        )
    # made (and proved writable) before any training: a reference takes up to an hour of runs to make, and a
    # folder that cannot take the file would lose them at the end
    probe = folder / ".accelbench-references-write-test"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise OSError(f"cannot write reference files to {folder}: {error}") from error
    out = output_dir or Path(tempfile.mkdtemp(prefix="accelbench-references-"))
    written: dict[str, dict[str, Any]] = {}
    for name in names:
        made_as = REFERENCES[name]
        recipe, options = made_as.fields, made_as.options
        models: dict[str, Any] = {}
        start, cpu_start = time.perf_counter(), time.process_time()
        for model in made_as.models:
            trajectories: dict[str, list[float]] = {}
            identity: dict[str, Any] = {}
            for seed in made_as.seeds:
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
            **({"why": made_as.why} if made_as.why else {}),
            "seeds": list(made_as.seeds),
            "accelbench": __version__,
            "torch": torch.__version__,
            "threads": 1,
            "cores": usable_cores(),
            "seconds": round(time.perf_counter() - start, 1),
            "cpu_seconds": round(time.process_time() - cpu_start, 1),
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "test": "held-out loss after the last epoch within mean ± max(t(0.995, n-1) s sqrt(1 + 1/n), 1% of mean)",
        }
        written[name] = {"made": made, "models": models}
        # whole or not at all: a file cut short by an interruption would be a shipped reference that cannot load
        write_output((json.dumps(written[name], indent=1) + "\n").encode(), folder / f"{name}.json")
    return written


if __name__ == "__main__":
    asked = tuple(sys.argv[1:]) or tuple(REFERENCES)
    unknown = [n for n in asked if n not in REFERENCES]
    if unknown:
        sys.exit(f"no reference recipe named {', '.join(unknown)}; choose from: {', '.join(REFERENCES)}")
    for name, written in regenerate(asked).items():
        for model, entry in written["models"].items():
            print(
                model, {seed: [round(v, 4) for v in losses] for seed, losses in entry["trajectories"].items()}
            )
        print(f"written: {REFERENCE_DIR / (name + '.json')} ({written['made']['seconds']} s)", flush=True)
