"""Raw benchmark runs, folded into one file per experiment folder (``benchmarks/X/runs.json``).

A benchmark writes one JSON file per launch or round (``coll-ws2-r1-new.json``, ...). The
repository keeps them folded into one ``runs.json`` per top-level folder of
``benchmarks/`` (issue 40: at most 150 tracked files under ``benchmarks/``, kept so by
``tests/test_repo_layout.py``)::

    {"schema": "ccddp.benchmarks.runs/1", "about": "...",
     "files": {"coll-ws2-r1-new.json": {...the file's JSON...}, "ws4-1m/coll-ws4-r1-new.json": {...}}}

Each key is the raw file's path below the folder that holds ``runs.json``; its value is
the file's parsed content, nothing dropped or rounded. So ``benchmarks/engine/runs.json``
entry ``domains-ws4-r1.json`` is what ``benchmarks/engine/domains-ws4-r1.json`` was.

    # after a run: fold its raw files into the folder's runs.json (and delete them)
    python scripts/folded_runs.py fold benchmarks/engine 'coll-*.json' 'domains-*.json'
    # the raw files again, e.g. to read them with other tools
    python scripts/folded_runs.py unfold benchmarks/engine/runs.json /tmp/engine
    python scripts/folded_runs.py list benchmarks/training/runs.json [PREFIX]

Readers take a raw file's original path: :func:`exists` / :func:`read` look on disk first
(a fresh, not yet folded run), then in the ``runs.json`` of the nearest folder above it;
:func:`materialize` turns paths of folded files or folders into real ones (in a temporary
folder) for code that reads files, such as ``ccddp.runs.load_runs``.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

SCHEMA = "ccddp.benchmarks.runs/1"
NAME = "runs.json"


class FoldError(Exception):
    """A folded file this module cannot use, or a fold that would lose a run."""


def load(folded: str | Path) -> dict:
    """The folded file's object (``schema``, ``about``, ``files``)."""
    data = json.loads(Path(folded).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("files"), dict):
        raise FoldError(f"{folded} is not a folded runs file ({SCHEMA})")
    return data


def _write(folded: Path, data: dict) -> None:
    data = {"schema": SCHEMA, "about": data.get("about", ""), "files": dict(sorted(data["files"].items()))}
    tmp = folded.with_name(folded.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, folded)


def _folded_for(path: Path) -> tuple[Path, str] | None:
    """(the runs.json in or above ``path``, ``path``'s key in it: "" for its own folder), or None."""
    path = Path(os.path.abspath(path))
    for folder in (path, *path.parents):
        if (folder / NAME).is_file() and _files(folder / NAME) is not None:
            key = path.relative_to(folder).as_posix()
            return folder / NAME, "" if key == "." else key
    return None


_LOADED: dict[Path, dict | None] = {}


def _files(folded: Path) -> dict | None:
    """The folded file's entries (cached), or None where it is some other file named runs.json."""
    if folded not in _LOADED:
        try:
            _LOADED[folded] = load(folded)["files"]
        except (FoldError, OSError, ValueError):
            _LOADED[folded] = None
    return _LOADED[folded]


def entries(path: str | Path) -> dict[str, object]:
    """The folded files at or below ``path`` (a raw file's or folder's original path),
    keyed by their path below ``runs.json``'s folder."""
    found = _folded_for(Path(path))
    if found is None:
        return {}
    folded, key = found
    files = _files(folded)
    if not key:
        return dict(files)
    return {k: v for k, v in files.items() if k == key or k.startswith(key + "/")}


def exists(path: str | Path) -> bool:
    """Whether the raw file ``path`` is on disk or folded."""
    if Path(path).is_file():
        return True
    found = _folded_for(Path(path))
    return found is not None and found[1] in _files(found[0])


def read(path: str | Path):
    """The raw file ``path``'s JSON: from disk if it is there, else from its runs.json."""
    path = Path(path)
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    found = _folded_for(path)
    if found is None or found[1] not in _files(found[0]):
        raise FileNotFoundError(f"{path}: neither on disk nor in a {NAME} above it")
    return _files(found[0])[found[1]]


