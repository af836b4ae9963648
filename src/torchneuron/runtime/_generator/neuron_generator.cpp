// The neuron device's generators and PrivateUse1 hooks, as a tiny shared library.
//
// The library has no Python bindings of its own: torchneuron loads it with ctypes and calls
// the three `extern "C"` functions at the bottom. Everything else of the backend stays in
// Python. Building it is optional (runtime/_generator/__init__.py); without it the package
// runs on the pure-Python generator in runtime/rng.py.
//
// Why C++ at all: torch.Generator(device="neuron") asks the registered PrivateUse1 hooks for
// getNewGenerator, and ATen asks them for getDefaultGenerator; Python subclasses of
// torch._C._acc.PrivateUse1Hooks cannot provide either. NeuronHooks answers every query the
// Python hooks answered (isBuilt, isAvailable, hasPrimaryContext: all true) plus those two.
//
// Generator state is exactly what runtime/rng.py keeps: a 64-bit seed and a 64-bit count of
// draws (the offset). get_state() is 16 bytes, seed then offset, each a native-endian
// uint64, so states move freely between torch.neuron.get_rng_state() and any neuron
// Generator. The random numbers themselves are made by JAX from (seed, offset).

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Generator.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>

namespace torchneuron {
namespace {

constexpr uint64_t kDefaultSeed = 67280421310721ULL;  // c10::default_rng_seed_val
constexpr int64_t kStateBytes = 16;
constexpr int kMaxDevices = 64;

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  if (index >= 0) {
    return index;
  }
  if (c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
  }
  return 0;
}

struct NeuronGeneratorImpl final : public c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex index)
      : c10::GeneratorImpl(
            c10::Device(c10::DeviceType::PrivateUse1, index),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    uint64_t fresh = c10::detail::getNonDeterministicRandom();
    set_current_seed(fresh);
    return fresh;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu(
        {kStateBytes}, c10::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
        std::nullopt);
    auto* bytes = static_cast<uint8_t*>(state.data_ptr());
    std::memcpy(bytes, &seed_, 8);
    std::memcpy(bytes + 8, &offset_, 8);
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK(
        new_state.device().is_cpu() && new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
            new_state.numel() == kStateBytes && new_state.is_contiguous(),
        "neuron RNG state must be a contiguous CPU uint8 tensor of ", kStateBytes,
        " bytes (seed, offset)");
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    std::memcpy(&seed_, bytes, 8);
    std::memcpy(&offset_, bytes + 8, 8);
  }

 private:
  NeuronGeneratorImpl* clone_impl() const override {
    auto* copy = new NeuronGeneratorImpl(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }

  uint64_t seed_ = kDefaultSeed;
  uint64_t offset_ = 0;
};

// One default generator per device, created on first use and kept for the process lifetime
// (ATen hands out references to them), with the Python object that wraps each.
struct Defaults {
  std::mutex mutex;
  std::array<at::Generator, kMaxDevices> generators;
  std::array<PyObject*, kMaxDevices> wrappers{};
};

Defaults& defaults() {
  static auto* table = new Defaults();  // never destroyed: outlives every user at exit
  return *table;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = resolve(index);
  TORCH_CHECK(
      index >= 0 && index < kMaxDevices, "Invalid device ordinal neuron:", static_cast<int>(index));
  auto& table = defaults();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto& slot = table.generators[index];
  if (!slot.defined()) {
    slot = at::make_generator<NeuronGeneratorImpl>(index);
  }
  return slot;
}

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return true;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return at::make_generator<NeuronGeneratorImpl>(resolve(device_index));
  }
};

}  // namespace
}  // namespace torchneuron

extern "C" {

// Lets the loader refuse a library built from other sources.
int torchneuron_generator_abi_version() {
  return 2;
}

// Registers NeuronHooks unless some hooks are registered already (PyTorch takes one set per
// process). 1: registered now; 0: others were there first; -1: error.
int torchneuron_register_hooks() {
  try {
    if (at::isPrivateUse1HooksRegistered()) {
      return 0;
    }
    static auto* hooks = new torchneuron::NeuronHooks();
    at::RegisterPrivateUse1HooksInterface(hooks);
    return 1;
  } catch (const std::exception&) {
    return -1;
  }
}

// The torch.Generator wrapping the default generator of `index` (called with the GIL held,
// through ctypes.PyDLL; the reference is borrowed: the wrapper lives as long as the process).
PyObject* torchneuron_default_generator(int index) {
  try {
    const auto& gen = torchneuron::default_generator(static_cast<c10::DeviceIndex>(index));
    auto& table = torchneuron::defaults();
    auto slot = static_cast<size_t>(gen.device().index());
    std::lock_guard<std::mutex> lock(table.mutex);
    if (table.wrappers[slot] == nullptr) {
      table.wrappers[slot] = THPGenerator_initDefaultGenerator(gen);
    }
    return table.wrappers[slot];
  } catch (const c10::Error& err) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, err.what_without_backtrace());
    }
    return nullptr;
  } catch (const std::exception& err) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError, err.what());
    }
    return nullptr;
  }
}

}  // extern "C"
