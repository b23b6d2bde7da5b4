"""vLLM 0.33.0's Triton fused MoE (`fused_moe_kernel`) run as vLLM's `fused_experts_impl` runs it,
with glue written here: the kernel source and its tuned configs (the H200's, or another GPU's by
vLLM's name for it) are loaded from a folder given at run time (never part of this repository).

The glue reproduces what vLLM launches around the kernel, one launch per vLLM custom op:
- route alignment: vLLM's `moe_align_block_size` is a CUDA op; here triton_moe's own route grouping
  (one launch up to 2048 routes, two beyond) fills the same arrays (`sorted_token_ids` padded with
  the route count, one expert per block), so both sides pay the same for it. At small batches
  without an expert map vLLM skips alignment (`naive_block_assignment`, one block per route), and
  so does this glue;
- the activation between the GEMMs (`silu_and_mul`, `swigluoai_and_mul`): one Triton launch;
- block fp8: the per-token-group (1 x 128) e4m3 quantization of each GEMM's input: one launch each;
- the top-k sum (`moe_sum`): one launch, after zeroing the GEMM 2 output under an expert map (as
  vLLM does).

    peer = PeerFusedMoE.load(folder, spec, weights)   # folder: fused_moe_kernel.py + configs/
    peer = PeerFusedMoE.load(folder, spec, weights, tables=vllm_device_name())  # this GPU's tables
    call = peer.call(x, topk_weights, topk_ids, out)  # buffers for one input set
    call.run()        # the whole layer
    call.run_gemms()  # the two fused_moe_kernel launches alone, on the buffers run() filled
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch
import triton
import triton.language as tl
from hal.backends.triton_moe.kernel import ALIGN_CHUNK, ALIGN_TILE_ELEMENTS, ALIGN_WARPS, align_programs
from hal.backends.triton_moe.routing import align_routes_kernel, count_routes_kernel, scatter_routes_kernel

FP8_GROUP = 128
FP8_MAX = 448.0
QUANT_GROUPS_PER_PROGRAM = 8
ACT_BLOCK = 1024
SUM_BLOCK = 1024
COMPUTE_TYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def act_and_mul_kernel(c1_ptr, c2_ptr, I, alpha, limit, SWIGLU_OAI: tl.constexpr, BLOCK: tl.constexpr):
    """c2[r] = act(gate) * up from c1[r] ([rows, 2I]: gate then up halves, or interleaved for
    swiglu_oai), in fp32, stored in c2's dtype."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    if SWIGLU_OAI:
        gate = tl.load(c1_ptr + row * 2 * I + 2 * cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(c1_ptr + row * 2 * I + 2 * cols + 1, mask=ok, other=0.0).to(tl.float32)
        gate = tl.minimum(gate, limit)
        up = tl.clamp(up, -limit, limit)
        h = gate * tl.sigmoid(alpha * gate) * (up + 1.0)
    else:
        gate = tl.load(c1_ptr + row * 2 * I + cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(c1_ptr + row * 2 * I + I + cols, mask=ok, other=0.0).to(tl.float32)
        h = gate * tl.sigmoid(gate) * up
    tl.store(c2_ptr + row * I + cols, h.to(c2_ptr.dtype.element_ty), mask=ok)


@triton.jit
def group_quant_kernel(x_ptr, q_ptr, s_ptr, K, GROUPS: tl.constexpr, GROUP: tl.constexpr,
                       FP8_MAX: tl.constexpr):
    """Per-token-group e4m3 quantization: q = x / s, s = max|x| / 448 over each 1 x GROUP slice
    (scales [rows, K / GROUP], row-major)."""
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = group[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    ok = cols < K
    x = tl.load(x_ptr + row * K + cols, mask=ok, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / FP8_MAX
    q = tl.clamp(x / scale[:, None], -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * tl.cdiv(K, GROUP) + group, scale, mask=group * GROUP < K)


@triton.jit
def moe_sum_kernel(c3_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for slot in tl.static_range(TOP_K):
        acc += tl.load(c3_ptr + (token * TOP_K + slot) * H + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * H + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def _load_module(path: Path):
    module_spec = importlib.util.spec_from_file_location("peer_fused_moe_kernel", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


H200_TABLES = "NVIDIA_H200"


def vllm_device_name(device=None) -> str:
    """The device_name of vLLM's config files for this GPU: its CUDA name, spaces made underscores
    (vLLM 0.33.0's get_config_file_name), e.g. NVIDIA_H100_80GB_HBM3."""
    return torch.cuda.get_device_name(device).replace(" ", "_")


def config_file_name(local_experts: int, n: int, fp8: bool, device_name: str = H200_TABLES) -> str:
    """vLLM's get_config_file_name on the GPU named `device_name`: N is the intermediate size (w2's
    last dim)."""
    dtype = ",dtype=fp8_w8a8,block_shape=[128,128]" if fp8 else ""
    return f"E={local_experts},N={n},device_name={device_name}{dtype}.json"


def quantize_groups(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    rows, K = x.shape
    groups = math.ceil(K / FP8_GROUP)
    group_quant_kernel[(rows, triton.cdiv(groups, QUANT_GROUPS_PER_PROGRAM))](
        x, q, scale, K, GROUPS=QUANT_GROUPS_PER_PROGRAM, GROUP=FP8_GROUP, FP8_MAX=FP8_MAX)


class PeerFusedMoE:
    """The peer for one layer: its kernel module, its config table (or vLLM's default rule where
    none is tuned for the shape) and the layer's weights in vLLM's layout (the checkpoint's)."""

    def __init__(self, module, table, spec, weights, tables: str = H200_TABLES):
        self.module = module
        self.table = table  # {tokens: config} or None
        self.tables = tables  # the device_name whose tables were looked up
        self.spec = spec
        self.fp8 = spec.weight_format == "fp8_block128"
        if spec.weight_format not in ("bf16", "fp8_block128"):
            raise ValueError(f"weight_format={spec.weight_format!r}: the peer runs bf16 and fp8_block128")
        if spec.activation not in ("silu", "swiglu_oai"):
            raise ValueError(f"activation={spec.activation!r}: the peer glue runs silu and swiglu_oai")
        self.w13, self.w2 = weights.w13, weights.w2
        self.s13, self.s2 = weights.w13_scale, weights.w2_scale
        self.b13 = None if weights.b13 is None else weights.b13.float().contiguous()
        self.b2 = None if weights.b2 is None else weights.b2.float().contiguous()
        self.expert_map = weights.expert_map
        # vLLM's enable_swap_ab: Hopper only.
        device = weights.w13.device
        self.swap_ab_arch = device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)

    @classmethod
    def load(cls, folder, spec, weights, tables: str = H200_TABLES) -> PeerFusedMoE:
        """tables: the device_name of the tuned tables to look up (vLLM's default rule where none
        is tuned for the shape), as vLLM itself does on that GPU."""
        folder = Path(folder)
        module = _load_module(folder / "fused_moe_kernel.py")
        name = config_file_name(spec.local_experts, spec.intermediate_size, spec.weight_format != "bf16",
                                tables)
        path = folder / "configs" / name
        table = None
        if path.exists():
            raw = json.loads(path.read_text())
            raw.pop("triton_version", None)
            table = {int(k): v for k, v in raw.items()}
        return cls(module, table, spec, weights, tables)

    def config(self, tokens: int) -> dict:
        """vLLM's try_get_optimal_moe_config: the tuned entry nearest to `tokens`, else its default."""
        if self.table:
            return dict(self.table[min(self.table, key=lambda t: abs(t - tokens))])
        spec = self.spec
        return self.module.get_default_config(tokens, spec.local_experts, spec.intermediate_size,
                                              spec.hidden_size, spec.top_k,
                                              "fp8_w8a8" if self.fp8 else None,
                                              [128, 128] if self.fp8 else None)

    def config_source(self) -> str:
        if self.table:
            return f"tuned {self.tables} table"
        return f"vLLM default rule (no tuned {self.tables} table)"

    def call(self, x, topk_weights, topk_ids, out) -> PeerCall:
        return PeerCall(self, x, topk_weights, topk_ids, out)


class PeerCall:
    """One input set's buffers and launches (static shapes: a CUDA graph can capture run())."""

    def __init__(self, peer: PeerFusedMoE, x, topk_weights, topk_ids, out):
        spec = peer.spec
        self.peer, self.x, self.out = peer, x, out
        self.topk_weights = topk_weights.contiguous()
        self.topk_ids = topk_ids.contiguous()
        M, k, H, I = x.shape[0], spec.top_k, spec.hidden_size, spec.intermediate_size
        self.M = M
        self.config = peer.config(M)
        bm = self.config["BLOCK_SIZE_M"]
        dev = x.device
        routes = M * k
        self.naive = peer.expert_map is None and routes * 4 <= spec.num_experts
        if self.naive:
            self.sorted_ids = None
            self.expert_ids = self.topk_ids.view(-1)
            self.post_padded = torch.full((1,), routes * bm, dtype=torch.int32, device=dev)
        else:
            blocks = triton.cdiv(routes, bm) + min(spec.local_experts, routes)
            self.max_padded = blocks * bm
            self.sorted_ids = torch.empty(self.max_padded, dtype=torch.int32, device=dev)
            self.expert_ids = torch.empty(blocks, dtype=torch.int32, device=dev)
            # Blocks past the last used one hold expert -1: the kernel skips them (writes nothing,
            # every row is padding), as it skips blocks past num_tokens_post_padded.
            self.post_padded = torch.full((1,), self.max_padded, dtype=torch.int32, device=dev)
            self.bins = triton.next_power_of_2(spec.local_experts + 1)
            self.programs, self.chunk = align_programs(routes)
            self.cursor = torch.empty(self.programs, self.bins, dtype=torch.int32, device=dev)
            self.counts = torch.empty(self.programs, self.bins, dtype=torch.int32, device=dev)
        self.cache1 = torch.empty(M, k, spec.w13_rows, dtype=x.dtype, device=dev)
        self.cache2 = torch.empty(routes, I, dtype=x.dtype, device=dev)
        self.cache3 = torch.empty(M, k, H, dtype=x.dtype, device=dev)
        if peer.fp8:
            fp8 = peer.w13.dtype
            self.qx = torch.empty(M, H, dtype=fp8, device=dev)
            self.sx = torch.empty(M, math.ceil(H / FP8_GROUP), dtype=torch.float32, device=dev)
            self.q2 = torch.empty(routes, I, dtype=fp8, device=dev)
            self.s2 = torch.empty(routes, math.ceil(I / FP8_GROUP), dtype=torch.float32, device=dev)
        else:
            self.qx, self.sx, self.q2, self.s2 = x, None, self.cache2, None

    # --- launches ------------------------------------------------------------------------------
    def align(self) -> None:
        spec = self.peer.spec
        routes = self.M * spec.top_k
        ids, expert_map = self.topk_ids, self.peer.expert_map
        has_map = expert_map is not None
        id_map = expert_map if has_map else ids
        bm = self.config["BLOCK_SIZE_M"]
        block_chunk = max(16, ALIGN_TILE_ELEMENTS // self.bins)
        blocks = self.expert_ids.shape[0]
        if self.programs == 1:
            align_routes_kernel[(1,)](
                ids, id_map, self.sorted_ids, self.expert_ids, self.cursor, self.cursor, routes,
                spec.num_experts, self.max_padded, blocks, 0, LOCAL_EXPERTS=spec.local_experts,
                BINS=self.bins, BLOCK_M=bm, CHUNK=ALIGN_CHUNK, BLOCK_CHUNK=block_chunk, HAS_MAP=has_map,
                ZERO_COUNTERS=False, num_warps=ALIGN_WARPS)
            return
        count_routes_kernel[(self.programs,)](
            ids, id_map, self.counts, self.sorted_ids, routes, spec.num_experts, self.max_padded,
            LOCAL_EXPERTS=spec.local_experts, BINS=self.bins, CHUNK=self.chunk, HAS_MAP=has_map,
            num_warps=ALIGN_WARPS)
        scatter_routes_kernel[(self.programs,)](
            ids, id_map, self.counts, self.cursor, self.sorted_ids, self.expert_ids, routes,
            spec.num_experts, blocks, LOCAL_EXPERTS=spec.local_experts, BINS=self.bins, BLOCK_M=bm,
            CHUNK=self.chunk, PROGRAMS_POW2=triton.next_power_of_2(self.programs),
            BLOCK_CHUNK=block_chunk, HAS_MAP=has_map, num_warps=ALIGN_WARPS)

    def _gemm(self, a, a_scale, w, w_scale, bias, c, mul_routed_weight: bool, top_k: int) -> None:
        """vLLM's invoke_fused_moe_triton_kernel for these arguments."""
        peer = self.peer
        config = dict(self.config)
        bm, bn = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
        swap_ab = peer.fp8 and peer.swap_ab_arch and bm < 64 and bn >= 64
        num_tokens = a.shape[0] * top_k
        if self.sorted_ids is not None:
            em = self.sorted_ids.shape[0]
            if a.shape[0] < bm:
                em = min(em, a.shape[0] * top_k * bm)
        else:
            em = num_tokens * bm
        config["SPLIT_K"] = 1
        block_k = config.pop("BLOCK_SIZE_K")
        if peer.fp8:
            block_k = min(block_k, FP8_GROUP)
        grid = (triton.cdiv(em, bm) * triton.cdiv(w.shape[1], bn),)
        peer.module.fused_moe_kernel[grid](
            a, w, c, bias, a_scale, w_scale, self.topk_weights, self.sorted_ids, self.expert_ids,
            self.post_padded, w.shape[1], w.shape[2], em, num_tokens,
            a.stride(0), a.stride(1), w.stride(0), w.stride(2), w.stride(1), c.stride(1), c.stride(2),
            a_scale.stride(0) if a_scale is not None else 0, a_scale.stride(1) if a_scale is not None else 0,
            w_scale.stride(0) if w_scale is not None else 0,
            w_scale.stride(2) if w_scale is not None else 0,
            w_scale.stride(1) if w_scale is not None else 0,
            bias.stride(0) if bias is not None else 0, bias.stride(1) if bias is not None else 0,
            FP8_GROUP if peer.fp8 else 0, FP8_GROUP if peer.fp8 else 0,
            MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k,
            compute_type=COMPUTE_TYPES[c.dtype],
            use_fp8_w8a8=peer.fp8, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
            naive_block_assignment=self.sorted_ids is None, HAS_BIAS=bias is not None,
            BLOCK_SIZE_K=block_k, SWAP_AB=swap_ab, USE_TD=False, **config)

    def gemm1(self) -> None:
        p = self.peer
        self._gemm(self.qx, self.sx, p.w13, p.s13, p.b13, self.cache1, False, p.spec.top_k)

    def gemm2(self) -> None:
        p = self.peer
        self._gemm(self.q2, self.s2, p.w2, p.s2, p.b2, self.cache3, True, 1)

    def activation(self) -> None:
        spec = self.peer.spec
        rows, I = self.cache2.shape
        act_and_mul_kernel[(rows, triton.cdiv(I, ACT_BLOCK))](
            self.cache1, self.cache2, I, float(spec.swiglu_alpha), float(spec.swiglu_limit),
            SWIGLU_OAI=spec.activation == "swiglu_oai", BLOCK=ACT_BLOCK)

    def top_k_sum(self) -> None:
        H = self.peer.spec.hidden_size
        moe_sum_kernel[(self.M, triton.cdiv(H, SUM_BLOCK))](
            self.cache3, self.out, H, TOP_K=self.peer.spec.top_k, BLOCK=SUM_BLOCK)

    def run(self) -> None:
        if self.peer.fp8:
            quantize_groups(self.x, self.qx, self.sx)
        if self.sorted_ids is not None:
            self.align()
        self.gemm1()
        self.activation()
        if self.peer.fp8:
            quantize_groups(self.cache2, self.q2, self.s2)
        if self.peer.expert_map is not None:
            self.cache3.zero_()
        self.gemm2()
        self.top_k_sum()

    def run_gemms(self) -> None:
        self.gemm1()
        self.gemm2()
