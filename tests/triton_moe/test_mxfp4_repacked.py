"""The repacked mxfp4 layout (backends/triton_moe/mxfp4_repacked.py) decoded by the GEMMs' own step
tile, in both operand orders: every e2m1 nibble under e8m0 exponents from 0 to 250 (above 128 the
scale takes two multiplies) lands at its k bit for bit equal to the float64 dequantization, on a K
that is not a multiple of the 128-wide step, and the padding decodes to zeros. In the interpreter
on CPU (fp32 tiles) and on a CUDA GPU (bf16 tiles)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from backends.reference import dequant
from backends.triton_moe import mxfp4_repacked

N, K = 24, 352  # 2.75 steps of 128
EXPONENTS = (0, 1, 100, 119, 127, 128, 129, 200, 250)  # 6 x 2^(250 - 127) is within bf16's range


@triton.jit
def _decode_kernel(w_ptr, s_ptr, out_ptr, N, K, SCALE_HIGH: tl.constexpr, DOT_F32: tl.constexpr,
                   SWAP_AB: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[n, k] = the weight the GEMM's step tile holds for row n."""
    rows = tl.arange(0, BLOCK_N)
    row_ok = rows < N
    kk = tl.arange(0, 128)
    steps = tl.cdiv(K, 128)
    for k0 in range(0, steps * 128, 128):
        tile = mxfp4_repacked.step_tile(w_ptr, s_ptr, 0, rows, row_ok, k0, K, N, 0, 0, SCALE_HIGH, DOT_F32,
                                        SWAP_AB).to(tl.float32)
        k = k0 + kk
        if SWAP_AB:
            tl.store(out_ptr + rows[:, None] * (steps * 128) + k[None, :], tile, mask=row_ok[:, None])
        else:
            tl.store(out_ptr + rows[None, :] * (steps * 128) + k[:, None], tile, mask=row_ok[None, :])


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
    words, scales, scale_high = mxfp4_repacked.repack(packed, e8m0)
    assert scale_high
    assert words.shape == (1, N, 3 * 16) and scales.shape == (1, 3 * 4, N)
    ref = dequant.mxfp4(packed.cpu(), e8m0.cpu(), torch.float64)[0]
    for swap_ab in (True, False):
        out = torch.full((N, 3 * 128), float("nan"), dtype=torch.float32, device=device)
        _decode_kernel[(1,)](words, scales, out, N, K, SCALE_HIGH=True, DOT_F32=device == "cpu",
                             SWAP_AB=swap_ab, BLOCK_N=triton.next_power_of_2(N))
        got = out.cpu().double()
        assert torch.equal(got[:, :K], ref), f"a decoded value differs from float64 (swap_ab={swap_ab})"
        assert bool((got[:, K:] == 0).all()), "the padding past K does not decode to zeros"


@pytest.mark.usefixtures("interpreter")
def test_decode_exact_in_interpreter():
    _check("cpu")


@pytest.mark.cuda
def test_decode_exact_on_gpu():
    _check("cuda:0")
