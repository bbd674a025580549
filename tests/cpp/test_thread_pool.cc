// parallel_for: every index exactly once, chunks honour the grain, errors reach the caller,
// nesting or concurrent callers neither deadlock nor lose work, and a foreign pool (torch's)
// takes the chunks while one is in scope.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "opforge/parallel.h"
#include "test_util.h"

namespace opforge {
namespace {

using testing::throws;

// Runs each test with a pool larger than this machine's core count, so chunks really
// interleave across threads, and puts the size back afterwards.
class ThreadPool : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = num_threads();
    set_num_threads(4);
  }
  void TearDown() override { set_num_threads(saved_); }
  int64_t saved_ = 1;
};

// Calls parallel_for and checks the chunks: disjoint, covering [0, n) once, each at least
// `grain` long except the one that ends at n.
void check_cover(int64_t n, int64_t grain) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " grain=" << grain);
  auto hits = std::make_unique<std::atomic<int>[]>(static_cast<size_t>(std::max<int64_t>(n, 1)));
  for (int64_t i = 0; i < n; ++i) hits[i] = 0;
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    std::lock_guard lock(mutex);
    chunks.emplace_back(begin, end);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
  if (n == 0) {
    EXPECT_TRUE(chunks.empty());  // no work: body not called at all
    return;
  }
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks.front().first, 0);
  EXPECT_EQ(chunks.back().second, n);
  for (size_t c = 0; c < chunks.size(); ++c) {
    EXPECT_LT(chunks[c].first, chunks[c].second) << "empty chunk";
    if (c + 1 < chunks.size()) {
      EXPECT_EQ(chunks[c].second, chunks[c + 1].first) << "gap or overlap";
      EXPECT_GE(chunks[c].second - chunks[c].first, grain) << "chunk shorter than the grain";
    }
  }
}

TEST_F(ThreadPool, CoversEveryIndexOnce) {
  for (int64_t n : {0, 1, 2, 3, 7, 9, 16, 63, 64, 65, 1000, 4097, 100003})
    for (int64_t grain : {0, 1, 2, 4, 7, 64, 1000, 1 << 20}) check_cover(n, grain);
}

TEST_F(ThreadPool, CoversWithOtherPoolSizes) {
  for (int64_t threads : {1, 2, 3, 7}) {
    set_num_threads(threads);
    EXPECT_EQ(num_threads(), threads);
    for (int64_t n : {1, 5, 33, 4097}) check_cover(n, 1);
  }
}

TEST_F(ThreadPool, NegativeNDoesNothing) {
  bool called = false;
  parallel_for(-5, 1, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST_F(ThreadPool, ExceptionsPropagate) {
  // From a worker chunk and from the inline path; the first one wins, its type intact.
  for (int64_t n : {int64_t{1}, int64_t{10000}}) {
    SCOPED_TRACE(n);
    EXPECT_TRUE(throws(
        [&] {
          parallel_for(n, 1, [&](int64_t begin, int64_t) {
            if (begin == 0 || n > 1) fail(ErrorKind::value, "bad chunk at ", begin);
          });
        },
        ErrorKind::value, "bad chunk at "));
    EXPECT_THROW(parallel_for(n, 1, [](int64_t, int64_t end) {
                   if (end > 0) throw std::out_of_range("oops");
                 }),
                 std::out_of_range);
  }
  check_cover(5000, 1);  // the pool still works after a failed job
}

TEST_F(ThreadPool, NestedCallsRunInline) {
  constexpr int64_t outer = 64, inner = 1000;
  std::vector<std::atomic<int64_t>> sums(outer);
  parallel_for(outer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o)
      parallel_for(inner, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sums[o].fetch_add(i + 1);
      });
  });
  for (int64_t o = 0; o < outer; ++o) EXPECT_EQ(sums[o].load(), inner * (inner + 1) / 2) << o;
}

TEST_F(ThreadPool, NumThreadsIsReadableFromInsideABody) {
  // A kernel may size per-thread scratch from num_threads() while the pool is busy.
  std::atomic<int64_t> seen{0};
  parallel_for(64, 1, [&](int64_t, int64_t) { seen = num_threads(); });
  EXPECT_EQ(seen.load(), 4);
}

TEST_F(ThreadPool, SetNumThreadsRejectsNonPositive) {
  EXPECT_TRUE(throws([] { set_num_threads(0); }, ErrorKind::value,
                     "set_num_threads(): 'n' must be >= 1, got 0"));
  EXPECT_TRUE(throws([] { set_num_threads(-3); }, ErrorKind::value, "got -3"));
  EXPECT_EQ(num_threads(), 4);  // a rejected size leaves the pool alone
}

