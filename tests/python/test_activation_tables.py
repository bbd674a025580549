"""The float32 activations on a dense grid, on every SIMD target, to 1e-6 of their terms.

On AVX-512 and AVX2 the CPU kernels compute Phi, phi and sigmoid from piecewise polynomials
(include/opforge/cpu/piecewise_tables.h) in the lanes inside the tables' range and from exp
in the others; narrower targets always use exp. Random normal inputs rarely
reach the outer intervals, so this walks every interval, both sides of every interval edge and
of the range's end, and vectors that straddle it. The error allowed is relative to the
magnitude of the formula's terms (the result itself unless terms cancel): 1e-6 (the tables
stay within about 2.5e-7, the exp path within about 6e-7), plus 2^-22 per unit of exp's
argument (rounded before exp sees it, so the exp path's error grows with it), plus the float32
rounding of the result. That is 1.5-4x what either path makes here, and far below what a wrong
coefficient or interval would.
"""

import importlib.util
import math
import re
from pathlib import Path

import numpy as np
import pytest

import opforge

ROOT = Path(__file__).resolve().parents[2]
erfc = np.vectorize(math.erfc, otypes=[np.float64])
TANH_K = 2 * math.sqrt(2 / math.pi)  # gelu's tanh form is x * sigmoid(TANH_K * (x + 0.044715 x^3))


def normal_cdf(x):
    return 0.5 * erfc(-x / math.sqrt(2))


def normal_pdf(x):
    return np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def tanh_form(x):
    """sigmoid(2u) and d(2u)/dx for gelu's tanh form."""
    return sigmoid(TANH_K * (x + 0.044715 * x**3)), TANH_K * (1 + 3 * 0.044715 * x * x)


def gelu(x):
    return x * normal_cdf(x), np.abs(x) * normal_cdf(x)


def gelu_grad(x):
    return normal_cdf(x) + x * normal_pdf(x), normal_cdf(x) + np.abs(x) * normal_pdf(x)


def gelu_tanh(x):
    s, _ = tanh_form(x)
    return x * s, np.abs(x) * s


def gelu_tanh_grad(x):
    s, slope = tanh_form(x)
    return s * (1 + x * (1 - s) * slope), s * (1 + np.abs(x) * (1 - s) * slope)


def silu(x):
    return x * sigmoid(x), np.abs(x) * sigmoid(x)


def silu_grad(x):
    s = sigmoid(x)
    return s * (1 + x * (1 - s)), s * (1 + np.abs(x) * (1 - s))


def erf_argument(x):
    return 0.5 * x * x


def tanh_argument(x):
    return np.abs(TANH_K * (x + 0.044715 * x**3))


# name: (opforge call, float64 value and term magnitude, exp's argument, grid half-width).
# Grids reach past the tables (|x| < 4 for Phi and phi; |2u| < 16, |x| < 4.7, for the tanh
# form; |x| < 16 for silu) into the exp path.
CASES = {
    "gelu": (lambda x: opforge.gelu(x), gelu, erf_argument, 6),
    "gelu_backward": (lambda x: opforge.gelu_backward(np.ones_like(x), x), gelu_grad, erf_argument, 6),
    "gelu_tanh": (lambda x: opforge.gelu(x, approximate="tanh"), gelu_tanh, tanh_argument, 6),
    "gelu_tanh_backward": (lambda x: opforge.gelu_backward(np.ones_like(x), x, approximate="tanh"),
                           gelu_tanh_grad, tanh_argument, 6),
    "silu": (lambda x: opforge.silu(x), silu, np.abs, 17),
    "silu_backward": (lambda x: opforge.silu_backward(np.ones_like(x), x), silu_grad, np.abs, 17),
}


def grid(half_width):
    """Every multiple of 2^-10 in [-half_width, half_width) (the interval edges among them) and
    both float32 neighbours of each."""
    x = np.arange(-half_width, half_width, 2.0**-10, dtype=np.float32)
    return np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])


def check(name, simd_target, x):
    call, reference, argument, _ = CASES[name]
    x64 = x.astype(np.float64)
    want, scale = reference(x64)
    allowed = scale * (1e-6 + 2.0**-22 * argument(x64)) + 0.5 * np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    error = np.abs(np.asarray(call(x), dtype=np.float64) - want)
    worst = int(np.argmax(error - allowed))
    assert np.all(error <= allowed), (
        f"{name} on {simd_target}: at x = {x[worst]!r} off by {error[worst]:.3e}, allowed {allowed[worst]:.3e} "
        f"(want {want[worst]!r})")


@pytest.mark.parametrize("name", CASES)
def test_dense_grid(simd_target, name):
    check(name, simd_target, grid(CASES[name][-1]))


@pytest.mark.parametrize("name", CASES)
def test_shuffled_grid(simd_target, rng, name):
    # In random order most vectors mix lanes inside and outside the tables.
    check(name, simd_target, rng.permutation(grid(CASES[name][-1])))


@pytest.mark.parametrize("name", CASES)
def test_a_value_does_not_depend_on_its_neighbours(simd_target, rng, name):
    # Each lane picks the table or exp by its own |x|, never by the vector's: the same x gives the
    # same bits among neighbours inside the tables (the sorted grid) and outside them (shuffled),
    # so a row's tail, a thread's share or a fused epilogue (linear_act's) give the op's bits.
    call, x = CASES[name][0], grid(CASES[name][-1])
    order = rng.permutation(x.size)
    np.testing.assert_array_equal(call(x[order]), call(x)[order], err_msg=f"{name} on {simd_target}")


def test_tables_match_their_generator():
    # The header is generated; an edit by hand (or a changed fit) must go through the script.
    # Numbers are compared to 1%: another LAPACK build may move a fit's last digits.
    spec = importlib.util.spec_from_file_location("fit_piecewise_tables", ROOT / "scripts" / "fit_piecewise_tables.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    number = r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?(?=f|\b)"
    generated, committed = fit.header_source(), fit.HEADER.read_text()
    assert re.sub(number, "#", generated) == re.sub(number, "#", committed), "run: python scripts/fit_piecewise_tables.py"
    np.testing.assert_allclose([float(v) for v in re.findall(number, committed)],
                               [float(v) for v in re.findall(number, generated)], rtol=1e-2, atol=1e-9)
