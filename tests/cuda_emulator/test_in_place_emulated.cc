// The CUDA kernels of elementwise ops written over one of their own inputs, as opforge.<op>(...,
// out=x) runs them (bindings/python/out_arrays.cc allows it for elementwise ops only): each
// case must give the bits the same kernel gives into a separate result, with the blocks taking
// turns forward and in reverse, and with grid-stride loops cut to 3 blocks (a thread that read an
// element after another had written it would see the result, not the input).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "differential.h"
#include "op_cases.h"

namespace opforge::emulated {
namespace {

// The emulated run of `name` with its result written over input `slot`; the result's bytes.
std::vector<unsigned char> run_in_place(const std::string& name, const Inputs& inputs, int64_t slot) {
  const OpDef& op = find_op(name);
  const Device device{DeviceType::cuda, kTensorDevice};
  std::vector<void*> memory;
  OpInputs in;
  in.attrs = inputs.attrs;
  for (const auto& t : inputs.tensors) {
    if (!t) {
      in.tensors.emplace_back(std::nullopt);
      continue;
    }
    memory.push_back(cuda_emu::allocate(t->bytes.size()));
    std::memcpy(memory.back(), t->bytes.data(), t->bytes.size());
    in.tensors.emplace_back(t->view(memory.back(), device));
  }
  std::vector<unsigned char> bytes;
  set_backend_override("", kEmulated);
  try {
    const std::vector<TensorView> outputs{*in.tensors[slot]};
    run_kernel(op, select_kernel(op, in), in, outputs, kCallerStream);
    bytes.resize(size_t(outputs[0].nbytes()));
    std::memcpy(bytes.data(), outputs[0].data, bytes.size());
  } catch (const Error& e) {
    ADD_FAILURE() << name << " in place over input " << slot << ": " << e.what();
  }
  set_backend_override("", "");
  for (void* p : memory) cuda_emu::release(p);
  return bytes;
}

// Elementwise ops with a CUDA kernel (OpDef::elementwise).
std::vector<std::string> elementwise_ops() {
  std::vector<std::string> names;
  for (const OpDef* op : all_ops())
    if (!op->elementwise_args().empty() && !emulated_dtypes(op->name()).empty()) names.push_back(op->name());
  return names;
}

class InPlace : public ::testing::TestWithParam<std::string> {};

TEST_P(InPlace, GivesTheBitsOfASeparateResult) {
  const std::string name = GetParam();
  const OpDef& op = find_op(name);
  const Case& c = cases().at(name);
  std::mt19937 rng(std::hash<std::string>{}(name) & 0xffffffff);
  int runs = 0;
  for (DType dtype : emulated_dtypes(name))
    for (int s = 0; s < c.shapes; ++s)
      for (Layout layout : {Layout::contiguous, Layout::misaligned}) {  // out= takes dense arrays only
        const std::optional<Inputs> in = c.inputs(dtype, s, layout, rng);
        if (!in) continue;
        const Outcome separate = run_on(kEmulated, name, *in);
        if (!separate.error.empty()) continue;
        for (const std::string& arg : op.elementwise_args()) {
          const int64_t slot = op.tensor_slot(arg);
          const auto& t = in->tensors[slot];
          // In place only over an input that is exactly the result (same dtype and shape, no broadcast).
          if (!t || t->dtype != separate.specs[0].dtype || t->shape != separate.specs[0].shape) continue;
          const std::string what = name + " over '" + arg + "', " + std::string(dtype_name(dtype)) + " " +
                                   layout_name(layout) + " case " + std::to_string(s) + " " + shape_text(t->shape);
          EXPECT_TRUE(run_in_place(name, *in, slot) == separate.results[0]) << what;
          cuda_emu::set_schedule(cuda_emu::Schedule::reverse);
          EXPECT_TRUE(run_in_place(name, *in, slot) == separate.results[0]) << what << " (blocks in reverse)";
          cuda_emu::set_schedule(cuda_emu::Schedule::forward);
          const int64_t cap = cuda_emu::set_grid_cap(3);
          EXPECT_TRUE(run_in_place(name, *in, slot) == separate.results[0]) << what << " (3 blocks)";
          cuda_emu::set_grid_cap(cap);
          ++runs;
          if (HasFailure()) return;
        }
      }
  EXPECT_GT(runs, 0) << name << ": no case has an input shaped like the result";
}

INSTANTIATE_TEST_SUITE_P(Ops, InPlace, ::testing::ValuesIn(elementwise_ops()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace opforge::emulated
