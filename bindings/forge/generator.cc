#include "generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GeneratorImpl.h>

#include <deque>
#include <mutex>

#include "runtime.h"

namespace opforge::forge {

namespace {

class ForgeGenerator final : public c10::GeneratorImpl {
 public:
  ForgeGenerator(int device, at::Generator cpu)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  // Every state change goes to the inner CPU generator, under its own lock (the CPU kernels
  // take that lock while drawing).
  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override { return cpu_.get_offset(); }
  uint64_t current_seed() const override { return cpu_.current_seed(); }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override { return cpu_.unsafeGetGeneratorImpl()->get_state(); }
  const at::Generator& cpu() const { return cpu_; }

 private:
  ForgeGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return new ForgeGenerator(device().index(), cpu_.clone());
  }
  mutable at::Generator cpu_;  // mutable: locking its mutex in const members
};

// Default seeds differ per device (as CUDA's do not need to, but it keeps devices independent
// before anyone seeds them); torch.manual_seed reseeds them all through torch.forge.
at::Generator fresh(int device) {
  return at::make_generator<ForgeGenerator>(device, at::make_generator<at::CPUGeneratorImpl>(
                                                        c10::detail::getNonDeterministicRandom()));
}

}  // namespace

const at::Generator& default_generator(int device) {
  check_device(device, "default_generator");
  static std::mutex mutex;
  static auto* generators = new std::deque<at::Generator>();
  std::lock_guard<std::mutex> lock(mutex);
  while (static_cast<int>(generators->size()) < device_count()) generators->push_back(fresh(static_cast<int>(generators->size())));
  return (*generators)[device];
}

at::Generator make_generator(int device) {
  check_device(device, "Generator");
  return fresh(device);
}

at::Generator cpu_generator_for(const std::optional<at::Generator>& gen, int device) {
  const at::Generator& g = gen.has_value() && gen->defined() ? *gen : default_generator(device);
  TORCH_CHECK_TYPE(g.device().is_privateuseone(), "forge random op: expected a forge generator, got a ",
                   g.device().type(), " generator");
  return static_cast<ForgeGenerator*>(g.unsafeGetGeneratorImpl())->cpu();
}

}  // namespace opforge::forge
