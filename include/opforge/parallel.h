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

// Another runtime's parallel_for (the shape of torch's stable torch_parallel_for): runs
// chunk(begin, end, ctx) over chunks covering [0, n), each at least `grain` long but the last.
using ForeignParallelFor = void (*)(int64_t n, int64_t grain, void (*chunk)(int64_t, int64_t, void*), void* ctx);

// While one is alive on a thread, that thread's parallel_for hands its chunks to `pool` (unless
// opforge runs one thread: set_num_threads(1) stays serial), each chunk marked as a pool task, so
// nested calls stay inline; exceptions from the body reach the caller as they were thrown. The
// torch adapters use it with torch's intra-op pool: called between torch's ops, opforge's own
// workers would fight torch's still-spinning OpenMP threads for the same cores (measured: a
// 64 x 1024 gelu right after a torch matmul took 70-100 us, 8-12 us on torch's pool).
// OPFORGE_FOREIGN_POOL=0 turns it off for the process (opforge's own pool always).
class UseForeignPool {
 public:
  explicit UseForeignPool(ForeignParallelFor pool);
  ~UseForeignPool();
  UseForeignPool(const UseForeignPool&) = delete;
  UseForeignPool& operator=(const UseForeignPool&) = delete;

 private:
  ForeignParallelFor previous_;
};

}  // namespace opforge
