#include "ffi_call.h"

#include <string>

#include "opforge/dispatch.h"
#include "opforge/registry.h"

namespace opforge::jax {

namespace {

DType dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::float32;
    case ffi::DataType::F64: return DType::float64;
    case ffi::DataType::F16: return DType::float16;
    case ffi::DataType::BF16: return DType::bfloat16;
    case ffi::DataType::S8: return DType::int8;
    case ffi::DataType::U8: return DType::uint8;
    case ffi::DataType::S32: return DType::int32;
    case ffi::DataType::S64: return DType::int64;
    case ffi::DataType::PRED: return DType::boolean;
    default: fail(ErrorKind::type, "XLA element type ", static_cast<int>(t), " has no opforge dtype");
  }
}

TensorView view_of(const ffi::AnyBuffer& buffer, Device device) {
  TensorView view;
  view.data = buffer.untyped_data();
  view.dtype = dtype_of(buffer.element_type());
  view.device = device;
  const auto dims = buffer.dimensions();
  view.shape.assign(dims.begin(), dims.end());
  view.strides = contiguous_strides(view.shape);  // XLA hands custom calls dense row-major buffers
  return view;
}

template <typename T>
T attr_or_fail(const ffi::Dictionary& attrs, const OpDef& op, const std::string& name) {
  auto value = attrs.get<T>(name);
  if (value.has_error())
    fail(ErrorKind::type, op.name(), "(): attribute '", name, "' did not decode: ", value.error().message());
  return *value;
}

AttrValue read_attr(const ffi::Dictionary& attrs, const OpDef& op, const ArgSpec& spec) {
  switch (spec.kind) {
    case ArgKind::float_: return attr_or_fail<double>(attrs, op, spec.name);
    case ArgKind::int_: return attr_or_fail<int64_t>(attrs, op, spec.name);
    case ArgKind::bool_: return attr_or_fail<bool>(attrs, op, spec.name);
    case ArgKind::str: return std::string(attr_or_fail<std::string_view>(attrs, op, spec.name));
    default: fail(ErrorKind::runtime, "read_attr: not an attribute");
  }
}

// The status code each kind of opforge error reaches Python with, one code per kind, so that
// opforge.jax can raise TypeError, ValueError, NotImplementedError or RuntimeError again for
// errors a kernel reports while running (python/opforge/jax.py, _typed_error).
ffi::ErrorCode status_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::type: return ffi::ErrorCode::kInvalidArgument;
    case ErrorKind::value: return ffi::ErrorCode::kOutOfRange;
    case ErrorKind::not_implemented: return ffi::ErrorCode::kUnimplemented;
    default: return ffi::ErrorCode::kFailedPrecondition;
  }
}

}  // namespace

ffi::Error run(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs, Device device,
               void* stream, ScratchAllocator* scratch) {
  try {
    auto name = attrs.get<std::string_view>("op");
    if (name.has_error()) return ffi::Error::InvalidArgument("opforge FFI call without an 'op' attribute");
    const OpDef& op = find_op(*name);
    auto present = attrs.get<int64_t>("present");
    if (present.has_error()) return ffi::Error::InvalidArgument(op.name() + "(): FFI call without 'present'");

    OpInputs inputs = OpInputs::reserved_for(op.schema());
    size_t operand = 0;
    int64_t slot = 0;
    for (const ArgSpec& spec : op.schema().args) {
      if (!spec.is_tensor()) {
        inputs.attrs.push_back(read_attr(attrs, op, spec));
        continue;
      }
      if (!((*present >> slot++) & 1)) {
        inputs.tensors.emplace_back(std::nullopt);
        continue;
      }
      auto buffer = args.get<ffi::AnyBuffer>(operand++);
      if (buffer.has_error()) return buffer.error();
      inputs.tensors.emplace_back(view_of(*buffer, device));
    }
    const Outputs specs = infer_outputs(op, inputs);
    if (specs.size() != rets.size())
      fail(ErrorKind::runtime, op.name(), "(): XLA passed ", rets.size(), " results, the op has ", specs.size());
    std::vector<TensorView> outputs;
    for (size_t i = 0; i < rets.size(); ++i) {
      auto result = rets.get<ffi::AnyBuffer>(i);
      if (result.has_error()) return result.error();
      outputs.push_back(view_of(**result, device));
      if (outputs.back().shape != specs[i].shape || outputs.back().dtype != specs[i].dtype)
        fail(ErrorKind::runtime, op.name(), "(): XLA result ", i, " is ", dtype_name(outputs.back().dtype),
             outputs.back().shape, ", the shape rule says ", dtype_name(specs[i].dtype), specs[i].shape);
    }
    run_kernel(op, select_kernel(op, inputs), inputs, outputs, stream, scratch);
    return ffi::Error::Success();
  } catch (const Error& e) {
    return ffi::Error(status_code(e.kind()), e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
}

}  // namespace opforge::jax
