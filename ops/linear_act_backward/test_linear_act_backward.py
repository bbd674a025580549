"""linear_act_backward against torch autograd of linear_act's torch reference in float64, on every
dtype, SIMD target, activation and layout; gradients through the torch and JAX adapters with and
without a bias; results bitwise the same whatever the thread count."""

import math

import numpy as np
import pytest
import torch

import opforge
from opforge.testing import (FLOAT_DTYPES, STRIDED_KINDS, TOLERANCES, assert_result, cases, random, strided,
                             to_float64, to_framework)
from opforge.references import linear_act as linear_act_reference

ACTS = ["none", "relu", "gelu", "gelu_tanh", "silu"]
COMPUTE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}
STORAGE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# (m, n, k) as in test_linear_act.py: dot products, panels along either operand, K and row blocks.
SHAPES = [(1, 7, 33), (1, 1, 1), (5, 65, 257), (65, 5, 33), (33, 65, 513), (257, 33, 65), (257, 300, 33)]


def autograd(g, x, w, b, act):
    """(grad_x, grad_weight, grad_bias) of the torch reference by autograd, in float64 (a zero
    bias stands in for none: the same z, and its gradient is the sum the op returns)."""
    xt, wt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    bt = torch.from_numpy(np.zeros(w.shape[0]) if b is None else b).requires_grad_()
    linear_act_reference.torch(xt, wt, bt, act).backward(torch.from_numpy(g))
    return xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()


def check(grad, x, w, b, framework, dtype, act, preact=None, g_rounded=False):
    g64, x64, w64 = to_float64(grad), to_float64(x), to_float64(w)
    b64 = None if b is None else to_float64(b)
    got = opforge.linear_act_backward(grad, x, w, b, act=act, preact=preact)
    want = autograd(g64, x64, w64, b64, act)
    # Sums over n (grad_x) or the rows (grad_weight, grad_bias): an ulp per term of the magnitudes
    # they ran over, |g| * |act'| <= 1.2 |g|; plus act' off by z's rounding (k ulps, |act''| <= 1).
    k = x64.shape[-1]
    rows_g = g64.reshape(-1, w64.shape[0])
    rows_x = x64.reshape(rows_g.shape[0], k)
    z_scale = np.abs(rows_x) @ np.abs(w64).T + (0 if b64 is None else np.abs(b64))
    terms = max(w64.shape[0], rows_x.shape[0]) + 2
    # A saved preact is z rounded to the dtype: act' off by one more rounding of z.
    rounding = 0 if preact is None else STORAGE_EPS[dtype] / COMPUTE_EPS[dtype]
    a = np.abs(rows_g) * (1.2 * terms + (k + 2 + rounding) * z_scale)
    if g_rounded:  # g = grad * act'(z) rounded to the dtype before the products: one more rounding per term
        a += np.abs(rows_g) * 1.2 * STORAGE_EPS[dtype] / COMPUTE_EPS[dtype]
    scales = [(a @ np.abs(w64)).reshape(x64.shape), a.T @ np.abs(rows_x), a.sum(axis=0)]
    rtol, atol = TOLERANCES[dtype]
    for name, g, wv, scale in zip(("grad_x", "grad_weight", "grad_bias"), got, want, scales):
        assert_result(g, framework, dtype, wv.shape)
        allowed = atol + rtol * np.abs(wv) + 1.2 * COMPUTE_EPS[dtype] * scale
        gv = to_float64(g)
        bad = ~(np.abs(gv - wv) <= allowed)
        assert not bad.any(), f"{name}: {bad.sum()} of {bad.size} off: got {gv[bad][:5]}, want {wv[bad][:5]}"


