"""The Triton MoE kernel object: keeps the checkpoint weights as they are but for mxfp4 and int4,
which it repacks once for the tensor cores (mxfp4_repacked, int4_repacked: gate and up rows
interleaved; on int4's checkpoint path its gate/up columns are de-interleaved for swiglu_oai),
picks the launch config per token bucket, and runs a layer as four launches: align routes, GEMM 1
+ activation, GEMM 2 x top-k weight, top-k sum (five past ALIGN_ONE_PROGRAM_ROUTES routes, where
grouping the routes takes two), or, at decode where experts rarely share a route, two: GEMV 1 +
activation, GEMV 2 + top-k sum. w8a8 quantizes the input to e4m3 per row and 128 columns in the
grouping's first launch (quantized_grouping; a launch of its own where each block is one route).
Scratch sizes depend on the token count and top_k only, and nothing reads device values on the
host, so a call can be captured in a CUDA graph."""

from __future__ import annotations

import math
from typing import Optional, Union

import attrs
import torch
import triton
from hal.backends.triton_moe import configs, int4_repacked, mxfp4_repacked, split_k
from hal.backends.triton_moe.gemm import moe_gemm_kernel
from hal.backends.triton_moe.gemv import moe_gemv_first_kernel, moe_gemv_second_kernel
from hal.backends.triton_moe.plan import TritonMoEPlan
from hal.backends.triton_moe.quant import FP8_GROUP, quantize_groups_kernel
from hal.backends.triton_moe.quant import GROUPS_PER_PROGRAM as QUANT_GROUPS_PER_PROGRAM
from hal.backends.triton_moe.quantized_grouping import align_and_quantize_kernel, count_and_quantize_kernel
from hal.backends.triton_moe.routing import (
    align_routes_kernel,
    count_routes_kernel,
    scatter_routes_kernel,
    sum_routes_kernel,
)

from hal import traceable
from hal.backend import triton_interpreting
from hal.caps import GpuCaps
from hal.kernel import MoEKernel

NAME = "triton_moe"
LAUNCHES = 4  # with grouped routes; grouping many routes takes two launches
GEMV_LAUNCHES = 2
MXFP4_PATHS = (configs.REPACKED, "dot_scaled", "bits")
INT4_PATHS = (configs.REPACKED, "checkpoint")
SUM_BLOCK_H = 1024
ALIGN_WARPS = 8
ALIGN_CHUNK = 1024  # routes per step of the align kernel's loops
# Up to this many routes one program groups them (one launch); beyond, count_routes and
# scatter_routes share the work over up to ALIGN_MAX_PROGRAMS programs (two launches): one program
# took 143 us for the 32768 routes of qwen3-30b-a3b at 4096 tokens on the H200.
ALIGN_ONE_PROGRAM_ROUTES = 2048
ALIGN_MAX_PROGRAMS = 32
# The align kernel's block-owner step holds [blocks, bins] tiles: about this many elements.
ALIGN_TILE_ELEMENTS = 8192
WEIGHT_PATHS = {
    "bf16": "bf16 weights straight to the tensor cores",
    "fp8_block128": "e4m3 weights, 128x128 block scales applied per K step",
    "mxfp4": "e2m1 + e8m0 dequantized in registers to the activation dtype (w4a16)",
    "int4_g128": "uint4b8 dequantized in registers, group scales applied per K step (w4a16)",
}
REPACKED_PATH = "repacked by prepare_weights, decoded with integer operations (NVIDIA: and packed FMAs)"


@attrs.frozen
class TritonMoEWeights:
    w13: torch.Tensor
    w2: torch.Tensor
    s13: Optional[torch.Tensor]
    s2: Optional[torch.Tensor]
    b13: Optional[torch.Tensor]  # fp32 [E, w13 rows]
    b2: Optional[torch.Tensor]  # fp32 [E, H]
    expert_map: Optional[torch.Tensor]  # int32 [num_experts]
    gate_stride: int  # w13 row of gate column n is n * gate_stride; up is that + up_offset
    up_offset: int
    repacked: bool = False  # mxfp4 or int4 in repacked_words' layout (else the checkpoint's)
    scale_high: bool = False  # repacked mxfp4 with an e8m0 above 128: scaled in two multiplies


