// The host CUDA emulator's test-facing side: which kernels ran, what memory is still held, and the
// allocator behind the emulated device. See cuda_emulator.h for how kernels run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace cuda_emu {

// What a kernel did that real hardware would punish (a deadlock, a barrier two code paths reach,
// a shuffle naming a lane that is not there, a bad launch configuration). Thrown by the launch.
struct KernelFault : std::logic_error {
  using std::logic_error::logic_error;
};

// Device memory: pages of its own, its last byte against an unmapped page (a read or write past
// the end faults at once), an unmapped page before it, filled with 0xff bytes (NaN in every float
// type, -1 in the integer types) so a result nobody wrote stands out.
void* allocate(size_t bytes);
void release(void* p);
size_t live_allocations();  // allocate()/cudaMallocAsync minus release()/cudaFreeAsync
// cudaMallocAsync refuses more than this with cudaErrorMemoryAllocation (default 8 GiB), so a test
// can take the out-of-memory path; returns the previous limit.
size_t set_allocation_limit(size_t bytes);
// cudaMalloc is refused (it waits for the device; opforge's code allocates from its pool) unless
// allowed, as for a standalone GPU program (bench/schedules_cuda.cu); returns the previous setting.
bool allow_cuda_malloc(bool allowed);
// A cudaMemcpyAsync from device memory into host memory lands at the next synchronize of the
// stream or the device, or of an event recorded after it, not before: host code that reads it
// without waiting (or after waiting for an earlier event) reads stale bytes. The copies not yet
// landed (dropped by the call: nobody waited for them).
size_t take_unwaited_copies();

// Stray writes found when an op freed its own memory (cudaFreeAsync, often from a destructor,
// which must not throw), since the last call.
void note_memory_fault(const std::string& what);
std::vector<std::string> take_memory_faults();

// The memory pools made (cudaMemPoolCreate) and not destroyed, in order: the device, the release threshold set,
// and the allocations made from each (cudaMallocFromPoolAsync).
struct PoolState {
  int device;
  uint64_t release_threshold;
  int64_t allocations;
};
std::vector<PoolState> pool_states();

// Makes `stream` one that captures a CUDA graph (nullptr: none), as torch.cuda.graph would: it
// reports so (cudaStreamIsCapturing), and a synchronize meanwhile is a fault. Returns the previous.
const void* set_capturing_stream(const void* stream);

// The emulated machine has kDevices GPUs; each host thread has a current one (cudaSetDevice).
inline constexpr int kDevices = 2;
int current_device();
// Events created (cudaEventCreate*) and not yet destroyed.
size_t live_events();

// The order blocks, and threads within a block, take turns (each runs until it waits at a
// barrier or a shuffle, or ends). Running a kernel both ways and getting different bits shows a
// race: a read that only sees the right value when its writer happens to run first.
enum class Schedule { forward, reverse };
void set_schedule(Schedule schedule);

// The most blocks a grid-stride launch asks for (opforge::cuda::grid_blocks reads it through
// CUDA_EMU_GRID_CAP; by default no lower than the package's own cap). A few blocks make every
// grid-stride loop take several trips. Returns the previous cap.
int64_t grid_cap();
int64_t set_grid_cap(int64_t blocks);

// The kernels launched since the last call, oldest first, each as its launch site names it:
// "contiguous_kernel<T> (ops/rms_norm/rms_norm_cuda.cu:26)".
std::vector<std::string> take_launches();

// Each launch and each CUDA runtime call that runs on a stream, with that stream (nullptr for the
// legacy default stream, which the calls without a stream argument use) and the calling thread's
// current device, since the last call.
struct StreamUse {
  std::string what;
  const void* stream;
  int device;
};
std::vector<StreamUse> take_stream_uses();
void record_stream_use(std::string what, const void* stream);

// The last kernel launched on this thread with no cudaGetLastError (or cudaPeekAtLastError) after
// it, "" if none; cleared by the call. A launch's configuration errors surface only there, so
// opforge checks every launch (one check may follow several).
void note_launch(const char* name);
std::string take_unchecked_launch();

// Every launch site of the emulated sources, declared by each rewritten file at load time.
bool declare_launch_sites(std::initializer_list<const char*> sites);
std::vector<std::string> launch_sites();  // sorted

}  // namespace cuda_emu
