// NumPy arrays in and out through NumPy's C API, the generic adapter's fast path.
//
// The generic path (DLPack through nanobind) costs a Python method call, a capsule and two
// heap blocks per input, and numpy.asarray over a buffer object per result: most of a small
// call's time. Here an ndarray's dtype, shape and strides are read off the object, and a
// result is made with PyArray_NewFromDescr over opforge's memory (a small one in NumPy's own).
// Anything this path does not take for certain (other dtypes, swapped byte order, strides that
// are not whole elements, or a NumPy whose C API cannot be loaded) goes the generic way, which
// words the errors.
#pragma once

#include <nanobind/nanobind.h>

#include "arrays.h"
#include "opforge/tensor.h"

namespace opforge::python {

// A view of `obj` when it is a NumPy ndarray (or subclass) this path takes; false otherwise.
bool numpy_view(nb::handle obj, TensorView& out);

// Whether a NumPy array numpy_view took may be written (out=).
bool numpy_writeable(nb::handle obj);

// `result` (CPU memory) as a NumPy array that keeps its owner alive; an invalid object where
// its dtype has no NumPy type (bfloat16), for the generic path to handle.
nb::object numpy_wrap(const Allocation& result);

// Results of at most this many bytes NumPy allocates itself (numpy_small_result).
inline constexpr int64_t kNumpySmallResultBytes = 4096;

// A NumPy array of `shape` and `strides` (elements) in memory NumPy allocates, and `view` over
// it, for a result of at most kNumpySmallResultBytes: NumPy keeps a cache of small blocks, where
// opforge's own result takes an aligned block, an owner and a capsule (a tenth of a tiny call's
// instructions, counted with callgrind). Alignment does not matter at that size; larger results keep opforge's aligned
// memory. An invalid object where NumPy cannot hold the result (bfloat16, too large).
nb::object numpy_small_result(DType dtype, const Dims& shape, const Dims& strides, TensorView& view);

}  // namespace opforge::python
