"""Fixtures shared by tests/python and every ops/<name>/test_<name>.py.

Data is fresh on every run (a new seed per test) yet every failure is reproducible: the
seed is printed in the failure report, and OPFORGE_TEST_SEED=<seed> replays it.
"""

import pytest

import opforge
from opforge.testing import bf16_unit, rng, simd_target  # noqa: F401  (fixtures for every test; also enables jax x64)


def pytest_report_header(config):
    return (f"opforge {opforge.__version__}: SIMD targets {opforge.simd_targets()} "
            f"(compiled {opforge.simd_targets_compiled()}), {opforge.num_threads()} threads")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for name, value in item.user_properties:
            if name == "seed":
                report.sections.append(("rng seed", f"rerun with OPFORGE_TEST_SEED={value}"))
    return report
