"""``python -m accelbench.references [NAME ...]``: regenerate the shipped reference trajectories
(accelbench/references/<name>.json, :data:`~accelbench.references.REFERENCES`), every file or only those named.
Regenerating runs the engine, so it lives here, above it; the package itself only reads the shipped files (compare and the plugin host use it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelbench.references import REFERENCE_DIR, REFERENCES

if TYPE_CHECKING:
    from accelbench.config import RunConfig
    from accelbench.results import ResultRecord


def regenerate(
    names: tuple[str, ...] = tuple(REFERENCES),
    folder: Path = REFERENCE_DIR,
    output_dir: Path | None = None,
    keep_shipped: bool = False,
) -> dict[str, dict[str, Any]]:
    """Train every model of each reference file in ``names`` at its recipe for each of its seeds and
    write ``<name>.json`` with how it was made. Returns what was written, by name.

    ``keep_shipped``: the seeds ``folder``'s own ``<name>.json`` already has, made at the same recipe, workload
    options, accelbench and torch, are kept rather than trained again (:func:`shipped_trajectories`), so giving a
    file more seeds trains only the new ones; the file's ``made.kept`` says which were kept, from when."""
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
    # each run's record stays in ``out``: a regeneration cut short (killed, out of memory) is resumed by giving the
    # same folder again, which keeps every seed whose record is there and trains only the others
    print(
        f"run records: {out} (if this is cut short, --work-dir {out} keeps the seeds already run)", flush=True
    )
    finished = records_in(out)  # read once: a work folder holds a record per run already made
    written: dict[str, dict[str, Any]] = {}
    for name in names:
        made_as = REFERENCES[name]
        recipe, options = made_as.fields, made_as.options
        shipped = shipped_trajectories(folder / f"{name}.json", recipe, options) if keep_shipped else None
        if keep_shipped and shipped is None:
            print(
                f"--keep-shipped: {folder / (name + '.json')} is missing, unreadable or made at another recipe, "
                "accelbench or torch; every seed trains",
                flush=True,
            )
        models: dict[str, Any] = {}
        reused: list[str] = []
        kept: list[str] = []
        start, cpu_start = time.perf_counter(), time.process_time()
        for model in made_as.models:
            trajectories: dict[str, list[float]] = {}
            identity: dict[str, Any] = {}
            kept_here = shipped["models"].get(model, {}) if shipped else {}
            for seed in made_as.seeds:
                if str(seed) in kept_here.get("trajectories", {}):
                    trajectories[str(seed)] = list(kept_here["trajectories"][str(seed)])
                    kept.append(f"{model} seed {seed}")
                    continue
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
                record = matching_run(finished, config)
                if record is not None:
                    reused.append(f"{model} seed {seed}")
                else:
                    record, _, status = run(config, get_host())
                    if record is None or status != "ok" or record.quality is None:
                        raise RuntimeError(f"reference run {model} seed {seed} ended {status}")
                assert record.quality is not None
                trajectories[str(seed)] = [
                    q.val_loss for q in record.quality.epochs if q.val_loss is not None
                ]
                identity = dict(record.workload_identity)
            if kept_here:
                if identity and identity != kept_here["identity"]:
                    raise RuntimeError(
                        f"{model}: the shipped {name}.json was made with workload identity {kept_here['identity']}, "
                        f"this accelbench's runs have {identity}; its seeds cannot be kept, so make the file "
                        "again without --keep-shipped"
                    )
                identity = dict(kept_here["identity"])
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
            **(
                {
                    "reused": {
                        "runs": reused,
                        "why": "kept from an earlier regeneration that was cut short, with the same work folder, "
                        "recipe, accelbench and torch; their time is not in seconds or cpu_seconds",
                    }
                }
                if reused
                else {}
            ),
            **(
                {
                    "kept": {
                        "runs": kept,
                        # the file kept from, as it said it was made (its own kept and reused runs too): a file
                        # extended twice still says when and how long each of its seeds took
                        **{
                            key: shipped["made"][key]
                            for key in ("created_at", "seconds", "cpu_seconds", "reused", "kept")
                            if key in shipped["made"]
                        },
                        "why": "--keep-shipped: kept from the file made at created_at (its time in seconds and "
                        "cpu_seconds here, what it kept or reused in turn beside them), at the same recipe, "
                        "workload options, accelbench and torch, and not trained again",
                    }
                }
                if kept and shipped
                else {}
            ),
            "test": "held-out loss after the last epoch within mean ± max(t(0.995, n-1) s sqrt(1 + 1/n), 1% of mean)",
        }
        written[name] = {"made": made, "models": models}
        # whole or not at all: a file cut short by an interruption would be a shipped reference that cannot load
        write_output((json.dumps(written[name], indent=1) + "\n").encode(), folder / f"{name}.json")
    return written


