"""Twins of the compiled ops that torch.compile can trace. The C++ sources define each op with its
kernel in one step (m.def(schema, fn)), which torch registers as CompositeImplicitAutograd: such
an op takes no fake kernel, and tracing it runs the C++ kernel on tensors without data. So each
op a kernel calls gets a twin with the same schema in the namespace `<namespace>_traced`: its
implementation calls the C++ op, its fake kernel (given by the backend) returns outputs of the
right shapes and dtypes without computing. A kernel calls the twin only while torch.compile
traces it (torch.compiler.is_compiling()); eager calls go straight to the C++ op.

Triton kernels' launch code (configs, grids and launches built as Python objects per call) is
beyond Dynamo; `between_graphs` has torch.compile run it eagerly between two graphs instead."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

_libraries: dict = {}  # twin namespace -> torch.library.Library, kept alive for the process
_lock = threading.Lock()


def twins(namespace: str, fakes: Mapping[str, Callable]):
    """The torch.ops namespace of the twins of `namespace`'s ops named in `fakes` (op name -> fake
    kernel taking the op's arguments), defined on first use."""
    import torch

    traced = f"{namespace}_traced"
    with _lock:
        if traced not in _libraries:
            library = torch.library.Library(traced, "DEF")
            for op_name, fake in fakes.items():
                original = getattr(getattr(torch.ops, namespace), op_name).default
                schema = str(original._schema)
                library.define(schema[schema.index("::") + 2:])
                library.impl(op_name, _forward(original), "CompositeExplicitAutograd")
                torch.library.register_fake(f"{traced}::{op_name}", fake, lib=library)
            _libraries[traced] = library
    return getattr(torch.ops, traced)


def _forward(original):
    def call(*args):
        return original(*args)
    return call


def between_graphs(run):
    """`run` (a kernel's _run) called eagerly under torch.compile, as a graph break, rather than
    traced."""
    import torch

    return torch.compiler.disable(run, reason="moe-hal: the kernel's Triton launch code runs eagerly")