TEST_F(ThreadPool, ConcurrentCallersBothComplete) {
  // One caller gets the pool, the other runs inline; neither may lose or repeat an index.
  auto hammer = [](int64_t n, int64_t* failures) {
    for (int rep = 0; rep < 200; ++rep) {
      std::vector<std::atomic<int>> hits(n);
      parallel_for(n, 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (auto& h : hits) *failures += h.load() != 1;
    }
  };
  int64_t failures_a = 0, failures_b = 0;
  std::thread a(hammer, 5000, &failures_a);
  std::thread b(hammer, 777, &failures_b);
  a.join();
  b.join();
  EXPECT_EQ(failures_a, 0);
  EXPECT_EQ(failures_b, 0);
}

TEST_F(ThreadPool, ResizeBetweenJobs) {
  for (int64_t threads : {3, 1, 5, 2}) {
    set_num_threads(threads);
    std::atomic<int64_t> total{0};
    parallel_for(100000, 10, [&](int64_t b, int64_t e) { total += e - b; });
    EXPECT_EQ(total.load(), 100000);
  }
}

}  // namespace
}  // namespace opforge

// Resizing from inside a task would join the worker running it: an error, not a hang.
TEST(ThreadPoolTask, SetNumThreadsInsideTaskIsAnError) {
  bool raised = false;
  opforge::parallel_for(1, 1, [&](int64_t, int64_t) {
    try {
      opforge::set_num_threads(2);
    } catch (const opforge::Error& e) {
      raised = e.kind() == opforge::ErrorKind::runtime &&
               std::string(e.what()).find("inside a parallel_for task") != std::string::npos;
    }
  });
  EXPECT_TRUE(raised);
}

namespace opforge {
namespace {

using testing::throws;

namespace foreign {

// A stand-in for torch's pool: runs the chunks on two threads of its own, chunks of
// max(grain, n / 2) as at::parallel_for would, and converts nothing (the caller must).
std::atomic<int> calls{0};
std::atomic<int> foreign_thread_chunks{0};

void two_threads(int64_t n, int64_t grain, void (*chunk)(int64_t, int64_t, void*), void* ctx) {
  ++calls;
  const int64_t size = std::max(grain, (n + 1) / 2);
  std::thread other([&] {
    if (size < n) {
      ++foreign_thread_chunks;
      chunk(size, n, ctx);
    }
  });
  chunk(0, std::min(size, n), ctx);
  other.join();
}

}  // namespace foreign

TEST_F(ThreadPool, ForeignPoolTakesTheChunksWhileInScope) {
  foreign::calls = 0;
  foreign::foreign_thread_chunks = 0;
  std::vector<int> hits(1000, 0);
  const auto count = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ++hits[i];
  };
  {
    UseForeignPool use(foreign::two_threads);
    parallel_for(1000, 10, count);
    parallel_for(5, 10, count);  // below the grain: inline, no foreign call
  }
  EXPECT_EQ(foreign::calls, 1);
  EXPECT_EQ(foreign::foreign_thread_chunks, 1);
  parallel_for(1000, 10, count);  // out of scope: opforge's own pool again
  EXPECT_EQ(foreign::calls, 1);
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(hits[i], i < 5 ? 3 : 2) << i;
}

TEST_F(ThreadPool, ForeignPoolChunksAreTasksAndErrorsKeepTheirKind) {
  foreign::calls = 0;
  UseForeignPool use(foreign::two_threads);
  std::atomic<int> nested_chunks{0};
  parallel_for(100, 10, [&](int64_t, int64_t) {
    // Nested: inline on whichever thread runs this chunk, not a second foreign call.
    parallel_for(100, 1, [&](int64_t begin, int64_t end) {
      EXPECT_EQ(begin, 0);
      EXPECT_EQ(end, 100);
      ++nested_chunks;
    });
  });
  EXPECT_EQ(foreign::calls, 1);
  EXPECT_EQ(nested_chunks, 2);
  EXPECT_TRUE(throws([] {
    parallel_for(100, 10, [](int64_t begin, int64_t) {
      if (begin > 0) fail(ErrorKind::value, "chunk at ", begin, " failed");
    });
  }, ErrorKind::value, "chunk at 50 failed"));
}

TEST_F(ThreadPool, ForeignPoolNotUsedWithOneThread) {
  foreign::calls = 0;
  set_num_threads(1);
  UseForeignPool use(foreign::two_threads);
  int64_t covered = 0;  // opforge's pool, serial: no race
  parallel_for(1000, 10, [&](int64_t begin, int64_t end) { covered += end - begin; });
  EXPECT_EQ(foreign::calls, 0);
  EXPECT_EQ(covered, 1000);
}

}  // namespace
}  // namespace opforge
