"""Fixtures shared by the core tests."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """1 intra-op thread for a module's tests (restored after).

    On a shared 2-core machine OpenMP spin-waiting makes 2 threads 3-10x slower than 1 for the tiny
    pipelines (measured). Outputs are compared only within a module, so the thread count (part of the
    fp32 result) is the same for every output a module compares.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def reg():
    """A private ``CompileRegistry`` (not the process-wide ``REGISTRY``), closed after the test."""
    from steadfast.core.compile.registry import CompileRegistry

    r = CompileRegistry()
    yield r
    r.close()


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters reset before and after the test (compile counts start at zero)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()
