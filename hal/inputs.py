"""Validation of per-call inputs. Every error names the argument and what was expected; kernels
skip it with check=False on hot paths."""

from __future__ import annotations

import torch

from hal.spec import TOKEN_GROUP, MoESpec


def require(cond: bool, message: str):
    if not cond:
        raise ValueError(message)


def _same_device(name: str, t: torch.Tensor, device: torch.device):
    require(t.device == device, f"{name} is on {t.device}: expected {device}")


def check_count(name: str, value, optional: bool = True) -> None:
    """A row count: an int >= 0 (a bool is not a count), or None where `optional`."""
    if value is None and optional:
        return
    require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            f"{name}={value!r}: expected {'None or ' if optional else ''}an int >= 0")


def check_token_inputs(spec: MoESpec, device: torch.device, x, topk_weights, topk_ids, out):
    dtype = getattr(torch, spec.act_dtype)
    require(isinstance(x, torch.Tensor), f"x must be a torch.Tensor, got {type(x).__name__}")
    require(x.dim() == 2 and x.shape[1] == spec.hidden_size,
            f"x has shape {tuple(x.shape)}: expected (M, {spec.hidden_size})")
    require(x.dtype == dtype, f"x has dtype {x.dtype}: expected {dtype}")
    _same_device("x", x, device)
    require(x.is_contiguous(), "x must be contiguous")
    M = x.shape[0]
    require(isinstance(topk_ids, torch.Tensor) and tuple(topk_ids.shape) == (M, spec.top_k),
            f"topk_ids has shape {tuple(getattr(topk_ids, 'shape', ()))}: expected ({M}, {spec.top_k})")
    require(topk_ids.dtype in (torch.int32, torch.int64),
            f"topk_ids has dtype {topk_ids.dtype}: expected torch.int32 or torch.int64")
    _same_device("topk_ids", topk_ids, device)
    require(isinstance(topk_weights, torch.Tensor) and topk_weights.shape == topk_ids.shape,
            f"topk_weights has shape {tuple(getattr(topk_weights, 'shape', ()))}: expected "
            f"({M}, {spec.top_k})")
    require(topk_weights.dtype in (torch.float32, dtype),
            f"topk_weights has dtype {topk_weights.dtype}: expected torch.float32 or {dtype}")
    _same_device("topk_weights", topk_weights, device)
    # Kernels read the routing through raw pointers: a strided view would be read as contiguous.
    require(topk_ids.is_contiguous(), "topk_ids must be contiguous")
    require(topk_weights.is_contiguous(), "topk_weights must be contiguous")
    if M and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        require(lo >= -1 and hi < spec.num_experts,
                f"topk_ids holds values in [{lo}, {hi}]: expected [-1, {spec.num_experts}) "
                "(an expert id, or -1 for no route)")
    if out is not None:
        require(isinstance(out, torch.Tensor) and out.shape == x.shape and out.dtype == x.dtype,
                f"out must be a {x.dtype} tensor of shape {tuple(x.shape)}")
        _same_device("out", out, device)
        require(out.is_contiguous(), "out must be contiguous")


