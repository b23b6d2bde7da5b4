"""The CPU fused MoE kernel object: packs weights once, routes each call into expert blocks and
runs each block on BRGEMM or TinyGEMM as its policy says."""

from __future__ import annotations

import functools
from typing import Optional

import torch
from hal.backends.cpu_brgemm import extension, pack
from hal.backends.cpu_brgemm.backend import isa_for
from hal.backends.cpu_brgemm.plan import PATH_NAMES, BlockPlan, MoEPlan
from hal.backends.cpu_brgemm.policy import (
    ACTIVATION_CODES,
    BASELINE_POLICY,
    DEFAULT_POLICY,
    FORMAT_CODES,
    POLICIES,
    SCRATCH_CAP_BYTES,
)

from hal import live
from hal.backend import Target
from hal.kernel import MoEKernel
from hal.spec import MoESpec
from hal.weights_check import check_expert_map


class CpuBrgemmKernel(MoEKernel):
    backend = "cpu_brgemm"

    def __init__(self, spec: MoESpec, target: Target, policy: str = DEFAULT_POLICY,
                 isa: Optional[str] = None):
        super().__init__(spec, target)
        if policy not in POLICIES:
            raise ValueError(f"policy={policy!r} is not allowed: expected one of {', '.join(POLICIES)}")
        isa = isa or isa_for(target.cpu)
        if isa is None:
            raise ValueError("target CPU has neither AVX-512-BF16 nor AVX2+FMA: cpu_brgemm cannot run")
        if policy == "brgemm" and isa != "avx512bf16":
            raise ValueError(f"policy='brgemm' needs the avx512bf16 build (oneDNN's bf16 BRGEMM "
                             f"needs AVX-512); this kernel is built for {isa}")
        self.policy = policy
        self.variant = policy
        self.isa = isa
        self._brgemm_supported = None
        self._host_checked = False

    @property
    def ops(self):
        return extension.ops(self.isa)

    @property
    def brgemm_supported(self) -> bool:
        """BRGEMM on AMX for bf16, as hal.live settles it: from the capabilities and, for live
        ones, this process's AMX permission and torch's oneDNN. Recorded capabilities (a profile)
        are taken as they are, so a plan for another host shows that host's decisions."""
        if self._brgemm_supported is None:
            self._brgemm_supported = self.isa == "avx512bf16" and live.amx_bf16_brgemm(self.target)
        return self._brgemm_supported

    @property
    def _planner_isa(self) -> str:
        """route_plan does not depend on the ISA, so a plan for a recorded profile runs on the
        build this machine executes, never on one whose instructions it may lack."""
        if self.target.caps.profile is None:
            return self.isa
        host_isa = isa_for(live.host_cpu().cpu)
        if host_isa is None:
            raise ValueError("this CPU has neither AVX-512-BF16 nor AVX2+FMA: the planner cannot run")
        return host_isa

    @property
    def _planner_ops(self):
        if torch.compiler.is_compiling():
            return extension.traced_ops(self._planner_isa)
        return self.ops if self.target.caps.profile is None else extension.ops(self._planner_isa)

    @functools.cached_property
    def max_chunk_tokens(self) -> int:
        """Tokens per pass of a call: one pass's compact caches, top_k x (6H + 2I) bytes a token,
        stay within SCRATCH_CAP_BYTES, so the scratch a call keeps has that cap."""
        spec = self.spec
        token_bytes = spec.top_k * (6 * spec.hidden_size + 2 * spec.intermediate_size)
        return max(1, SCRATCH_CAP_BYTES // token_bytes)

    def compile(self) -> list:
        self.ops  # noqa: B018  (builds this kernel's ISA specialization)
        return [f"cpu_brgemm {self.isa}"]

    def baselines(self) -> dict:
        return {BASELINE_POLICY: self.with_policy(BASELINE_POLICY)}

    def with_policy(self, policy: str) -> CpuBrgemmKernel:
        """The same kernel under another dispatch policy, sharing its BRGEMM probe; it accepts this
        kernel's prepared weights."""
        other = CpuBrgemmKernel(self.spec, self.target, policy, self.isa)
        other._brgemm_supported = self._brgemm_supported
        return other

    def _prepare(self, weights):
        return pack.pack(self.spec, weights)

    def _check_host(self) -> None:
        """A kernel built from recorded capabilities (a profile, HAL_CAPS) runs only where this CPU
        has what the record promised; otherwise its instructions would end the process."""
        if self._host_checked or self.target.caps.profile is None:
            return
        if self.isa == "avx512bf16" and isa_for(live.host_cpu().cpu) != "avx512bf16":
            raise ValueError(f"this kernel was built for profile {self.target.caps.profile!r} "
                             "(AVX-512-BF16), which this CPU lacks: select a kernel with this "
                             "machine's capabilities")
        if self.brgemm_supported and not live.host_amx_bf16_brgemm():
            raise ValueError(f"this kernel was built for profile {self.target.caps.profile!r} "
                             "(AMX usable), but this CPU cannot run AMX: select a kernel with this "
                             "machine's capabilities")
        self._host_checked = True

    @functools.cached_property
    def _fused_moe(self):
        """The op, its twin for torch.compile (hal.traceable) and its per-kernel arguments, looked
        up once: a decode call runs on caches the previous layer's work has evicted, where each
        lookup on the way to the op is a miss."""
        self._check_host()
        spec = self.spec
        return self.ops.fused_moe, extension.traced_ops(self.isa).fused_moe, (
            FORMAT_CODES[spec.weight_format], ACTIVATION_CODES[spec.activation], float(spec.swiglu_alpha),
            float(spec.swiglu_limit), POLICIES.index(self.policy), self.brgemm_supported,
            self.max_chunk_tokens)

    def _run(self, x, topk_weights, topk_ids, data, out) -> None:
        op, traced, constants = self._fused_moe
        if torch.compiler.is_compiling():
            op = traced
        op(x, topk_weights, topk_ids, data.expert_map, data.w13, data.w13_scale, data.w2, data.w2_scale,
           data.b13, data.b2, out, *constants)

    def plan(self, topk_ids, expert_map: Optional[torch.Tensor] = None) -> MoEPlan:
        """The expert blocks of a call with these routes and the path of each. Under expert
        parallelism pass the weights' expert_map; without one the plan assumes this rank holds the
        contiguous slice [0, num_local_experts) of the global experts, and says so."""
        spec = self.spec
        if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 \
                or topk_ids.shape[1] != spec.top_k or topk_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"topk_ids must be an int32/int64 tensor of shape (M, {spec.top_k})")
        if topk_ids.numel() and not (-1 <= int(topk_ids.min()) and int(topk_ids.max()) < spec.num_experts):
            raise ValueError(f"topk_ids must hold expert ids in [0, {spec.num_experts}) or -1 (no route)")
        assumed = spec.is_ep and expert_map is None
        if assumed:
            expert_map = torch.full((spec.num_experts,), -1, dtype=torch.int32)
            expert_map[: spec.local_experts] = torch.arange(spec.local_experts, dtype=torch.int32)
        elif expert_map is not None:
            check_expert_map(expert_map, spec)
        rows = self._planner_ops.route_plan(topk_ids.cpu(), None if expert_map is None else expert_map.cpu(),
                                   spec.local_experts, POLICIES.index(self.policy),
                                   self.brgemm_supported, self.max_chunk_tokens).tolist()
        blocks = [BlockPlan(e, s, m, n, PATH_NAMES[p1], PATH_NAMES[p2]) for e, s, m, n, p1, p2 in rows]
        tokens = int(topk_ids.shape[0])
        passes = max(1, -(-tokens // self.max_chunk_tokens))
        return MoEPlan(self.policy, self.isa, self.brgemm_supported, tokens,
                       sum(b.m_size for b in blocks), blocks, assumed, passes)