@attrs.frozen
class Launches:
    stages: list  # [(name, launch)] in order
    scratch: dict  # name -> tensor: sorted_routes, block_expert, h (GEMM 1 out), y (GEMM 2 out)


def _gpu_caps(target, device: torch.device) -> Optional[GpuCaps]:
    """The target's GPU, with the two fields the config rule reads filled from the runtime where a
    shallow probe left them out."""
    gpu = target.gpu
    if gpu is None or device.type != "cuda" or not torch.cuda.is_available():
        return gpu
    props = torch.cuda.get_device_properties(device)
    found = {}
    if gpu.sm_count is None:
        found["sm_count"] = props.multi_processor_count
    if gpu.smem_per_block_optin is None and hasattr(props, "shared_memory_per_block_optin"):
        found["smem_per_block_optin"] = props.shared_memory_per_block_optin
    return attrs.evolve(gpu, **found) if found else gpu


def align_programs(routes: int) -> tuple:
    """(programs, routes per program) of the route grouping: one program up to
    ALIGN_ONE_PROGRAM_ROUTES, else chunks of at least ALIGN_CHUNK over at most ALIGN_MAX_PROGRAMS."""
    if routes <= ALIGN_ONE_PROGRAM_ROUTES:
        return 1, ALIGN_CHUNK
    chunk = max(ALIGN_CHUNK, triton.next_power_of_2(triton.cdiv(routes, ALIGN_MAX_PROGRAMS)))
    return triton.cdiv(routes, chunk), chunk


def _interleave_rows(t: Optional[torch.Tensor], half: int) -> Optional[torch.Tensor]:
    """[E, 2 * half, ...] rows gate 0..half-1 then up -> gate 0, up 0, gate 1, up 1, ..."""
    if t is None:
        return None
    return torch.stack((t[:, :half], t[:, half:]), dim=2).flatten(1, 2).contiguous()


def _interleave_columns(t: torch.Tensor, half: int) -> torch.Tensor:
    """[..., 2 * half] columns gate 0..half-1 then up -> gate 0, up 0, gate 1, up 1, ..."""
    return torch.stack((t[..., :half], t[..., half:]), dim=-1).flatten(-2).contiguous()


def _deinterleave_columns(t: Optional[torch.Tensor], rows: int) -> Optional[torch.Tensor]:
    """int4 keeps output features in its last dim: gate (even) columns first, then up (odd)."""
    if t is None:
        return None
    order = torch.cat([torch.arange(0, rows, 2), torch.arange(1, rows, 2)]).to(t.device)
    return t.index_select(t.dim() - 1, order).contiguous()


