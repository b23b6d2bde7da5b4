"""The W4AFP8 masked MoE kernel: both GEMMs, the activation and the FP8 requant between them on
Triton, fed in one of two ways that write the same bytes:

    requant  (default) the requant op (selected through hal.select_requant_kernel) writes
             per-tensor FP8 first, then GEMM 1 reads it;
    fused    GEMM 1 reads the per-token-group FP8 and requantizes it in registers: one launch
             fewer, at best even and up to 65% slower on an H200 (docs/backends/w4afp8.md), so it
             is the baseline.

On the folded path (33 rows per expert and more on sm_90) the requant feed is w4afp8's own launch,
which writes the per-tensor FP8 values as fp16 for the fp16 MMA to read (triton_feed.py).

The tile rule ("transposed", default; "per_group", the same without folding the weight scales, and
"rows_on_m", the previous tiles, are baselines) picks the GEMMs' path and tile from the expected
rows (configs.py)."""

from __future__ import annotations

from typing import Optional

import torch
from hal.backends.w4afp8 import configs, layer
from hal.backends.w4afp8.plan import W4AFp8Plan

from hal import traceable
from hal.kernel import MaskedMoEKernel

NAME = "w4afp8"
VARIANTS = ("requant", "fused")


class W4AFp8MaskedKernel(MaskedMoEKernel):
    backend = NAME

    def __init__(self, spec, target, variant: str = "requant", rule: str = "transposed",
                 tile: Optional[configs.GemmTile] = None):
        """tile: one transposed tile for every call instead of the rule's (tile sweeps)."""
        super().__init__(spec, target)
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} is not allowed: expected one of {VARIANTS}")
        if rule not in configs.RULES:
            raise ValueError(f"rule={rule!r} is not allowed: expected one of {configs.RULES}")
        if tile is not None and not (isinstance(tile, configs.GemmTile) and tile.transposed):
            raise ValueError(f"tile={tile!r}: expected a configs.GemmTile of a transposed path")
        self.variant = variant
        self.rule = rule
        self.tile = tile
        self.requant = self._select_requant() if variant == "requant" else None

    def mma_dtype(self, tile: configs.GemmTile) -> torch.dtype:
        """FP8 MMA on the fp8 paths, bf16 on the decode path, fp16 on the planes and folded paths;
        fp32 in Triton's CPU interpreter, which has none of them (the operands carry the same
        values either way)."""
        if self.device.type == "cpu":
            return torch.float32
        if tile.path in ("planes", "folded"):
            return torch.float16
        return torch.bfloat16 if tile.path == "decode" else self.fp8_dtype

    @property
    def magic_unpack(self) -> bool:
        """The decode path's PTX unpack (NVIDIA); shifts and masks elsewhere."""
        gpu = self.target.gpu
        return bool(gpu and gpu.vendor == "nvidia")

    def _select_requant(self):
        import hal

        spec = hal.RequantSpec(self.spec.local_experts, self.spec.hidden_size)
        return hal.select_requant_kernel(spec, self.target.device, caps=self.target.caps)

    def baselines(self) -> dict:
        """The other feed, and (for the default tile rule) the per-group and the previous rows-on-M
        tiles."""
        other = VARIANTS[1 - VARIANTS.index(self.variant)]
        out = {other: W4AFp8MaskedKernel(self.spec, self.target, other, self.rule)}
        if self.rule == "transposed":
            for rule in ("per_group", "rows_on_m"):
                out[rule] = W4AFp8MaskedKernel(self.spec, self.target, self.variant, rule)
        return out

    def _prepare(self, weights):
        return layer.prepare(self.spec, weights, self.device)

    def _launch(self, max_m: int, expected_rows: Optional[int], foldable: bool = True):
        """(tile, m-programs); weights whose scales cannot be folded take the per-group rule."""
        gpu = self.target.gpu
        rows = configs.tile_rows(max_m, expected_rows, self.rule)
        vendor, wgmma = gpu and gpu.vendor, bool(gpu and gpu.features.wgmma)
        tile = self.tile or configs.gemm_tile(rows, vendor, wgmma, self.rule)
        if tile.path == "folded" and not foldable:
            tile = configs.gemm_tile(rows, vendor, wgmma, "per_group")
        return tile, configs.m_grid(max_m, expected_rows, tile.block_m, tile.path)

    @traceable.between_graphs
    def _run(self, x, x_scale, masked_m, data, out, expected_rows):
        if x.dtype != self.fp8_dtype:
            raise ValueError(f"x has dtype {x.dtype}: expected {self.fp8_dtype}, the target's FP8")
        E, max_m, _ = x.shape
        if E == 0 or max_m == 0:
            return
        tile, m_programs = self._launch(max_m, expected_rows, data.foldable)
        # the folded path's fp16 MMA reads x and h as fp16 holding FP8 values
        values = torch.float16 if tile.path == "folded" else self.fp8_dtype
        if self.variant == "requant" and tile.path == "folded":
            x16 = torch.empty(x.shape, dtype=values, device=x.device)
            layer.requant_to_f16(x, x_scale, masked_m, data, x16)
            x, x_scale = x16, None
        elif self.variant == "requant":
            x = self.requant(x, x_scale, masked_m, data.w13_input_scale, expected_rows=expected_rows,
                             check=False)
            x_scale = None
        h = torch.empty((E, max_m, self.spec.intermediate_size), dtype=values, device=x.device)
        dot, magic = self.mma_dtype(tile), self.magic_unpack
        split1, split2 = self._splits(tile, m_programs)
        layer.gemm1(self.spec, x, x_scale, masked_m, data, h, tile, m_programs, dot, magic, split1,
                    self.fp8_dtype)
        layer.gemm2(self.spec, h, masked_m, data, out, tile, m_programs, dot, magic, split2)

    def _splits(self, tile: configs.GemmTile, m_programs: int) -> tuple:
        """K splits of (GEMM 1, GEMM 2): transposed tiles only, from the grid and the SM count."""
        if not tile.transposed:
            return 1, 1
        gpu = self.target.gpu
        sms = gpu.sm_count if gpu is not None else None
        E, H, inter = self.spec.local_experts, self.spec.hidden_size, self.spec.intermediate_size
        if tile.path == "planes":
            programs = lambda n: E * m_programs * -(-n // tile.block_n)
            warps = tile.num_warps
            return (configs.planes_split_k(programs(inter), warps, H // configs.GROUP_K, sms),
                    configs.planes_split_k(programs(H), warps, inter // configs.GROUP_K, sms))
        programs = lambda n: E * m_programs * -(-n // tile.block_n)
        return (configs.split_k(programs(inter), H // configs.GROUP_K, sms),
                configs.split_k(programs(H), inter // configs.GROUP_K, sms))

    def plan(self, masked_m=None, expected_rows: Optional[int] = None, max_m: Optional[int] = None):
        """max_m defaults to the largest count in masked_m. The plan is for weights whose scales fold
        exactly (layer.fold_shift); others take the per-group rule's tile."""
        live = rows = None
        if masked_m is not None:
            live, rows = int((masked_m > 0).sum()), int(masked_m.sum())
            if max_m is None:
                max_m = int(masked_m.max()) if masked_m.numel() else 0
        max_m = max_m or 0
        tile, m_programs = self._launch(max_m, expected_rows)
        blocks = lambda n: -(-n // tile.block_n)
        return W4AFp8Plan(
            self.variant, self.rule, tile, m_programs, blocks(self.spec.intermediate_size),
            blocks(self.spec.hidden_size), self.spec.local_experts, max_m, expected_rows,
            str(self.mma_dtype(tile)).replace("torch.", ""), self._splits(tile, m_programs), live, rows,
            self.requant.plan(max_m, expected_rows)
            if self.requant is not None and tile.path != "folded" else None)
