"""The requant backend on the recorded GPU profiles: its verdicts and its launch geometry. A
profile named here is committed in hal/profiles; a missing one fails (hal.probe raises), it is
never skipped."""

import hal.backends.requant as requant
import pytest
from hal.backends.requant.geometry import requant_launch_geometry

import hal
from hal.backend import Target
from hal.spec import RequantSpec

pytestmark = [pytest.mark.profiles, pytest.mark.cpu]

REQUANT = RequantSpec(num_experts=256, hidden_size=7168)
DSV3_GROUPS = 7168 // 128


@pytest.mark.parametrize("profile", ["h200", "mi300x", "h100", "b200", "rtx5090"])
def test_recorded_fp8_gpus_are_accepted(profile):
    verdict = requant.backend.check(REQUANT, Target("cuda:0", hal.probe(profile=profile)))
    assert verdict.ok, verdict.reasons
    assert not verdict.explicit_only


def test_rdna3_is_rejected_for_lack_of_fp8():
    verdict = requant.backend.check(REQUANT, Target("cuda:0", hal.probe(profile="rx7900xtx")))
    assert not verdict.ok and "FP8" in verdict.summary()


@pytest.mark.parametrize("profile, g_block_wide, g_block_narrow", [("h200", 16, 8), ("mi300x", 32, 16)])
def test_recorded_profiles_give_their_geometry(profile, g_block_wide, g_block_narrow):
    warp = hal.probe(profile=profile).gpus[0].warp_size
    wide = requant_launch_geometry(DSV3_GROUPS, 256, expected_rows=2, warp_size=warp, max_rows=4096)
    assert tuple(wide) == (g_block_wide, 4, 4)
    narrow = requant_launch_geometry(DSV3_GROUPS, 8, expected_rows=129, warp_size=warp, max_rows=4096)
    assert tuple(narrow) == (g_block_narrow, 32, 258)


def test_a_missing_profile_is_an_error_not_a_skip():
    with pytest.raises(ValueError, match="profile"):
        hal.probe(profile="h300-not-recorded")
