// The aten kernels forge implements itself: tensor creation and metadata (no data touched),
// copies (ordered on forge streams, opening the blocks they touch), random numbers (from forge's
// generators), and a boxed fallback that runs every other aten op on the CPU.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/strides.h>
#include <torch/library.h>

#include "generator.h"
#include "runtime.h"

namespace opforge::forge {

namespace {

at::Tensor cpu_alias(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

void check_forge_args(c10::Device device, std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(device.is_privateuseone(), "forge: empty() called for a ", device.type(), " device");
  TORCH_CHECK_NOT_IMPLEMENTED(c10::layout_or_default(layout) == c10::Layout::Strided,
                              "forge supports strided tensors only, got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "forge: pin_memory applies to CPU tensors only");
}

constexpr c10::DispatchKeySet kForgeKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const c10::Device d = c10::device_or_default(device);
  check_forge_args(d, layout, pin_memory);
  const c10::DeviceGuard guard(d);  // validates the index; the allocator allocates on the current device
  return at::detail::empty_generic(size, &allocator(), kForgeKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const c10::Device d = c10::device_or_default(device);
  check_forge_args(d, layout, pin_memory);
  const c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, &allocator(), kForgeKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// Grows `storage` to `bytes`, keeping its contents. Queued work may still write the old block,
// so the device's current stream is drained first.
void grow_storage(const c10::Storage& storage, size_t bytes) {
  const int device = storage.device().index();
  if (storage.nbytes() > 0) current_stream(device).synchronize();
  const c10::DeviceGuard guard(storage.device());
  c10::DataPtr fresh = allocator().allocate(bytes);
  if (storage.nbytes() > 0) allocator().copy_data(fresh.get(), storage.data(), std::min(bytes, storage.nbytes()));
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
  storage.unsafeGetStorageImpl()->set_nbytes(bytes);
}

// Not at::native::resize_: its CPU storage growth copies with memcpy, which would touch
// protected memory from the host.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> format) {
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (format.has_value() && *format != at::MemoryFormat::Preserve) impl->empty_tensor_restride(*format);
  if (impl->numel() == 0) return self;
  const size_t needed =
      at::detail::computeStorageNbytes(size, impl->strides(), self.dtype().itemsize(), impl->storage_offset());
  const c10::Storage& storage = impl->unsafe_storage();
  TORCH_CHECK(storage, "forge: resize_ of a tensor without storage");
  if (needed > storage.nbytes()) {
    TORCH_CHECK(storage.resizable(), "forge: trying to resize a storage that is not resizable");
    grow_storage(storage, needed);
  }
  return self;
}

// Copies run on a forge stream, so they are ordered with the kernels around them: on the
// destination's current stream when it is forge, else on the source's. Copies into CPU memory
// wait unless non_blocking; copies from the CPU wait unless non_blocking too, since the caller may
// reuse its CPU buffer as soon as copy_ returns (CUDA's rule for pageable memory).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.numel() == 0) return dst;
  const bool src_forge = self.is_privateuseone(), dst_forge = dst.is_privateuseone();
  TORCH_CHECK((src_forge || self.is_cpu()) && (dst_forge || dst.is_cpu()), "forge: cannot copy from ", self.device(),
              " to ", dst.device(), "; forge copies to and from forge and CPU tensors");
  Stream& on = current_stream(dst_forge ? dst.device().index() : self.device().index());
  if (src_forge && dst_forge && self.device() != dst.device()) {
    // Between forge devices: the destination's stream first waits for the source's work.
    Event ready;
    record(ready, current_stream(self.device().index()));
    block(ready, on);
  }
  on.enqueue([self, dst] {
    HostAccess access{&self, &dst};
    at::Tensor to = dst.is_cpu() ? dst : cpu_alias(dst);
    at::native::copy_(to, self.is_cpu() ? self : cpu_alias(self), false);
  });
  if (!non_blocking && !(src_forge && dst_forge)) on.synchronize();
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  current_stream(self.device().index()).synchronize();
  HostAccess access{&self};
  return at::native::_local_scalar_dense_cpu(cpu_alias(self));
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  // An empty stride means contiguous (set_.source_Storage passes none).
  const c10::DimVector strides = stride.empty() ? c10::contiguous_strides(size) : c10::DimVector(stride);
  // Growth through resize_impl_cpu_ would memcpy from the host; size the storage here first.
  const size_t needed = c10::multiply_integers(size) == 0
                            ? 0
                            : at::detail::computeStorageNbytes(size, strides, self.dtype().itemsize(), offset);
  if (needed > source.nbytes()) grow_storage(source, needed);
  return at::native::set_storage_cpu_(self, std::move(source), offset, size, strides);  // never an empty, non-null stride
}
at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, std::move(source)); }
at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

// ---- random numbers ----------------------------------------------------------------------

// Draws on the CPU with the forge generator's engine, then copies into self: seeded forge
// randomness is reproducible and independent of the CPU generator's stream.
template <typename Fill>
at::Tensor& random_fill(at::Tensor& self, const std::optional<at::Generator>& gen, Fill fill) {
  at::Generator cpu_gen = cpu_generator_for(gen, self.device().index());
  at::Tensor tmp = at::empty(self.sizes(), self.options().device(at::kCPU));
  fill(tmp, cpu_gen);
  copy_from(tmp, self, false);
  return self;
}

at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  return random_fill(self, gen, [&](at::Tensor& t, at::Generator& g) { t.normal_(mean, std, g); });
}
at::Tensor& uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  return random_fill(self, gen, [&](at::Tensor& t, at::Generator& g) { t.uniform_(from, to, g); });
}
at::Tensor& random_(at::Tensor& self, std::optional<at::Generator> gen) {
  return random_fill(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(g); });
}
at::Tensor& random_from_(at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  return random_fill(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(from, to, g); });
}
at::Tensor& random_to_(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_fill(self, gen, [&](at::Tensor& t, at::Generator& g) { t.random_(to, g); });
}
at::Tensor& bernoulli_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  return random_fill(self, gen, [&](at::Tensor& t, at::Generator& g) { t.bernoulli_(p, g); });
}
at::Tensor& exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  return random_fill(self, gen, [&](at::Tensor& t, at::Generator& g) { t.exponential_(lambd, g); });
}

// ---- fallback ----------------------------------------------------------------------------

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.schema().operator_name();
  std::string full = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  TORCH_CHECK_NOT_IMPLEMENTED(fallback_mode() != FallbackMode::error, "forge: '", full,
                              "' has no forge kernel, and falling back to the CPU is disabled "
                              "(torch.forge.set_fallback('allow') enables it)");
  note_fallback(full);
  at::native::cpu_fallback(op, stack);
}

}  // namespace

void resize_storage_bytes(const c10::Storage& storage, size_t bytes) { grow_storage(storage, bytes); }

}  // namespace opforge::forge

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace opforge::forge;
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("normal_", TORCH_FN(normal_));
  m.impl("uniform_", TORCH_FN(uniform_));
  m.impl("random_", TORCH_FN(random_));
  m.impl("random_.from", TORCH_FN(random_from_));
  m.impl("random_.to", TORCH_FN(random_to_));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_));
  m.impl("exponential_", TORCH_FN(exponential_));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&opforge::forge::fallback>());
}
