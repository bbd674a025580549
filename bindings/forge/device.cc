// What torch needs to treat PrivateUse1 as a device: the allocator, the device guard (devices,
// streams, events), the hooks (availability, generators, pinned host memory) and the generator.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <stdlib.h>

#include <set>

#include "generator.h"
#include "runtime.h"

namespace opforge::forge {

namespace {

// ---- device guard ------------------------------------------------------------------------

c10::Stream as_torch(const Stream& s) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(s.device())),
                     static_cast<c10::StreamId>(s.id()));
}

Stream& as_forge(const c10::Stream& s) { return stream(s.device_index(), s.id()); }

// The global pool torch.Stream() draws from: a fixed set per device, handed out round-robin as
// CUDA does, so creating many stream objects does not create many threads.
constexpr int kPoolStreams = 8;

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current_device()));
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.is_privateuseone(), "forge device guard given a ", d.type(), " device");
    set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) set_current_device(d.index());
  }

  c10::Stream getStream(c10::Device d) const override { return as_torch(current_stream(index(d))); }
  c10::Stream getDefaultStream(c10::Device d) const override { return as_torch(stream(index(d), 0)); }
  c10::Stream getNewStream(c10::Device d, int) const override { return as_torch(new_stream(index(d))); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    const int device = index(d);
    static std::mutex mutex;
    static int64_t next[64] = {};
    std::lock_guard<std::mutex> lock(mutex);
    while (stream_count(device) < 1 + kPoolStreams) new_stream(device);
    const int64_t id = 1 + next[device]++ % kPoolStreams;
    return as_torch(stream(device, id));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::Stream old = getStream(s.device());
    set_current_stream(s.device_index(), s.id());
    return old;
  }
  void* getStreamNativeHandle(const c10::Stream s) const override { return &as_forge(s); }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override { delete static_cast<Event*>(event); }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex device, const c10::EventFlag) const override {
    TORCH_CHECK(device == -1 || device == s.device_index(), "forge: event of forge:", device,
                " recorded on a stream of forge:", s.device_index());
    if (!*event) *event = new Event();
    forge::record(*static_cast<Event*>(*event), as_forge(s));
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event) forge::block(*static_cast<Event*>(event), as_forge(s));
  }
  bool queryEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    return !e || !e->mark || e->mark->query();
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<Event*>(event);
    if (e && e->mark) e->mark->wait();
    if (e && e->device >= 0) raise_pending_error(e->device);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "forge: elapsed_time needs two recorded events");
    return elapsed_ms(*static_cast<Event*>(start), *static_cast<Event*>(end));
  }

  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(device_count()); }
  bool queryStream(const c10::Stream& s) const override { return as_forge(s).query(); }
  void synchronizeStream(const c10::Stream& s) const override { as_forge(s).synchronize(); }
  void synchronizeDevice(const c10::DeviceIndex device) const override { synchronize_device(device); }
  // Queued tasks hold references to their tensors; nothing to record.
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static int index(c10::Device d) {
    const int i = d.has_index() ? d.index() : current_device();
    check_device(i, "forge stream");
    return i;
  }
};

// ---- pinned host memory ------------------------------------------------------------------

// Page-aligned host memory, remembered so is_pinned() can answer. A real device would lock the
// pages and register them for DMA; forge copies with memcpy, so alignment is all it needs.
struct PinnedAllocator final : c10::Allocator {
  std::mutex mutex;
  std::set<uintptr_t> live;

  static void release(void* ptr);
  c10::DataPtr allocate(size_t bytes) override {
    void* ptr = nullptr;
    if (bytes && posix_memalign(&ptr, 4096, bytes) != 0) ptr = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, ptr || !bytes, "forge: out of pinned host memory allocating ", bytes, " bytes");
    if (ptr) {
      std::lock_guard<std::mutex> lock(mutex);
      live.insert(reinterpret_cast<uintptr_t>(ptr));
    }
    return c10::DataPtr(ptr, ptr, &release, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dst, const void* src, size_t bytes) const override { default_copy_data(dst, src, bytes); }
  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex);
    return live.count(reinterpret_cast<uintptr_t>(ptr)) > 0;
  }
};

PinnedAllocator& pinned() {
  static auto* a = new PinnedAllocator();
  return *a;
}

void PinnedAllocator::release(void* ptr) {
  if (!ptr) return;
  {
    std::lock_guard<std::mutex> lock(pinned().mutex);
    pinned().live.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  free(ptr);
}

// ---- hooks -------------------------------------------------------------------------------

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override { ensure_initialized(); }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(current_device()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const int old = current_device();
    set_current_device(d);
    return static_cast<c10::DeviceIndex>(old);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    if (d < 0 || d >= device_count()) return static_cast<c10::DeviceIndex>(current_device());
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return default_generator(d < 0 ? current_device() : d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return make_generator(d < 0 ? current_device() : d);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    const int d = allocator().device_of(data);
    TORCH_CHECK(d >= 0, "forge: pointer ", data, " is not inside a live forge allocation");
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d));
  }
  bool isPinnedPtr(const void* data) const override { return pinned().contains(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &pinned(); }
  // Storage.resize_() on forge.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t bytes) const override {
    resize_storage_bytes(storage, bytes);
  }
};

}  // namespace

// Registered while the library loads; none of these touch a device, so loading never fails.
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator());

namespace {
[[maybe_unused]] const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();
}  // namespace

}  // namespace opforge::forge
