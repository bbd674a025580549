// ggml's quantized block formats, as the quantization ops (quantize_q8_0, quantize_q4_0,
// dequantize, matmul_q) share them. A block holds 32 values: a little-endian IEEE fp16 scale d,
// then the quants. Q8_0: 32 int8 q, value q * d (34 bytes). Q4_0: 16 bytes, byte j holding
// element j in its low nibble and element j + 16 in its high nibble, value (q - 8) * d
// (18 bytes). Byte-identical to ggml's, so files written by ggml-based tools load as they are.
#pragma once

#include <cstdint>
#include <string>

#include "opforge/cpu/strided.h"
#include "opforge/half.h"
#include "opforge/op.h"

namespace opforge::quant {

inline constexpr int64_t kBlock = 32;

enum class Format : uint8_t { q8_0, q4_0 };

inline int64_t block_bytes(Format f) { return f == Format::q8_0 ? 34 : 18; }
inline const char* format_name(Format f) { return f == Format::q8_0 ? "q8_0" : "q4_0"; }

// The op's str attribute `format`; ValueError naming the formats otherwise.
inline Format format_of(const ArgAccess& a) {
  const std::string& name = a.attr_str("format");
  if (name == "q8_0") return Format::q8_0;
  if (name == "q4_0") return Format::q4_0;
  a.fail(ErrorKind::value, "'format' must be 'q8_0' or 'q4_0', got '", name, "'");
}

inline float load_scale(const uint8_t* block) {
  return to_float(float16{static_cast<uint16_t>(block[0] | (block[1] << 8))});
}

inline void store_scale(uint8_t* block, float16 d) {
  block[0] = static_cast<uint8_t>(d.bits & 0xff);
  block[1] = static_cast<uint8_t>(d.bits >> 8);
}

// Scales as ggml computes them from the block's absolute maximum (Q8_0: amax / 127) or its
// signed value of largest magnitude (Q4_0: max / -8), in float32; the quants multiply by the
// inverse of these unrounded values while the block stores them rounded to fp16. The CPU
// kernels compute them a group of blocks at a time (cpu/ggml_quant-inl.h: GroupScales).
inline float scale_q8_0(float amax) { return amax / 127.0f; }
inline float inverse_scale(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

// Walks the blocks of t ([..., k], any strides) in order from block `begin`, a block being
// `block` consecutive elements of the last dimension: get() is the current block's first
// element (the rest follow at t.stride(-1)), next() steps to the following block. One division
// to start and per row, none per block. A cursor rather than a callback, so the per-target
// kernels inline it (a generic function cannot inline a target-specific lambda: every block
// paid a call).
template <typename T>
class BlockCursor {
 public:
  BlockCursor(const TensorView& t, int64_t block, int64_t begin)
      : t_(t), nb_(t.size(-1) / block), step_(block * t.stride(-1)), row_(begin / nb_), b_(begin % nb_),
        p_(row_start(row_) + b_ * step_) {}

  const T* get() const { return p_; }

  void next() {
    if (++b_ < nb_) {
      p_ += step_;
    } else {
      b_ = 0;
      p_ = row_start(++row_);
    }
  }

 private:
  const T* row_start(int64_t row) const {
    return t_.data_as<const T>() + cpu::offset_of(row, t_.shape.data(), t_.strides.data(), t_.rank() - 1);
  }

  const TensorView& t_;
  int64_t nb_, step_, row_, b_;
  const T* p_;
};

}  // namespace opforge::quant
