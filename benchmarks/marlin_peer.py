"""marlin side by side with vLLM's Marlin MoE (built by benchmarks/marlin_peer_build.py), on one GPU:
same GPTQ int4 weights (repacked to each kernel's layout by its own repack), same tokens and
routings, L2 flushed before every timed call, each call a CUDA graph replayed between two events,
medians; ratio = peer time / marlin time (above 1: marlin faster). Without --peer only marlin runs;
--triton-moe adds triton_moe's int4 (the other int4 kernel on NVIDIA) on the same weights and inputs.

    python benchmarks/marlin_peer.py --peer .peer/marlin/build/libhal_peer_vllm_marlin.so \
        [--shapes mixtral-8x7b,qwen3-30b-a3b] [--tokens 1,8,64,256,2048] [--sweep-tokens 16,64,256]
        [--sweep-all-splits] [--sweep-block-m 8] [--triton-moe] [--out results.jsonl]

The peer layer is vLLM 0.33.0's fused_marlin_moe path: its block-size rule, moe_align_block_size,
GEMM 1 (fp32 reduce, no atomics), the activation, GEMM 2 with the top-k weight, and the top-k sum
(torch.sum, or a pad-aware sum under expert parallelism), with vLLM's own config choice.

--sweep-tokens times marlin's whole layer for every compiled block_m and every config of each GEMM
(the other GEMM at the rule's choice for that block_m, K splits as the rule sets them for that
config), so the config rule can be checked against measurement."""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import math
import statistics
import sys
import time

import attrs
import torch
from device_weights import device_weights  # benchmarks/ is on sys.path when run as a script

from hal.bench.ratios import geomean
from hal.bench.table import table_lines
from hal.presets import PRESETS
from hal.spec import MoESpec, MoEWeights

ROTATE = 4  # input sets (tokens + routing) cycled through; each is its own CUDA graph
# Read before every timed call: over 4x the H200's 60 MB L2. Read, not written: a written buffer
# leaves L2 full of dirty lines whose write-back would then compete with the timed call's loads
# (up to ~60 MB, ~14 us at 4.3 TB/s, most of a decode call).
FLUSH_BYTES = 256 << 20
BLOCK_M_PEER = (8, 16, 32, 48, 64)  # vLLM's moe_block_size candidates
GPT_OSS_LIKE = dict(num_experts=128, top_k=4, hidden_size=2944, intermediate_size=2944,
                    weight_format="int4_g128", activation="swiglu_oai")


def shape_specs() -> dict:
    """The benchmark's layers. The gpt-oss-120b-like layer rounds gpt-oss's 2880 up to 2944, a
    multiple of the 128-wide scale group."""
    return {
        "mixtral-8x7b": PRESETS["mixtral-8x7b"].spec("int4_g128"),
        "qwen3-30b-a3b": PRESETS["qwen3-30b-a3b"].spec("int4_g128"),
        "deepseek-v3-ep8": PRESETS["deepseek-v3"].spec("int4_g128", num_local_experts=32),
        "qwen3-235b-a22b": PRESETS["qwen3-235b-a22b"].spec("int4_g128"),
        "kimi-k2-ep8": PRESETS["kimi-k2"].spec("int4_g128", num_local_experts=48),
        "gpt-oss-like-bias": MoESpec(**GPT_OSS_LIKE, has_bias=True),
        "gpt-oss-like": MoESpec(**GPT_OSS_LIKE, has_bias=False),
    }


def input_sets(spec: MoESpec, tokens: int):
    from hal.synth import random_routing, random_tokens

    out = []
    for i in range(ROTATE):
        x = random_tokens(spec, tokens, seed=1000 + i, device="cuda")
        tw, ti = random_routing(spec, tokens, "uniform", seed=2000 + i, device="cuda")
        out.append((x, tw.float().contiguous(), ti.to(torch.int32).contiguous()))
    return out


