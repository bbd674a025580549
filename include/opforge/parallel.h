// opforge's own thread pool. It does not use OpenMP, so loading opforge into a process
// that already runs torch's OpenMP runtime starts no second one. Size: OPFORGE_NUM_THREADS,
// set_num_threads(), default the cores this process may run on.
#pragma once

#include <cstdint>
#include <functional>

namespace opforge {

int64_t num_threads();
void set_num_threads(int64_t n);  // n >= 1; Error(value) otherwise

// Calls body(begin, end) over disjoint chunks covering [0, n), each at least `grain` long
// except the last. Runs inline when the work is small, when called from inside a pool task,
// or when another thread is using the pool. Exceptions from body propagate to the caller.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

}  // namespace opforge
