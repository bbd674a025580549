#include "runtime.h"

#include <c10/util/Exception.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <unordered_map>

namespace opforge::forge {

// Everything below is created once and never destroyed: tensors may be freed, and streams may
// still be draining, while the interpreter tears down after static destructors have run.
template <typename T>
T& leaked() {
  static T* instance = new T();
  return *instance;
}

// ---- devices -----------------------------------------------------------------------------

namespace {

constexpr int kMaxDevices = 64;

struct Config {
  int devices = 0;
  std::string error;
  Config() {
    const char* text = std::getenv("OPFORGE_FORGE_DEVICES");
    if (!text) {
      devices = 2;
      return;
    }
    char* end = nullptr;
    const long n = std::strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || n < 1 || n > kMaxDevices) {
      error = std::string("forge device initialisation failed: OPFORGE_FORGE_DEVICES must be an integer from 1 to ") +
              std::to_string(kMaxDevices) + ", got '" + text + "'";
      return;
    }
    devices = static_cast<int>(n);
  }
};

const Config& config() {
  static const Config c;
  return c;
}

thread_local int this_thread_device = 0;

}  // namespace

int device_count() noexcept { return config().devices; }
const std::string& init_error() noexcept { return config().error; }

void ensure_initialized() { TORCH_CHECK(config().error.empty(), config().error); }

void check_device(int64_t index, const char* what) {
  ensure_initialized();
  TORCH_CHECK_INDEX(index >= 0 && index < device_count(), what, ": invalid forge device index ", index,
                    " (there are ", device_count(), " forge devices, set by OPFORGE_FORGE_DEVICES)");
}

int current_device() noexcept { return this_thread_device; }

void set_current_device(int index) {
  check_device(index, "set_device");
  this_thread_device = index;
}

// ---- memory ------------------------------------------------------------------------------

namespace {

constexpr size_t kPage = 4096;

bool read_protect_flag() {
  const char* text = std::getenv("OPFORGE_FORGE_PROTECT");
  return !(text && std::strcmp(text, "0") == 0);
}

// The address range forge has ever mapped, for the fault handler (which may not take locks).
std::atomic<uintptr_t> lowest_mapping{UINTPTR_MAX}, highest_mapping{0};
struct sigaction previous_segv;

void on_segv(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  if (addr >= lowest_mapping.load() && addr < highest_mapping.load()) {
    static const char message[] =
        "\nforge: the host touched forge device memory (segmentation fault inside a forge block).\n"
        "forge tensors live on a device: read them with .cpu() or .item(), not through data_ptr().\n";
    [[maybe_unused]] auto n = write(STDERR_FILENO, message, sizeof(message) - 1);
  }
  // Hand the fault to whoever handled it before (Python's faulthandler, or the default action:
  // the faulting instruction runs again and the process dies loudly).
  sigaction(SIGSEGV, &previous_segv, nullptr);
  (void)sig;
  (void)context;
}

void install_fault_message() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action{};
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_segv);
  });
}

struct BlockInfo {
  size_t size;       // mapped bytes
  size_t requested;  // what the caller asked for
  int device;
  int open = 0;  // HostAccess references
};

// Small sizes round to pages; larger ones to a quarter of their power of two, so sizes that
// differ a little share cached blocks (at most 25% waste).
size_t round_size(size_t bytes) {
  size_t granule = kPage;
  if (bytes > (size_t{1} << 20)) granule = std::max(kPage, std::bit_floor(bytes) / 4);
  return (bytes + granule - 1) / granule * granule;
}

struct Pool {
  std::mutex mutex;
  std::map<uintptr_t, BlockInfo> live;  // handed out, by base address
  std::unordered_map<size_t, std::vector<void*>> cached[kMaxDevices];
  c10::CachingDeviceAllocator::DeviceStats stats[kMaxDevices];
  bool caching = true;
  const bool protect = read_protect_flag();

