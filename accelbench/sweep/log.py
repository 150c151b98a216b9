"""The sweep log: one JSON line per attempt in ``accelbench-sweep.log.jsonl`` in the output folder.

Records say how runs went; the log also says what left no record (a refused point, a crash, a timeout before
training began) and how long each attempt took, so a failed sweep can be understood after the fact.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from accelbench.sweep.spec import Point, Sweep
from accelbench.sweep.supervise import Attempt

SWEEP_LOG = "accelbench-sweep.log.jsonl"


def log_attempt(output_dir: Path, sweep: Sweep, point: Point, attempt: Attempt) -> None:
    """Append one line to the sweep log (JSON lines; one writer per sweep, so no locking)."""
    entry = {
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sweep": sweep.name,
        "point": {k: str(v) if isinstance(v, Path) else v for k, v in point.options},
        "status": attempt.status,
        "exit_code": attempt.exit_code,
        "seconds": round(attempt.seconds, 3),
        "record": str(attempt.record) if attempt.record else None,
        "message": attempt.message,
    }
    with open(output_dir / SWEEP_LOG, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