def _write_entry(dest: Path, content) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(content, indent=1) + "\n", encoding="utf-8")


@contextlib.contextmanager
def materialize(paths: Sequence[str]) -> Iterator[list[str]]:
    """``paths`` for code that reads files: a path to a folded file, or to a folder with
    folded files at or below it, is replaced by a temporary copy under the same relative
    layout (a folder's files on disk copied in too); other paths are kept as they are."""
    with tempfile.TemporaryDirectory(prefix="folded-runs-") as tmp:
        out = []
        for i, p in enumerate(paths):
            found = {} if os.path.isfile(p) else entries(p)
            if not found:
                out.append(p)
                continue
            key = _folded_for(Path(p))[1]
            base = Path(tmp) / str(i)
            target = base / key
            if os.path.isdir(p):
                for f in Path(p).rglob("*.json"):
                    if f.name != NAME:
                        dst = target / f.relative_to(p)
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        dst.write_bytes(f.read_bytes())
            for k, v in found.items():
                if not (base / k).exists():     # a file on disk (not yet folded) wins
                    _write_entry(base / k, v)
            out.append(str(target))
        yield out


def fold(root: str | Path, patterns: Sequence[str], about: str | None = None, replace: bool = False,
         keep: bool = False) -> list[str]:
    """Fold the JSON files under ``root`` matching ``patterns`` (globs of their path below
    ``root``) into ``root/runs.json``, then delete them (unless ``keep``). A file already
    folded with other content is an error unless ``replace``. Returns the keys folded."""
    root = Path(root)
    folded = root / NAME
    data = load(folded) if folded.exists() else {"about": about or "", "files": {}}
    if about is not None:
        data["about"] = about
    found = []
    for f in sorted(root.rglob("*.json")):
        key = f.relative_to(root).as_posix()
        if key != NAME and any(fnmatch.fnmatchcase(key, pat) for pat in patterns):
            found.append((key, f))
    for key, f in found:
        content = json.loads(f.read_text(encoding="utf-8"))
        if key in data["files"] and data["files"][key] != content and not replace:
            raise FoldError(f"{key} is already in {folded} with other content (--replace to overwrite)")
        data["files"][key] = content
    _write(folded, data)
    _LOADED.pop(Path(os.path.abspath(folded)), None)
    if not keep:
        for key, f in found:
            f.unlink()
            d = f.parent
            while d != root and not any(d.iterdir()):
                d.rmdir()
                d = d.parent
    return [k for k, _ in found]


def unfold(folded: str | Path, dest: str | Path, prefix: str = "") -> list[str]:
    """Write the folded files (those whose key starts with ``prefix``) under ``dest``."""
    keys = []
    for key, content in load(folded)["files"].items():
        if key.startswith(prefix):
            _write_entry(Path(dest) / key, content)
            keys.append(key)
    return keys


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fold", help="fold raw JSON files under ROOT into ROOT/runs.json and delete them")
    f.add_argument("root")
    f.add_argument("patterns", nargs="+", help="globs of the files' paths below ROOT, e.g. 'coll-*.json'")
    f.add_argument("--about", help="what the folder's runs are (set once, when the file is made)")
    f.add_argument("--replace", action="store_true", help="overwrite runs already folded with other content")
    f.add_argument("--keep", action="store_true", help="keep the raw files")
    u = sub.add_parser("unfold", help="write the folded files out again")
    u.add_argument("folded")
    u.add_argument("dest")
    u.add_argument("prefix", nargs="?", default="")
    ls = sub.add_parser("list", help="the folded files' names")
    ls.add_argument("folded")
    ls.add_argument("prefix", nargs="?", default="")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "fold":
            keys = fold(args.root, args.patterns, args.about, args.replace, args.keep)
            print(f"folded {len(keys)} files into {Path(args.root) / NAME}")
        elif args.cmd == "unfold":
            keys = unfold(args.folded, args.dest, args.prefix)
            print(f"wrote {len(keys)} files under {args.dest}")
        else:
            print("\n".join(k for k in load(args.folded)["files"] if k.startswith(args.prefix)))
    except (FoldError, OSError, json.JSONDecodeError) as e:
        print(f"folded_runs: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
