// dequantize on the CPU: per Highway target, in parallel over all blocks of all rows.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/dequantize/dequantize_cpu.cc"
#include <hwy/foreach_target.h>  // re-includes this file once per target
#include <hwy/highway.h>

#include "opforge/cpu/ggml_quant.h"
#include "opforge/registry.h"

HWY_BEFORE_NAMESPACE();
namespace opforge::dequantize_cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One block into 32 floats: one product per value, as ggml's dequantize_row_q8_0/_q4_0.
template <quant::Format F>
HWY_INLINE void Block(const uint8_t* HWY_RESTRICT block, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<int32_t, decltype(df)> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto d = hn::Set(df, quant::load_scale(block));
  const uint8_t* qs = block + 2;
  if constexpr (F == quant::Format::q8_0) {
    const hn::Rebind<int8_t, decltype(df)> d8;
    const int8_t* q = reinterpret_cast<const int8_t*>(qs);
    for (int64_t j = 0; j < quant::kBlock; j += lanes)
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q + j))), d), df, out + j);
  } else {
    const hn::Rebind<uint8_t, decltype(df)> d8;
    const auto low = hn::Set(di, 0x0f), eight = hn::Set(di, 8);
    for (int64_t j = 0; j < quant::kBlock / 2; j += lanes) {
      const auto v = hn::PromoteTo(di, hn::LoadU(d8, qs + j));
      const auto lo = hn::Sub(hn::And(v, low), eight), hi = hn::Sub(hn::ShiftRight<4>(v), eight);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, lo), d), df, out + j);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, hi), d), df, out + j + quant::kBlock / 2);
    }
  }
}

template <quant::Format F>
void Rows(const TensorView& q, const TensorView& out) {
  const int64_t bytes = quant::block_bytes(F);
  if (q.size(-1) == 0) return;
  const int64_t inner = q.stride(-1);
  float* dst = out.data_as<float>();
  parallel_for(out.numel() / quant::kBlock, 1024, [&](int64_t begin, int64_t end) {
    uint8_t gathered[34];
    quant::BlockCursor<uint8_t> cursor(q, bytes, begin);
    for (int64_t g = begin; g < end; ++g, cursor.next()) {
      const uint8_t* block = cursor.get();
      if (inner != 1) {
        for (int64_t j = 0; j < bytes; ++j) gathered[j] = block[j * inner];
        block = gathered;
      }
      Block<F>(block, dst + g * quant::kBlock);
    }
  });
}

void Run(const KernelCall& call) {
  if (quant::format_of(call) == quant::Format::q8_0)
    Rows<quant::Format::q8_0>(call.tensor("q"), call.output());
  else
    Rows<quant::Format::q4_0>(call.tensor("q"), call.output());
}

}  // namespace opforge::dequantize_cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opforge::dequantize_cpu {
HWY_EXPORT(Run);
void run(const KernelCall& call) { HWY_DYNAMIC_DISPATCH(Run)(call); }
OPFORGE_KERNEL(dequantize, "cpu", (std::vector<DType>{DType::uint8}), run);
}  // namespace opforge::dequantize_cpu
#endif
