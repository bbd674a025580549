// cub::DeviceRadixSort for the host CUDA emulator (cuda_emulator.h): the same contract (a sizing
// call with no storage, then a stable sort of the pairs by the keys' bits [begin_bit, end_bit)),
// done with std::stable_sort. Stands in for CUB's header, which only nvcc compiles.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "emulator.h"

namespace cub {

struct DeviceRadixSort {
  template <class Key, class Value, class Count>
  static cudaError_t SortPairs(void* storage, size_t& storage_bytes, const Key* keys_in, Key* keys_out,
                               const Value* values_in, Value* values_out, Count count, int begin_bit = 0,
                               int end_bit = int(sizeof(Key) * 8), cudaStream_t stream = nullptr) {
    static_assert(std::is_unsigned_v<Key>, "the emulated radix sort orders unsigned keys");
    const size_t n = static_cast<size_t>(count);
    if (!storage) {  // CUB asks for storage of its own; so does this, so the caller's sizing is used
      storage_bytes = 16 + n;
      return cudaSuccess;
    }
    cuda_emu::record_stream_use("cub::DeviceRadixSort::SortPairs", stream);
    if (storage_bytes < 16 + n) throw cuda_emu::KernelFault("cub::DeviceRadixSort::SortPairs: storage smaller than sized");
    const int bits = end_bit - begin_bit;
    const Key mask = bits >= int(sizeof(Key) * 8) ? ~Key{0} : (Key{1} << bits) - 1;
    auto digit = [&](size_t i) { return static_cast<Key>(keys_in[i] >> begin_bit) & mask; };
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return digit(a) < digit(b); });
    std::vector<Key> keys(n);
    std::vector<Value> values(n);
    for (size_t i = 0; i < n; ++i) {
      keys[i] = keys_in[order[i]];
      values[i] = values_in[order[i]];
    }
    std::copy(keys.begin(), keys.end(), keys_out);
    std::copy(values.begin(), values.end(), values_out);
    return cudaSuccess;
  }
};

}  // namespace cub
