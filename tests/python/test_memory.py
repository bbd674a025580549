"""The CPU backend's large-block cache: a freed large result is reused for the next result of
the same size (no fresh pages to fault in). OPFORGE_CPU_CACHE_MB sets its limit (default
1024; 0 turns it off)."""

import numpy as np

import opforge


def test_large_result_memory_is_reused(rng):
    x = rng.standard_normal((1024, 1024)).astype(np.float32)  # 4 MiB: a cached size
    first = opforge.add_one(x)
    address = first.ctypes.data
    np.testing.assert_array_equal(first, x + 1)
    del first
    second = opforge.add_one(x * 2)
    assert second.ctypes.data == address
    np.testing.assert_array_equal(second, x * 2 + 1)  # reused memory holds the new result only


def test_live_results_never_share_memory(rng):
    x = rng.standard_normal((1024, 1024)).astype(np.float32)
    a, b = opforge.add_one(x), opforge.add_one(x)
    assert a.ctypes.data != b.ctypes.data
