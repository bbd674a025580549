// opforge's thread pool: n-1 workers plus the calling thread share the chunks of one
// parallel_for at a time. No OpenMP, so it coexists with torch's and JAX's own pools.
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "opforge/error.h"
#include "opforge/parallel.h"
#include "environment.h"

namespace opforge {

namespace {

int64_t default_threads() {
  if (const char* env = std::getenv("OPFORGE_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n >= 1) return n;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

thread_local bool in_pool_task = false;
thread_local ForeignParallelFor foreign_pool = nullptr;  // UseForeignPool's, on this thread

// Waiting threads poll this long before blocking. A futex wake-up costs several microseconds,
// as much as a whole small op; back-to-back calls (a model's layers) find their workers still
// spinning and start at once. OpenMP runtimes do the same (GOMP_SPINCOUNT, KMP_BLOCKTIME).
constexpr auto kSpin = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `done` for up to kSpin; the caller then blocks (or finds it true under its lock).
template <class F>
void spin_until(const F& done) {
  const auto stop = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1; !done(); ++i) {
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > stop) return;
  }
}

class Pool {
 public:
  ~Pool() { stop(); }

  // Lock-free: a body running on the pool may ask, and the pool is busy until it returns.
  int64_t size() const { return threads_.load(); }

  void resize(int64_t n) {
    std::lock_guard lock(submit_);
    stop();
    threads_ = n;
  }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
    // Checked before locking: the thread running a job already holds submit_.
    if (in_pool_task) {
      body(0, n);
      return;
    }
    std::unique_lock submit(submit_, std::try_to_lock);
    const int64_t chunks = std::min((n + grain - 1) / grain, submit.owns_lock() ? threads_.load() * 4 : 1);
    if (chunks <= 1) {
      // Inline, but still a task: nested calls stay inline and resizing is refused, the same
      // whether or not the pool happened to be free.
      if (submit.owns_lock()) submit.unlock();
      in_pool_task = true;
      try {
        body(0, n);
      } catch (...) {
        in_pool_task = false;
        throw;
      }
      in_pool_task = false;
      return;
    }
    if (workers_.empty()) start();
    bool wake = false;
    {
      // A worker that woke late for the previous job may still be in work(): let it leave
      // before the job's fields change under it.
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return active_ == 0; });
      body_ = &body;
      n_ = n;
      // Never below the grain: ceil(n / chunks) alone gives 3 for n=9, grain=4.
      chunk_ = std::max(grain, (n + chunks - 1) / chunks);
      chunks_ = (n + chunk_ - 1) / chunk_;
      next_ = 0;
      pending_ = chunks_;
      error_ = nullptr;
      ++generation_;
      wake = sleepers_ > 0;
    }
    // Workers still spinning from the last job see the new generation without a wake-up.
    if (wake) wake_.notify_all();
    work();
    const auto finished = [&] { return pending_ == 0 && active_ == 0; };
    spin_until(finished);
    // Once both counts are zero no worker touches the job again, and the counters' atomic
    // updates publish error_ (written before them): the mutex is needed only to sleep.
    if (!finished()) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, finished);
    }
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void start() {
    stopping_ = false;
    for (int64_t i = 1; i < threads_; ++i) workers_.emplace_back([this] { loop(); });
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  void loop() {
    in_pool_task = true;
    uint64_t seen = 0;
    while (true) {
      spin_until([&] { return stopping_ || generation_ != seen; });
      {
        std::unique_lock lock(mutex_);
        ++sleepers_;
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        --sleepers_;
        if (stopping_) return;
        seen = generation_;
        ++active_;
      }
      work();
      if (active_.fetch_sub(1) == 1 && pending_ == 0) notify_done();
    }
  }

  // Wakes the caller blocked on done_. The counters change without the mutex; taking it here
  // orders this wake-up after the caller's last look at them (it holds the mutex from that look
  // until it sleeps), so none is lost.
  void notify_done() {
    std::lock_guard lock(mutex_);
    done_.notify_all();
  }

  // Claims chunks until none are left; the last to finish wakes the caller.
  void work() {
    const bool was_in_task = in_pool_task;
    in_pool_task = true;
    while (true) {
      int64_t c = next_.fetch_add(1);
      if (c >= chunks_) break;
      try {
        (*body_)(c * chunk_, std::min(n_, (c + 1) * chunk_));
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      // One atomic per chunk; the mutex only for the last (it was taken for every chunk, and
      // two threads trading it cost more than a small op's chunk of work).
      if (pending_.fetch_sub(1) == 1) notify_done();
    }
    in_pool_task = was_in_task;
  }

  std::mutex submit_;  // one parallel_for at a time; others run inline
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::atomic<int64_t> threads_{default_threads()};
  // Atomic so that spinning threads may read them without the mutex; written under it.
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> pending_{0}, active_{0};
  int64_t sleepers_ = 0;  // workers blocked on wake_ (under mutex_)
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t n_ = 0, chunk_ = 1, chunks_ = 0;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

// Never destroyed: threads the pool does not own (a forge stream's worker, a framework's own
// threads) may still be inside a parallel_for while the process exits, and a pool torn down by
// the static destructors under them would restart its workers into a destroyed vector
// (std::terminate: "terminate called without an active exception"). The workers block on a
// condition variable and end with the process.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

int64_t num_threads() { return pool().size(); }

void set_num_threads(int64_t n) {
  if (n < 1) fail(ErrorKind::value, "set_num_threads(): 'n' must be >= 1, got ", n);
  // Resizing joins the workers, which would wait forever on the task calling it.
  if (in_pool_task) fail(ErrorKind::runtime, "set_num_threads(): cannot be called from inside a parallel_for task");
  pool().resize(n);
}

// OPFORGE_FOREIGN_POOL=0: opforge's own pool always (UseForeignPool does nothing).
bool foreign_pools_allowed() {
  static const bool allowed = !turned_off_by_environment("OPFORGE_FOREIGN_POOL");
  return allowed;
}

UseForeignPool::UseForeignPool(ForeignParallelFor pool) : previous_(foreign_pool) {
  if (foreign_pools_allowed()) foreign_pool = pool;
}
UseForeignPool::~UseForeignPool() { foreign_pool = previous_; }

namespace {

// A parallel_for on the foreign pool: every chunk a pool task on whichever thread runs it; the
// first exception kept and rethrown here (a foreign runtime may turn it into its own type).
void run_on_foreign_pool(ForeignParallelFor foreign, int64_t n, int64_t grain,
                         const std::function<void(int64_t, int64_t)>& body) {
  struct Job {
    const std::function<void(int64_t, int64_t)>& body;
    std::mutex mutex;
    std::exception_ptr error;
  } job{body, {}, nullptr};
  foreign(
      n, grain,
      [](int64_t begin, int64_t end, void* ctx) {
        Job& job = *static_cast<Job*>(ctx);
        const bool was_in_task = in_pool_task;
        in_pool_task = true;
        try {
          job.body(begin, end);
        } catch (...) {
          std::lock_guard lock(job.mutex);
          if (!job.error) job.error = std::current_exception();
        }
        in_pool_task = was_in_task;
      },
      &job);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (foreign_pool && !in_pool_task && n > grain && pool().size() > 1)
    return run_on_foreign_pool(foreign_pool, n, grain, body);
  pool().run(n, grain, body);
}

}  // namespace opforge
