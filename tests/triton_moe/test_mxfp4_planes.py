"""The repacked mxfp4 layout (backends/triton_moe/mxfp4_planes.py) decoded in a Triton kernel:
every e2m1 nibble under e8m0 scales from 0 to 250 (so also above 128, where the scale takes two
multiplies) lands at its k, bit for bit equal to the float64 dequantization, on K that is not a
multiple of the 128-wide step. In the interpreter on CPU and on a CUDA GPU."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from backends.reference import dequant
from backends.triton_moe import mxfp4_planes
from backends.triton_moe.mxfp4_planes import _k_pairs_tile, _plane_pair, _scale_factors, _scaled, step_tile

N, K = 24, 352  # 2.75 steps of 128
EXPONENTS = (0, 1, 100, 119, 127, 128, 129, 200, 250)


@triton.jit
def _decode_kernel(w_ptr, s_ptr, out_ptr, N, K, SCALE_HIGH: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n, k] = the fp32 weight the GEMM's planes hold, for every k of the padded steps."""
    rows = tl.arange(0, BLOCK_N)
    row_ok = rows < N
    r = tl.arange(0, 16)
    steps = tl.cdiv(K, 128)
    for step in range(0, steps):
        words = tl.load(w_ptr + rows[:, None] * (steps * 16) + step * 16 + r[None, :], mask=row_ok[:, None],
                        other=0)
        for jj in tl.static_range(4):
            lo, hi = _plane_pair(words, jj)
            low, high = _scale_factors(s_ptr, 0, 0, step * 4 + jj // 2, rows, row_ok, N, SCALE_HIGH)
            lo = _scaled(lo, low, high, SCALE_HIGH, True)
            low, high = _scale_factors(s_ptr, 0, 0, step * 4 + 2 + jj // 2, rows, row_ok, N, SCALE_HIGH)
            hi = _scaled(hi, low, high, SCALE_HIGH, True)
            k = step * 128 + 16 * jj + r
            tl.store(out_ptr + rows[:, None] * (steps * 128) + k[None, :], lo, mask=row_ok[:, None])
            tl.store(out_ptr + rows[:, None] * (steps * 128) + k[None, :] + 64, hi, mask=row_ok[:, None])


@triton.jit
def _decode_k_pairs_kernel(w_ptr, s_ptr, out_ptr, N, K, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr,
                           SWAP_AB: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n, k] = the weight the GEMM's whole-step k-pairs tile holds ([BN, 128], or [128, BN]
    unless SWAP_AB; bf16 on the GPU path, fp32 with DOT_F32)."""
    rows = tl.arange(0, BLOCK_N)
    row_ok = rows < N
    r = tl.arange(0, 16)
    kk = tl.arange(0, 128)
    steps = tl.cdiv(K, 128)
    for step in range(0, steps):
        if SWAP_AB:
            words = tl.load(w_ptr + rows[:, None] * (steps * 16) + step * 16 + r[None, :],
                            mask=row_ok[:, None], other=0)
        else:
            words = tl.load(w_ptr + rows[None, :] * (steps * 16) + step * 16 + r[:, None],
                            mask=row_ok[None, :], other=0)
        e0 = tl.load(s_ptr + (step * 4) * N + rows, mask=row_ok, other=0).to(tl.int32)
        e1 = tl.load(s_ptr + (step * 4 + 1) * N + rows, mask=row_ok, other=0).to(tl.int32)
        e2 = tl.load(s_ptr + (step * 4 + 2) * N + rows, mask=row_ok, other=0).to(tl.int32)
        e3 = tl.load(s_ptr + (step * 4 + 3) * N + rows, mask=row_ok, other=0).to(tl.int32)
        tile = step_tile(_k_pairs_tile(words, 0, e0, SCALE_HIGH, DOT_F32, SWAP_AB),
                         _k_pairs_tile(words, 1, e1, SCALE_HIGH, DOT_F32, SWAP_AB),
                         _k_pairs_tile(words, 2, e2, SCALE_HIGH, DOT_F32, SWAP_AB),
                         _k_pairs_tile(words, 3, e3, SCALE_HIGH, DOT_F32, SWAP_AB), SWAP_AB)
        k = step * 128 + kk
        if SWAP_AB:
            tl.store(out_ptr + rows[:, None] * (steps * 128) + k[None, :], tile.to(tl.float32),
                     mask=row_ok[:, None])
        else:
            tl.store(out_ptr + rows[None, :] * (steps * 128) + k[:, None], tile.to(tl.float32),
                     mask=row_ok[None, :])


def _weights(device):
    g = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (1, N, K // 2), generator=g, dtype=torch.int32).to(torch.uint8)
    packed[0, 0, :8] = torch.arange(0, 256, 0x11, dtype=torch.int32)[:8].to(torch.uint8)  # all 16 nibbles
    packed[0, 1, :8] = torch.arange(0x88, 256, 0x11, dtype=torch.int32)[:8].to(torch.uint8)
    pick = torch.randint(0, len(EXPONENTS), (1, N, K // 32), generator=g)
    e8m0 = torch.tensor(EXPONENTS, dtype=torch.uint8)[pick]
    return packed.to(device), e8m0.to(device)


def _check(device):
    packed, e8m0 = _weights(device)
    words, scales, scale_high = mxfp4_planes.repack(packed, e8m0)
    _check_k_pairs(packed, e8m0, device)
    assert scale_high
    assert words.shape == (1, N, 3 * 16) and scales.shape == (1, 3 * 4, N)
    out = torch.full((N, 3 * 128), float("nan"), dtype=torch.float32, device=device)
    _decode_kernel[(1,)](words, scales, out, N, K, SCALE_HIGH=True, BLOCK_N=triton.next_power_of_2(N))
    ref = dequant.mxfp4(packed.cpu(), e8m0.cpu(), torch.float64)[0]
    got = out.cpu()
    assert torch.equal(got[:, :K].double(), ref), "a decoded value differs from the float64 dequantization"
    assert bool((got[:, K:] == 0).all()), "the padding past K does not decode to zeros"
    # Rounded to bf16 for the dots: exact (two significant bits), nothing flushed to zero.
    assert torch.equal(got[:, :K].bfloat16().double(), ref)


def _check_k_pairs(packed, e8m0, device):
    words, scales, _ = mxfp4_planes.repack(packed, e8m0, k_pairs=True)
    ref = dequant.mxfp4(packed.cpu(), e8m0.cpu(), torch.float64)[0]
    for swap_ab in (True, False):
        out = torch.full((N, 3 * 128), float("nan"), dtype=torch.float32, device=device)
        _decode_k_pairs_kernel[(1,)](words, scales, out, N, K, SCALE_HIGH=True, DOT_F32=device == "cpu",
                                     SWAP_AB=swap_ab, BLOCK_N=triton.next_power_of_2(N))
        got = out.cpu().double()
        # bf16 holds every decoded value exactly, up to 6 x 2^123 (e8m0 250): none rounded or flushed.
        assert torch.equal(got[:, :K], ref), f"a k-pairs value differs from float64 (swap_ab={swap_ab})"
        assert bool((got[:, K:] == 0).all()), "the padding past K does not decode to zeros"


@pytest.mark.usefixtures("interpreter")
def test_decode_exact_in_interpreter():
    _check("cpu")


@pytest.mark.cuda
def test_decode_exact_on_gpu():
    _check("cuda:0")
