// 16-byte copies from global to shared memory that do not pass through registers (cp.async, sm_80
// and later): a kernel queues them, does other work, and waits for them before the barrier after
// which its threads read what they copied. In the CUDA emulator, plain copies done at once (the
// wait has nothing left to wait for).
#pragma once

#ifdef CUDA_EMU_ARCH
#include <cstring>
#endif

namespace opforge::cuda {

// shared and global 16-byte aligned.
__device__ __forceinline__ void copy16_async(void* shared, const void* global) {
#ifndef CUDA_EMU_ARCH
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(global) : "memory");
#else
  std::memcpy(shared, global, 16);
#endif
}

// Waits for this thread's copies (every thread's, once the block's barrier follows).
__device__ __forceinline__ void wait_async_copies() {
#ifndef CUDA_EMU_ARCH
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

}  // namespace opforge::cuda
