"""Fixtures shared by tests/python and every ops/<name>/test_<name>.py.

Data is fresh on every run (a new seed per test) yet every failure is reproducible: the
seed is printed in the failure report, and OPFORGE_TEST_SEED=<seed> replays it.
"""

import os
import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge

# Op tests live in their op's folder, away from tests/python; this makes `import harness`
# work from anywhere without turning the folders into packages.
sys.path.insert(0, str(Path(__file__).parent / "tests" / "python"))

try:
    import jax
except ImportError:
    pass
else:
    # Without x64 jax silently makes float64 and int64 arrays 32-bit. Set once for the whole
    # session, before any test runs, so test order cannot change which dtypes jax tests see.
    jax.config.update("jax_enable_x64", True)


def pytest_report_header(config):
    return (f"opforge {opforge.__version__}: SIMD targets {opforge.simd_targets()} "
            f"(compiled {opforge.simd_targets_compiled()}), {opforge.num_threads()} threads")


@pytest.fixture
def rng(request):
    seed = int(os.environ.get("OPFORGE_TEST_SEED") or secrets.randbits(32))
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for name, value in item.user_properties:
            if name == "seed":
                report.sections.append(("rng seed", f"rerun with OPFORGE_TEST_SEED={value}"))
    return report


@pytest.fixture(params=opforge.simd_targets())
def simd_target(request):
    """Runs the test once per SIMD target this CPU supports, pinned, so fallbacks are tested too."""
    opforge.set_simd_target(request.param)
    yield request.param
    opforge.set_simd_target("")
