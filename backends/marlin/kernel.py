"""The Marlin MoE kernel object: repacks GPTQ weights once, picks the launch config per token
bucket, and runs the whole layer (routing, then two W4A16 GEMMs with the activation, the top-k sum
and the rounding in their epilogues) in one op."""

from __future__ import annotations

import threading
from typing import Optional

import attrs
import torch
from hal.backends.marlin import build, configs, repack
from hal.backends.marlin.plan import MarlinPlan

from hal import traceable
from hal.caps import GpuCaps
from hal.kernel import MoEKernel

NAME = "marlin"
ACTIVATION_CODES = {"silu": 0, "swiglu_oai": 1, "relu2": 2}  # Activation in marlin_moe_pointwise.cuh
# The moe op's overlap of its three launches (MoeProblem::overlap): programmatic dependent launch
# with GEMM 2's weight prefetch.
OVERLAP = 2


@attrs.frozen
class MarlinWeights:
    # GEMM 1's columns in repack.gate_up_columns order
    w13: torch.Tensor  # int32 [E, w13_rows/64, H/16, 32, 4]
    s13: torch.Tensor  # [E, G, w13_rows] activation dtype
    w2: torch.Tensor  # int32 [E, H/64, I/16, 32, 4]
    s2: torch.Tensor  # [E, G, H]
    group13: int  # k elements per scale row
    group2: int
    b13: Optional[torch.Tensor] = None  # fp32 [E, w13_rows]
    b2: Optional[torch.Tensor] = None  # fp32 [E, H]
    expert_map: Optional[torch.Tensor] = None  # int32 [num_experts]


