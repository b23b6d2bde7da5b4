"""What an engine asks for: the MoE layer (`MoESpec`), the requant op (`RequantSpec`), and the
weights it hands over (`MoEWeights`). Everything is validated on construction, so a backend never
sees an impossible spec and a user sees the bad field by name."""

from __future__ import annotations

import math
from typing import Optional

import attrs

WEIGHT_FORMATS = ("bf16", "fp8_block128", "mxfp4", "int4_g128", "w4afp8")
ACTIVATIONS = ("silu", "swiglu_oai", "relu2")
LAYOUTS = ("tokens", "masked")
ACT_DTYPES = ("bfloat16", "float16")
# How a layer quantizes the activations each GEMM reads (docs/contract.md, "Activation numerics"):
# "none" keeps them in act_dtype; "fp8_g128" quantizes them dynamically to e4m3 per token and 128
# columns (DeepSeek-V3's serving numerics: vLLM 0.33.0's per_token_group_quant_fp8, SGLang, DeepGEMM).
ACT_QUANTS = ("none", "fp8_g128")

FP8_BLOCK = 128  # DeepSeek-V3 / Qwen3 FP8 checkpoints: one fp32 scale per 128x128 weight block
MXFP4_GROUP = 32  # OCP MX: one e8m0 scale per 32 e2m1 values along K
INT4_PACK = 8  # GPTQ: eight 4-bit values per int32 along K
TOKEN_GROUP = 128  # DeepEP: one fp32 activation scale per 128 columns

# Along K the weight container needs whole packing units (int4: 8 per int32, mxfp4: 32 per scale).
# Block and group scales tolerate a ragged last block only where the checkpoint format does:
# fp8_block128 stores ceil(n/128) scales, int4 groups must divide K.
_K_MULTIPLE = {"bf16": 1, "fp8_block128": 1, "mxfp4": MXFP4_GROUP, "int4_g128": INT4_PACK,
               "w4afp8": TOKEN_GROUP}


def _fail(field: str, value, allowed: str):
    raise ValueError(f"{field}={value!r} is not allowed: expected {allowed}")