def arrays(rng, m, n, k, framework, dtype, bias=True, lead=()):
    grad = to_framework(random(rng, lead + (m, n), dtype), framework, dtype)
    x = to_framework(random(rng, lead + (m, k), dtype), framework, dtype)
    w = to_framework(random(rng, (n, k), dtype) / math.sqrt(max(k, 1)), framework, dtype)
    b = to_framework(random(rng, (n,), dtype), framework, dtype) if bias else None
    return grad, x, w, b


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("framework, dtype", cases(["numpy"], FLOAT_DTYPES) + cases(["torch"], ["bfloat16"]))
def test_shapes(simd_target, rng, framework, dtype, shape):
    check(*arrays(rng, *shape, framework, dtype), framework, dtype, "gelu")


@pytest.mark.parametrize("shape", [(40, 66, 34), (33, 65, 70)], ids=str)
def test_no_act_bfloat16(simd_target, rng, shape):
    # act="none" multiplies grad itself as bfloat16 (g is grad): every target's product of it.
    check(*arrays(rng, *shape, "torch", "bfloat16"), "torch", "bfloat16", "none")
    # Without grad_bias, no float32 copy of grad is made: the same two gradients.
    grad, x, w, b = arrays(rng, *shape, "torch", "bfloat16")
    full = opforge.linear_act_backward(grad, x, w, b, act="none")
    masked = opforge.linear_act_backward(grad, x, w, b, act="none", output_mask=3)
    assert torch.equal(masked[0], full[0]) and torch.equal(masked[1], full[1]) and masked[2].numel() == 0


# relu only in float64: its derivative jumps at 0, where float32 rounding of z may pick either side.
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", [(3, 40, 65), (33, 70, 300), (70, 33, 9)], ids=str)
def test_acts(simd_target, rng, act, bias, shape):
    check(*arrays(rng, *shape, "numpy", "float64", bias), "numpy", "float64", act)
    if act != "relu":
        check(*arrays(rng, *shape, "numpy", "float32", bias), "numpy", "float32", act)


@pytest.mark.parametrize("framework, dtype", cases(["torch", "jax"], FLOAT_DTYPES))
def test_frameworks(rng, framework, dtype):
    check(*arrays(rng, 9, 20, 33, framework, dtype, lead=(2,)), framework, dtype, "silu")


@pytest.mark.parametrize("lead", [(0,), (2, 0), (2, 3)], ids=str)
def test_leading_dims(simd_target, rng, lead):
    # No rows: grad_weight and grad_bias are empty sums (zeros); grad_x is empty.
    check(*arrays(rng, lead[-1], 12, 20, "numpy", "float32", lead=lead[:-1]), "numpy", "float32", "gelu")


def test_empty_k(rng):
    # k = 0: z = bias, so grad_bias = sum of grad * act'(bias); grad_x and grad_weight are empty.
    grad, x, w, b = arrays(rng, 4, 5, 0, "numpy", "float64")
    gx, gw, gb = opforge.linear_act_backward(grad, x, w, b, act="silu")
    assert gx.shape == (4, 0) and gw.shape == (5, 0)
    check(grad, x, w, b, "numpy", "float64", "silu")


@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]])
def test_strided(simd_target, rng, framework, kind):
    grad, x, w, b = arrays(rng, 6, 40, 33, framework, "float32")
    check(strided(rng, (6, 40), framework, "float32", kind)[0], x, w, b, framework, "float32", "gelu")
    check(grad, strided(rng, (6, 33), framework, "float32", kind)[0], w, b, framework, "float32", "gelu")
    check(grad, x, strided(rng, (40, 33), framework, "float32", kind)[0], b, framework, "float32", "gelu")
    base = to_framework(random(rng, (2, 7, 33), "float32"), framework, "float32")  # rows not evenly spaced
    check(grad.reshape(2, 3, 40)[:, :2], base[:, ::4], w, b, framework, "float32", "gelu")