def shipped_trajectories(
    path: Path, recipe: dict[str, Any], options: dict[str, Any]
) -> dict[str, Any] | None:
    """The reference file at ``path`` (``{"made": ..., "models": ...}``) where it was made at ``recipe`` and
    ``options`` with this accelbench and torch; None where it is missing, unreadable or made otherwise."""
    import torch

    from accelbench import __version__

    try:
        shipped = json.loads(path.read_text())
        made = shipped["made"]
        same = (
            made["recipe"] == recipe
            and made["workload_options"] == options
            and made["accelbench"] == __version__
            and made["torch"] == torch.__version__
            and isinstance(shipped["models"], dict)
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return shipped if same else None


def records_in(folder: Path) -> list[ResultRecord]:
    """Every readable result record in ``folder`` (none where it does not exist); other files are passed over."""
    from accelbench.errors import AccelbenchError
    from accelbench.results import read_record

    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            records.append(read_record(path))
        except (AccelbenchError, OSError):
            continue
    return records


def matching_run(records: list[ResultRecord], config: RunConfig) -> ResultRecord | None:
    """The first of ``records`` that finished at exactly ``config``'s recipe (model, seed, backend, threads, every
    recipe field and workload option), with this accelbench and torch, and measured a held-out loss after every
    epoch; None where there is none."""
    import torch

    from accelbench import __version__

    asked = config.model_dump(exclude={"output_dir", "workload_options"})
    for record in records:
        done = record.config.model_dump(exclude={"output_dir", "workload_options"})
        quality = record.quality
        if (
            done == asked
            and all(record.config.workload_options.get(k) == v for k, v in config.workload_options.items())
            and record.outcome.status == "ok"
            and record.system.torch_version == torch.__version__
            and record.system.accelbench_version == __version__
            and quality is not None
            and len(quality.epochs) == config.epochs
            and all(q.val_loss is not None for q in quality.epochs)
        ):
            return record
    return None


def main(argv: list[str]) -> None:
    """``python -m accelbench.references [--work-dir DIR] [NAME ...]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m accelbench.references", description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="the files to make again (default: every one)"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="where each run's record goes (default: a new temporary folder); a folder of an earlier regeneration "
        "that was cut short keeps the seeds it finished",
    )
    parser.add_argument(
        "--keep-shipped",
        action="store_true",
        help="keep the seeds the shipped file already has at the same recipe, accelbench and torch, and train only "
        "the others (a recipe given more seeds)",
    )
    args = parser.parse_args(argv)
    asked = tuple(args.names) or tuple(REFERENCES)
    unknown = [n for n in asked if n not in REFERENCES]
    if unknown:
        sys.exit(f"no reference recipe named {', '.join(unknown)}; choose from: {', '.join(REFERENCES)}")
    if args.work_dir is not None:
        from accelbench.errors import ConfigError
        from accelbench.results import check_writable

        try:
            check_writable(args.work_dir, "--work-dir")
        except ConfigError as error:
            sys.exit(str(error))
    for name, written in regenerate(asked, output_dir=args.work_dir, keep_shipped=args.keep_shipped).items():
        for model, entry in written["models"].items():
            print(
                model, {seed: [round(v, 4) for v in losses] for seed, losses in entry["trajectories"].items()}
            )
        print(f"written: {REFERENCE_DIR / (name + '.json')} ({written['made']['seconds']} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
