// The host CUDA emulator's scheduler: each launch's blocks, each block's threads as fibers, the
// barriers and warp operations they meet, the faults they commit, and the records the tests read
// (launches, streams, launch sites). The emulated device's memory and runtime calls: device.cc.
// See cuda_emulator.h.
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "cuda_emulator.h"

namespace cuda_emu {

thread_local const ThreadContext* current = nullptr;

namespace {

constexpr size_t kPage = 4096;
// Deep enough for the kernels' register arrays in an unoptimized build; an overflow lands on the
// unmapped page below and is reported as the thread's.
constexpr size_t kStackBytes = 256 << 10;
constexpr unsigned kMaxBlockThreads = 1024;
constexpr unsigned kUnboundedThreads = 256;  // the largest block whose kernel needs no __launch_bounds__

// Where a fiber (or the scheduler) stopped. On x86-64 a switch saves the callee-saved registers
// and the stack pointer and loads another's (swapcontext would also save the signal mask, a
// system call on every switch: half the emulator's time); elsewhere, ucontext.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
extern "C" void cuda_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl cuda_emu_switch
  .hidden cuda_emu_switch
  .type cuda_emu_switch, @function
cuda_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuda_emu_switch, .-cuda_emu_switch
)");

void switch_context(Context& from, Context& to) { cuda_emu_switch(&from.sp, to.sp); }

// A frame cuda_emu_switch can load: the default MXCSR and x87 control word, zeroed registers, and
// `entry` as the return address, placed so that entry starts with the stack as a call leaves it
// (rsp = 8 mod 16, above it a null return address).
void prepare_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  char* top = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15});
  char* frame = top - 72;
  std::memset(frame, 0, 72);
  const uint32_t mxcsr = 0x1f80;
  const uint16_t fpu_control = 0x037f;
  std::memcpy(frame, &mxcsr, 4);
  std::memcpy(frame + 4, &fpu_control, 2);
  std::memcpy(frame + 56, &entry, sizeof entry);
  c.sp = frame;
}
#else
struct Context {
  ucontext_t uc;
};
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
void prepare_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

struct Fiber {
  enum class State { ready, at_barrier, at_warp, done };
  Context context;
  ThreadContext where;
  State state = State::ready;
};

struct Warp {
  unsigned arrived = 0, mask = 0;
  const char* what = "";
  unsigned generation = 0;
  alignas(16) unsigned char slots[2][32][16];
};

// One launch in flight on this OS thread.
struct Run {
  const char* name;
  void (*body)(void*);
  void* closure;
  Context scheduler;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Fiber* running = nullptr;
  unsigned live = 0;
  // The block barrier: how many wait, where, and the predicates' OR (for __syncthreads_or).
  unsigned at_barrier = 0;
  const char* barrier_file = nullptr;
  int barrier_line = 0;
  int barrier_or = 0, released_or = 0;
  std::set<void*> poisoned;  // __shared__ variables this block has declared
  bool bounded = false;      // the kernel declares __launch_bounds__ (check_launch_bounds ran)
  std::string fault;
};

thread_local Run* active = nullptr;
std::atomic<Schedule> schedule{Schedule::forward};

std::string describe(const ThreadContext& t) {
  char text[160];
  std::snprintf(text, sizeof text, "block (%u, %u, %u), thread (%u, %u, %u)", t.block.x, t.block.y, t.block.z,
                t.thread.x, t.thread.y, t.thread.z);
  return text;
}

// Stacks, reused by every launch on this OS thread: each with an unmapped page below it.
struct Stacks {
  std::vector<char*> bases;
  char* get(size_t i) {
    while (bases.size() <= i) {
      void* p = mmap(nullptr, kStackBytes + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      mprotect(p, kPage, PROT_NONE);
      bases.push_back(static_cast<char*>(p) + kPage);
    }
    return bases[i];
  }
  ~Stacks() {
    for (char* b : bases) munmap(b - kPage, kStackBytes + kPage);
  }
};
thread_local Stacks stacks;

// A faulting access in a kernel: say which thread, then let the default action end the process
// (ctest reports the test as failed). Runs on its own stack, so a fiber's stack overflow reports too.
void on_segv(int sig, siginfo_t* info, void*) {
  char text[512];
  int len;
  if (active && active->running)
    len = std::snprintf(text, sizeof text,
                        "cuda emulator: kernel %s, %s: touched memory it does not own (address %p): out of "
                        "bounds, or its stack overflowed\n",
                        active->name, describe(active->running->where).c_str(), info->si_addr);
  else
    len = std::snprintf(text, sizeof text, "cuda emulator: segmentation fault outside a kernel (address %p)\n",
                        info->si_addr);
  if (write(2, text, len) < 0) {
  }
  signal(sig, SIG_DFL);
}

void install_segv_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    static char alternate[64 << 10];
    stack_t ss{};
    ss.ss_sp = alternate;
    ss.ss_size = sizeof alternate;
    sigaltstack(&ss, nullptr);
    struct sigaction sa{};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
  });
}

