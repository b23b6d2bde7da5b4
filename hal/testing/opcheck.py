"""torch.library.opcheck over the calls a kernel really makes: a Recorder stands in for an op
namespace and keeps each op's last arguments, and `opcheck_recorded` checks the ops on them."""

from __future__ import annotations

from collections.abc import Iterable

import torch

# test_faketensor and test_aot_dispatch need fake kernels, which eager-only ops do not register;
# the schema and autograd checks are the ones about what an op declares.
EAGER_CHECKS = ("test_schema", "test_autograd_registration")


class Recorder:
    """Stands in for an op namespace: records each call's arguments, then runs the real op."""

    def __init__(self, namespace):
        self.namespace, self.calls = namespace, {}

    def __getattr__(self, name):
        op = getattr(self.namespace, name)

        def call(*args):
            self.calls[name] = (op, args)
            return op(*args)
        return call


def opcheck_recorded(recorder: Recorder, names: Iterable[str], checks=EAGER_CHECKS) -> None:
    """Run torch.library.opcheck with `checks` on each named op, with the arguments of its last
    recorded call (KeyError if the op was never called)."""
    for name in names:
        op, args = recorder.calls[name]
        torch.library.opcheck(op.default, args, test_utils=checks)
