"""ggml's own CPU library, called through ctypes: the reference and the competitor for opforge's
ggml-format ops (quantize_q8_0, quantize_q4_0, dequantize, matmul_q).

opforge does not link ggml. This module loads a libggml-base / libggml-cpu pair found at run
time: the directory named by OPFORGE_GGML_LIB_DIR (a ggml or llama.cpp build of your own, e.g.
one compiled for this CPU with -DGGML_NATIVE=ON), else the copy the `pywhispercpp` wheel ships
(ggml 0.13, built for AVX2 + FMA + F16C, no AVX-512: compare it with opforge pinned to AVX2 for
like against like). `load()` returns None when neither is there.

    lib = opforge.ggml_cpu.load()
    q = lib.quantize(x, "q4_0")                  # ggml_quantize_chunk's bytes
    y = lib.dequantize(q, "q4_0")                # the type's to_float
    with lib.matmul(w_q4_0, "q4_0", rows=32) as mm:
        out = mm(x)                             # ggml_mul_mat on ggml's CPU backend
"""

from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import os

import numpy as np

TYPES = {"f32": 0, "q4_0": 2, "q8_0": 8}
BLOCK_BYTES = {"q4_0": 18, "q8_0": 34}
QK = 32


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class _TypeTraits(ctypes.Structure):
    # ggml.h's struct ggml_type_traits, as of ggml 0.9-0.13.
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def _candidates() -> list[tuple[str, str]]:
    """(libggml-base, libggml-cpu) paths to try, the user's directory first."""
    dirs = []
    if os.environ.get("OPFORGE_GGML_LIB_DIR"):
        dirs.append(os.environ["OPFORGE_GGML_LIB_DIR"])
    try:
        root = importlib.metadata.distribution("pywhispercpp").locate_file("")
        dirs.append(os.path.join(str(root), "pywhispercpp.libs"))  # auditwheel's consistent set
    except importlib.metadata.PackageNotFoundError:
        pass
    pairs = []
    for d in dirs:
        base = sorted(glob.glob(os.path.join(d, "libggml-base*.so*")))
        cpu = sorted(glob.glob(os.path.join(d, "libggml-cpu*.so*")))
        if base and cpu:
            pairs.append((base[0], cpu[0]))
    return pairs