  void* map(size_t size) {
    void* p = mmap(nullptr, size, protect ? PROT_NONE : PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (uintptr_t low = lowest_mapping.load(); a < low && !lowest_mapping.compare_exchange_weak(low, a);) {}
    for (uintptr_t high = highest_mapping.load(); a + size > high && !highest_mapping.compare_exchange_weak(high, a + size);) {}
    return p;
  }

  void release_cached(int device) {  // mutex held
    for (auto& [size, blocks] : cached[device]) {
      for (void* p : blocks) munmap(p, size);
      auto& s = stats[device];
      s.reserved_bytes[0].decrease(size * blocks.size());
      for (size_t i = 0; i < blocks.size(); ++i) s.segment[0].decrease(1);
    }
    cached[device].clear();
  }
};

Pool& pool() { return leaked<Pool>(); }

void free_block(void* ptr) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.live.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == p.live.end()) return;  // not ours: nothing sane to do in a deleter but ignore it
  const BlockInfo info = it->second;
  p.live.erase(it);
  auto& s = p.stats[info.device];
  s.allocated_bytes[0].decrease(info.size);
  s.requested_bytes[0].decrease(info.requested);
  s.allocation[0].decrease(1);
  s.active[0].decrease(1);
  s.active_bytes[0].decrease(info.size);
  if (p.protect && info.open > 0) mprotect(ptr, info.size, PROT_NONE);
  if (p.caching) {
    p.cached[info.device][info.size].push_back(ptr);
  } else {
    munmap(ptr, info.size);
    s.reserved_bytes[0].decrease(info.size);
    s.segment[0].decrease(1);
  }
}

}  // namespace

bool protection_enabled() noexcept { return pool().protect; }

c10::DataPtr Allocator::allocate(size_t bytes) {
  ensure_initialized();
  const int device = current_device();
  const c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  if (bytes == 0) return c10::DataPtr(nullptr, nullptr, &free_block, where);
  if (pool().protect) install_fault_message();
  const size_t size = round_size(bytes);
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  auto& s = p.stats[device];
  void* ptr = nullptr;
  auto& free_list = p.cached[device][size];
  if (!free_list.empty()) {
    ptr = free_list.back();
    free_list.pop_back();
  } else {
    ptr = p.map(size);
    if (!ptr) {  // give every cached block back and try once more
      for (int d = 0; d < device_count(); ++d) p.release_cached(d);
      ptr = p.map(size);
    }
    TORCH_CHECK_WITH(OutOfMemoryError, ptr, "forge: out of memory allocating ", bytes, " bytes on forge:", device,
                     " (mmap failed: ", std::strerror(errno), ")");
    s.reserved_bytes[0].increase(size);
    s.segment[0].increase(1);
  }
  p.live.emplace(reinterpret_cast<uintptr_t>(ptr), BlockInfo{size, bytes, device});
  s.allocated_bytes[0].increase(size);
  s.requested_bytes[0].increase(bytes);
  s.allocation[0].increase(1);
  s.active[0].increase(1);
  s.active_bytes[0].increase(size);
  return c10::DataPtr(ptr, ptr, &free_block, where);
}

void Allocator::copy_data(void* dst, const void* src, size_t bytes) const {
  if (bytes == 0) return;
  // Both are forge blocks (resize_ moving a storage); open them for the copy.
  Pool& p = pool();
  auto open = [&](const void* ptr, int prot) {
    std::lock_guard<std::mutex> lock(p.mutex);
    auto it = p.live.find(reinterpret_cast<uintptr_t>(ptr));
    if (p.protect && it != p.live.end() && it->second.open == 0) mprotect(const_cast<void*>(ptr), it->second.size, prot);
  };
  open(dst, PROT_READ | PROT_WRITE);
  open(src, PROT_READ | PROT_WRITE);
  std::memcpy(dst, src, bytes);
  open(dst, PROT_NONE);
  open(src, PROT_NONE);
}

void Allocator::emptyCache(c10::MempoolId_t) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (int d = 0; d < device_count(); ++d) p.release_cached(d);
}

c10::CachingDeviceAllocator::DeviceStats Allocator::getDeviceStats(c10::DeviceIndex device) {
  check_device(device, "memory_stats");
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().stats[device];
}

namespace {

// fn(stat) for every counter of a device's statistics (all pools of each kind).
template <class F>
void for_each_stat(c10::CachingDeviceAllocator::DeviceStats& s, const F& fn) {
  for (auto* kind : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                     &s.requested_bytes})
    for (auto& stat : *kind) fn(stat);
}

}  // namespace

