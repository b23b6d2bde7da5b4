"""`hal profiles`: the recorded capability profiles any machine can show."""

from __future__ import annotations

import json


def add_parser(sub):
    p = sub.add_parser("profiles", help="list recorded capability profiles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    import hal

    rows = []
    for name in hal.profiles():
        caps = hal.probe(profile=name)
        gpu = caps.gpus[0] if caps.gpus else None
        rows.append({
            "name": name,
            "kind": "synthetic" if caps.synthetic else "captured",
            "cpu": caps.cpu.model_name,
            "gpu": f"{gpu.name} ({gpu.arch}, warp {gpu.warp_size})" if gpu else None,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no recorded profiles found")
        return 1
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['kind']:<9}  {r['gpu'] or '-'}  | {r['cpu'] or '-'}")
    return 0