class Ggml:
    """One loaded ggml: its quantizer, dequantizer and CPU matrix product."""

    def __init__(self, base_path: str, cpu_path: str):
        # Global, so libggml-cpu's reference to libggml-base resolves to this copy.
        self.base = ctypes.CDLL(base_path, mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(cpu_path, mode=ctypes.RTLD_GLOBAL)
        self.path = os.path.dirname(cpu_path)
        b, c, vp, i64 = self.base, self.cpu, ctypes.c_void_p, ctypes.c_int64
        b.ggml_init.restype, b.ggml_init.argtypes = vp, [_InitParams]
        b.ggml_free.argtypes = [vp]
        b.ggml_new_tensor_2d.restype = vp
        b.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, i64, i64]
        b.ggml_mul_mat.restype, b.ggml_mul_mat.argtypes = vp, [vp, vp, vp]
        b.ggml_new_graph.restype, b.ggml_new_graph.argtypes = vp, [vp]
        b.ggml_build_forward_expand.argtypes = [vp, vp]
        b.ggml_get_data.restype, b.ggml_get_data.argtypes = vp, [vp]
        b.ggml_graph_overhead.restype = ctypes.c_size_t
        b.ggml_tensor_overhead.restype = ctypes.c_size_t
        b.ggml_quantize_chunk.restype = ctypes.c_size_t
        b.ggml_quantize_chunk.argtypes = [ctypes.c_int, vp, vp, i64, i64, i64, vp]
        b.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
        b.ggml_get_type_traits.argtypes = [ctypes.c_int]
        b.ggml_backend_graph_compute.restype = ctypes.c_int
        b.ggml_backend_graph_compute.argtypes = [vp, vp]
        b.ggml_backend_free.argtypes = [vp]
        c.ggml_cpu_init.argtypes = []
        c.ggml_backend_cpu_init.restype = vp
        c.ggml_backend_cpu_set_n_threads.argtypes = [vp, ctypes.c_int]
        c.ggml_cpu_init()  # its fp16 tables; quantize_chunk and the products need them
        self.features = [f for f in ("avx2", "avx512", "avx512_vnni", "amx_int8")
                         if getattr(c, f"ggml_cpu_has_{f}")()]

    def quantize(self, x, format: str) -> np.ndarray:
        """ggml_quantize_chunk of float32 rows [..., k] (k a multiple of 32): uint8 [..., k/32*B]."""
        x = np.ascontiguousarray(x, np.float32)
        k = x.shape[-1]
        _check_format("quantize", format)
        if k % QK:
            raise ValueError(f"ggml_cpu.quantize: k must be a multiple of {QK}, got {k}")
        rows = x.size // k if k else 0
        out = np.empty(x.shape[:-1] + (k // QK * BLOCK_BYTES[format],), np.uint8)
        if x.size:
            self.base.ggml_quantize_chunk(TYPES[format], x.ctypes.data, out.ctypes.data, 0, rows,
                                          k, None)
        return out

    def dequantize(self, q, format: str) -> np.ndarray:
        """The type's to_float over uint8 blocks [..., k/32*B]: float32 [..., k]."""
        q = np.ascontiguousarray(q, np.uint8)
        k = _row_length("dequantize", "q", q, format)
        out = np.empty(q.shape[:-1] + (k,), np.float32)
        to_float = _TO_FLOAT(self.base.ggml_get_type_traits(TYPES[format]).contents.to_float)
        if out.size:
            to_float(q.ctypes.data, out.ctypes.data, out.size)
        return out

    def matmul(self, w, format: str, rows: int, threads: int | None = None) -> "Matmul":
        """A prepared ggml_mul_mat of `rows` float32 activation rows against the quantized weight
        w (uint8 [n, k/32*B]), computed by ggml's CPU backend on `threads` threads."""
        return Matmul(self, w, format, rows, threads or os.cpu_count() or 1)


class Matmul:
    """x [rows, k] float32 -> x @ dequant(w)^T [rows, n]: one graph, built once, run per call (as
    llama.cpp reuses its graphs); ggml quantizes x to Q8_0 inside, as opforge's matmul_q does."""

    def __init__(self, g: Ggml, w, format: str, rows: int, threads: int):
        self.ctx = None
        w = np.ascontiguousarray(w, np.uint8)
        if w.ndim != 2:
            raise ValueError(f"ggml_cpu.matmul: 'w' must have 2 dimensions, got {w.ndim}")
        k = _row_length("matmul", "w", w, format)
        n = w.shape[0]
        self.g, self.rows, self.k, self.n = g, rows, k, n
        b = g.base
        size = (w.nbytes + 4 * rows * (k + n) + 3 * b.ggml_tensor_overhead()
                + b.ggml_graph_overhead() + (1 << 20))
        self.ctx = b.ggml_init(_InitParams(size, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init of {size} bytes failed")
        self.w = b.ggml_new_tensor_2d(self.ctx, TYPES[format], k, n)
        self.x = b.ggml_new_tensor_2d(self.ctx, TYPES["f32"], k, rows)
        self.y = b.ggml_mul_mat(self.ctx, self.w, self.x)
        self.graph = b.ggml_new_graph(self.ctx)
        b.ggml_build_forward_expand(self.graph, self.y)
        ctypes.memmove(b.ggml_get_data(self.w), w.ctypes.data, w.nbytes)
        self.backend = g.cpu.ggml_backend_cpu_init()
        g.cpu.ggml_backend_cpu_set_n_threads(self.backend, threads)
        self.x_view = _view(b.ggml_get_data(self.x), (rows, k))
        self.y_view = _view(b.ggml_get_data(self.y), (rows, n))

    def __call__(self, x=None) -> np.ndarray:
        """Copies x in (None: keep the last one) and runs the graph; returns ggml's result array,
        overwritten by the next call."""
        if x is not None:
            if tuple(np.shape(x)) != (self.rows, self.k):
                raise ValueError(f"ggml_cpu.matmul: 'x' must have shape {[self.rows, self.k]}, got {list(np.shape(x))}")
            self.x_view[...] = x
        status = self.g.base.ggml_backend_graph_compute(self.backend, self.graph)
        if status != 0:
            raise RuntimeError(f"ggml_backend_graph_compute failed with status {status}")
        return self.y_view

    def close(self):
        if self.ctx:
            self.g.base.ggml_backend_free(self.backend)
            self.g.base.ggml_free(self.ctx)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    __del__ = close


# ggml asserts (aborting the process) where these fail: checked here first.
def _check_format(what: str, format: str) -> None:
    if format not in BLOCK_BYTES:
        raise ValueError(f"ggml_cpu.{what}: format must be one of {sorted(BLOCK_BYTES)}, got {format!r}")


def _row_length(what: str, name: str, blocks: np.ndarray, format: str) -> int:
    """k, the values in a row of whole blocks of `format` (the last dimension's bytes)."""
    _check_format(what, format)
    if blocks.ndim < 1 or blocks.shape[-1] % BLOCK_BYTES[format]:
        got = blocks.shape[-1] if blocks.ndim else "no"
        raise ValueError(f"ggml_cpu.{what}: {name!r} rows must be whole {format} blocks of "
                         f"{BLOCK_BYTES[format]} bytes, got {got} bytes")
    return blocks.shape[-1] // BLOCK_BYTES[format] * QK


def _view(address: int, shape: tuple[int, int]) -> np.ndarray:
    count = shape[0] * shape[1]
    return np.ctypeslib.as_array((ctypes.c_float * count).from_address(address)).reshape(shape)


_loaded: Ggml | None = None


def load() -> Ggml | None:
    """ggml's CPU library (loaded once), or None where no copy is found."""
    global _loaded
    if _loaded is None:
        for base, cpu in _candidates():
            try:
                _loaded = Ggml(base, cpu)
                break
            except (OSError, AttributeError):
                continue
    return _loaded
