// out= on the generic path: the caller's own arrays as an op's results, written in place of new
// ones (NumPy's and torch's out=). They must be writable, and what opforge/out.h's check_out
// accepts: exactly what the op would allocate, sharing no memory with the inputs but in place.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <vector>

#include "call.h"

namespace opforge::python {

struct OutArrays {
  std::vector<std::optional<TensorView>> views;  // per result; nullopt: allocate it as usual
  // Per result: the caller's array (held: a list's items could go while the kernel runs), or null.
  std::vector<nanobind::object> objects;
  std::vector<nanobind::ndarray<>> arrays;       // imported arrays, kept alive for the call
  bool sequence = false;                         // given as a tuple or list (returned as a tuple)
};

// Reads and checks `out` (one array, or a tuple or list with an array or None per result)
// against the prepared call: typed errors naming the op and 'out' / 'out[i]'.
OutArrays out_arrays(const OpDef& op, nanobind::handle out, const PreparedCall& call);

// After the kernel: torch tensors written through DLPack get their version counter bumped, as
// torch's own in-place writes do, so autograd refuses to use a value saved before the write.
void mark_written(const OutArrays& out);

}  // namespace opforge::python
