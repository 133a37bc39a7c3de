"""Stopline's Triton kernel on a machine without CUDA: the test modules that run
it call :func:`interpret_without_cuda` before importing ``stopline.logits``."""

from __future__ import annotations

import importlib
import os
import sys


def interpret_without_cuda(cuda: bool) -> None:
    """Without CUDA, set ``TRITON_INTERPRET=1`` and, when the kernel module was
    already imported with the compiler, reload it: Triton picks the
    interpreter when ``@triton.jit`` decorates the kernel, whatever other
    test files imported first."""
    if cuda:
        return
    os.environ["TRITON_INTERPRET"] = "1"
    mod = sys.modules.get("stopline.logits.triton_kernel")
    if mod is not None and type(mod._constraints_kernel).__name__ != "InterpretedFunction":
        importlib.reload(mod)
