"""Make the peer folder of `benchmarks/triton_moe_peer.py` from a vLLM source tree: vLLM's Triton
`fused_moe_kernel`, the functions it and vLLM's default config rule (`get_default_config`) call,
and its tuned NVIDIA config tables (every GPU's: the benchmark takes the H200's or the running
GPU's). Nothing of vLLM is copied into this repository: the functions are read from --vllm when
this runs, and written to --out.

    python benchmarks/triton_moe_peer_build.py --vllm /path/to/vllm-0.33.0 --out .peer/tritonmoe
    python benchmarks/triton_moe_peer.py --peer .peer/tritonmoe ...

The functions are taken from vllm/model_executor/layers/fused_moe/fused_moe.py whole, with every
function of that file they call; the names they take from the rest of vLLM are given here
(PLATFORM_SHIM): Triton, vLLM's environment flags at their defaults (batch invariance off), and
the platform questions answered by the torch build.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import shutil
import sys
from pathlib import Path

SOURCE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
CONFIGS = "vllm/model_executor/layers/fused_moe/configs"
ENTRY_POINTS = ("fused_moe_kernel", "get_default_config")
CONFIG_GLOB = "*device_name=NVIDIA_*.json"
# The names the extracted functions take from outside their file, as vLLM's defaults.
SHIMMED = {"triton", "tl", "envs", "current_platform", "next_power_of_2"}
PLATFORM_SHIM = '''import torch
import triton
import triton.language as tl


class envs:  # vLLM's environment flags at their defaults
    VLLM_BATCH_INVARIANT = False


class current_platform:  # the torch build answers vLLM's platform questions
    @staticmethod
    def is_rocm() -> bool:
        return torch.version.hip is not None

    @staticmethod
    def is_cuda() -> bool:
        return torch.version.cuda is not None


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(n)
'''


def functions_needed(tree: ast.Module) -> tuple:
    """(the file's top-level functions the entry points reach, in file order; the names they read
    that the file does not define)."""
    defined = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    reached, outside, stack = set(), set(), list(ENTRY_POINTS)
    while stack:
        name = stack.pop()
        if name in reached:
            continue
        reached.add(name)
        node = defined[name]
        local = {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
                if n.id in defined:
                    stack.append(n.id)
                elif not hasattr(builtins, n.id):
                    outside.add(n.id)
    return [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in reached], outside


def build(vllm: Path, out: Path) -> Path:
    text = (vllm / SOURCE).read_text()
    nodes, outside = functions_needed(ast.parse(text))
    if outside - SHIMMED:
        raise SystemExit(f"{SOURCE} now needs names this tool does not provide: {sorted(outside - SHIMMED)}")
    lines = text.splitlines()
    parts = [f'"""Extracted from vLLM ({SOURCE}) by benchmarks/triton_moe_peer_build.py."""\n', PLATFORM_SHIM]
    for node in nodes:
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        parts.append("\n".join(lines[first - 1:node.end_lineno]) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    module = out / "fused_moe_kernel.py"
    module.write_text("\n\n".join(parts))
    (out / "configs").mkdir(exist_ok=True)
    tables = sorted((vllm / CONFIGS).glob(CONFIG_GLOB))
    for table in tables:
        shutil.copy(table, out / "configs" / table.name)
    print(f"{module}: {', '.join(node.name for node in nodes)}; {len(tables)} NVIDIA config tables")
    return module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", type=Path, required=True, help="an unpacked vLLM source tree (its sdist)")
    parser.add_argument("--out", type=Path, required=True, help="the peer folder to write")
    args = parser.parse_args(argv)
    build(args.vllm, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
