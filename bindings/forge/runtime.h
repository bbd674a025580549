// The forge device's runtime: virtual devices, memory, streams and events. Everything torch
// sees (the allocator, the device guard, the hooks, the aten kernels) is built on this file.
//
// A forge device is host memory that host code may not touch: blocks are mapped PROT_NONE and
// opened (PROT_READ|PROT_WRITE) only while forge's own code runs on them (a kernel on a
// stream's worker, a copy). A stray host dereference of a forge pointer faults at once instead
// of reading data that may still be in flight. Work runs asynchronously: each stream is a FIFO
// of tasks drained by its own worker thread, so forge behaves like an accelerator (results are
// ready only after a synchronize, an event, or a blocking copy).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

namespace opforge::forge {

// ---- devices -----------------------------------------------------------------------------

// The number of virtual devices (OPFORGE_FORGE_DEVICES, default 2); 0 when that variable is
// invalid. Never throws: torch calls it from noexcept paths.
int device_count() noexcept;
// Why the device cannot be used ("" when it can).
const std::string& init_error() noexcept;
// Throws c10::Error with init_error() when the device is unusable; every entry point that
// would touch a device calls it, so a failed initialisation is an exception each time.
void ensure_initialized();
// Throws c10::IndexError unless 0 <= index < device_count().
void check_device(int64_t index, const char* what);
int current_device() noexcept;
void set_current_device(int index);

// ---- memory ------------------------------------------------------------------------------

// The PrivateUse1 allocator: a caching pool of page-aligned, individually mapped blocks.
class Allocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  // Used by resize_ (and storage clones) to move old contents; goes through open().
  void copy_data(void* dst, const void* src, size_t bytes) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t = {0, 0}) override;
  // Tasks hold references to every tensor they use, so memory is never reused while queued
  // work still needs it: there is nothing to record.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // false: every allocation maps fresh pages and every free unmaps them (the benchmark's
  // "system allocator" side). Cached blocks are released when caching is turned off.
  void set_caching(bool on);
  bool caching() const;
  // The forge device holding `ptr` (any address inside a live block), or -1.
  int device_of(const void* ptr) const;
};

Allocator& allocator();

// Opens the blocks of the given tensors for host access for its lifetime. Reference counted,
// so concurrent kernels on different streams may share inputs. Tensors not on forge are
// ignored. OPFORGE_FORGE_PROTECT=0 turns protection off (all blocks stay open).
class HostAccess {
 public:
  HostAccess() = default;
  explicit HostAccess(std::initializer_list<const at::Tensor*> tensors);
  HostAccess(const HostAccess&) = delete;
  HostAccess& operator=(const HostAccess&) = delete;
  ~HostAccess();
  void add(const at::Tensor& t);

 private:
  std::vector<void*> blocks_;
};

bool protection_enabled() noexcept;

// ---- streams -----------------------------------------------------------------------------

// Stream ids: 0 is each device's default stream; new streams take the next id. A stream
// is never destroyed (torch's stream objects are plain ids), so ids stay valid.
constexpr int kMaxStreamsPerDevice = 1024;

class Stream {
 public:
  Stream(int device, int64_t id);
  // Queues `task`; returns at once. An exception from a task is kept and rethrown (as
  // c10::Error) by the next synchronization with the device (raise_pending_error).
  void enqueue(std::function<void()> task);
  void synchronize();
  bool query();  // true when every queued task has finished
  int device() const { return device_; }
  int64_t id() const { return id_; }

 private:
  void run();
  // Destroys the finished tasks (and the tensors they hold) on the calling thread. Never on
  // the worker: dropping the last reference to a tensor whose Python object Python has let go
  // frees that object, which takes the GIL, and the thread waiting on this stream may hold it.
  void release_finished();
  int device_;
  int64_t id_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::vector<std::function<void()>> queue_;
  std::vector<std::function<void()>> finished_tasks_;  // for release_finished()
  // Written under mutex_; atomic so that the worker and synchronize() may poll them without it.
  std::atomic<uint64_t> submitted_ = 0, finished_ = 0;
};

// An asynchronous error is the device's, as CUDA's are the context's: the first failure on any
// of its streams is raised (once) by the next synchronization with that device: a stream's or
// the device's synchronize(), an event's, or a blocking copy. Work queued after it still runs.
void raise_pending_error(int device);

Stream& stream(int device, int64_t id);
// A fresh stream on `device` (torch.Stream(device="forge"), getNewStream).
Stream& new_stream(int device);
int64_t stream_count(int device);
// The calling thread's current stream on `device` (the default stream unless set).
Stream& current_stream(int device);
void set_current_stream(int device, int64_t id);
void synchronize_device(int device);

// ---- events ------------------------------------------------------------------------------

// One recording of an event: done once the stream reaches it. Recording again starts a new
// one, so a wait queued earlier still waits for the recording it saw.
struct EventMark {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::chrono::steady_clock::time_point time;
  void complete();
  void wait();
  bool query();
};

struct Event {
  int device = -1;
  std::shared_ptr<EventMark> mark;  // null until recorded: queries say done, waits return
};

void record(Event& event, Stream& on);
void block(const Event& event, Stream& on);  // `on` waits for the event's recording
double elapsed_ms(const Event& start, const Event& end);

// Grows or shrinks a forge storage to `bytes`, keeping its contents (after draining the
// device's current stream, whose queued work may still write the old block).
void resize_storage_bytes(const c10::Storage& storage, size_t bytes);

// ---- fallback bookkeeping ----------------------------------------------------------------

enum class FallbackMode : int { allow = 0, error = 1 };
void set_fallback_mode(FallbackMode mode);
FallbackMode fallback_mode();
void note_fallback(const std::string& op);
std::vector<std::pair<std::string, int64_t>> fallback_counts();
void clear_fallback_counts();

}  // namespace opforge::forge