@pytest.mark.parametrize("framework, dtype", cases(["numpy"], FLOAT_DTYPES) + cases(["torch"], ["bfloat16"]))
@pytest.mark.parametrize("act", ACTS)
def test_saved_preact(simd_target, rng, act, framework, dtype):
    # z saved by linear_act_with_preact, rounded to the dtype, instead of recomputed: the same
    # bound plus one rounding of z.
    grad, x, w, b = arrays(rng, 33, 70, 65, framework, dtype)
    if act == "relu":  # relu' jumps at 0: no cotangent where z is close enough to pick either side
        near_zero = np.abs(to_float64(x) @ to_float64(w).T + to_float64(b)) < 1e-3
        grad[torch.from_numpy(near_zero) if framework == "torch" else near_zero] = 0
    z = opforge.linear_act_with_preact(x, w, b, act=act)[1]
    check(grad, x, w, b, framework, dtype, act, preact=z)
    if act != "none":  # the kernel reads preact, not a recomputed z
        shifted = opforge.linear_act_backward(grad, x, w, b, act=act, preact=z + 1)[0]
        assert not np.allclose(to_float64(shifted), to_float64(opforge.linear_act_backward(grad, x, w, b, act=act)[0]))


# Not broadcast: a view with stride 0 cannot hold z's distinct rows.
@pytest.mark.parametrize("framework, kind", [(f, k) for f in ("numpy", "torch") for k in STRIDED_KINDS[f]
                                             if k != "broadcast"])
def test_saved_preact_strided(rng, framework, kind):
    grad, x, w, b = arrays(rng, 6, 40, 33, framework, "float32")
    z = opforge.linear_act_with_preact(x, w, b, act="silu")[1]
    view = strided(rng, (6, 40), framework, "float32", kind)[0]
    view[...] = z
    check(grad, x, w, b, framework, "float32", "silu", preact=view)


@pytest.fixture
def restore_threads():
    before = opforge.num_threads()
    yield
    opforge.set_num_threads(before)


@pytest.mark.parametrize("shape", [(300, 260, 520), (2, 1000, 300), (1000, 3, 64)], ids=str)
def test_deterministic_across_thread_counts(rng, restore_threads, shape):
    args = arrays(rng, *shape, "torch", "float32")
    results = []
    for threads in (1, 2, 3, 1):
        opforge.set_num_threads(threads)
        results.append(opforge.linear_act_backward(*args, act="gelu"))
    assert all(torch.equal(a, b) for r in results[1:] for a, b in zip(r, results[0]))


@pytest.mark.parametrize("act", ["gelu", "relu", "silu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_torch_autograd(rng, act, bias):
    # Without a bias the adapter hands torch None for it and drops the computed grad_bias.
    import opforge.torch as ot

    _, x, w, b = arrays(rng, 4, 6, 5, "torch", "float64", lead=(2,))
    args = [t.requires_grad_() for t in ((x, w, b) if bias else (x, w))]
    assert torch.autograd.gradcheck(lambda *a: ot.linear_act(*a, act=act), args)
    if not bias:
        assert torch.autograd.gradcheck(lambda x, w: ot.linear_act(x, w, None, act=act), args)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_jax_grad(rng, bias):
    import jax
    import jax.numpy as jnp

    import opforge.jax as oj

    _, x, w, b = arrays(rng, 3, 6, 5, "jax", "float64", lead=(2,))
    args = (x, w, b) if bias else (x, w)
    loss = lambda f: lambda *a: jnp.sum(jnp.sin(f(*a, act="gelu")))  # noqa: E731
    ours = jax.grad(loss(oj.linear_act), argnums=tuple(range(len(args))))(*args)
    theirs = jax.grad(loss(linear_act_reference.jax), argnums=tuple(range(len(args))))(*args)
    for g, t in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(g), np.asarray(t), rtol=1e-10, atol=1e-12)


def test_declared_as_linear_act_gradient():
    assert opforge._core.op("linear_act").backward == ("linear_act_backward", ["x", "weight", "bias"])
    assert opforge._core.op("linear_act").leading_dim_args == ["x"]


G = np.ones((2, 4), np.float32)
X = np.ones((2, 3), np.float32)
W = np.ones((4, 3), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: opforge.linear_act_backward(np.ones((2, 5), np.float32), X, W), ValueError,
     r"linear_act_backward\(\): 'grad' must have shape \[2, 4\], got \[2, 5\]"),
    (lambda: opforge.linear_act_backward(G, X, np.ones((4, 2), np.float32)), ValueError,
     r"linear_act_backward\(\): 'weight' must have shape \[n, 3\] \(k = x.shape\[-1\] = 3\), got \[4, 2\]"),
    (lambda: opforge.linear_act_backward(G, X, W, np.ones(5, np.float32)), ValueError,
     r"linear_act_backward\(\): 'bias' must have shape \[4\], got \[5\]"),
    (lambda: opforge.linear_act_backward(G, X, W, act="elu"), ValueError,
     r"linear_act_backward\(\): 'act' must be one of 'none', 'relu', 'gelu', 'gelu_tanh', 'silu', got 'elu'"),
    (lambda: opforge.linear_act_backward(G, X.astype(np.float64), W), TypeError,
     r"linear_act_backward\(\): 'x' must have dtype float32 like 'grad', got float64"),
    (lambda: opforge.linear_act_backward(G, X, W, preact=np.ones((2, 5), np.float32)), ValueError,
     r"linear_act_backward\(\): 'preact' must have shape \[2, 4\], got \[2, 5\]"),
    (lambda: opforge.linear_act_backward(G, X, W, preact=G.astype(np.float64)), TypeError,
     r"linear_act_backward\(\): 'preact' must have dtype float32 like 'grad', got float64"),
    (lambda: opforge.linear_act_backward(G, X), TypeError,
     r"linear_act_backward\(\) missing required argument 'weight'"),
])
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


