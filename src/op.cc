// OpDef's builder and the named argument access shared by shape rules and kernels.
#include "opforge/op.h"

#include <algorithm>

namespace opforge {

OpInputs OpInputs::reserved_for(const Schema& schema) {
  OpInputs inputs;
  const auto tensors = static_cast<size_t>(schema.num_tensor_args());
  inputs.tensors.reserve(tensors);
  if (tensors < schema.args.size()) inputs.attrs.reserve(schema.args.size() - tensors);
  return inputs;
}

OpDef::OpDef(std::string_view schema) : schema_(Schema::parse(schema)) {
  int64_t tensors = 0, attrs = 0;
  for (const auto& arg : schema_.args) slot_of_arg_.push_back(arg.is_tensor() ? tensors++ : attrs++);
  constraints_.resize(tensors);
  if (tensors == 0) dispatch_slot_ = -1;
  const int64_t mask = schema_.arg_index("output_mask");
  if (mask >= 0) {
    const ArgSpec& arg = schema_.args[mask];
    const auto* fallback = arg.default_value ? std::get_if<int64_t>(&*arg.default_value) : nullptr;
    if (arg.kind != ArgKind::int_ || !fallback || *fallback != -1)
      fail(ErrorKind::value, name(),
           "(): 'output_mask' must be declared 'int output_mask=-1' (every result by default)");
    output_mask_slot_ = slot_of_arg_[mask];
  }
}

int64_t OpDef::tensor_slot(std::string_view arg) const {
  int64_t i = schema_.arg_index(arg);
  return i >= 0 && schema_.args[i].is_tensor() ? slot_of_arg_[i] : -1;
}

int64_t OpDef::attr_slot(std::string_view arg) const {
  int64_t i = schema_.arg_index(arg);
  return i >= 0 && !schema_.args[i].is_tensor() ? slot_of_arg_[i] : -1;
}

const std::string& OpDef::tensor_name(int64_t slot) const {
  for (size_t i = 0; i < schema_.args.size(); ++i)
    if (schema_.args[i].is_tensor() && slot_of_arg_[i] == slot) return schema_.args[i].name;
  fail(ErrorKind::runtime, name(), "(): no tensor slot ", slot);
}

TensorConstraint& OpDef::constraint_for(std::string_view arg) {
  int64_t slot = tensor_slot(arg);
  // A declaration naming an argument its schema lacks is a bug in the op's own file.
  if (slot < 0) fail(ErrorKind::runtime, name(), "(): declaration names unknown tensor argument '", arg, "'");
  return constraints_[slot];
}

OpDef& OpDef::dtypes(std::string_view arg, std::vector<DType> allowed) {
  constraint_for(arg).dtypes = std::move(allowed);
  return *this;
}

OpDef& OpDef::same_dtype(std::string_view arg, std::string_view as) {
  constraint_for(as);  // validates the name
  constraint_for(arg).same_dtype_as = std::string(as);
  return *this;
}

OpDef& OpDef::rank(std::string_view arg, int64_t min_rank, int64_t max_rank) {
  auto& c = constraint_for(arg);
  c.min_rank = min_rank;
  c.max_rank = max_rank;
  return *this;
}

OpDef& OpDef::shape(ShapeRule rule) {
  shape_rule_ = std::move(rule);
  return *this;
}

OpDef& OpDef::doc(std::string text) {
  doc_ = std::move(text);
  return *this;
}

OpDef& OpDef::dispatch_on(std::string_view arg) {
  constraint_for(arg);
  dispatch_slot_ = tensor_slot(arg);
  return *this;
}

OpDef& OpDef::backward(std::string_view backward_op, std::vector<std::string> inputs) {
  for (const auto& arg : inputs) constraint_for(arg);  // validates the names
  backward_op_ = std::string(backward_op);
  differentiable_ = std::move(inputs);
  return *this;
}

OpDef& OpDef::saving_forward(std::string_view saving_op, std::vector<std::string> saved) {
  if (saved.empty()) fail(ErrorKind::value, name(), "(): saving_forward('", saving_op, "') names no saved results");
  for (const auto& s : saved)
    if (s == "grad" || s == "result" || schema_.arg_index(s) >= 0)
      fail(ErrorKind::value, name(), "(): saved result '", s, "' is named like 'grad', 'result' or an argument");
  saving_op_ = std::string(saving_op);
  saved_ = std::move(saved);
  return *this;
}

OpDef& OpDef::identity_gradient(std::vector<std::string> inputs) {
  for (const auto& arg : inputs) constraint_for(arg);  // validates the names
  if (inputs.empty()) fail(ErrorKind::value, name(), "(): identity_gradient() names no inputs");
  identity_inputs_ = std::move(inputs);
  return *this;
}

OpDef& OpDef::shape_only(std::vector<std::string> args) {
  for (const auto& arg : args) constraint_for(arg);  // validates the names
  shape_only_ = std::move(args);
  return *this;
}

OpDef& OpDef::autocast(AutocastPolicy policy) {
  autocast_ = policy;
  return *this;
}

std::string_view autocast_policy_name(AutocastPolicy policy) {
  switch (policy) {
    case AutocastPolicy::lower_precision: return "lower_precision";
    case AutocastPolicy::fp32: return "fp32";
    case AutocastPolicy::promote: return "promote";
    case AutocastPolicy::none: break;
  }
  return "none";
}

OpDef& OpDef::validates(std::vector<std::string> args) {
  for (const auto& arg : args) constraint_for(arg);
  validated_ = std::move(args);
  return *this;
}

OpDef& OpDef::elementwise(std::vector<std::string> args) {
  for (const auto& arg : args) constraint_for(arg);
  elementwise_ = std::move(args);
  return *this;
}

OpDef& OpDef::maps_over_leading_dims(std::vector<std::string> args) {
  for (const auto& arg : args) constraint_for(arg);
  leading_dim_args_ = std::move(args);
  return *this;
}

const TensorView* ArgAccess::optional_tensor(std::string_view name) const {
  int64_t slot = op_.tensor_slot(name);
  if (slot < 0) fail(ErrorKind::runtime, "no tensor argument '", name, "'");
  const auto& t = inputs_.tensors[slot];
  return t ? &*t : nullptr;
}

const TensorView& ArgAccess::tensor(std::string_view name) const {
  const TensorView* t = optional_tensor(name);
  if (!t) fail(ErrorKind::runtime, "tensor argument '", name, "' is None");
  return *t;
}

const AttrValue& ArgAccess::attr(std::string_view name) const {
  int64_t slot = op_.attr_slot(name);
  if (slot < 0) fail(ErrorKind::runtime, "no attribute '", name, "'");
  return inputs_.attrs[slot];
}

double ArgAccess::attr_float(std::string_view name) const { return std::get<double>(attr(name)); }
int64_t ArgAccess::attr_int(std::string_view name) const { return std::get<int64_t>(attr(name)); }
bool ArgAccess::attr_bool(std::string_view name) const { return std::get<bool>(attr(name)); }
const std::string& ArgAccess::attr_str(std::string_view name) const {
  return std::get<std::string>(attr(name));
}

void ShapeContext::expect_shape(std::string_view arg, const Dims& expected) const {
  const auto& got = tensor(arg).shape;
  if (got != expected) fail(ErrorKind::value, "'", arg, "' must have shape ", expected, ", got ", got);
}

Dims ShapeContext::broadcast(std::string_view a, std::string_view b) const {
  const auto& sa = tensor(a).shape;
  const auto& sb = tensor(b).shape;
  Dims out(std::max(sa.size(), sb.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    int64_t da = i < sa.size() ? sa[sa.size() - 1 - i] : 1;
    int64_t db = i < sb.size() ? sb[sb.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1)
      fail(ErrorKind::value, "'", a, "' of shape ", sa, " and '", b, "' of shape ", sb,
           " cannot be broadcast together");
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

OutputSpec ShapeContext::like(std::string_view arg) const {
  const auto& t = tensor(arg);
  return {t.dtype, t.shape};
}

}  // namespace opforge
