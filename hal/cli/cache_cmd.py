"""`hal cache list | verify | clear`: the compiled kernels in HAL_CACHE_DIR, each checked as a
build checks it before loading (owner, mode, size, sha256, key)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("cache", help="list, verify or clear the compiled kernel cache")
    actions = p.add_subparsers(dest="action", required=True)
    for action, text in (("list", "each entry's name, size and status"),
                         ("verify", "check every entry; exit 1 naming any that cannot be loaded"),
                         ("clear", "remove entries (all, or those of the named builds), printing each path; "
                                   "leave the cache alone while a build runs")):
        a = actions.add_parser(action, help=text)
        a.add_argument("names", nargs="*", help="build names (cpu_brgemm_avx2) or entry keys; default: all")
        if action == "list":
            a.add_argument("--json", action="store_true")
        a.set_defaults(run=run)


def _selected(root: Path, names) -> list:
    if not root.is_dir():
        return []
    entries = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [p for p in entries if not names or p.name in names or p.name.rsplit("_", 1)[0] in names]


def _row(entry: Path) -> dict:
    from hal import kernel_cache

    try:
        state = kernel_cache.inspect_entry(entry.parent, entry.name)
        status, reason = state.status, state.reason
        name = state.marker.get("name") or entry.name.rsplit("_", 1)[0]
        what = state.marker.get("what", "")
    except (kernel_cache.UntrustedCacheError, OSError) as exc:
        status, reason, name, what = "untrusted", str(exc), entry.name.rsplit("_", 1)[0], ""
    try:
        size = kernel_cache.entry_size(entry)
    except OSError:
        size = None
    return {"name": name, "key": entry.name, "what": what, "size": size, "status": status,
            "reason": reason, "path": str(entry)}


def run(args) -> int:
    from hal import kernel_cache

    root = kernel_cache.cache_dir()
    entries = _selected(root, args.names)
    if args.action == "clear":
        for entry in entries:
            shutil.rmtree(entry)
            print(f"removed {entry}")
        print(f"{len(entries)} entries removed from {root}")
        return 0
    rows = [_row(entry) for entry in entries]
    if args.action == "list":
        if args.json:
            print(json.dumps({"cache": str(root), "entries": rows}, indent=2))
            return 0
        print(f"{root}: {len(rows)} entries")
        for r in rows:
            size = f"{r['size'] / 2**20:.1f} MiB" if r["size"] is not None else "?"
            print(f"{r['name']:<24} {r['key']:<40} {size:>10}  {r['status']}"
                  + (f": {r['reason']}" if r["reason"] else ""))
        return 0
    bad = [r for r in rows if r["status"] != "ok"]
    for r in bad:
        print(f"BAD {r['path']}: {r['status']}" + (f": {r['reason']}" if r["reason"] else ""))
    print(f"{len(rows) - len(bad)} of {len(rows)} entries in {root} verified")
    return 1 if bad else 0