# bfloat16 on AMX tiles, g split into two bfloat16 parts (SplitProduct): odd shapes everywhere,
# n = 1 and m = 1 (one-value sums), 600 rows of the packed operand (two P ranges), 1030 summed
# values (a partial tile after a second K block).
# act="none" takes grad itself as the products' bfloat16 g (AVX512_BF16 pairs where the summed
# dimension is even: m for grad_weight, n for grad_x, both transposed operands made into pairs).
@pytest.mark.parametrize("act", ["gelu", "none"])
@pytest.mark.parametrize("shape", [(33, 65, 513), (600, 70, 40), (40, 515, 600), (1, 40, 33), (37, 1, 20)], ids=str)
def test_bf16_unit_shapes(bf16_unit, rng, shape, act):
    check(*arrays(rng, *shape, "torch", "bfloat16"), "torch", "bfloat16", act)


@pytest.mark.parametrize("operand", ["grad", "x", "weight"])
def test_bf16_unit_strided(bf16_unit, rng, operand):
    # A transposed weight or x reaches the tiles' packing with its values apart (no vector path).
    grad, x, w, b = arrays(rng, 40, 50, 33, "torch", "bfloat16")
    shapes = {"grad": (40, 50), "x": (40, 33), "weight": (50, 33)}
    view = strided(rng, shapes[operand], "torch", "bfloat16", "transposed")[0]
    args = {"grad": grad, "x": x, "weight": w, operand: view}
    check(args["grad"], args["x"], args["weight"], b, "torch", "bfloat16", "silu")


@pytest.fixture
def g_rounding():
    """linear_act_backward with its bfloat16 g rounded to bfloat16 (opforge/simd.h), then restored."""
    before = opforge.bf16_grad_rounding_enabled()
    opforge.set_bf16_grad_rounding_enabled(True)
    yield
    opforge.set_bf16_grad_rounding_enabled(before)


