// The neuron device's generators, PrivateUse1 hooks, device guard and allocators: one half of
// the runtime's optional C++ library (fastpath.cpp is the other).
//
// torchneuron loads the library with ctypes and calls the `extern "C"` functions at the
// bottom. Building it is optional (runtime/_native/__init__.py); without it the package runs
// on the pure-Python generator in runtime/rng.py.
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

#include <Python.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>

#include <array>
#include <atomic>
#include <string>
#include <unordered_set>
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

// Storages that PyTorch allocates itself (e.g. torch.UntypedStorage(n, device="neuron")) get a
// synthetic address from a range of their own, like the Python runtime's: no host memory is
// ever behind it; the data lives in the storage's Python payload.
struct NeuronAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    static std::atomic<uint64_t> next{uint64_t{1} << 52};
    constexpr uint64_t align = 4096;
    uint64_t span = (static_cast<uint64_t>(nbytes) + align - 1) / align * align;
    void* address = nbytes ? reinterpret_cast<void*>(next.fetch_add(span)) : nullptr;
    return {address, address, &release, c10::Device(c10::DeviceType::PrivateUse1, 0)};
  }
  static void release(void* /*ptr*/) {}
  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }
  void copy_data(void* /*dest*/, const void* /*src*/, std::size_t /*count*/) const override {
    TORCH_CHECK(false, "neuron storages hold no host memory to copy");
  }
};

// "Pinned" host memory: ordinary CPU allocations, remembered so that is_pinned() answers true
// for them (DDP's reducer checks that its pinned staging buffers really are pinned).
struct PinnedHostAllocator final : public c10::Allocator {
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::unordered_set<const void*>& live() {
    static std::unordered_set<const void*> pointers;
    return pointers;
  }
  static void release(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      live().erase(ptr);
    }
    c10::free_cpu(ptr);
  }
  static bool owns(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex());
    return live().count(ptr) != 0;
  }
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = c10::alloc_cpu(nbytes == 0 ? 1 : nbytes);
    {
      std::lock_guard<std::mutex> lock(mutex());
      live().insert(ptr);
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedHostAllocator& pinned_allocator() {
  static PinnedHostAllocator instance;
  return instance;
}

NeuronAllocator& allocator() {
  static NeuronAllocator instance;
  return instance;
}

// Calls torchneuron.runtime.storage.<function>(storage, *int args) with the GIL held.
void call_python_storage(const char* function, const c10::Storage& storage, int64_t arg) {
  PyGILState_STATE state = PyGILState_Ensure();
  PyObject* module = PyImport_ImportModule("torchneuron.runtime.storage");
  PyObject* py_storage = module ? THPStorage_Wrap(storage) : nullptr;
  PyObject* result = py_storage
      ? PyObject_CallMethod(module, function, "OL", py_storage, static_cast<long long>(arg))
      : nullptr;
  std::string message;
  if (result == nullptr) {
    PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
    PyErr_Fetch(&type, &value, &trace);
    PyObject* text = value ? PyObject_Str(value) : nullptr;
    message = text ? PyUnicode_AsUTF8(text) : "unknown error";
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(trace);
  }
  bool failed = result == nullptr;
  Py_XDECREF(result);
  Py_XDECREF(py_storage);
  Py_XDECREF(module);
  PyGILState_Release(state);
  TORCH_CHECK(!failed, "torchneuron: storage.", function, " failed: ", message);
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
  // Host memory is host memory here: "pinned" buffers (DDP, DataLoader pin_memory) are plain
  // CPU allocations that the hooks recognise as pinned.
  bool isPinnedPtr(const void* data) const override {
    return PinnedHostAllocator::owns(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &pinned_allocator();
  }
  // Storage.resize_ (FSDP2 frees and re-allocates parameter storages this way): a new
  // synthetic address, and the Python payload resized to match (prefix kept).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(allocator().allocate(newsize));
    impl->set_nbytes(newsize);
    call_python_storage("resize_payload", storage, static_cast<int64_t>(newsize));
  }
};

// The device guard: what the Python guard offered (one device, the default stream) plus
// synchronizeDevice, which torch.accelerator.synchronize() needs and the Python guard lacks.
// It waits through torchneuron.runtime.storage.wait_for_pending (the GIL is taken here).
struct NeuronGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return c10::DeviceType::PrivateUse1;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    return c10::Device(c10::DeviceType::PrivateUse1, 0);
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::PrivateUse1, 0);
  }
  void setDevice(c10::Device /*device*/) const override {}
  void uncheckedSetDevice(c10::Device /*device*/) const noexcept override {}
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream getNewStream(c10::Device /*device*/, int /*priority*/) const override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::Stream exchangeStream(c10::Stream /*stream*/) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, getDevice());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return 1;
  }
  void record(void** /*event*/, const c10::Stream& /*stream*/,
              const c10::DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override {
    return true;
  }
  void destroyEvent(void* /*event*/, const c10::DeviceIndex /*device_index*/)
      const noexcept override {}
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    synchronizeDevice(stream.device_index());
  }
  void synchronizeDevice(const c10::DeviceIndex /*device_index*/) const override {
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject* module = PyImport_ImportModule("torchneuron.runtime.storage");
    PyObject* result = module ? PyObject_CallMethod(module, "wait_for_pending", nullptr) : nullptr;
    bool failed = result == nullptr;
    std::string message;
    if (failed) {
      PyObject *type = nullptr, *value = nullptr, *trace = nullptr;
      PyErr_Fetch(&type, &value, &trace);
      PyObject* text = value ? PyObject_Str(value) : nullptr;
      message = text ? PyUnicode_AsUTF8(text) : "unknown error";
      Py_XDECREF(text);
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(trace);
    }
    Py_XDECREF(result);
    Py_XDECREF(module);
    PyGILState_Release(state);
    TORCH_CHECK(!failed, "neuron synchronize failed: ", message);
  }
};

}  // namespace
}  // namespace torchneuron

extern "C" {

// Lets the loader refuse a library built from other sources.
int torchneuron_generator_abi_version() {
  return 8;
}

}  // extern "C"

// The allocator of neuron storages, for fastpath.cpp's output tensors.
c10::Allocator* torchneuron_device_allocator() {
  return &torchneuron::allocator();
}

extern "C" {

// Registers NeuronHooks unless some hooks are registered already (PyTorch takes one set per
// process). 1: registered now; 0: others were there first; -1: error.
int torchneuron_register_hooks() {
  try {
    if (at::isPrivateUse1HooksRegistered()) {
      return 0;
    }
    static auto* hooks = new torchneuron::NeuronHooks();
    at::RegisterPrivateUse1HooksInterface(hooks);
    // The device guard and allocator come with the hooks; the Python guard registered later
    // by PyTorch's helper then finds one in place and is skipped.
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
      static torchneuron::NeuronGuard guard;
      c10::impl::registerDeviceGuard(c10::DeviceType::PrivateUse1, &guard);
    }
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &torchneuron::allocator());
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
