// The CPU backend: always available, 64-byte aligned host memory. Large blocks (results of
// big ops) are kept in a small cache when freed: a fresh 64 MiB block costs 16k page faults
// on first touch, often more time than the memory-bound op writing into it.
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "opforge/backend.h"
#include "opforge/error.h"

namespace opforge {

namespace {

constexpr size_t kLargeBlock = size_t{1} << 20;  // cache blocks from 1 MiB up
constexpr size_t kHugePage = size_t{2} << 20;     // large blocks round to 2 MiB huge pages

size_t cache_limit() {
  const char* env = std::getenv("OPFORGE_CPU_CACHE_MB");
  return (env ? std::strtoull(env, nullptr, 10) : 1024) << 20;
}

class LargeBlockCache {
 public:
  void* take(size_t size) {
    std::lock_guard lock(mutex_);
    // The most recently freed block of this size (last of its equal range): its pages are the
    // likeliest to still be in cache and TLB, and reuse does not depend on older leftovers.
    auto it = free_.upper_bound(size);
    if (it == free_.begin() || std::prev(it)->first != size) return nullptr;
    --it;
    void* p = it->second;
    free_.erase(it);
    cached_ -= size;
    return p;
  }

  void* fresh(size_t size) {
    void* p = std::aligned_alloc(kHugePage, size);
    if (!p) return nullptr;
    madvise(p, size, MADV_HUGEPAGE);  // a hint; fewer faults and TLB misses where THP is on
    std::lock_guard lock(mutex_);
    sizes_[p] = size;
    return p;
  }

  // False if `p` is not a large block (the caller frees it).
  bool give_back(void* p) {
    std::lock_guard lock(mutex_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return false;
    if (cached_ + it->second > limit_) {
      sizes_.erase(it);
      std::free(p);
    } else {
      free_.emplace(it->second, p);
      cached_ += it->second;
    }
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;  // every live or cached large block
  std::multimap<size_t, void*> free_;        // cached blocks by size (exact match only)
  size_t cached_ = 0;
  size_t limit_ = cache_limit();
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  DeviceType device_type() const override { return DeviceType::cpu; }
  bool available() const override { return true; }
  int score() const override { return 10; }
  int64_t device_count() const override { return 1; }

  void* allocate(int64_t bytes, Device, void*) override {
    void* p = nullptr;
    if (static_cast<size_t>(bytes) >= kLargeBlock) {
      const size_t size = (static_cast<size_t>(bytes) + kHugePage - 1) / kHugePage * kHugePage;
      p = cache_.take(size);
      if (!p) p = cache_.fresh(size);
    } else {
      // Round up so aligned_alloc's size rule holds; never return null for empty tensors.
      const size_t size = (static_cast<size_t>(bytes) + 63) / 64 * 64;
      p = std::aligned_alloc(64, size ? size : 64);
    }
    if (!p) fail(ErrorKind::runtime, "cpu backend: out of memory allocating ", bytes, " bytes");
    return p;
  }
  void release(void* ptr, Device, void*) noexcept override {
    // Large blocks are huge-page aligned; a small block seldom is, and only those ask the cache
    // (a lock and a lookup, on every small result otherwise).
    if (reinterpret_cast<uintptr_t>(ptr) % kHugePage != 0 || !cache_.give_back(ptr)) std::free(ptr);
  }
  void copy(void* dst, const void* src, int64_t bytes, void*) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void synchronize(Device, void*) override {}

 private:
  LargeBlockCache cache_;
};

struct Registrar {
  Registrar() { register_backend(std::make_unique<CpuBackend>()); }
} registrar;

}  // namespace

}  // namespace opforge