# Rounded g: bfloat16 products on every unit, with or without the saved pre-activation.
@pytest.mark.parametrize("shape", [(33, 65, 513), (600, 70, 40), (40, 515, 600), (64, 200, 96)], ids=str)
@pytest.mark.parametrize("saved", [False, True], ids=["recomputed_z", "saved_z"])
def test_bf16_unit_rounded_g(bf16_unit, g_rounding, rng, shape, saved):
    grad, x, w, b = arrays(rng, *shape, "torch", "bfloat16")
    preact = opforge.linear_act_with_preact(x, w, b, act="silu")[1] if saved else None
    check(grad, x, w, b, "torch", "bfloat16", "silu", preact=preact, g_rounded=True)


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "relu"])
def test_rounded_g_is_the_activation_gradient_in_bfloat16(bf16_unit, rng, act):
    # Rounding means exactly: the activation's own backward op in bfloat16 (float32 inside, one
    # rounding), then the products of act="none" on that g. Without rounding, most results differ
    # by an ulp or more. relu' is 0 or 1, so its g is exact either way: there the two differ only
    # where the float32 product and the bfloat16 one add in another order and a sum lands across a
    # bfloat16 rounding boundary (1-2 results of 12800 in about one seed of 15).
    grad, x, w, b = arrays(rng, 64, 200, 96, "torch", "bfloat16")
    z = opforge.linear_act_with_preact(x, w, b, act=act)[1]
    if act == "gelu_tanh":
        g = opforge.gelu_backward(grad, z, approximate="tanh")
    else:
        g = getattr(opforge, f"{act}_backward")(grad, z)
    want = opforge.linear_act_backward(g, x, w, b, act="none")
    before = opforge.bf16_grad_rounding_enabled()
    try:
        opforge.set_bf16_grad_rounding_enabled(False)
        kept = opforge.linear_act_backward(grad, x, w, b, act=act, preact=z)
        opforge.set_bf16_grad_rounding_enabled(True)
        rounded = opforge.linear_act_backward(grad, x, w, b, act=act, preact=z)
    finally:
        opforge.set_bf16_grad_rounding_enabled(before)
    for name, got, want_v, kept_v in zip(("grad_x", "grad_weight"), rounded, want, kept):
        assert torch.equal(got, want_v), name
        differ = (kept_v != want_v).float().mean().item()
        assert differ < 0.002 if act == "relu" else differ > 0.05, f"{name}: {differ:.2%} differ"


def test_rounded_g_through_autograd(g_rounding, rng):
    # opforge.torch's backward (saved pre-activation) reads the same switch.
    import opforge.torch as ot

    grad, x, w, b = arrays(rng, 48, 66, 80, "torch", "bfloat16")
    got = torch.autograd.grad(ot.linear_act(x.requires_grad_(), w, b, act="gelu"), x, grad)[0]
    z = opforge.linear_act_with_preact(x.detach(), w, b, act="gelu")[1]
    want = opforge.linear_act_backward(opforge.gelu_backward(grad, z), x.detach(), w, b, act="none")[0]
    assert torch.equal(got, want)


def test_amx_keeps_g_to_twice_bfloat16_precision(rng):
    # g = grad * act'(z) is float32; on AMX it goes in as hi + lo bfloat16 parts. With both, the
    # rounded gradients match the float32 kernel's but for rare ties at a rounding boundary;
    # with hi alone (g rounded to bfloat16, as torch's bfloat16 autograd does) a sizeable share
    # of them would differ by an ulp.
    if not opforge.amx_supported():
        pytest.skip("no AMX on this CPU or OS")
    grad, x, w, b = arrays(rng, 64, 200, 96, "torch", "bfloat16")
    before = opforge.amx_enabled()
    opforge.set_simd_target("AVX3")
    try:
        opforge.set_amx_enabled(False)
        want = opforge.linear_act_backward(grad, x, w, b, act="gelu")
        opforge.set_amx_enabled(True)
        got = opforge.linear_act_backward(grad, x, w, b, act="gelu")
    finally:
        opforge.set_amx_enabled(before)
        opforge.set_simd_target("")
    for name, g, wv in zip(("grad_x", "grad_weight"), got[:2], want[:2]):
        differ = (g != wv).float().mean().item()
        assert differ < 0.02, f"{name}: {differ:.1%} of the values differ from the float32 kernel's"
