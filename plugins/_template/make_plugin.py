"""Make a new accelbench backend plugin from this template: ``python plugins/_template/make_plugin.py NAME``.

Copies ``template/`` to ``plugins/NAME`` (or ``--dest DIR``, for a plugin in its own repository), filling in the
placeholders ``{{name}}``, ``{{Name}}``, ``{{NAME}}``, ``{{device_type}}``, ``{{device_unit}}`` and ``{{priority}}``
in file names and contents, and dropping the ``-tpl`` suffix that keeps template files out of linters. Standard
library only, so it runs before anything is installed.

The plugin it writes implements plugin contract 3.3 (:data:`CONTRACT`): a ``Backend`` subclass registered by its
plugin module. As generated it installs and loads, but the methods every backend must write raise
``NotImplementedError("TODO: ...")``, so it fails the conformance kit until they are written; see the generated
README.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "template"
SUFFIX = "-tpl"
TAKEN = {"cpu", "template", "accelbench"}
CONTRACT = "3.3"  # the plugin contract the template implements (accelbench.contract.CONTRACT_VERSION)


def render(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def make_plugin(name: str, dest: Path, device_type: str, device_unit: str, priority: int) -> list[Path]:
    """Write the plugin ``name`` into ``dest`` (which must not exist yet); return the files written."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name) or name in TAKEN:
        raise ValueError(
            f"plugin name {name!r} must be a lowercase Python identifier (letters, digits, _) other than "
            f"{', '.join(sorted(TAKEN))}: it becomes the backend name and the package accelbench_{name}"
        )
    if dest.exists():
        raise ValueError(f"{dest} already exists; choose another --dest or remove it first")
    values = {
        "name": name,
        "Name": name.replace("_", " ").title().replace(" ", ""),
        "NAME": name.upper(),
        "device_type": device_type,
        "device_unit": device_unit,
        "priority": str(priority),
    }
    written = []
    for source in sorted(TEMPLATE.rglob("*")):
        if source.is_dir() or "__pycache__" in source.parts:
            continue
        relative = render(str(source.relative_to(TEMPLATE)), values).removesuffix(SUFFIX)
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(source.read_text(encoding="utf-8"), values), encoding="utf-8")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make a new accelbench backend plugin from the template.")
    parser.add_argument("name", help="backend name, e.g. gaudi (package accelbench_gaudi)")
    parser.add_argument(
        "--device-type", default="cpu", help="torch device type its tensors live on (default: cpu)"
    )
    parser.add_argument("--device-unit", default="one device", help="what one device is, in words")
    parser.add_argument("--priority", type=int, default=100, help="detection priority (GPUs ~100, CPU 0)")
    parser.add_argument("--dest", type=Path, help="output folder (default: plugins/NAME next to _template)")
    args = parser.parse_args(argv)
    dest = args.dest or TEMPLATE.parent.parent / args.name
    try:
        files = make_plugin(args.name, dest, args.device_type, args.device_unit, args.priority)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {len(files)} files to {dest}: plugin accelbench-{args.name} on plugin contract {CONTRACT}, backend "
        f"{args.name!r} on torch device type {args.device_type!r}; next: pip install -e {dest} && pytest {dest}/tests "
        f"(it fails until every NotImplementedError('TODO: ...') in {dest}/accelbench_{args.name}/plugin.py is written)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