def _positive(inst, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        _fail(attribute.name, value, "a positive int")


def _bool(inst, attribute, value):
    if not isinstance(value, bool):
        _fail(attribute.name, value, "True or False")


def _finite_real(inst, attribute, value):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        _fail(attribute.name, value, "a finite number")


def _one_of(options):
    def check(inst, attribute, value):
        if value not in options:
            _fail(attribute.name, value, "one of " + ", ".join(options))
    return check


@attrs.frozen
class MoESpec:
    """One MoE layer as the engine runs it (docs/contract.md, "What every backend computes")."""

    num_experts: int = attrs.field(validator=_positive)
    top_k: int = attrs.field(validator=_positive)
    hidden_size: int = attrs.field(validator=_positive)
    intermediate_size: int = attrs.field(validator=_positive)
    weight_format: str = attrs.field(default="bf16", validator=_one_of(WEIGHT_FORMATS))
    activation: str = attrs.field(default="silu", validator=_one_of(ACTIVATIONS))
    has_bias: bool = attrs.field(default=False, validator=_bool)
    num_local_experts: Optional[int] = attrs.field(default=None)
    layout: str = attrs.field(default="tokens", validator=_one_of(LAYOUTS))
    act_dtype: str = attrs.field(default="bfloat16", validator=_one_of(ACT_DTYPES))
    # int4 formats only: 128, or -1 for one group over all of K (per-channel GPTQ).
    group_size: int = attrs.field(default=128)
    swiglu_alpha: float = attrs.field(default=1.702, validator=_finite_real)
    swiglu_limit: float = attrs.field(default=7.0, validator=_finite_real)
    act_quant: str = attrs.field(default="none", validator=_one_of(ACT_QUANTS))

    def __attrs_post_init__(self):
        if self.top_k > self.num_experts:
            _fail("top_k", self.top_k, f"<= num_experts ({self.num_experts})")
        if self.num_local_experts is not None:
            n = self.num_local_experts
            if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= self.num_experts:
                _fail("num_local_experts", n, f"None or an int in [1, {self.num_experts}]")
        if self.group_size not in (128, -1) or not isinstance(self.group_size, int) \
                or isinstance(self.group_size, bool):
            _fail("group_size", self.group_size, "128, or -1 for per-channel")
        if self.group_size == -1 and self.weight_format not in ("int4_g128",):
            _fail("group_size", -1, "128 unless weight_format is int4_g128")
        k_mult = _K_MULTIPLE[self.weight_format]
        if self.weight_format == "int4_g128" and self.group_size == 128:
            k_mult = 128
        for name in ("hidden_size", "intermediate_size"):
            value = getattr(self, name)
            if value % k_mult:
                _fail(name, value, f"a multiple of {k_mult} for weight_format={self.weight_format}")
        if self.activation == "swiglu_oai" and not (self.swiglu_limit > 0):
            _fail("swiglu_limit", self.swiglu_limit, "> 0")
        if self.weight_format == "w4afp8" and self.layout != "masked":
            _fail("layout", self.layout, "'masked' for weight_format=w4afp8 (DeepEP low-latency)")
        if self.layout == "masked" and self.weight_format != "w4afp8":
            _fail("layout", self.layout, "'tokens' unless weight_format is w4afp8")
        if self.act_quant != "none" and self.layout != "tokens":
            _fail("act_quant", self.act_quant, "'none' for layout='masked' (its input is already e4m3)")
        if self.has_bias and self.weight_format == "w4afp8":
            _fail("has_bias", True, "False for weight_format=w4afp8")

    @property
    def local_experts(self) -> int:
        return self.num_local_experts or self.num_experts

    @property
    def is_ep(self) -> bool:
        return self.num_local_experts is not None and self.num_local_experts < self.num_experts

    @property
    def gated(self) -> bool:
        return self.activation != "relu2"

    @property
    def w13_rows(self) -> int:
        """Rows of the first GEMM's weight: gate and up for gated activations."""
        return 2 * self.intermediate_size if self.gated else self.intermediate_size

    def scale_groups(self, k: int) -> int:
        """Scale groups of an int4 weight along a K of k: one per group_size rows, or one per
        channel (group_size -1)."""
        return 1 if self.group_size == -1 else k // self.group_size

    def weight_bytes_per_expert(self) -> int:
        """Bytes of weights and scales one expert reads, as the checkpoint stores them."""
        H, I, R = self.hidden_size, self.intermediate_size, self.w13_rows
        elems = R * H + H * I
        fmt = self.weight_format
        if fmt == "bf16":
            return 2 * elems
        if fmt == "fp8_block128":
            blocks = (math.ceil(R / FP8_BLOCK) * math.ceil(H / FP8_BLOCK)
                      + math.ceil(H / FP8_BLOCK) * math.ceil(I / FP8_BLOCK))
            return elems + 4 * blocks
        if fmt == "mxfp4":
            return elems // 2 + elems // MXFP4_GROUP
        scales = R * self.scale_groups(H) + H * self.scale_groups(I)
        return elems // 2 + 2 * scales

    def flops_per_token(self) -> int:
        """Multiply-adds x 2 of the two GEMMs for one (token, expert) route."""
        return 2 * self.hidden_size * (self.w13_rows + self.intermediate_size)


@attrs.frozen
class RequantSpec:
    """Per-token-group FP8 -> per-tensor FP8 on the DeepEP masked layout [E, max_m, hidden]."""

    num_experts: int = attrs.field(validator=_positive)
    hidden_size: int = attrs.field(validator=_positive)
    group_size: int = attrs.field(default=TOKEN_GROUP)

    def __attrs_post_init__(self):
        if self.group_size != TOKEN_GROUP or not isinstance(self.group_size, int):
            _fail("group_size", self.group_size, f"{TOKEN_GROUP} (DeepEP's token group)")
        if self.hidden_size % self.group_size:
            _fail("hidden_size", self.hidden_size, f"a multiple of {self.group_size}")


def _tensor_or_none(inst, attribute, value):
    import torch

    if value is not None and not isinstance(value, torch.Tensor):
        _fail(attribute.name, type(value).__name__, "a torch.Tensor or None")


@attrs.frozen
class MoEWeights:
    """Weights as public checkpoints store them (docs/contract.md, "Weight formats"). Shapes and dtypes
    are checked against a spec by `validate(spec)`, which every kernel's prepare_weights calls."""

    w13: object = attrs.field(validator=_tensor_or_none)
    w2: object = attrs.field(validator=_tensor_or_none)
    w13_scale: object = attrs.field(default=None, validator=_tensor_or_none)
    w2_scale: object = attrs.field(default=None, validator=_tensor_or_none)
    b13: object = attrs.field(default=None, validator=_tensor_or_none)
    b2: object = attrs.field(default=None, validator=_tensor_or_none)
    expert_map: object = attrs.field(default=None, validator=_tensor_or_none)
    # w4afp8 only: the static fp32 per-tensor scale of each GEMM's FP8 input.
    w13_input_scale: object = attrs.field(default=None, validator=_tensor_or_none)
    w2_input_scale: object = attrs.field(default=None, validator=_tensor_or_none)

    def validate(self, spec: MoESpec) -> MoEWeights:
        from hal.weights_check import check_weights

        check_weights(self, spec)
        return self
