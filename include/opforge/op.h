// Declaring an op: its schema, per-argument constraints and its shape rule. One declaration
// drives validation, output allocation and every framework adapter.
//
//   OPFORGE_OP(rms_norm) {
//     return opforge::OpDef("rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor")
//         .dtypes("x", opforge::float_dtypes())
//         .same_dtype("weight", "x")
//         .rank("x", 1).rank("weight", 1, 1)
//         .shape([](const opforge::ShapeContext& c) {
//           c.expect_shape("weight", {c.tensor("x").size(-1)});
//           return opforge::Outputs{c.like("x")};
//         });
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "opforge/error.h"
#include "opforge/schema.h"
#include "opforge/tensor.h"

namespace opforge {

// The floating dtypes most ops accept. A function, not a global: kernels register from
// static initializers in other translation units.
inline std::vector<DType> float_dtypes() {
  return {DType::float32, DType::float64, DType::float16, DType::bfloat16};
}

// One call's arguments, in schema order: tensors (None for an absent optional tensor) and
// attributes (floats, ints, bools, strings).
struct OpInputs {
  std::vector<std::optional<TensorView>> tensors;
  std::vector<AttrValue> attrs;

  // Empty lists with room for a call of `schema`: one heap block each (none without attributes)
  // rather than one per growth. Every frontend's binding starts from it.
  static OpInputs reserved_for(const Schema& schema);
};

// What the shape rule says about one result. `strides` (elements) is the layout adapters
// allocate it with: infer_outputs fills it, row-major unless the op is elementwise (OpDef::
// elementwise), and shape rules leave it empty.
struct OutputSpec {
  DType dtype;
  Dims shape;
  Dims strides = {};
};
using Outputs = std::vector<OutputSpec>;

class OpDef;

// How torch.autocast casts an op's floating tensor arguments (float64 ones stay), as torch's own
// policies: lower_precision to the autocast dtype (linear_act, like torch's linear); fp32 (norms,
// softmax, as torch's); promote to the widest floating dtype among them (add, rope: torch's own
// ops promote mixed inputs). none (the default) leaves them as they are.
enum class AutocastPolicy { none, lower_precision, fp32, promote };
std::string_view autocast_policy_name(AutocastPolicy policy);

// Named access to one call's arguments, shared by shape rules and kernels.
class ArgAccess {
 public:
  ArgAccess(const OpDef& op, const OpInputs& inputs) : op_(op), inputs_(inputs) {}

  const OpDef& op() const { return op_; }
  const OpInputs& inputs() const { return inputs_; }
  // The tensor argument `name`; Error(runtime) if it is an absent optional.
  const TensorView& tensor(std::string_view name) const;
  const TensorView* optional_tensor(std::string_view name) const;
  double attr_float(std::string_view name) const;
  int64_t attr_int(std::string_view name) const;
  bool attr_bool(std::string_view name) const;
  const std::string& attr_str(std::string_view name) const;

  // Throws Error(kind) with the message prefixed by "<op>(): ".
  template <typename... Args>
  [[noreturn]] void fail(ErrorKind kind, const Args&... args) const;

 private:
  const AttrValue& attr(std::string_view name) const;
  const OpDef& op_;
  const OpInputs& inputs_;
};

// What a shape rule sees. Its checks throw messages in the house format:
//   rms_norm(): 'weight' must have shape [4096], got [4095]
class ShapeContext : public ArgAccess {
 public:
  using ArgAccess::ArgAccess;
  void expect_shape(std::string_view arg, const Dims& expected) const;
  // NumPy broadcasting of two tensor arguments' shapes; ValueError when incompatible.
  Dims broadcast(std::string_view a, std::string_view b) const;
  // A result with the dtype and shape of tensor argument `arg`.
  OutputSpec like(std::string_view arg) const;
};

using ShapeRule = std::function<Outputs(const ShapeContext&)>;

// Per tensor argument: what the validator checks before the shape rule runs.
struct TensorConstraint {
  std::vector<DType> dtypes;  // empty: any
  std::string same_dtype_as;  // empty: no relation
  int64_t min_rank = 0;
  int64_t max_rank = -1;  // -1: unbounded
};

class OpDef {
 public:
  explicit OpDef(std::string_view schema);