class TritonMoEKernel(MoEKernel):
    backend = NAME

    def __init__(self, spec, target, *, fp8_act: Union[bool, str, None] = None,
                 dot_f32: Optional[bool] = None, mxfp4_path: Optional[str] = None,
                 int4_path: Optional[str] = None, gemv: Optional[bool] = None,
                 swap_ab: Optional[bool] = None, grouped_n: Optional[bool] = None):
        """fp8_act=True runs fp8 weights as w8a8, "x2" as w8a8 with each activation held as two e4m3
        terms, False as w8a16; None leaves it to the rule (see configs: w8a8x2 or w8a16, both within
        the contract). dot_f32 feeds the
        dots fp32 operands: the Triton interpreter's 16-bit dot is wrong, so it defaults to on
        there and off on a GPU. mxfp4_path: "repacked" (the default: weights repacked by
        prepare_weights, decoded exactly with integer operations, plain dots, the GEMMs at every
        size), or on the checkpoint layout "dot_scaled" (Triton's microscaled dot, and the GEMV at
        1 token) or "bits" (values built from bit patterns and two plain dots). int4_path:
        "repacked" (the default, likewise) or "checkpoint" (GPTQ's layout, group scales applied to
        each K step's tile in fp32).
        gemv=False runs decode through the grouped GEMMs (the rule's alternative, timed beside it
        by benchmarks/triton_moe_peer.py), gemv=True through the GEMV path for bf16 too (not for
        repacked mxfp4, which has none). swap_ab=True puts dequantized weights first in the dot
        (the rule does for repacked mxfp4, not elsewhere: measured slower on the H200), False
        never. grouped_n=False walks each block's N tiles in turn everywhere, True groups
        the blocks wherever the rule may (None: the rule's choice per GEMM)."""
        super().__init__(spec, target)
        if fp8_act is not None and fp8_act not in configs.FP8_ACT_VALUES:
            raise ValueError(f"fp8_act={fp8_act!r} is not allowed: expected None, False, True or 'x2'")
        if spec.act_quant == "fp8_g128":
            # The spec's numerics are w8a8's: the kernels must quantize as the oracle does, so
            # neither the 16-bit GEMV nor the two-term activations may stand in for them.
            if fp8_act not in (None, True) or gemv:
                raise ValueError(f"fp8_act={fp8_act!r}, gemv={gemv!r}: act_quant='fp8_g128' runs "
                                 "w8a8 (fp8_act=True) through the grouped GEMMs")
            fp8_act, gemv = True, False
        self.fp8_act = fp8_act
        self.dot_f32 = triton_interpreting() if dot_f32 is None else dot_f32
        if mxfp4_path not in (None, *MXFP4_PATHS):
            raise ValueError(f"mxfp4_path={mxfp4_path!r} is not allowed: expected one of "
                             + ", ".join(MXFP4_PATHS))
        self.mxfp4_path = mxfp4_path or configs.REPACKED
        if int4_path not in (None, *INT4_PATHS):
            raise ValueError(f"int4_path={int4_path!r} is not allowed: expected one of "
                             + ", ".join(INT4_PATHS))
        self.int4_path = int4_path or configs.REPACKED
        self.gemv = gemv
        self.swap_ab = swap_ab
        self.grouped_n = grouped_n
        if fp8_act is not None and spec.act_quant == "none":
            self.variant = {False: "w8a16", True: "w8a8", "x2": "w8a8x2"}[fp8_act]
        elif mxfp4_path is not None or int4_path is not None:
            self.variant = mxfp4_path or int4_path
        self._gpu = None
        self._configs: dict = {}

    def baselines(self) -> dict:
        """The other numerics or code path of the same layer, timed beside it by `hal bench`."""
        if self.variant != "default":
            return {}
        if self.spec.weight_format == "fp8_block128":
            exact = attrs.evolve(self.spec, act_quant="none")
            if self.spec.act_quant != "none":  # the default exact numerics, timed beside w8a8
                return {"exact": TritonMoEKernel(exact, self.target)}
            return {"w8a16": TritonMoEKernel(exact, self.target, fp8_act=False),
                    "w8a8": TritonMoEKernel(exact, self.target, fp8_act=True)}
        if self.spec.weight_format == "mxfp4" and not self.dot_f32:
            other = "bits" if self.mxfp4_path == "dot_scaled" else "dot_scaled"
            return {other: TritonMoEKernel(self.spec, self.target, mxfp4_path=other)}
        if self.spec.weight_format == "int4_g128":
            other = "checkpoint" if self.int4_path == configs.REPACKED else configs.REPACKED
            return {other: TritonMoEKernel(self.spec, self.target, int4_path=other)}
        return {}

    # --- config --------------------------------------------------------------------------------
    def config(self, tokens: int) -> configs.LaunchConfig:
        bucket = configs.token_bucket(tokens)
        chosen = self._configs.get(bucket)
        if chosen is None:
            if self._gpu is None:
                self._gpu = _gpu_caps(self.target, self.device)
            chosen = configs.choose(self.spec, self._gpu, bucket, self.fp8_act, self.gemv, self.swap_ab,
                                    mxfp4_path=self.mxfp4_path, int4_path=self.int4_path,
                                    grouped_n=self.grouped_n)
            self._configs[bucket] = chosen
        return chosen

    def plan(self, topk_ids) -> TritonMoEPlan:
        tokens = topk_ids if isinstance(topk_ids, int) else int(topk_ids.shape[0])
        config = self.config(tokens)
        _, blocks = configs.max_rows(tokens, self.spec, config.block_m)
        path = WEIGHT_PATHS[self.spec.weight_format] + (f"; {REPACKED_PATH}" if self._repacked() else "")
        if config.gemv1 is not None:
            path += "; GEMV: weights converted to fp32 in registers, one fused multiply-add each"
            return TritonMoEPlan(tokens, config, 0, GEMV_LAUNCHES, path)
        if self.spec.weight_format == "fp8_block128":
            path += ((", two fp8 x fp8 dots per K step" if config.act_terms == 2 else ", fp8 x fp8 dots")
                     if config.fp8_act else ", converted to 16 bits in registers")
        if config.per_route:  # no grouping launch: w8a8 quantizes x in one of its own
            return TritonMoEPlan(tokens, config, tokens * self.spec.top_k, LAUNCHES - 1 + int(config.fp8_act),
                                 path)
        programs, _ = align_programs(tokens * self.spec.top_k)
        return TritonMoEPlan(tokens, config, blocks, LAUNCHES + (programs > 1), path)

    # --- weights -------------------------------------------------------------------------------
    def _prepare(self, weights) -> TritonMoEWeights:
        spec = self.spec
        # prepare_weights has validated the map (int32, [num_experts], local ids, no duplicates).
        expert_map = None if weights.expert_map is None else weights.expert_map.contiguous()
        w13, s13, b13 = weights.w13, weights.w13_scale, weights.b13
        gate_stride, up_offset = 1, spec.intermediate_size
        repacked = self._repacked()
        if spec.activation == "swiglu_oai":
            if spec.weight_format == "int4_g128" and not repacked:
                w13 = _deinterleave_columns(w13, spec.w13_rows)
                s13 = _deinterleave_columns(s13, spec.w13_rows)
                b13 = _deinterleave_columns(b13, spec.w13_rows)
            else:
                gate_stride, up_offset = 2, 1
        bias = (lambda b: None if b is None else b.to(torch.float32).contiguous())
        keep = (lambda t: None if t is None else t.contiguous())
        w2, s2, scale_high = weights.w2, weights.w2_scale, False
        if repacked and spec.gated and gate_stride == 1:
            # Gate row n next to up row n: GEMM 1 takes both in one tile.
            half = spec.intermediate_size
            if spec.weight_format == "int4_g128":  # its rows are the checkpoint's last dim
                w13, s13 = _interleave_columns(w13, half), _interleave_columns(s13, half)
            else:
                w13, s13 = _interleave_rows(w13, half), _interleave_rows(s13, half)
            b13 = _interleave_rows(b13, half)
            gate_stride, up_offset = 2, 1
        if repacked and spec.weight_format == "int4_g128":
            (w13, s13), (w2, s2) = int4_repacked.repack(w13, s13), int4_repacked.repack(w2, s2)
        elif repacked:
            w13, s13, high13 = mxfp4_repacked.repack(w13, s13)
            w2, s2, high2 = mxfp4_repacked.repack(w2, s2)
            scale_high = high13 or high2
        return TritonMoEWeights(keep(w13), keep(w2), keep(s13), keep(s2), bias(b13), bias(weights.b2),
                                expert_map, gate_stride, up_offset, repacked, scale_high)

    def _repacked(self) -> bool:
        fmt = self.spec.weight_format
        return ((fmt == "mxfp4" and self.mxfp4_path == configs.REPACKED)
                or (fmt == "int4_g128" and self.int4_path == configs.REPACKED))

    def _pair_fma(self) -> bool:
        """Repacked weights scaled by packed 16-bit FMAs (NVIDIA's inline PTX; the dots 16-bit)."""
        gpu = self.target.gpu
        return self._repacked() and not self.dot_f32 and bool(gpu and gpu.vendor == "nvidia")

    # --- per call ------------------------------------------------------------------------------
    def _gemm(self, first: bool, a, a_scale, w, s, bias, out, out_scale, sorted_routes, block_expert,
              topk_weights, ids, id_map, has_map: bool, num_routes: int, n: int, k: int, n_total: int,
              gate_stride: int, up_offset: int, block_m: int, gemm: configs.GemmConfig, fp8_act: bool,
              act_terms: int, per_route: bool, scale_high: bool, split: Optional[tuple]):
        """One expert GEMM launch. a_scale: the e4m3 input's scales (None: a is 16-bit, quantized in
        registers under w8a8); out_scale: GEMM 1 writes e4m3 + these scales (None: out's dtype);
        act_terms: e4m3 terms per quantized activation (each row holds them one after another, in
        units of the row's one scale per 128 columns); split: (workspace, zeroed counters) where
        gemm.split_k > 1."""
        spec = self.spec
        fmt = spec.weight_format
        group = (k if spec.group_size == -1 else spec.group_size) if fmt == "int4_g128" else 128
        blocks = num_routes if per_route else block_expert.shape[0]
        tiles = blocks * triton.cdiv(n, gemm.block_n)
        if gemm.split_k > triton.cdiv(k, gemm.block_k):
            raise ValueError(f"split_k={gemm.split_k}: more than the {triton.cdiv(k, gemm.block_k)} K steps "
                             f"of {'GEMM 1' if first else 'GEMM 2'} (each split walks at least one)")
        ws, counters = (w, w) if split is None else split  # any tensor where K is not split
        moe_gemm_kernel[(tiles, gemm.split_k)](
            a, w if a_scale is None else a_scale, w, w if s is None else s, w if bias is None else bias,
            out, w if out_scale is None else out_scale, sorted_routes, block_expert,
            topk_weights, ids, id_map, ws, counters, num_routes, spec.num_experts, n, k, n_total, w.stride(0),
            0 if s is None else s.stride(0), math.ceil(k / 128), group, gate_stride, up_offset,
            float(spec.swiglu_alpha), float(spec.swiglu_limit),
            FIRST=first, TOP_K=spec.top_k, FORMAT=configs.FORMAT_CODES[fmt],
            ACTIVATION=configs.ACTIVATION_CODES[spec.activation], HAS_BIAS=bias is not None,
            A_FP8=fp8_act and fmt == "fp8_block128", A_TERMS=act_terms, A_QUANTIZED=a_scale is not None,
            OUT_FP8=out_scale is not None, DOT_F32=self.dot_f32,
            MXFP4_DOT_SCALED=self.mxfp4_path == "dot_scaled", REPACKED=self._repacked(),
            SCALE_HIGH=scale_high, PAIR_FMA=self._pair_fma(),
            A_FORMAT="fp16" if spec.act_dtype == "float16" else "bf16",
            BLOCK_M=block_m, BLOCK_N=gemm.block_n, BLOCK_K=gemm.block_k, SWAP_AB=gemm.swap_ab,
            PER_ROUTE=per_route, LOCAL_EXPERTS=spec.local_experts, HAS_MAP=has_map, GROUP_M=gemm.group_m,
            SPLIT_K=gemm.split_k, num_warps=gemm.num_warps, num_stages=gemm.num_stages)

    @traceable.between_graphs
    def _run(self, x, topk_weights, topk_ids, data: TritonMoEWeights, out) -> None:
        for _, launch in self.launches(x, topk_weights, topk_ids, data, out).stages:
            launch()

    def _gemv_launches(self, x, topk_weights, topk_ids, data: TritonMoEWeights, out, config) -> Launches:
        spec = self.spec
        M, H, I = x.shape[0], spec.hidden_size, spec.intermediate_size
        routes = M * spec.top_k
        ids = topk_ids.contiguous()
        weights = topk_weights.contiguous()
        has_map = data.expert_map is not None
        id_map = data.expert_map if has_map else ids  # any tensor where there is no map
        h = torch.empty(routes, I, dtype=x.dtype, device=x.device)
        fmt = configs.FORMAT_CODES[spec.weight_format]
        no_scale = (lambda t, w: w if t is None else t)  # noqa: E731
        g1, g2 = config.gemv1, config.gemv2

        def gemv1():
            moe_gemv_first_kernel[(routes, triton.cdiv(I, g1.block_n))](
                x, ids, id_map, data.w13, no_scale(data.s13, data.w13), no_scale(data.b13, data.w13), h,
                routes, spec.num_experts, I, H, spec.w13_rows, data.w13.stride(0),
                0 if data.s13 is None else data.s13.stride(0), math.ceil(H / 128), data.gate_stride,
                data.up_offset, float(spec.swiglu_alpha), float(spec.swiglu_limit),
                TOP_K=spec.top_k, LOCAL_EXPERTS=spec.local_experts, HAS_MAP=has_map, FORMAT=fmt,
                ACTIVATION=configs.ACTIVATION_CODES[spec.activation], HAS_BIAS=data.b13 is not None,
                BLOCK_N=g1.block_n, BLOCK_K=g1.block_k, num_warps=g1.num_warps)

        def gemv2_top_k_sum():
            moe_gemv_second_kernel[(M, triton.cdiv(H, g2.block_n))](
                h, ids, id_map, weights, data.w2, no_scale(data.s2, data.w2), no_scale(data.b2, data.w2),
                out, routes, spec.num_experts, H, I, data.w2.stride(0),
                0 if data.s2 is None else data.s2.stride(0), math.ceil(I / 128),
                TOP_K=spec.top_k, LOCAL_EXPERTS=spec.local_experts, HAS_MAP=has_map, FORMAT=fmt,
                HAS_BIAS=data.b2 is not None, BLOCK_N=g2.block_n, BLOCK_K=g2.block_k,
                num_warps=g2.num_warps)

        return Launches([("gemv1", gemv1), ("gemv2_top_k_sum", gemv2_top_k_sum)], dict(h=h))

    def launches(self, x, topk_weights, topk_ids, data: TritonMoEWeights, out) -> Launches:
        """The call's dependent launches, in order, over scratch allocated here. `_run` runs them;
        a benchmark may time them one by one, a test read the scratch between them."""
        spec = self.spec
        if data.repacked != self._repacked():
            raise ValueError("prepared holds weights in another layout than this kernel's (mxfp4_path="
                             f"{self.mxfp4_path!r}, int4_path={self.int4_path!r}): call this kernel's "
                             "prepare_weights")
        M, H, I = x.shape[0], spec.hidden_size, spec.intermediate_size
        routes = M * spec.top_k
        config = self.config(M)
        if config.gemv1 is not None:
            return self._gemv_launches(x, topk_weights, topk_ids, data, out, config)
        bm = config.block_m
        max_padded, max_blocks = configs.max_rows(M, spec, bm)
        device = x.device
        ids = topk_ids.contiguous()
        weights = topk_weights.contiguous()
        expert_map = data.expert_map
        has_map = expert_map is not None
        id_map = expert_map if has_map else ids  # any tensor where there is no map
        sorted_routes = torch.empty(max_padded, dtype=torch.int32, device=device)
        block_expert = torch.empty(max_blocks, dtype=torch.int32, device=device)
        bins = triton.next_power_of_2(spec.local_experts + 1)
        cursor = torch.empty(bins, dtype=torch.int32, device=device)
        per_route = config.per_route
        # GEMM 1's output: a row per padded row of the blocks, or per route where each is a block.
        h_rows = routes if per_route else max_padded
        fp8 = data.w13.dtype
        terms = config.act_terms
        h = (torch.empty(h_rows, terms * I, dtype=fp8, device=device) if config.h_fp8
             else torch.empty(h_rows, I, dtype=x.dtype, device=device))
        h_scale = (torch.empty(h_rows, math.ceil(I / FP8_GROUP), dtype=torch.float32, device=device)
                   if config.h_fp8 else None)
        y = torch.empty(routes, H, dtype=x.dtype, device=device)
        x_q, x_scale = x, None
        if config.fp8_act:
            x_q = torch.empty(M, terms * H, dtype=fp8, device=device)
            x_scale = torch.empty(M, math.ceil(H / FP8_GROUP), dtype=torch.float32, device=device)

        blocks = routes if per_route else max_blocks
        programs, chunk = align_programs(routes)
        # The one-program grouping zeroes the K-split counters: exactly where `align` below is the
        # grouping launch (w8a8's grouping launch does not zero them, per-route blocks have none).
        zeroing = not per_route and programs == 1 and not config.fp8_act
        counters, (split1, split2) = split_k.scratch(blocks, bm, (I, config.gemm1, spec.gated),
                                                     (H, config.gemm2, False), zeroed_by_grouping=zeroing,
                                                     device=device)
        groups = math.ceil(H / FP8_GROUP)
        parts = triton.cdiv(groups, QUANT_GROUPS_PER_PROGRAM)  # quantizing programs per row of x

        def quantize_x():
            quantize_groups_kernel[(M, parts)](x, x_q, x_scale, H, groups, GROUPS=QUANT_GROUPS_PER_PROGRAM,
                                               TERMS=terms)

        block_chunk = max(16, ALIGN_TILE_ELEMENTS // bins)

        def align():
            align_routes_kernel[(1,)](
                ids, id_map, sorted_routes, block_expert, cursor, cursor if counters is None else counters,
                routes, spec.num_experts, max_padded, max_blocks, 0 if counters is None else counters.numel(),
                LOCAL_EXPERTS=spec.local_experts, BINS=bins, BLOCK_M=bm, CHUNK=ALIGN_CHUNK,
                BLOCK_CHUNK=block_chunk, HAS_MAP=has_map, ZERO_COUNTERS=counters is not None,
                num_warps=ALIGN_WARPS)

        def align_quantize_x():
            align_and_quantize_kernel[(1 + M * parts,)](
                ids, id_map, sorted_routes, block_expert, cursor, routes, spec.num_experts, max_padded,
                max_blocks, x, x_q, x_scale, H, groups, parts, LOCAL_EXPERTS=spec.local_experts, BINS=bins,
                BLOCK_M=bm, CHUNK=ALIGN_CHUNK, BLOCK_CHUNK=block_chunk, HAS_MAP=has_map,
                GROUPS=QUANT_GROUPS_PER_PROGRAM, TERMS=terms, num_warps=ALIGN_WARPS)

        counts = torch.empty(programs, bins, dtype=torch.int32, device=device)
        cursors = torch.empty(programs, bins, dtype=torch.int32, device=device)

        def count_routes():
            count_routes_kernel[(programs,)](
                ids, id_map, counts, sorted_routes, routes, spec.num_experts, max_padded,
                LOCAL_EXPERTS=spec.local_experts, BINS=bins, CHUNK=chunk, HAS_MAP=has_map,
                num_warps=ALIGN_WARPS)

        def count_routes_quantize_x():
            count_and_quantize_kernel[(programs + M * parts,)](
                ids, id_map, counts, sorted_routes, routes, spec.num_experts, max_padded, programs, x, x_q,
                x_scale, H, groups, parts, LOCAL_EXPERTS=spec.local_experts, BINS=bins, CHUNK=chunk,
                HAS_MAP=has_map, GROUPS=QUANT_GROUPS_PER_PROGRAM, TERMS=terms, num_warps=ALIGN_WARPS)

        def scatter_routes():
            scatter_routes_kernel[(programs,)](
                ids, id_map, counts, cursors, sorted_routes, block_expert, routes, spec.num_experts,
                max_blocks, LOCAL_EXPERTS=spec.local_experts, BINS=bins, BLOCK_M=bm, CHUNK=chunk,
                PROGRAMS_POW2=triton.next_power_of_2(programs), BLOCK_CHUNK=block_chunk, HAS_MAP=has_map,
                num_warps=ALIGN_WARPS)

        def gemm1():
            self._gemm(True, x_q, x_scale, data.w13, data.s13, data.b13, h, h_scale, sorted_routes,
                       block_expert, weights, ids, id_map, has_map, routes, I, H, spec.w13_rows,
                       data.gate_stride, data.up_offset, bm, config.gemm1, config.fp8_act, terms, per_route,
                       data.scale_high, split1)

        def gemm2():
            self._gemm(False, h, h_scale, data.w2, data.s2, data.b2, y, None, sorted_routes, block_expert,
                       weights, ids, id_map, has_map, routes, H, I, H, 1, 0, bm, config.gemm2,
                       config.fp8_act, terms, per_route, data.scale_high, split2)

        def top_k_sum():
            sum_routes_kernel[(M, triton.cdiv(H, SUM_BLOCK_H))](
                y, ids, id_map, out, routes, spec.num_experts, H, TOP_K=spec.top_k,
                LOCAL_EXPERTS=spec.local_experts, HAS_MAP=has_map, BLOCK_H=SUM_BLOCK_H)

        # w8a8 quantizes x in the grouping's first launch, or alone where a block is a route.
        if per_route:
            grouping = [("quantize_x", quantize_x)] if config.fp8_act else []
        elif programs == 1:
            grouping = [("align_quantize_x", align_quantize_x) if config.fp8_act else ("align", align)]
        else:
            grouping = [("count_routes_quantize_x", count_routes_quantize_x) if config.fp8_act
                        else ("count_routes", count_routes), ("scatter_routes", scatter_routes)]
        return Launches(grouping + [("gemm1", gemm1), ("gemm2", gemm2), ("top_k_sum", top_k_sum)],
                        dict(sorted_routes=sorted_routes, block_expert=block_expert, h=h, h_scale=h_scale,
                             x_q=x_q, x_scale=x_scale, y=y))