void fiber_main() {
  Run& run = *active;
  run.body(run.closure);
  run.running->state = Fiber::State::done;
  switch_context(run.running->context, run.scheduler);  // never resumed
}

// Back to the scheduler until it resumes this fiber.
void yield(Run& run) { switch_context(run.running->context, run.scheduler); }

void release_barrier_if_complete(Run& run) {
  if (run.at_barrier == 0 || run.at_barrier != run.live) return;
  for (Fiber& f : run.fibers)
    if (f.state == Fiber::State::at_barrier) f.state = Fiber::State::ready;
  run.released_or = run.barrier_or;
  run.at_barrier = 0;
  run.barrier_or = 0;
}

std::string deadlock_report(const Run& run) {
  std::string text = "kernel " + std::string(run.name) + " deadlocked: ";
  unsigned done = 0;
  for (const Fiber& f : run.fibers) done += f.state == Fiber::State::done;
  if (run.at_barrier)
    text += std::to_string(run.at_barrier) + " threads wait at __syncthreads (" + run.barrier_file + ":" +
            std::to_string(run.barrier_line) + ")";
  for (size_t w = 0; w < run.warps.size(); ++w)
    if (run.warps[w].arrived) {
      char part[160];
      std::snprintf(part, sizeof part, "; warp %zu waits in %s for lanes 0x%08x (arrived 0x%08x)", w,
                    run.warps[w].what, run.warps[w].mask, run.warps[w].arrived);
      text += part;
    }
  const uint3 b = run.fibers.front().where.block;
  return text + "; " + std::to_string(done) + " threads had exited (block " + std::to_string(b.x) + ", " +
         std::to_string(b.y) + ", " + std::to_string(b.z) + ")";
}

void run_block(Run& run, const dim3& grid, const dim3& block, const uint3& block_index) {
  const unsigned threads = block.x * block.y * block.z;
  run.fibers.assign(threads, Fiber{});
  run.warps.assign((threads + 31) / 32, Warp{});
  run.live = threads;
  run.at_barrier = 0;
  run.barrier_or = 0;
  run.poisoned.clear();
  for (unsigned i = 0; i < threads; ++i) {
    Fiber& f = run.fibers[i];
    f.where.thread = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
    f.where.block = block_index;
    f.where.block_dim = block;
    f.where.grid_dim = grid;
    f.where.lane = i % 32;
    f.where.warp = i / 32;
    prepare_context(f.context, stacks.get(i), kStackBytes, fiber_main);
  }
  const bool reverse = schedule.load() == Schedule::reverse;
  while (run.live > 0) {
    bool progressed = false;
    for (unsigned turn = 0; turn < threads; ++turn) {
      Fiber& f = run.fibers[reverse ? threads - 1 - turn : turn];
      if (f.state != Fiber::State::ready) continue;
      progressed = true;
      run.running = &f;
      current = &f.where;
      switch_context(run.scheduler, f.context);
      run.running = nullptr;
      current = nullptr;
      if (!run.fault.empty()) throw KernelFault(run.fault);
      if (f.state == Fiber::State::done) {
        --run.live;
        release_barrier_if_complete(run);  // threads that exited no longer count, as on the GPU
      }
    }
    if (!progressed) throw KernelFault(deadlock_report(run));
  }
}

std::mutex launches_mutex;
std::vector<std::string>& launches() {
  static std::vector<std::string> names;
  return names;
}


}  // namespace

[[noreturn]] void fault(const std::string& what) {
  Run* run = active;
  if (!run || !run->running) throw KernelFault(what);
  run->fault = "kernel " + std::string(run->name) + ", " + describe(run->running->where) + ": " + what;
  switch_context(run->running->context, run->scheduler);  // never resumed
  __builtin_unreachable();
}

int sync_block(int predicate, const char* file, int line) {
  Run* run = active;
  if (!run || !run->running) throw KernelFault("__syncthreads outside a kernel");
  if (run->at_barrier == 0) {
    run->barrier_file = file;
    run->barrier_line = line;
  } else if (run->barrier_line != line || std::strcmp(run->barrier_file, file) != 0) {
    fault("reached __syncthreads at " + std::string(file) + ":" + std::to_string(line) + " while others wait at " +
          run->barrier_file + ":" + std::to_string(run->barrier_line) + " (the block's threads must meet at one barrier)");
  }
  run->barrier_or |= predicate;
  ++run->at_barrier;
  run->running->state = Fiber::State::at_barrier;
  release_barrier_if_complete(*run);
  if (run->running->state == Fiber::State::at_barrier) yield(*run);
  return run->released_or;
}

