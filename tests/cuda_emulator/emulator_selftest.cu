// The emulator itself (cuda_emulator.h): CUDA semantics it must keep (block barriers, shuffles,
// per-block shared memory, launch limits, the runtime's errors), and the misuse it must catch,
// each shown by a kernel that commits it. Compiled like the ops' CUDA sources: rewritten, then
// with the emulator's header ahead.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

namespace {

// Every thread: the block's sum by warp shuffles and a shared array, as the row kernels do.
__global__ void block_sums(int* out, const int* in) {
  __shared__ int partial[32];
  int v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  int total = 0;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) total += partial[w];
  out[blockIdx.x * blockDim.x + threadIdx.x] = total;
}

TEST(CudaEmulator, BarriersShufflesAndSharedMemoryPerBlock) {
  const int blocks = 3, threads = 96;
  std::vector<int> in(blocks * threads);
  std::iota(in.begin(), in.end(), 1);
  std::vector<int> out(in.size(), -1);
  block_sums<<<blocks, threads, 0, nullptr>>>(out.data(), in.data());
  for (int b = 0; b < blocks; ++b) {
    const int want = std::accumulate(in.begin() + b * threads, in.begin() + (b + 1) * threads, 0);
    for (int t = 0; t < threads; ++t) ASSERT_EQ(out[b * threads + t], want) << "block " << b << " thread " << t;
  }
}

__global__ void shuffles(int* out, int width) {
  const int lane = threadIdx.x;
  out[lane] = __shfl_down_sync(0xffffffffu, lane * 10, 3, width);
  out[32 + lane] = __shfl_sync(0xffffffffu, lane * 10, 5, width);
  out[64 + lane] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0) == 0x49249249u);
  out[96 + lane] = __syncthreads_or(lane == 17);
}

TEST(CudaEmulator, ShuffleSemantics) {
  std::vector<int> out(128, -1);
  shuffles<<<1, 32, 0, nullptr>>>(out.data(), 8);
  for (int lane = 0; lane < 32; ++lane) {
    const int base = lane / 8 * 8;
    EXPECT_EQ(out[lane], (lane + 3 < base + 8 ? lane + 3 : lane) * 10) << lane;  // own value past the segment
    EXPECT_EQ(out[32 + lane], (base + 5) * 10) << lane;
    EXPECT_EQ(out[64 + lane], 1) << lane;
    EXPECT_EQ(out[96 + lane], 1) << lane;
  }
}