  OpDef& dtypes(std::string_view arg, std::vector<DType> allowed);
  OpDef& same_dtype(std::string_view arg, std::string_view as);
  OpDef& rank(std::string_view arg, int64_t min_rank, int64_t max_rank = -1);
  OpDef& shape(ShapeRule rule);
  OpDef& doc(std::string text);
  // The tensor argument whose dtype selects the kernel (default: the first tensor).
  OpDef& dispatch_on(std::string_view arg);
  // Gradients come from another registered op, `backward_op`, whose results are the
  // gradients of `inputs` (tensor arguments of this op, in that order). Its arguments are
  // bound by name: "grad" is the cotangent of this op's result, "result" this op's result,
  // and any other name is this op's argument of that name. Adapters (torch autograd, JAX
  // custom_vjp) wire it up; arguments not listed get no gradient.
  OpDef& backward(std::string_view backward_op, std::vector<std::string> inputs);
  // What the backward op needs beyond the inputs and the result (an activation's input, a
  // norm's statistics) comes from another registered op, `saving_op`: same arguments as this
  // op, results this op's result and then one tensor per name in `saved`. Adapters run it in
  // place of this op when a gradient will be needed (torch's C++ autograd kernel, JAX's
  // custom_vjp forward rule), and hand its extra results to the backward op's arguments of
  // those names. Those must be optional (`Tensor? name=None`): where the forward cannot be
  // swapped (torch's Python autograd rules) they arrive as None and the backward op
  // recomputes them.
  OpDef& saving_forward(std::string_view saving_op, std::vector<std::string> saved);
  // The gradient of each of `inputs` (among the differentiable ones) is the cotangent itself
  // wherever that input has the result's shape and dtype: add's operands, add_one's x. There
  // the adapters hand the cotangent through, as torch's own autograd does for x + y, and run
  // the backward op only for the gradients that still need it (a broadcast operand's sum).
  OpDef& identity_gradient(std::vector<std::string> inputs);
  // Tensor arguments whose shape and dtype are all this op (a backward op) reads, never their
  // data: add_backward's x and y. Adapters then keep only the shape of the forward's tensor of that
  // name and hand a stand-in without storage (a broadcast scalar), so autograd neither keeps the
  // tensor alive nor objects when it is changed in place after the forward.
  OpDef& shape_only(std::vector<std::string> args);
  // A backward op whose schema ends in `int output_mask=-1` computes only the results whose bit
  // is set (bit i: result i); the others come back empty, shape [0], and its kernels skip them
  // (kernels skip empty results anyway). Adapters set it to the gradients autograd wants, as
  // torch's own backward functions take `bool[] output_mask`: the first layer of a network
  // needs no grad_x, a frozen weight no grad_weight, an operand the cotangent itself no sum.
  // -1 (the default, for direct calls) computes every result.
  int64_t output_mask_slot() const { return output_mask_slot_; }
  OpDef& autocast(AutocastPolicy policy);
  // The op works independently on every index of the leading dimensions of `args` (which
  // broadcast against each other), so a batch axis can be one more leading dimension: one
  // call on the batched arrays instead of a loop. Adapters use it for vmap.
  OpDef& maps_over_leading_dims(std::vector<std::string> args);
  // Tensor arguments whose values the kernels check (an index's range). Kernels are not called
  // when every result is empty, except while one of these has elements: a bad value is then
  // still an error (scatter_add with dim_size=0), and the kernels return after their check.
  OpDef& validates(std::vector<std::string> args);
  // Each element of the results depends only on the elements of `args` at its own (broadcast)
  // index, and the results have the broadcast shape of `args`. The results then take their
  // inputs' layout, as torch's elementwise ops and NumPy's ufuncs (order='K') give theirs: a
  // transposed input gives a transposed result, a channels-last one a channels-last result
  // (opforge/layout.h has the rule). Kernels still see contiguous results: run_kernel hands
  // them every view with the dimensions reordered to the results' memory order.
  OpDef& elementwise(std::vector<std::string> args);

  const std::string& name() const { return schema_.name; }
  const Schema& schema() const { return schema_; }
  const std::string& doc() const { return doc_; }
  const ShapeRule& shape_rule() const { return shape_rule_; }
  const TensorConstraint& constraint(int64_t tensor_slot) const { return constraints_[tensor_slot]; }
  int64_t dispatch_slot() const { return dispatch_slot_; }
  const std::string& backward_op() const { return backward_op_; }
  const std::vector<std::string>& differentiable() const { return differentiable_; }
  const std::string& saving_op() const { return saving_op_; }
  const std::vector<std::string>& saved() const { return saved_; }
  const std::vector<std::string>& identity_inputs() const { return identity_inputs_; }
  const std::vector<std::string>& leading_dim_args() const { return leading_dim_args_; }
  const std::vector<std::string>& shape_only_args() const { return shape_only_; }
  const std::vector<std::string>& validated_args() const { return validated_; }
  const std::vector<std::string>& elementwise_args() const { return elementwise_; }
  AutocastPolicy autocast_policy() const { return autocast_; }

  // Slot of schema argument `arg` among the tensors or among the attributes; -1 if absent.
  int64_t tensor_slot(std::string_view arg) const;
  int64_t attr_slot(std::string_view arg) const;
  const std::string& tensor_name(int64_t slot) const;

 private:
  TensorConstraint& constraint_for(std::string_view arg);

  Schema schema_;
  std::string doc_;
  ShapeRule shape_rule_;
  std::vector<TensorConstraint> constraints_;  // one per tensor slot
  std::vector<int64_t> slot_of_arg_;  // schema arg -> tensor or attr slot
  int64_t dispatch_slot_ = 0;
  std::string backward_op_;
  std::vector<std::string> differentiable_;
  std::string saving_op_;
  std::vector<std::string> saved_;
  std::vector<std::string> identity_inputs_;
  std::vector<std::string> leading_dim_args_;
  std::vector<std::string> shape_only_;
  std::vector<std::string> validated_;
  std::vector<std::string> elementwise_;
  AutocastPolicy autocast_ = AutocastPolicy::none;
  int64_t output_mask_slot_ = -1;  // attribute slot of `int output_mask=-1`, or -1
};

template <typename... Args>
[[noreturn]] void ArgAccess::fail(ErrorKind kind, const Args&... args) const {
  opforge::fail(kind, op_.name(), "(): ", args...);
}

}  // namespace opforge