void Allocator::resetAccumulatedStats(c10::DeviceIndex device) {
  check_device(device, "reset_accumulated_memory_stats");
  std::lock_guard<std::mutex> lock(pool().mutex);
  for_each_stat(pool().stats[device], [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
}

void Allocator::resetPeakStats(c10::DeviceIndex device) {
  check_device(device, "reset_peak_memory_stats");
  std::lock_guard<std::mutex> lock(pool().mutex);
  for_each_stat(pool().stats[device], [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
}

std::pair<size_t, size_t> Allocator::getMemoryInfo(c10::DeviceIndex device) {
  check_device(device, "mem_get_info");
  // A virtual device has the host's memory; the part this device holds is not free.
  const size_t total = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
  std::lock_guard<std::mutex> lock(pool().mutex);
  const auto reserved = static_cast<size_t>(pool().stats[device].reserved_bytes[0].current);
  return {total > reserved ? total - reserved : 0, total};
}

void Allocator::set_caching(bool on) {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.caching = on;
  if (!on)
    for (int d = 0; d < device_count(); ++d) p.release_cached(d);
}

bool Allocator::caching() const {
  std::lock_guard<std::mutex> lock(pool().mutex);
  return pool().caching;
}

int Allocator::device_of(const void* ptr) const {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  auto it = p.live.upper_bound(a);
  if (it == p.live.begin()) return -1;
  --it;
  return a < it->first + it->second.size ? it->second.device : -1;
}

Allocator& allocator() { return leaked<Allocator>(); }

HostAccess::HostAccess(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) add(*t);
}

void HostAccess::add(const at::Tensor& t) {
  if (!t.defined() || !t.is_privateuseone() || !t.has_storage()) return;
  void* base = t.storage().mutable_data();
  if (!base) return;
  Pool& p = pool();
  if (!p.protect) return;
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.live.find(reinterpret_cast<uintptr_t>(base));
  if (it == p.live.end()) return;
  if (it->second.open++ == 0) mprotect(base, it->second.size, PROT_READ | PROT_WRITE);
  blocks_.push_back(base);
}

HostAccess::~HostAccess() {
  if (blocks_.empty()) return;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (void* base : blocks_) {
    auto it = p.live.find(reinterpret_cast<uintptr_t>(base));
    if (it != p.live.end() && --it->second.open == 0) mprotect(base, it->second.size, PROT_NONE);
  }
}

// ---- streams -----------------------------------------------------------------------------

namespace {

// The worker and synchronize() poll this long before blocking: a futex hand-off between two
// threads costs tens of microseconds on a VM whose idle vCPU must be woken, more than a small
// op, and back-to-back work (queue, synchronize, queue) finds the other side still polling.
constexpr auto kSpin = std::chrono::microseconds(50);

template <class F>
void spin_until(const F& done) {
  const auto stop = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1; !done(); ++i) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0 && std::chrono::steady_clock::now() > stop) return;
  }
}

}  // namespace

Stream::Stream(int device, int64_t id) : device_(device), id_(id) {
  // Detached: the worker sleeps on the condition variable until the process ends.
  std::thread([this] { run(); }).detach();
}

namespace {

struct PendingErrors {
  std::mutex mutex;
  std::string message[kMaxDevices];  // the first failure since the last report, per device
};

PendingErrors& pending_errors() { return leaked<PendingErrors>(); }

void keep_error(int device, int64_t stream, const std::string& error) {
  PendingErrors& p = pending_errors();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.message[device].empty())
    p.message[device] = "forge:" + std::to_string(device) + " stream " + std::to_string(stream) +
                        ": an asynchronous task failed: " + error;
}

}  // namespace

void raise_pending_error(int device) {
  PendingErrors& p = pending_errors();
  std::string message;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    message.swap(p.message[device]);
  }
  TORCH_CHECK(message.empty(), message);
}

void Stream::enqueue(std::function<void()> task) {
  std::vector<std::function<void()>> done;  // finished tasks, destroyed here (release_finished)
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done.swap(finished_tasks_);
    queue_.push_back(std::move(task));
    ++submitted_;
  }
  wake_.notify_one();
}

void Stream::run() {
  for (;;) {
    std::function<void()> task;
    spin_until([&] {
      return submitted_.load(std::memory_order_acquire) != finished_.load(std::memory_order_relaxed);
    });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return !queue_.empty(); });
      task = std::move(queue_.front());
      queue_.erase(queue_.begin());
    }
    std::string error;
    try {
      task();
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!error.empty()) keep_error(device_, id_, error);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_tasks_.push_back(std::move(task));  // destroyed by a caller (release_finished)
      ++finished_;
    }
    idle_.notify_all();
  }
}

void Stream::release_finished() {
  std::vector<std::function<void()>> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done.swap(finished_tasks_);
  }
}  // destroyed here, outside the lock