__global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void shuffle_after_exit(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void masks_disagree(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(threadIdx.x < 16 ? 0xffffu : 0xffffffffu, 1, 1);
}

__global__ void reads_past_the_end(float* out, const float* in, int n) { out[0] = in[n - 1 + threadIdx.x]; }

__global__ void nothing(int*) {}

__global__ void __launch_bounds__(64) bounded(int* out) { out[threadIdx.x] = 1; }

// Reads the shared array before any thread wrote it.
__global__ void reads_unwritten_shared(float* out) {
  __shared__ float values[32];
  out[threadIdx.x] = values[threadIdx.x];
  __syncthreads();
  values[threadIdx.x] = 1.f;
}

TEST(CudaEmulator, CatchesWhatTheHardwarePunishes) {
  std::vector<int> out(64);
  auto fault_of = [](auto launch) -> std::string {
    try {
      launch();
    } catch (const cuda_emu::KernelFault& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(fault_of([&] { divergent_barrier<<<1, 32, 0, nullptr>>>(out.data()); }).find("must meet at one barrier"),
            std::string::npos);
  EXPECT_NE(fault_of([&] { shuffle_after_exit<<<1, 32, 0, nullptr>>>(out.data()); }).find("deadlocked"),
            std::string::npos);
  EXPECT_NE(fault_of([&] { masks_disagree<<<1, 32, 0, nullptr>>>(out.data()); }).find("mask"), std::string::npos);
  EXPECT_NE(fault_of([&] { nothing<<<0, 32, 0, nullptr>>>(out.data()); }).find("no blocks"), std::string::npos);
  EXPECT_NE(fault_of([&] { nothing<<<1, 2048, 0, nullptr>>>(out.data()); }).find("1 to 1024"), std::string::npos);
  EXPECT_NE(fault_of([&] { bounded<<<1, 96, 0, nullptr>>>(out.data()); }).find("__launch_bounds__(64)"),
            std::string::npos);
  EXPECT_EQ(fault_of([&] { bounded<<<2, 64, 0, nullptr>>>(out.data()); }), "");
  // Past 256 threads a kernel must declare its bounds (the registers it may use depend on them).
  EXPECT_NE(fault_of([&] { nothing<<<1, 512, 0, nullptr>>>(out.data()); }).find("no __launch_bounds__"),
            std::string::npos);
  EXPECT_EQ(fault_of([&] { nothing<<<1, 256, 0, nullptr>>>(out.data()); }), "");
  // A warp shuffle in a block of 48 threads names lanes the second warp lacks.
  EXPECT_NE(fault_of([&] { block_sums<<<1, 48, 0, nullptr>>>(out.data(), out.data()); }).find("deadlocked"),
            std::string::npos);
}

TEST(CudaEmulatorDeathTest, AnOutOfBoundsReadNamesTheThread) {
  float* in = static_cast<float*>(cuda_emu::allocate(16 * sizeof(float)));
  float* out = static_cast<float*>(cuda_emu::allocate(sizeof(float)));
  EXPECT_DEATH(reads_past_the_end<<<1, 2, 0, nullptr>>>(out, in, 16), "reads_past_the_end .*, block \\(0, 0, 0\\), thread \\(1, 0, 0\\): touched memory");
  cuda_emu::release(in);
  cuda_emu::release(out);
}

// Thread 0 publishes a value through shared memory without a barrier before the others read it.
__global__ void missing_barrier(int* out) {
  __shared__ int value;
  if (threadIdx.x == 0) value = 42;
  out[threadIdx.x] = value;
}

TEST(CudaEmulator, ReversedTurnsExposeAMissingBarrier) {
  std::vector<int> forward(64), reversed(64);
  missing_barrier<<<1, 64, 0, nullptr>>>(forward.data());
  cuda_emu::set_schedule(cuda_emu::Schedule::reverse);
  missing_barrier<<<1, 64, 0, nullptr>>>(reversed.data());
  cuda_emu::set_schedule(cuda_emu::Schedule::forward);
  EXPECT_EQ(forward[63], 42);  // thread 0 happened to write first
  EXPECT_NE(reversed[63], 42);  // thread 63 read the poisoned value
}

TEST(CudaEmulator, SharedMemoryStartsAsGarbageInEveryBlock) {
  std::vector<float> out(32, 0.f);
  for (int launch = 0; launch < 2; ++launch) {  // the second launch finds the first one's 1s: poisoned again
    reads_unwritten_shared<<<1, 32, 0, nullptr>>>(out.data());
    for (float v : out) EXPECT_TRUE(std::isnan(v)) << "launch " << launch;
  }
}

cudaMemPool_t pool_on(int device) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  EXPECT_EQ(cudaMemPoolCreate(&pool, &props), cudaSuccess);
  return pool;
}

TEST(CudaEmulator, MemoryStartsAsNaNAndOutOfMemoryIsAnError) {
  const cudaMemPool_t pool = pool_on(0);
  float* p = nullptr;
  ASSERT_EQ(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&p), 3 * sizeof(float), pool, nullptr), cudaSuccess);
  EXPECT_TRUE(std::isnan(p[2]));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
  EXPECT_EQ(cudaFreeAsync(p, nullptr), cudaSuccess);
  void* huge = nullptr;
  EXPECT_EQ(cudaMallocFromPoolAsync(&huge, size_t{1} << 40, pool, nullptr), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
  cudaMemPoolDestroy(pool);
}

// Stream-ordered memory comes from a pool of the current device (opforge's own); the runtime's
// default pool, which gives memory back to the driver at every synchronize, is refused.
TEST(CudaEmulator, MemoryComesFromAPoolOfTheCurrentDevice) {
  void* p = nullptr;
  EXPECT_THROW(cudaMallocAsync(&p, 16, nullptr), cuda_emu::KernelFault);
  const cudaMemPool_t other = pool_on(1);
  EXPECT_THROW(cudaMallocFromPoolAsync(&p, 16, other, nullptr), cuda_emu::KernelFault);  // device 0 current
  cudaMemPoolDestroy(other);
}

// One element past the end, or one before the start, of a 3-float allocation: inside the 16 bytes
// the allocation is rounded to, or on its own page, where no unmapped page can catch it; the
// bytes around it catch it at release.
__global__ void writes_at(float* out, int at) { out[at] = 1.f; }

TEST(CudaEmulator, AWriteJustOutsideAnAllocationIsFoundAtRelease) {
  for (const auto& [at, words] : {std::pair{3, "a write 1 byte past its end of a device allocation of 12 bytes"},
                                  std::pair{-1, "a write 4 bytes before its start of a device allocation of 12 bytes"}}) {
    float* p = static_cast<float*>(cuda_emu::allocate(3 * sizeof(float)));
    writes_at<<<1, 1, 0, nullptr>>>(p, at);
    try {
      cuda_emu::release(p);
      ADD_FAILURE() << "a write at " << at << " was not found";
    } catch (const cuda_emu::KernelFault& e) {
      EXPECT_STREQ(e.what(), words);
    }
  }
  EXPECT_EQ(cuda_emu::live_allocations(), 0u);
}

}  // namespace
