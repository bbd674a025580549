// The one validator: turns an op's declaration into argument checks, then runs its shape rule.
#include <algorithm>

#include "opforge/backend.h"
#include "opforge/dispatch.h"
#include "opforge/layout.h"

namespace opforge {

namespace {

// "float32" or "in [float32, float64]": what "'x' must have dtype ..." goes on with.
std::string expected_dtypes(const std::vector<DType>& dtypes) {
  return dtypes.size() == 1 ? std::string(dtype_name(dtypes[0])) : "in " + dtype_list(dtypes);
}

void check_tensor(const OpDef& op, const OpInputs& in, int64_t slot, const TensorView& t,
                  const ShapeContext& ctx) {
  const std::string& name = op.tensor_name(slot);
  const TensorConstraint& c = op.constraint(slot);
  if (!c.dtypes.empty() && std::find(c.dtypes.begin(), c.dtypes.end(), t.dtype) == c.dtypes.end())
    ctx.fail(ErrorKind::type, "'", name, "' must have dtype ", expected_dtypes(c.dtypes), ", got ",
             dtype_name(t.dtype));
  if (!c.same_dtype_as.empty()) {
    const auto& other = in.tensors[op.tensor_slot(c.same_dtype_as)];
    if (other && other->dtype != t.dtype)
      ctx.fail(ErrorKind::type, "'", name, "' must have dtype ", dtype_name(other->dtype), " like '",
               c.same_dtype_as, "', got ", dtype_name(t.dtype));
  }
  if (c.min_rank == c.max_rank && t.rank() != c.min_rank)
    ctx.fail(ErrorKind::value, "'", name, "' must have rank ", c.min_rank, ", got rank ", t.rank(),
             " (shape ", t.shape, ")");
  if (t.rank() < c.min_rank)
    ctx.fail(ErrorKind::value, "'", name, "' must have rank >= ", c.min_rank, ", got rank ", t.rank(),
             " (shape ", t.shape, ")");
  if (c.max_rank >= 0 && t.rank() > c.max_rank)
    ctx.fail(ErrorKind::value, "'", name, "' must have rank <= ", c.max_rank, ", got rank ", t.rank(),
             " (shape ", t.shape, ")");
  for (int64_t s : t.shape)
    if (s < 0) ctx.fail(ErrorKind::value, "'", name, "' has a negative size in shape ", t.shape);
}

// A result whose size in bytes overflows int64 could be neither allocated nor indexed (an
// input broadcast by stride 0 can have that many elements without taking the memory).
void check_size(const ShapeContext& ctx, const OutputSpec& out, size_t index, size_t count) {
  if (std::find(out.shape.begin(), out.shape.end(), 0) != out.shape.end()) return;  // empty
  int64_t bytes = dtype_size(out.dtype);
  bool overflow = false;
  for (int64_t s : out.shape) overflow = overflow || __builtin_mul_overflow(bytes, s, &bytes);
  if (!overflow) return;
  const std::string which = count == 1 ? "the result" : str("result ", index);
  ctx.fail(ErrorKind::value, which, " would have shape ", out.shape, " (", dtype_name(out.dtype),
           "), 2^63 bytes or more");
}

// OpDef::output_mask_slot: the results not asked for become empty, shape [0] (after the shape
// rule, which still checks every argument).
void apply_output_mask(const ShapeContext& ctx, int64_t mask, Outputs& outputs) {
  if (mask == -1) return;
  const int64_t n = static_cast<int64_t>(outputs.size());
  if (mask < 0 || mask >= (int64_t{1} << n))
    ctx.fail(ErrorKind::value, "'output_mask' must be -1 (every result) or a bit mask of its ", n,
             " results in [0, ", (int64_t{1} << n) - 1, "], got ", mask);
  for (int64_t r = 0; r < n; ++r)
    if (!(mask >> r & 1)) outputs[r].shape = {0};
}

}  // namespace

Device device_of(const OpInputs& inputs) {
  for (const auto& t : inputs.tensors)
    if (t) return t->device;
  return {};
}

Outputs infer_outputs(const OpDef& op, const OpInputs& inputs) {
  const Schema& schema = op.schema();
  ShapeContext ctx(op, inputs);
  OPFORGE_CHECK(static_cast<int64_t>(inputs.tensors.size()) == schema.num_tensor_args(),
                "tensor count mismatch for ", op.name());
  OPFORGE_CHECK(inputs.attrs.size() == schema.args.size() - inputs.tensors.size(),
                "attribute count mismatch for ", op.name());
  const std::string* first_name = nullptr;
  const TensorView* first = nullptr;
  for (int64_t slot = 0; slot < static_cast<int64_t>(inputs.tensors.size()); ++slot) {
    const auto& t = inputs.tensors[slot];
    if (!t) {
      if (schema.args[schema.arg_index(op.tensor_name(slot))].kind == ArgKind::tensor)
        ctx.fail(ErrorKind::type, "'", op.tensor_name(slot), "' must be a tensor, got None");
      continue;
    }
    check_tensor(op, inputs, slot, *t, ctx);
    if (!first) {
      first = &*t;
      first_name = &op.tensor_name(slot);
    } else if (!(t->device == first->device)) {
      ctx.fail(ErrorKind::runtime, "'", op.tensor_name(slot), "' is on ", device_name(t->device),
               " but '", *first_name, "' is on ", device_name(first->device),
               "; all tensors must be on one device");
    }
  }
  OPFORGE_CHECK(static_cast<bool>(op.shape_rule()), op.name(), " declares no shape rule");
  Outputs outputs = op.shape_rule()(ctx);
  OPFORGE_CHECK(static_cast<int64_t>(outputs.size()) == schema.num_results, op.name(),
                "'s shape rule returned ", outputs.size(), " results, schema says ", schema.num_results);
  for (size_t r = 0; r < outputs.size(); ++r) check_size(ctx, outputs[r], r, outputs.size());
  if (op.output_mask_slot() >= 0)
    apply_output_mask(ctx, std::get<int64_t>(inputs.attrs[op.output_mask_slot()]), outputs);
  std::vector<const TensorView*> operands;
  operands.reserve(op.elementwise_args().size());
  for (const auto& arg : op.elementwise_args()) {
    const auto& t = inputs.tensors[op.tensor_slot(arg)];
    if (t) operands.push_back(&*t);
  }
  for (OutputSpec& out : outputs)
    out.strides = operands.empty() ? contiguous_strides(out.shape) : elementwise_result_strides(operands, out.shape);
  return outputs;
}

void fail_unsupported_dtype(const OpDef& op, std::string_view arg, std::string_view got) {
  const int64_t slot = op.tensor_slot(arg);
  std::vector<DType> expected = slot >= 0 ? op.constraint(slot).dtypes : std::vector<DType>{};
  if (expected.empty()) expected.assign(std::begin(kAllDTypes), std::end(kAllDTypes));
  fail(ErrorKind::type, op.name(), "(): '", arg, "' must have dtype ", expected_dtypes(expected), ", got ", got);
}

void fail_result_allocation(const OpDef& op, const std::exception& error) {
  fail(ErrorKind::runtime, op.name(), "(): cannot allocate its results: ", error.what());
}

void run_kernel(const OpDef& op, const Selection& selection, const OpInputs& inputs,
                std::span<const TensorView> outputs, void* stream, ScratchAllocator* scratch) {
  // Nothing to compute (every result empty) and nothing to check (OpDef::validates).
  bool idle = !outputs.empty();
  for (const auto& out : outputs) idle = idle && out.numel() == 0;
  for (const auto& arg : op.validated_args()) {
    const auto& t = inputs.tensors[op.tensor_slot(arg)];
    idle = idle && !(t && t->numel() > 0);
  }
  if (idle) return;
  // Kernels write results row-major: hand them the views reordered to the results' layout.
  if (!op.elementwise_args().empty() && !outputs.empty() && !outputs.front().is_contiguous()) {
    OpInputs reordered_inputs = inputs;
    std::vector<TensorView> reordered(outputs.begin(), outputs.end());
    reorder_to_result_layout(op, reordered_inputs, reordered);
    run_kernel(op, selection, reordered_inputs, reordered, stream, scratch);
    return;
  }
  const Device device = outputs.empty() ? Device{} : outputs.front().device;
  if (device.type != DeviceType::cuda) {
    selection.fn(KernelCall(op, inputs, outputs, stream, scratch));
    return;
  }
  // Launches go to the current device: make it the tensors' for the call, then put it back.
  Backend& backend = *selection.backend;
  const int32_t previous = backend.exchange_device(device.index);
  struct Restore {
    Backend& backend;
    int32_t previous, index;
    ~Restore() {
      if (previous == index) return;
      try {
        backend.exchange_device(previous);
      } catch (...) {  // never from a destructor; a kernel's error may be on its way out
      }
    }
  } restore{backend, previous, device.index};
  selection.fn(KernelCall(op, inputs, outputs, stream, scratch));
}

}  // namespace opforge