void Stream::synchronize() {
  const uint64_t target = submitted_.load(std::memory_order_acquire);
  spin_until([&] { return finished_.load(std::memory_order_acquire) >= target; });
  {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [&] { return finished_ >= target; });
  }
  // After a synchronize, the memory statistics no longer count the finished tasks' tensors.
  release_finished();
  raise_pending_error(device_);
}

bool Stream::query() {
  release_finished();
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_ == submitted_;
}

namespace {

struct StreamTable {
  std::mutex mutex;
  std::deque<std::unique_ptr<Stream>> streams[kMaxDevices];
};

StreamTable& streams() { return leaked<StreamTable>(); }

thread_local int64_t this_thread_stream[kMaxDevices] = {};

}  // namespace

Stream& stream(int device, int64_t id) {
  check_device(device, "stream");
  StreamTable& t = streams();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto& list = t.streams[device];
  if (list.empty()) list.push_back(std::make_unique<Stream>(device, 0));
  TORCH_CHECK_INDEX(id >= 0 && id < static_cast<int64_t>(list.size()), "forge:", device, " has no stream ", id);
  return *list[id];
}

Stream& new_stream(int device) {
  check_device(device, "new stream");
  StreamTable& t = streams();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto& list = t.streams[device];
  if (list.empty()) list.push_back(std::make_unique<Stream>(device, 0));
  TORCH_CHECK(list.size() < kMaxStreamsPerDevice, "forge:", device, ": more than ", kMaxStreamsPerDevice,
              " streams (each is a thread); reuse streams");
  list.push_back(std::make_unique<Stream>(device, static_cast<int64_t>(list.size())));
  return *list.back();
}

int64_t stream_count(int device) {
  std::lock_guard<std::mutex> lock(streams().mutex);
  return static_cast<int64_t>(streams().streams[device].size());
}

Stream& current_stream(int device) { return stream(device, this_thread_stream[device]); }

void set_current_stream(int device, int64_t id) {
  stream(device, id);  // validates
  this_thread_stream[device] = id;
}

void synchronize_device(int device) {
  check_device(device, "synchronize");
  // Only the streams that exist: one not started yet has nothing queued (and starting one here
  // would start its worker thread, at exit too).
  for (int64_t i = 0, n = stream_count(device); i < n; ++i) stream(device, i).synchronize();
}

// ---- events ------------------------------------------------------------------------------

void EventMark::complete() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    time = std::chrono::steady_clock::now();
    done = true;
  }
  cv.notify_all();
}

void EventMark::wait() {
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [&] { return done; });
}

bool EventMark::query() {
  std::lock_guard<std::mutex> lock(mutex);
  return done;
}

void record(Event& event, Stream& on) {
  TORCH_CHECK(event.device < 0 || event.device == on.device(), "forge: event was recorded on forge:", event.device,
              " and cannot be recorded on a stream of forge:", on.device());
  event.device = on.device();
  auto mark = std::make_shared<EventMark>();
  event.mark = mark;
  on.enqueue([mark] { mark->complete(); });
}

void block(const Event& event, Stream& on) {
  if (!event.mark) return;
  on.enqueue([mark = event.mark] { mark->wait(); });
}

double elapsed_ms(const Event& start, const Event& end) {
  TORCH_CHECK(start.mark && end.mark, "forge: elapsed_time needs two recorded events");
  start.mark->wait();
  end.mark->wait();
  return std::chrono::duration<double, std::milli>(end.mark->time - start.mark->time).count();
}

// ---- fallback bookkeeping ----------------------------------------------------------------

namespace {
struct Fallbacks {
  std::mutex mutex;
  std::map<std::string, int64_t> counts;
  std::atomic<int> mode{0};
};
Fallbacks& fallbacks() { return leaked<Fallbacks>(); }
}  // namespace

void set_fallback_mode(FallbackMode mode) { fallbacks().mode = static_cast<int>(mode); }
FallbackMode fallback_mode() { return static_cast<FallbackMode>(fallbacks().mode.load()); }

void note_fallback(const std::string& op) {
  std::lock_guard<std::mutex> lock(fallbacks().mutex);
  ++fallbacks().counts[op];
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> lock(fallbacks().mutex);
  return {fallbacks().counts.begin(), fallbacks().counts.end()};
}

void clear_fallback_counts() {
  std::lock_guard<std::mutex> lock(fallbacks().mutex);
  fallbacks().counts.clear();
}

}  // namespace opforge::forge