# --- the peer ---------------------------------------------------------------------------------
def load_peer(path: str):
    lib = ctypes.CDLL(path)
    p, i, f, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64
    lib.hal_peer_gemm.argtypes = [p] * 11 + [i] * 12 + [p]
    lib.hal_peer_align.argtypes = [p, i, i, i, i, p, i, p, p, p, p, p]
    lib.hal_peer_repack.argtypes = [p, p, i, i, p]
    lib.hal_peer_act_mul.argtypes = [p, p, i64, i, i, f, f, p]
    lib.hal_peer_moe_sum.argtypes = [p, p, p, p, i64, i, i, p]
    for name in ("hal_peer_gemm", "hal_peer_align", "hal_peer_repack", "hal_peer_act_mul",
                 "hal_peer_moe_sum"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def _ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def _ok(rc: int, what: str):
    if rc:
        raise RuntimeError(f"peer {what} returned {rc}")


# vLLM's marlin scale and bias permutations (marlin_utils.get_scale_perms), as index lists.
SCALE_PERM = [i + 8 * j for i in range(8) for j in range(8)]
SCALE_PERM_SINGLE = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]


class PeerLayer:
    """vLLM 0.33.0's fused_marlin_moe for one spec, with preallocated buffers per token count."""

    def __init__(self, lib, spec: MoESpec, weights: MoEWeights):
        self.lib, self.spec = lib, spec
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.w13 = self._repack(weights.w13, spec.hidden_size, spec.w13_rows)
        self.w2 = self._repack(weights.w2, spec.intermediate_size, spec.hidden_size)
        self.s13 = self._scales(weights.w13_scale)
        self.s2 = self._scales(weights.w2_scale)
        perm = torch.tensor(SCALE_PERM_SINGLE, device="cuda")
        self.b13 = self.b2 = None
        if weights.b13 is not None:
            self.b13 = self._bias(weights.b13, perm)
            self.b2 = self._bias(weights.b2, perm)
        self.expert_map = weights.expert_map
        self.workspace = torch.zeros(self.sms * 4, dtype=torch.int32, device="cuda")
        self._buffers = {}

    def _repack(self, q, k, n):
        out = torch.empty((q.shape[0], k // 16, n * 2), dtype=torch.int32, device="cuda")
        for e in range(q.shape[0]):
            _ok(self.lib.hal_peer_repack(_ptr(q[e].contiguous()), _ptr(out[e]), k, n, _stream()), "repack")
        return out

    @staticmethod
    def _scales(s):
        n = s.shape[-1]
        perm = torch.tensor(SCALE_PERM, device=s.device)
        return s.reshape(s.shape[0], -1, len(perm))[:, :, perm].reshape(s.shape[0], -1, n).contiguous()

    @staticmethod
    def _bias(b, perm):
        return b.reshape(b.shape[0], -1, len(perm))[:, :, perm].reshape(b.shape).bfloat16().contiguous()

    def block_m(self, tokens: int) -> int:
        spec = self.spec
        E = spec.local_experts
        m = tokens if not spec.is_ep else math.ceil(tokens * E / spec.num_experts)
        for bm in BLOCK_M_PEER:
            if m * spec.top_k / E / bm < 0.9:
                break
        return bm

    def buffers(self, tokens: int) -> dict:
        got = self._buffers.get(tokens)
        if got is not None:
            return got
        spec = self.spec
        bm = self.block_m(tokens)
        numel = tokens * spec.top_k
        pad = numel + spec.num_experts * (bm - 1)
        if numel < spec.num_experts:
            pad = min(numel * bm, pad)
        routes = tokens * spec.top_k
        H, I, R = spec.hidden_size, spec.intermediate_size, spec.w13_rows
        tmp = min(max(R, H) * pad, self.sms * 4 * bm * 256) * (2 if bm == 8 else 1)
        dev = dict(device="cuda")
        got = dict(bm=bm, pad=pad, sorted=torch.empty(pad, dtype=torch.int32, **dev),
                   expert_ids=torch.empty(-(-pad // bm), dtype=torch.int32, **dev),
                   npp=torch.empty(1, dtype=torch.int32, **dev),
                   cumsum=torch.empty(spec.num_experts + 1, dtype=torch.int32, **dev),
                   c_tmp=torch.empty(tmp, dtype=torch.float32, **dev),
                   c1=torch.empty(routes, R, dtype=torch.bfloat16, **dev),
                   c2=torch.empty(routes, I, dtype=torch.bfloat16, **dev),
                   c3=torch.empty(routes, H, dtype=torch.bfloat16, **dev))
        self._buffers[tokens] = got
        return got

    def __call__(self, x, tw, ti, out):
        spec, lib, b = self.spec, self.lib, self.buffers(x.shape[0])
        M, K = x.shape
        top_k, E = spec.top_k, spec.local_experts
        H, I, R = spec.hidden_size, spec.intermediate_size, spec.w13_rows
        stream = _stream()
        emap = _ptr(self.expert_map)
        _ok(lib.hal_peer_align(_ptr(ti), ti.numel(), top_k, spec.num_experts, b["bm"], _ptr(b["sorted"]),
                               b["pad"], _ptr(b["expert_ids"]), _ptr(b["npp"]), emap, _ptr(b["cumsum"]),
                               stream), "align")
        common = (_ptr(self.workspace), _ptr(b["sorted"]), _ptr(b["expert_ids"]), _ptr(b["npp"]), _ptr(tw))
        _ok(lib.hal_peer_gemm(_ptr(x), _ptr(self.w13), _ptr(b["c1"]), _ptr(b["c_tmp"]), _ptr(self.b13),
                              _ptr(self.s13), *common, b["bm"], E, top_k, 0, M, R, K, 128, self.sms,
                              -1, -1, -1, stream), "gemm 1")
        _ok(lib.hal_peer_act_mul(_ptr(b["c1"]), _ptr(b["c2"]), M * top_k, I,
                                 1 if spec.activation == "swiglu_oai" else 0, spec.swiglu_alpha,
                                 spec.swiglu_limit, stream), "activation")
        _ok(lib.hal_peer_gemm(_ptr(b["c2"]), _ptr(self.w2), _ptr(b["c3"]), _ptr(b["c_tmp"]), _ptr(self.b2),
                              _ptr(self.s2), *common, b["bm"], E, 1, 1, M * top_k, H, I, 128, self.sms,
                              -1, -1, -1, stream), "gemm 2")
        if self.expert_map is None:
            torch.sum(b["c3"].view(M, top_k, H), dim=1, out=out)
        else:
            _ok(lib.hal_peer_moe_sum(_ptr(b["c3"]), _ptr(out), _ptr(ti), emap, M, top_k, H, stream), "sum")
        return out


# --- marlin with a forced config (the sweep) --------------------------------------------------
def forced_choice(kernel, tokens: int, block_m: int, config, gemm: int):
    """The rule's GemmChoice (K splits, occupancy) for one given config of GEMM `gemm`."""
    from hal.backends.marlin import configs

    table = {config.index: kernel.kernel_attributes()[config.index]}
    try:
        return configs.choose_gemm(kernel._gpu, table, kernel.spec, tokens, block_m, gemm)
    except ValueError:
        return None


def run_forced(kernel, data, x, tw, ti, out, block_m: int, g13, g2, overlap: int | None = None,
               fusion: str | None = None):
    """The layer with these choices forced; `fusion` None: the one the plan takes for them."""
    from hal.backends.marlin import configs
    from hal.backends.marlin.kernel import ACTIVATION_CODES, OVERLAP

    if fusion is None:
        fusion = configs.fusion_for(g13.splits)
    spec = kernel.spec
    kernel.loaded_ops().moe(x, tw, ti, data.w13, data.s13, data.w2, data.s2, data.b13, data.b2,
                            data.expert_map, out, spec.num_experts, spec.intermediate_size,
                            data.group13, data.group2, g13.config.index, g13.splits, g2.config.index,
                            g2.splits, configs.grid_m(spec, x.shape[0], block_m),
                            ACTIVATION_CODES[spec.activation], float(spec.swiglu_alpha),
                            float(spec.swiglu_limit), OVERLAP if overlap is None else overlap,
                            configs.FUSIONS.index(fusion))


# --- timing -----------------------------------------------------------------------------------
class Timer:
    """CUDA graphs of one call per input set; every timed replay follows an L2 flush and sits
    between two events, so the GPU never waits for the host inside the timed span."""

    def __init__(self):
        self.flush = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
        self.flush_sum = torch.empty((), dtype=torch.float32, device="cuda")
        self.stream = torch.cuda.Stream()
        # One memory pool for every graph: a call's temporaries are freed inside its capture, and
        # the graphs replay one at a time, so they can share it (without, the sweep's many graphs
        # would each hold their own K-split partials).
        self.pool = torch.cuda.graph_pool_handle()

    def graphs(self, calls):
        for call in calls:
            call()
        torch.cuda.synchronize()
        out = []
        with torch.cuda.stream(self.stream):
            for call in calls:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
                    call()
                out.append(g)
        torch.cuda.synchronize()
        return out

    def time(self, variants: dict, samples: int) -> dict:
        """{name: [callable per input set]} -> {name: median us}; the variants interleave, their
        order alternating from one sample to the next."""
        graphs = {name: self.graphs(calls) for name, calls in variants.items()}
        names = list(graphs)
        events = {name: [] for name in names}
        with torch.cuda.stream(self.stream):
            for s in range(samples):
                for name in (names if s % 2 == 0 else names[::-1]):
                    gs = graphs[name]
                    torch.sum(self.flush, dim=0, out=self.flush_sum)
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    gs[s % len(gs)].replay()
                    stop.record()
                    events[name].append((start, stop))
        torch.cuda.synchronize()
        return {name: statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
                for name, ev in events.items()}


# --- the runs ---------------------------------------------------------------------------------
class Sink:
    """Every measured point: printed, appended to the JSON-lines file as it comes (a run cut short
    keeps what it measured), and kept for the summary."""

    def __init__(self, path=None):
        self.records = []
        self.file = open(path, "a") if path else None

    def emit(self, record: dict):
        self.records.append(record)
        line = json.dumps(record)
        print(line, flush=True)
        if self.file is not None:
            self.file.write(line + "\n")
            self.file.flush()


@attrs.define
class Layer:
    name: str
    spec: MoESpec
    kernel: object
    prepared: object
    peer: object  # PeerLayer or None
    triton: object = None  # (triton_moe kernel, its prepared weights) with --triton-moe


def prepare(name: str, spec: MoESpec, peer_lib, with_triton: bool = False) -> Layer:
    from hal.registry import select_moe_kernel

    t0 = time.time()
    kernel = select_moe_kernel(spec, "cuda", prefer="marlin")
    weights = device_weights(spec, 7, "cuda")
    prepared = kernel.prepare_weights(weights)
    peer = PeerLayer(peer_lib, spec, weights) if peer_lib is not None else None
    triton = None
    if with_triton:
        triton_kernel = select_moe_kernel(spec, "cuda", prefer="triton_moe")
        triton = (triton_kernel, triton_kernel.prepare_weights(weights))
    del weights
    torch.cuda.synchronize()
    print(f"# {name}: weights ready in {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return Layer(name, spec, kernel, prepared, peer, triton)


def attributes_record(layer: Layer) -> dict:
    """What the config rule reads (the GPU's occupancy fields, every compiled kernel's registers and
    shared memory), so a rule can be replayed offline against the sweep."""
    table = layer.kernel.kernel_attributes()
    gpu = layer.kernel._gpu
    fields = ("name", "arch", "sm_count", "smem_per_block", "smem_per_block_optin", "smem_per_sm",
              "regs_per_sm", "regs_per_block", "max_threads_per_sm", "max_threads_per_block")
    return dict(kind="attrs", shape=layer.name, specialization=layer.kernel.specialization.describe(),
                gpu={f: getattr(gpu, f) for f in fields},
                kernels={i: attrs.asdict(a) for i, a in table.items()})


def call_work(spec: MoESpec, sets, expert_map) -> tuple:
    """(checkpoint bytes of the local experts a call touches, 2 x multiply-adds of its local
    routes), averaged over the input sets: int4 weights plus one bf16 scale per 128 along K."""
    macs_per_route = spec.w13_rows * spec.hidden_size + spec.hidden_size * spec.intermediate_size
    per_expert = macs_per_route * (0.5 + 2 / 128)
    touched = routes = 0
    for _, _, ti in sets:
        ids = ti.long().flatten()
        local = ids if expert_map is None else expert_map.long()[ids]
        local = local[local >= 0]
        touched += int(local.unique().numel())
        routes += int(local.numel())
    return per_expert * touched / len(sets), 2 * macs_per_route * routes / len(sets)


# The occupancy-first rule, timed beside the cost model with --ab: block_m from the padding rule
# (configs.block_m_for), then per GEMM the most blocks per SM (capped at 4 up to 64 tokens, 2
# above), ties to more waves of blocks (up to 8) for small batches or to the larger tile, with the
# fewest K splits that fill the resident slots.
OCC_FIRST_SMALL_TOKENS, OCC_FIRST_CAPS, OCC_FIRST_WAVES = 64, (4, 2), 8


def occupancy_first_choice(kernel, tokens: int):
    from hal.backends.marlin import configs

    spec, table = kernel.spec, kernel.kernel_attributes()
    gpu, bucket = kernel._gpu, configs.token_bucket(tokens)
    small = bucket <= OCC_FIRST_SMALL_TOKENS
    cap = OCC_FIRST_CAPS[0] if small else OCC_FIRST_CAPS[1]
    bm = configs.block_m_for(spec, bucket)
    m_blocks = configs.expected_blocks(spec, bucket, bm)
    slots_per_sm = gpu.sm_count

    def gemm(n, k):
        scored = []
        for c in configs.candidates():
            if c.block_m != bm or not configs.fits(c, n, k):
                continue
            per_sm, limiter = configs.blocks_per_sm(gpu, c, table[c.index], cap)
            if per_sm == 0:
                continue
            ctas, slots = m_blocks * (n // c.thread_n), slots_per_sm * per_sm
            splits = configs.splits_for(c, n, k, ctas, slots)
            area = c.thread_n * c.thread_k
            key = ((per_sm, min(ctas * splits / slots, OCC_FIRST_WAVES), -splits, area) if small
                   else (per_sm, -splits, area))
            scored.append((key, configs.GemmChoice(c, splits, per_sm, limiter, ctas * splits)))
        return max(scored, key=lambda item: item[0])[1]

    return bm, gemm(spec.w13_rows, spec.hidden_size), gemm(spec.hidden_size, spec.intermediate_size)


def ab_variants() -> tuple:
    """What --ab can time beside the rule (layer_point)."""
    from hal.backends.marlin import configs

    return ("occupancy_first", "sequential", "no_prefetch", *(f"fusion_{f}" for f in configs.FUSIONS),
            "overlapped_epilogue", "mma_sync", "fitted_fixed_cost")


def rel_diff(out, ref) -> float:
    """Largest difference from marlin's output, relative to marlin's largest magnitude."""
    ref = ref.float()
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def layer_point(layer: Layer, T: int, samples: int, timer: Timer, sink: Sink, check: bool,
                ab: frozenset = frozenset()):
    """One layer at T tokens: marlin, and beside it the peer, triton_moe and the A/B variants named
    in `ab` (ab_variants()) that differ from the rule's own choice."""
    kernel, peer, prepared = layer.kernel, layer.peer, layer.prepared
    sets = input_sets(layer.spec, T)
    outs = [torch.empty_like(s[0]) for s in sets]
    variants = {"marlin": [lambda s=s, o=o: kernel(*s, prepared, out=o, check=False)
                           for s, o in zip(sets, outs, strict=True)]}
    forced = []  # (name, block_m, gemm13, gemm2, overlap, fusion) of each A/B variant timed
    if ab:
        from hal.backends.marlin import configs

        rule = kernel._choice(T)
        if "occupancy_first" in ab:
            forced.append(("occupancy_first", *occupancy_first_choice(kernel, T), None, None))
        # the rule's configs with one choice changed
        same = (rule.block_m, rule.gemm13, rule.gemm2)
        forced += [(name, *same, overlap, rule.fusion)
                   for name, overlap in (("sequential", 0), ("no_prefetch", 1)) if name in ab]
        forced += [(f"fusion_{f}", *same, None, f) for f in configs.FUSIONS
                   if f != rule.fusion and f"fusion_{f}" in ab]
        # The cost model with the epilogue inside the mainloop's time, without the wgmma configs,
        # and with a block's fixed cost in the bytes of the GPU the model was fitted on (not at
        # this GPU's bandwidth share), where any chooses otherwise.
        table = kernel.kernel_attributes()
        others = {"overlapped_epilogue": dict(table=table, serial_epilogue=False),
                  "mma_sync": dict(table=configs.mma_sync_only(table)),
                  "fitted_fixed_cost": dict(table=table,
                                            gpu=attrs.evolve(kernel._gpu, mem_bandwidth_gbps=None))}

        def launches(c):
            return c.block_m, c.gemm13.config, c.gemm13.splits, c.gemm2.config, c.gemm2.splits

        for name, how in others.items():
            if name not in ab:
                continue
            other = configs.choose_layer(**{"gpu": kernel._gpu, **how}, spec=layer.spec,
                                         tokens_bucket=rule.tokens_bucket)
            if launches(other) != launches(rule):
                forced.append((name, other.block_m, other.gemm13, other.gemm2, None, None))
        for name, bm, g13, g2, overlap, fusion in forced:
            variants[name] = [
                functools.partial(run_forced, kernel, prepared.data, *s, o, bm, g13, g2, overlap, fusion)
                for s, o in zip(sets, outs, strict=True)]
    if peer is not None:
        pouts = [torch.empty_like(s[0]) for s in sets]
        variants["peer"] = [lambda s=s, o=o: peer(*s, o) for s, o in zip(sets, pouts, strict=True)]
    if layer.triton is not None:
        triton_kernel, triton_prepared = layer.triton
        touts = [torch.empty_like(s[0]) for s in sets]
        variants["triton_moe"] = [lambda s=s, o=o: triton_kernel(*s, triton_prepared, out=o, check=False)
                                  for s, o in zip(sets, touts, strict=True)]
    med = timer.time(variants, samples)
    work = call_work(layer.spec, sets, layer.prepared.data.expert_map)
    rec = dict(kind="layer", shape=layer.name, tokens=T, marlin_us=med["marlin"],
               plan=kernel.plan(T).describe(), weight_bytes=work[0], flops=work[1],
               marlin_gbps=work[0] / med["marlin"] / 1e3, marlin_tflops=work[1] / med["marlin"] / 1e6)
    if ab:
        rec["fusion"] = rule.fusion
    for name, bm, g13, g2, _, _ in forced:
        rec.update({f"{name}_us": med[name], f"vs_{name}": med[name] / med["marlin"]})
        if (bm, g13, g2) != same:  # a choice other than the rule's: what it chose
            rec[name] = f"block_m {bm} [{g13.describe()}] [{g2.describe()}]"
    if peer is not None:
        rec.update(peer_us=med["peer"], ratio=med["peer"] / med["marlin"], peer_block_m=peer.block_m(T))
        if check:
            rec["max_rel_diff_vs_peer"] = rel_diff(pouts[0], outs[0])
    if layer.triton is not None:
        rec.update(triton_moe_us=med["triton_moe"], triton_moe_plan=triton_kernel.plan(T).describe(),
                   triton_moe_gbps=work[0] / med["triton_moe"] / 1e3,
                   triton_moe_tflops=work[1] / med["triton_moe"] / 1e6,
                   marlin_over_triton_moe=med["marlin"] / med["triton_moe"])
        if peer is not None:
            rec["peer_over_triton_moe"] = med["peer"] / med["triton_moe"]
        if check:
            rec["max_rel_diff_triton_moe"] = rel_diff(touts[0], outs[0])
    sink.emit(rec)


def sweep_point(layer: Layer, T: int, samples: int, timer: Timer, sink: Sink, all_splits: bool = False,
                block_ms: tuple = ()):
    """Every block_m (or those of block_ms); for each, every GEMM-1 config (GEMM 2 at the rule's
    choice for that block_m), then every GEMM-2 config with GEMM 1 at the fastest of those. With
    all_splits every K split of every config is timed in those two passes (instead of the rule's
    split per config and a few around the fastest), so a cost model can be checked against every
    choice it could make."""
    from hal.backends.marlin import configs

    kernel, spec, data = layer.kernel, layer.spec, layer.prepared.data
    table = kernel.kernel_attributes()  # loads the ops, which fills kernel._gpu
    gpu = kernel._gpu
    sets = input_sets(spec, T)
    outs = [torch.empty_like(s[0]) for s in sets]
    rule = kernel._choice(T)
    k1, k2 = spec.hidden_size, spec.intermediate_size
    # Routes of an expert that has any; block sizes far from it (a quarter of it or less, but for
    # the largest, or more than twice it and above 16) are not timed.
    p = min(1.0, spec.top_k / spec.num_experts)
    rows = T * p / (1 - (1 - p) ** T)
    for bm in configs.BLOCK_M_CHOICES:
        too_small = bm * 4 <= rows and bm < max(configs.BLOCK_M_CHOICES)
        if too_small or bm > max(16, 2 * rows) or (block_ms and bm not in block_ms):
            continue
        cands = [c for c in configs.candidates() if c.block_m == bm]
        g1s = [g for g in (forced_choice(kernel, T, bm, c, 1) for c in cands) if g]
        g2s = [g for g in (forced_choice(kernel, T, bm, c, 2) for c in cands) if g]
        if all_splits:
            def every_split(gs, k):
                return [attrs.evolve(g, splits=sp, expected_ctas=g.expected_ctas // g.splits * sp)
                        for g in gs for sp in configs.split_options(g.config, k)]
            g1s, g2s = every_split(g1s, k1), every_split(g2s, k2)
        if not g1s or not g2s:
            continue
        base2 = configs.choose_gemm(gpu, table, spec, T, bm, 2)
        label = lambda g: f"{g.config.describe()} x{g.splits}"  # noqa: E731
        med1 = timer.time({label(g1): [functools.partial(run_forced, kernel, data, *s, o, bm, g1, base2)
                                       for s, o in zip(sets, outs, strict=True)] for g1 in g1s}, samples)
        best1 = min(g1s, key=lambda g: med1[label(g)])
        med2 = timer.time({label(g2): [functools.partial(run_forced, kernel, data, *s, o, bm, best1, g2)
                                       for s, o in zip(sets, outs, strict=True)] for g2 in g2s}, samples)
        best2 = min(g2s, key=lambda g: med2[label(g)])
        # K splits around the rule's, for the fastest config of each GEMM.
        more = {}
        for gemm, best, k in (() if all_splits else ((1, best1, k1), (2, best2, k2))):
            for f in (0.25, 0.5, 2, 4):
                sp = int(best.splits * f)
                if sp < 1 or sp > 16 or k % (sp * best.config.thread_k):
                    continue
                g = attrs.evolve(best, splits=sp, expected_ctas=best.expected_ctas // best.splits * sp)
                g1, g2 = (g, best2) if gemm == 1 else (best1, g)
                more[(gemm, g)] = [functools.partial(run_forced, kernel, data, *s, o, bm, g1, g2)
                                   for s, o in zip(sets, outs, strict=True)]
        med3 = timer.time({f"{gm}:{label(g)}": c for (gm, g), c in more.items()}, samples) if more else {}
        for gm, g in more:
            sink.emit(dict(kind="splits", shape=layer.name, tokens=T, block_m=bm, gemm=gm,
                           config=g.config.describe(), splits=g.splits,
                           rule_splits=(best1, best2)[gm - 1].splits,
                           layer_us=med3[f"{gm}:{label(g)}"],
                           base_us=min(med1.values()) if gm == 1 else min(med2.values())))
        for gemm, gs, med, chosen in ((1, g1s, med1, rule.gemm13), (2, g2s, med2, rule.gemm2)):
            for g in gs:
                sink.emit(dict(kind="sweep", shape=layer.name, tokens=T, block_m=bm, gemm=gemm,
                               config=g.config.describe(), splits=g.splits,
                               blocks_per_sm=g.blocks_per_sm, limiter=g.limiter, ctas=g.expected_ctas,
                               layer_us=med[label(g)], rule=bool(rule.block_m == bm and
                                                                 chosen.config == g.config),
                               rule_splits=chosen.splits if rule.block_m == bm else None,
                               all_splits=all_splits))


def geomean_line(ratios, what: str) -> str:
    return f"{what}: geomean {geomean(ratios):.3f} over {len(ratios)} points; min {min(ratios):.2f}"


def summarize(records) -> str:
    """A markdown table of the layer points: marlin beside the peer and triton_moe where they ran;
    each ratio is the other kernel's time over the one named second (above 1: that one faster)."""
    layers = [r for r in records if r["kind"] == "layer"]
    peer, triton = any("ratio" in r for r in layers), any("triton_moe_us" in r for r in layers)
    if not (peer or triton):
        return ""
    head = ["shape", "tokens"] + (["vLLM Marlin us"] if peer else []) + ["marlin us"]
    head += ["peer / marlin"] if peer else []
    if triton:
        head += ["triton_moe us", "marlin / triton_moe"] + (["peer / triton_moe"] if peer else [])
    body = []
    for r in layers:
        cells = [r["shape"], str(r["tokens"])] + ([f"{r['peer_us']:.1f}"] if peer else [])
        cells += [f"{r['marlin_us']:.1f}"] + ([f"{r['ratio']:.2f}"] if peer else [])
        if triton:
            cells += [f"{r['triton_moe_us']:.1f}", f"{r['marlin_over_triton_moe']:.2f}"]
            cells += [f"{r['peer_over_triton_moe']:.2f}"] if peer else []
        body.append(cells)
    lines = table_lines(head, body, markdown=True)
    if peer:
        lines.append("\n" + geomean_line([r["ratio"] for r in layers], "vLLM Marlin / marlin"))
    if triton:
        lines.append(geomean_line([r["marlin_over_triton_moe"] for r in layers], "marlin / triton_moe"))
        if peer:
            lines.append(geomean_line([r["peer_over_triton_moe"] for r in layers],
                                      "vLLM Marlin / triton_moe"))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", help="the peer library built by benchmarks/marlin_peer_build.py")
    parser.add_argument("--shapes", default=",".join(shape_specs()))
    parser.add_argument("--tokens", default="1,8,64,256,2048")
    parser.add_argument("--sweep-tokens", default="")
    parser.add_argument("--sweep-all-splits", action="store_true",
                        help="the sweep times every K split of every config (not only the rule's)")
    parser.add_argument("--sweep-block-m", default="",
                        help="the sweep times only these block sizes "
                             "(default: those near the routes per expert)")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop starting new points after this")
    parser.add_argument("--out", help="JSON lines, one per measured point")
    parser.add_argument("--ab", nargs="?", const="all", default="", metavar="VARIANTS",
                        help="also time these variants of the rule (comma-separated; all when none is "
                             "named): occupancy_first (the occupancy-first config rule, the A/B of the cost "
                             "model); the rule's configs with their launches one after another "
                             "(sequential), with programmatic dependent launch but no weight prefetch "
                             "(no_prefetch), with each other epilogue fusion (fusion_none, "
                             "fusion_activation, fusion_activation_and_rounding: five, four or three "
                             "launches); the cost model's choice with the epilogue inside the mainloop's "
                             "time (overlapped_epilogue), without the wgmma configs (mma_sync) and "
                             "with a block's fixed cost in the bytes of the GPU the model was fitted on "
                             "(fitted_fixed_cost), where any differs")
    parser.add_argument("--triton-moe", action="store_true",
                        help="also time triton_moe's int4 (its default path) on the same weights and inputs")
    parser.add_argument("--ceilings", action="store_true",
                        help="measure the copy and bf16 matmul ceilings first (hal.bench.ceilings)")
    args = parser.parse_args()
    specs = shape_specs()
    names = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in names if s not in specs]
    if unknown:
        raise ValueError(f"--shapes: unknown {unknown}; expected some of {', '.join(specs)}")
    tokens = [int(t) for t in args.tokens.split(",") if t]
    sweep = [int(t) for t in args.sweep_tokens.split(",") if t]
    sweep_block_ms = tuple(int(b) for b in args.sweep_block_m.split(",") if b)
    ab = frozenset(ab_variants() if args.ab == "all" else (v for v in args.ab.split(",") if v))
    if ab - set(ab_variants()):
        raise ValueError(f"--ab: unknown {sorted(ab - set(ab_variants()))}; expected some of "
                         f"{', '.join(ab_variants())}")
    if not torch.cuda.is_available():
        raise SystemExit("marlin_peer.py needs a CUDA GPU")
    deadline = time.time() + args.budget_s
    peer_lib = load_peer(args.peer) if args.peer else None
    sink = Sink(args.out)
    timer = Timer()
    print(f"# torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}",
          flush=True)
    if args.ceilings:
        from hal.bench.ceilings import measure

        c = measure("cuda")
        sink.emit(dict(kind="ceilings", copy_gbps=c.copy_gbps, bf16_tflops=c.bf16_tflops,
                       launch_us=c.launch_us))
    layers = []
    for name in names:
        try:
            layers.append(prepare(name, specs[name], peer_lib, args.triton_moe))
        except Exception as exc:  # one failing shape must not lose the others
            print(f"# {name}: FAILED to prepare: {type(exc).__name__}: {exc}", flush=True)
    for layer in layers:
        sink.emit(attributes_record(layer))
    work = [(layer_point, layer, T) for layer in layers for T in tokens]
    work += [(sweep_point, layer, T) for T in sweep for layer in layers]
    checked = set()
    for what, layer, T in work:
        if time.time() > deadline:
            print(f"# out of time before {what.__name__} {layer.name} {T}", flush=True)
            break
        try:
            if what is layer_point:
                # Outputs compared once per layer, at 64 tokens or more (every expert has routes).
                check = layer.name not in checked and T >= 64
                layer_point(layer, T, args.samples, timer, sink, check, ab)
                if check:
                    checked.add(layer.name)
            else:
                t0 = time.time()
                sweep_point(layer, T, max(6, args.samples // 2), timer, sink, args.sweep_all_splits,
                            sweep_block_ms)
                print(f"# sweep {layer.name} {T}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        except Exception as exc:
            print(f"# {layer.name} {T}: FAILED {type(exc).__name__}: {exc}", flush=True)
    print(summarize(sink.records), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