class MarlinMoEKernel(MoEKernel):
    backend = NAME

    def __init__(self, spec, target, *, policy: str = "occupancy", runtime_branch: bool = False):
        super().__init__(spec, target)
        if policy not in configs.POLICIES:
            raise ValueError(f"policy={policy!r} is not allowed: expected one of "
                             + ", ".join(configs.POLICIES))
        self.policy = policy
        self.runtime_branch = runtime_branch
        if runtime_branch:
            self.variant = "runtime_branch"
        elif policy != "occupancy":
            self.variant = policy
        gpu = self.target.gpu
        arch = gpu.arch if gpu is not None and gpu.arch else "sm_90"
        # The runtime-branch baseline: one build with both branches compiled in, decided at run time.
        self.specialization = build.Specialization(spec.act_dtype, spec.is_ep or runtime_branch,
                                                   spec.has_bias or runtime_branch, arch)
        self._lock = threading.Lock()
        self._ops = None
        self._traced_ops = None  # the ops' twins for torch.compile (hal.traceable)
        self._attrs: Optional[dict] = None
        self._gpu: Optional[GpuCaps] = None
        self._choices: dict = {}

    def baselines(self) -> dict:
        if self.variant != "default":
            return {}
        return {"first_valid": MarlinMoEKernel(self.spec, self.target, policy="first_valid"),
                "runtime_branch": MarlinMoEKernel(self.spec, self.target, runtime_branch=True)}

    # --- build ---------------------------------------------------------------------------------
    def compile(self) -> tuple:
        """Build or load this kernel's specialization (hal build calls this); returns what it built."""
        self.loaded_ops()
        return (f"marlin_moe ({self.specialization.describe()})",)

    def loaded_ops(self):
        """The specialization's ops, built on first use, with its kernels' attributes read."""
        if self._ops is not None:
            return self._ops
        with self._lock:
            if self._ops is None:
                ops = build.compile_ops(self.specialization)
                with torch.cuda.device(self.device):
                    rows = ops.kernel_attributes().tolist()
                stale = configs.check_table_matches(rows)
                if stale:
                    raise RuntimeError(f"marlin: {stale}; clear HAL_CACHE_DIR and rebuild")
                self._attrs = configs.attrs_table(rows)
                self._gpu = self.target.gpu  # hal.live filled the runtime's occupancy fields
                self._traced_ops = traceable.twins(ops.name, build.FAKES)
                self._ops = ops
        return self._ops

    def kernel_attributes(self) -> dict:
        self.loaded_ops()
        return dict(self._attrs)

    # --- weights -------------------------------------------------------------------------------
    def _prepare(self, weights) -> MarlinWeights:
        spec = self.spec
        expert_map = weights.expert_map
        if expert_map is not None and not self.specialization.is_ep and bool((expert_map < 0).any()):
            raise ValueError("weights.expert_map maps experts to -1 (not local) but the spec has no "
                             "expert parallelism: set num_local_experts < num_experts")
        H, I = spec.hidden_size, spec.intermediate_size
        whole = spec.group_size == -1
        bias = (lambda b: None if b is None else b.to(torch.float32).contiguous())
        # GEMM 1's columns in the order its epilogue activates them (repack.gate_up_columns).
        cols = repack.gate_up_columns(spec.activation, I).to(weights.w13.device)
        b13 = None if weights.b13 is None else weights.b13.index_select(-1, cols.to(weights.b13.device))
        return MarlinWeights(
            w13=repack.repack(weights.w13.index_select(-1, cols), "weights.w13"),
            s13=weights.w13_scale.index_select(-1, cols.to(weights.w13_scale.device)).contiguous(),
            w2=repack.repack(weights.w2, "weights.w2"),
            s2=weights.w2_scale.contiguous(),
            group13=H if whole else spec.group_size,
            group2=I if whole else spec.group_size,
            b13=bias(b13),
            b2=bias(weights.b2),
            expert_map=None if expert_map is None else expert_map.contiguous(),
        )

    # --- per call ------------------------------------------------------------------------------
    def _choice(self, tokens: int) -> configs.LayerChoice:
        bucket = configs.token_bucket(tokens)
        choice = self._choices.get(bucket)
        if choice is None:
            self.loaded_ops()
            choice = configs.choose_layer(self._gpu, self._attrs, self.spec, bucket, self.policy)
            self._choices[bucket] = choice
        return choice

    def plan(self, topk_ids) -> MarlinPlan:
        if self._ops is None and not torch.cuda.is_available():
            raise ValueError("Marlin's launch config is chosen from its compiled kernels' registers "
                             "and shared memory, which need a CUDA build and GPU: run hal select on "
                             "the GPU host for the plan")
        tokens = topk_ids if isinstance(topk_ids, int) else int(topk_ids.shape[0])
        choice = self._choice(tokens)
        bm = choice.block_m
        return MarlinPlan(tokens=tokens, tokens_bucket=choice.tokens_bucket, block_m=bm,
                          expected_blocks=configs.expected_blocks(self.spec, tokens, bm),
                          max_blocks=configs.max_blocks(self.spec, tokens, bm),
                          grid_m=configs.grid_m(self.spec, tokens, bm), gemm13=choice.gemm13,
                          gemm2=choice.gemm2, policy=self.policy,
                          specialization=self.specialization.describe(),
                          block_m_costs=choice.block_m_costs, fusion=choice.fusion)

    def _run(self, x, topk_weights, topk_ids, data: MarlinWeights, out) -> None:
        spec = self.spec
        ops = self.loaded_ops()
        if torch.compiler.is_compiling():
            ops = self._traced_ops
        choice = self._choice(x.shape[0])
        weights = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
        ops.moe(x, weights.contiguous(), topk_ids.contiguous(), data.w13, data.s13, data.w2, data.s2,
                data.b13, data.b2, data.expert_map, out, spec.num_experts, spec.intermediate_size,
                data.group13, data.group2, choice.gemm13.config.index, choice.gemm13.splits,
                choice.gemm2.config.index, choice.gemm2.splits,
                configs.grid_m(spec, x.shape[0], choice.block_m), ACTIVATION_CODES[spec.activation],
                float(spec.swiglu_alpha), float(spec.swiglu_limit), OVERLAP,
                configs.FUSIONS.index(choice.fusion))
