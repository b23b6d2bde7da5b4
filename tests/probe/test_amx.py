"""AMX state logic, with arch_prctl replaced by a fake kernel."""

import errno

import pytest

from hal.probe import amx

pytestmark = pytest.mark.cpu
XTILEDATA = 1 << amx.XFEATURE_XTILEDATA
XSTATE_LEGACY = 0b11  # x87 and SSE: always supported and permitted


class FakeKernel:
    """arch_prctl with a supported mask and a permitted mask that ARCH_REQ_XCOMP_PERM can grow."""

    def __init__(self, supported, permitted, grant=True, fail=None):
        self.supported, self.permitted, self.grant, self.fail = supported, permitted, grant, fail
        self.requests = 0

    def __call__(self, code, arg):
        if self.fail is not None:
            raise amx.ArchPrctlError(self.fail, "fake")
        if code == amx.ARCH_REQ_XCOMP_PERM:
            self.requests += 1
            if not self.grant:
                raise amx.ArchPrctlError(errno.EPERM, "fake refusal")
            self.permitted |= 1 << arg.value
            return
        mask = self.supported if code == amx.ARCH_GET_XCOMP_SUPP else self.permitted
        arg._obj.value = mask


@pytest.fixture
def kernel(monkeypatch):
    def install(**kwargs):
        fake = FakeKernel(**kwargs)
        monkeypatch.setattr(amx, "_arch_prctl", fake)
        return fake
    return install


def test_bare_metal_grants_on_request(kernel):
    fake = kernel(supported=XSTATE_LEGACY | XTILEDATA, permitted=XSTATE_LEGACY)
    state = amx.read_amx_state(cpuid=True)
    assert state.usable and fake.requests == 1 and "granted on request" in state.reason


def test_already_permitted_needs_no_request(kernel):
    fake = kernel(supported=XSTATE_LEGACY | XTILEDATA, permitted=XSTATE_LEGACY | XTILEDATA)
    state = amx.read_amx_state(cpuid=True)
    assert state.usable and fake.requests == 0 and state.reason == ""


def test_vm_without_tile_state(kernel):
    fake = kernel(supported=XSTATE_LEGACY, permitted=XSTATE_LEGACY)
    state = amx.read_amx_state(cpuid=True)
    assert state.cpuid and state.os_support is False and state.permitted is False and not state.usable
    assert fake.requests == 0 and "ARCH_GET_XCOMP_SUPP" in state.reason


def test_refused_request(kernel):
    kernel(supported=XSTATE_LEGACY | XTILEDATA, permitted=XSTATE_LEGACY, grant=False)
    state = amx.read_amx_state(cpuid=True)
    assert state.os_support and state.permitted is False and not state.usable
    assert "refused" in state.reason
    assert amx.request_amx_permission() is False


def test_old_kernel(kernel):
    kernel(supported=0, permitted=0, fail=errno.EINVAL)
    state = amx.read_amx_state(cpuid=True)
    assert state.os_support is None and state.permitted is None and not state.usable
    assert "Linux < 5.16" in state.reason


def test_no_amx_in_cpuid_never_requests(kernel):
    fake = kernel(supported=XSTATE_LEGACY | XTILEDATA, permitted=XSTATE_LEGACY)
    state = amx.read_amx_state(cpuid=False)
    assert not state.usable and fake.requests == 0 and "no AMX" in state.reason


def test_not_x86(monkeypatch):
    monkeypatch.setattr(amx.platform, "machine", lambda: "aarch64")
    state = amx.read_amx_state(cpuid=False)
    assert state.os_support is None and not state.usable
    assert amx.request_amx_permission() is False


def test_real_syscall_does_not_raise():
    state = amx.read_amx_state(cpuid=False)
    assert state.usable is False
    assert isinstance(amx.request_amx_permission(), bool)