def check_masked_inputs(num_experts: int, hidden: int, device: torch.device, x, x_scale, masked_m,
                        expected_rows=None):
    """DeepEP low-latency layout: x fp8 [E, max_m, H], x_scale fp32 [E, max_m, H/128] (row- or
    column-major in its last two dims), masked_m int32 [E] with values in [0, max_m]."""
    require(isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[0] == num_experts
            and x.shape[2] == hidden,
            f"x has shape {tuple(getattr(x, 'shape', ()))}: expected ({num_experts}, max_m, {hidden})")
    require(x.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz),
            f"x has dtype {x.dtype}: expected torch.float8_e4m3fn or torch.float8_e4m3fnuz")
    _same_device("x", x, device)
    require(x.is_contiguous(), "x must be contiguous")
    E, max_m = x.shape[0], x.shape[1]
    groups = hidden // TOKEN_GROUP
    require(isinstance(x_scale, torch.Tensor) and tuple(x_scale.shape) == (E, max_m, groups),
            f"x_scale has shape {tuple(getattr(x_scale, 'shape', ()))}: expected ({E}, {max_m}, {groups})")
    require(x_scale.dtype == torch.float32, f"x_scale has dtype {x_scale.dtype}: expected torch.float32")
    _same_device("x_scale", x_scale, device)
    row_major = x_scale.stride() == (max_m * groups, groups, 1)
    col_major = x_scale.stride() == (max_m * groups, 1, max_m)
    require(row_major or col_major or max_m <= 1 or groups == 1,
            f"x_scale has strides {x_scale.stride()}: expected row-major {(max_m * groups, groups, 1)} "
            f"or column-major {(max_m * groups, 1, max_m)} in its last two dims")
    require(isinstance(masked_m, torch.Tensor) and tuple(masked_m.shape) == (E,)
            and masked_m.dtype == torch.int32,
            f"masked_m must be an int32 tensor of shape ({E},)")
    _same_device("masked_m", masked_m, device)
    if E:
        lo, hi = int(masked_m.min()), int(masked_m.max())
        require(lo >= 0 and hi <= max_m,
                f"masked_m holds values in [{lo}, {hi}]: expected [0, max_m={max_m}]")
    check_count("expected_rows", expected_rows)


def check_masked_plan_args(experts: int, masked_m, expected_rows, max_m, masked_m_optional: bool):
    """plan(masked_m, expected_rows, max_m) of the masked layout: masked_m an int32 tensor of
    shape (experts,) with values in [0, max_m] (None only where the backend plans without it)."""
    check_count("expected_rows", expected_rows)
    check_count("max_m", max_m)
    if masked_m is None and masked_m_optional:
        return
    require(isinstance(masked_m, torch.Tensor) and masked_m.dtype == torch.int32
            and tuple(masked_m.shape) == (experts,) and masked_m.device.type != "meta",
            f"masked_m must be an int32 tensor of shape ({experts},) with values, got "
            f"{getattr(masked_m, 'dtype', type(masked_m).__name__)} "
            f"{tuple(getattr(masked_m, 'shape', ()))} on {getattr(masked_m, 'device', '-')}")
    if experts:
        lo, hi = int(masked_m.min()), int(masked_m.max())
        top = "max_m" if max_m is None else f"max_m={max_m}"
        require(lo >= 0 and (max_m is None or hi <= max_m),
                f"masked_m holds values in [{lo}, {hi}]: expected [0, {top}]")


def check_requant_args(x, output_scale, out, fp8_dtype, source: str = "this device's FP8"):
    """The requant's own arguments, after check_masked_inputs: x in the device's FP8, a positive
    finite one-element fp32 output_scale beside it, and out (if given) shaped and typed like x."""
    require(x.dtype == fp8_dtype, f"x has dtype {x.dtype}: expected {fp8_dtype}, {source}")
    require(isinstance(output_scale, torch.Tensor) and output_scale.numel() == 1
            and output_scale.dtype == torch.float32,
            "output_scale must be a one-element torch.float32 tensor")
    _same_device("output_scale", output_scale, x.device)
    value = float(output_scale.reshape(()))
    # Below the smallest normal fp32, 1 / output_scale is infinite and turns zeros into NaN.
    tiny = torch.finfo(torch.float32).tiny
    require(tiny <= value < float("inf"),
            f"output_scale={value}: expected a finite normal value >= {tiny} (so 1 / output_scale "
            "is finite)")
    if out is not None:
        require(isinstance(out, torch.Tensor) and out.shape == x.shape and out.dtype == fp8_dtype,
                f"out must be a {fp8_dtype} tensor of shape {tuple(x.shape)}")
        _same_device("out", out, x.device)
        require(out.is_contiguous(), "out must be contiguous")
