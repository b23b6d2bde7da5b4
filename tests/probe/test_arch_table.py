"""Arch-derived GPU facts."""

import pytest

from hal.probe.arch_table import amd_base_arch, amd_features, amd_warp_size, nvidia_arch, nvidia_features

pytestmark = pytest.mark.cpu


def test_nvidia_features():
    hopper = nvidia_features((9, 0))
    assert hopper.wgmma and hopper.tma and hopper.mma_sync and hopper.fp8 == "ocp" and not hopper.tcgen05
    blackwell = nvidia_features((10, 0))
    assert blackwell.tcgen05 and not blackwell.wgmma
    consumer = nvidia_features((12, 0))
    assert not consumer.tcgen05 and not consumer.wgmma and consumer.mma_sync and consumer.fp8 == "ocp"
    ampere = nvidia_features((8, 0))
    assert ampere.cp_async and ampere.fp8 is None and not ampere.tma
    assert nvidia_features((8, 9)).fp8 == "ocp"


def test_nvidia_optin_smem():
    assert nvidia_arch((9, 0)).smem_per_block_optin == 232448
    assert nvidia_arch((12, 0)).smem_per_block_optin == 101376
    assert nvidia_arch((8, 0)).smem_per_block_optin == 166912
    assert nvidia_arch((6, 1)) is None


def test_amd():
    assert amd_base_arch("gfx942:sramecc+:xnack-") == "gfx942"
    assert amd_warp_size("gfx942") == 64 and amd_warp_size("gfx1100") == 32
    assert amd_features("gfx942").fp8 == "fnuz" and amd_features("gfx942").mfma
    assert amd_features("gfx950").fp8 == "ocp"
    assert not amd_features("gfx1100").mfma and amd_features("gfx1100").fp8 is None