const unsigned char* warp_exchange(unsigned mask, const void* value, size_t size, const char* what) {
  Run* run = active;
  if (!run || !run->running) throw KernelFault(std::string(what) + " outside a kernel");
  Fiber& self = *run->running;
  Warp& warp = run->warps[self.where.warp];
  const unsigned lane = self.where.lane;
  if (!(mask >> lane & 1u)) fault(std::string(what) + ": the calling lane is not in its mask");
  if (warp.arrived == 0) {
    warp.mask = mask;
    warp.what = what;
  } else if (warp.mask != mask || std::strcmp(warp.what, what) != 0) {
    char text[200];
    std::snprintf(text, sizeof text, "%s with mask 0x%08x while lanes 0x%08x wait in %s with mask 0x%08x", what, mask,
                  warp.arrived, warp.what, warp.mask);
    fault(text);
  }
  const unsigned generation = warp.generation;
  if (size) std::memcpy(warp.slots[generation & 1][lane], value, size);
  warp.arrived |= 1u << lane;
  if (warp.arrived == mask) {
    for (unsigned l = 0; l < 32; ++l)
      if (mask >> l & 1u) run->fibers[self.where.warp * 32 + l].state = Fiber::State::ready;
    warp.arrived = 0;
    ++warp.generation;
  } else {
    self.state = Fiber::State::at_warp;
    yield(*run);
  }
  return &warp.slots[generation & 1][0][0];
}

void set_schedule(Schedule s) { schedule.store(s); }

namespace {
std::atomic<int64_t> block_cap{INT64_MAX};
}
int64_t grid_cap() { return block_cap.load(); }
int64_t set_grid_cap(int64_t blocks) { return block_cap.exchange(blocks); }

void check_launch_bounds(long long max_threads) {
  if (active) active->bounded = true;
  const ThreadContext& t = *current;
  const long long threads = 1ll * t.block_dim.x * t.block_dim.y * t.block_dim.z;
  if (threads > max_threads)
    fault("launched with " + std::to_string(threads) + " threads per block, over its __launch_bounds__(" +
          std::to_string(max_threads) + "): CUDA refuses the launch (too many resources requested)");
}

void poison_shared(void* variable, size_t bytes) {
  Run* run = active;
  if (run && run->poisoned.insert(variable).second) std::memset(variable, 0xff, bytes);
}

void run_grid(const char* name, dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*), void* closure) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  const std::string launch = std::string("kernel ") + name + ": ";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0)
    throw KernelFault(launch + "a grid with no blocks (CUDA fails the launch: invalid configuration argument)");
  if (threads == 0 || threads > kMaxBlockThreads || block.z > 64)
    throw KernelFault(launch + "blocks of " + std::to_string(threads) + " threads (CUDA allows 1 to 1024)");
  if (grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu)
    throw KernelFault(launch + "grid beyond CUDA's limits");
  if (shared_bytes > 0) throw KernelFault(launch + "dynamic shared memory is not emulated");
  if (active) throw KernelFault(launch + "launched from inside another kernel");
  {
    std::lock_guard lock(launches_mutex);
    launches().push_back(name);
  }
  install_segv_handler();
  Run run;
  run.name = name;
  run.body = body;
  run.closure = closure;
  active = &run;
  try {
    const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
    const bool reverse = schedule.load() == Schedule::reverse;
    for (unsigned long long turn = 0; turn < blocks; ++turn) {
      const unsigned long long b = reverse ? blocks - 1 - turn : turn;
      run_block(run, grid, block, uint3{unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / grid.x / grid.y)});
    }
  } catch (...) {
    active = nullptr;
    throw;
  }
  active = nullptr;
  // Without __launch_bounds__ the compiler may give each thread up to 255 registers: 256 threads
  // always fit the SM's 64K, a bigger block may not (cudaErrorLaunchOutOfResources on the GPU,
  // depending on the compiler's choices for that kernel).
  if (threads > kUnboundedThreads && !run.bounded)
    throw KernelFault(launch + "blocks of " + std::to_string(threads) + " threads and no __launch_bounds__ (more than " +
                      std::to_string(kUnboundedThreads) + " may not get the registers the compiler chose)");
}


std::vector<std::string> take_launches() {
  std::lock_guard lock(launches_mutex);
  return std::exchange(launches(), {});
}

namespace {
std::vector<StreamUse>& stream_uses() {
  static std::vector<StreamUse> uses;
  return uses;
}
}  // namespace

void record_stream_use(std::string what, const void* stream) {
  std::lock_guard lock(launches_mutex);
  stream_uses().push_back({std::move(what), stream, current_device()});
}

std::vector<StreamUse> take_stream_uses() {
  std::lock_guard lock(launches_mutex);
  return std::exchange(stream_uses(), {});
}

namespace {
std::set<std::string>& sites() {
  static std::set<std::string> table;
  return table;
}
}  // namespace

bool declare_launch_sites(std::initializer_list<const char*> names) {
  std::lock_guard lock(launches_mutex);
  sites().insert(names.begin(), names.end());
  return true;
}

std::vector<std::string> launch_sites() {
  std::lock_guard lock(launches_mutex);
  return {sites().begin(), sites().end()};
}
}  // namespace cuda_emu
