// PyTorch's own CPU kernels as XLA FFI handlers, for programs on XLA's CPU client.
//
// XLA's CPU convolutions are 2-5x slower than PyTorch's (oneDNN) at the sizes of small CNNs
// (docs/BENCHMARKS.md). On the CPU platform the convolution lowerings call these handlers as
// custom calls instead (lowerings/host_kernels.py): each wraps the program's buffers as CPU
// tensors, runs ATen's kernel and copies the result into XLA's output buffer. The results are
// then CPU's own. Python registers the handlers with JAX (runtime/device.py); without this
// library the lowerings keep their lax form.
//
// A handler runs on whichever thread XLA executes the program: one of XLA's workers, or the
// Python thread for a synchronous launch. It must not see that thread's PyTorch state (a
// Python dispatch mode, autocast, autograd), so it runs under a fixed dispatch key set.
//
// ATen's kernel runs with one OpenMP thread less than PyTorch's setting: the XLA worker
// running the handler, XLA's other workers and the Python thread recording the next program
// all want a core, and a full OpenMP team oversubscribes them (compiled CNN step of
// benchmarks/compile_bench.py on 2 cores: 13.1-14.3 ms with the full team, 11.2-12.1 ms with
// one thread less, 14.1-15.8 ms with XLA's own convolutions).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// OpenMP's per-thread team size, from the OpenMP runtime PyTorch loaded; weak, so a PyTorch
// built without OpenMP leaves them null (and the kernel's threads as PyTorch sets them).
extern "C" void omp_set_num_threads(int) __attribute__((weak));
extern "C" int omp_get_max_threads() __attribute__((weak));

namespace {

at::ScalarType scalar_type(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return at::kFloat;
    case ffi::DataType::F64: return at::kDouble;
    default: throw std::invalid_argument("torchneuron host kernel: unsupported element type");
  }
}

at::Tensor as_tensor(const ffi::AnyBuffer& buffer) {
  auto dims = buffer.dimensions();
  std::vector<int64_t> sizes(dims.begin(), dims.end());
  return at::from_blob(buffer.untyped_data(), sizes,
                       at::TensorOptions().dtype(scalar_type(buffer.element_type())));
}

std::vector<int64_t> as_vector(ffi::Span<const int64_t> values) {
  return {values.begin(), values.end()};
}

// The dispatch state of a fresh thread, less autograd and the Python keys: ATen's CPU kernel
// and nothing the calling thread set up.
struct PlainCpuDispatch {
  c10::impl::ForceDispatchKeyGuard keys{
      c10::default_included_set,
      c10::default_excluded_set | c10::autograd_dispatch_keyset_with_ADInplaceOrView |
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                               c10::DispatchKey::PreDispatch,
                               c10::DispatchKey::Functionalize})};
};

// One OpenMP thread less than PyTorch's setting (at least one) for this thread, while alive.
class TeamOneSmaller {
 public:
  TeamOneSmaller() {
    if (omp_set_num_threads == nullptr || omp_get_max_threads == nullptr) return;
    at::internal::lazy_init_num_threads();  // else ATen's first parallel loop here resets it
    saved_ = omp_get_max_threads();
    omp_set_num_threads(std::max(1, at::get_num_threads() - 1));
  }
  ~TeamOneSmaller() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }

 private:
  int saved_ = 0;
};

template <typename Body>
ffi::Error guarded(Body&& body) {
  try {
    PlainCpuDispatch plain;
    TeamOneSmaller team;
    body();
    return ffi::Error::Success();
  } catch (const std::exception& err) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("torchneuron host kernel: ") + err.what());
  }
}

// aten::convolution(input, weight, bias?) -> output; the arguments are input, weight[, bias].
ffi::Error convolution(ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> output,
                       ffi::Span<const int64_t> stride, ffi::Span<const int64_t> padding,
                       ffi::Span<const int64_t> dilation, bool transposed,
                       ffi::Span<const int64_t> output_padding, int64_t groups) {
  return guarded([&] {
    if (args.size() < 2 || args.size() > 3) throw std::invalid_argument("convolution takes 2 or 3 buffers");
    std::optional<at::Tensor> bias;
    if (args.size() == 3) bias = as_tensor(args.get<ffi::AnyBuffer>(2).value());
    auto result = at::convolution(as_tensor(args.get<ffi::AnyBuffer>(0).value()),
                                  as_tensor(args.get<ffi::AnyBuffer>(1).value()), bias,
                                  as_vector(stride), as_vector(padding), as_vector(dilation),
                                  transposed, as_vector(output_padding), groups);
    as_tensor(*output).copy_(result);
  });
}

// aten::convolution_backward: the gradients the mask asks for (input, weight, bias), in order.
ffi::Error convolution_backward(ffi::AnyBuffer grad_output, ffi::AnyBuffer input,
                                ffi::AnyBuffer weight, ffi::RemainingRets grads,
                                ffi::Span<const int64_t> stride, ffi::Span<const int64_t> padding,
                                ffi::Span<const int64_t> dilation, bool transposed,
                                ffi::Span<const int64_t> output_padding, int64_t groups,
                                bool grad_input, bool grad_weight, bool grad_bias) {
  return guarded([&] {
    auto g = as_tensor(grad_output);
    std::vector<int64_t> bias_size{g.size(1)};
    at::OptionalIntArrayRef bias_sizes;
    if (grad_bias) bias_sizes = bias_size;
    auto results = at::convolution_backward(
        g, as_tensor(input), as_tensor(weight), bias_sizes, as_vector(stride), as_vector(padding),
        as_vector(dilation), transposed, as_vector(output_padding), groups,
        {grad_input, grad_weight, grad_bias});
    size_t next = 0;
    auto write = [&](bool wanted, const at::Tensor& value) {
      if (!wanted) return;
      auto target = grads.get<ffi::AnyBuffer>(next++);
      if (!target.has_value()) throw std::invalid_argument("convolution_backward: too few results");
      as_tensor(**target).copy_(value);
    };
    write(grad_input, std::get<0>(results));
    write(grad_weight, std::get<1>(results));
    write(grad_bias, std::get<2>(results));
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    torchneuron_host_convolution, convolution,
    ffi::Ffi::Bind()
        .RemainingArgs()
        .Ret<ffi::AnyBuffer>()
        .Attr<ffi::Span<const int64_t>>("stride")
        .Attr<ffi::Span<const int64_t>>("padding")
        .Attr<ffi::Span<const int64_t>>("dilation")
        .Attr<bool>("transposed")
        .Attr<ffi::Span<const int64_t>>("output_padding")
        .Attr<int64_t>("groups"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    torchneuron_host_convolution_backward, convolution_backward,
    ffi::Ffi::Bind()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .Arg<ffi::AnyBuffer>()
        .RemainingRets()
        .Attr<ffi::Span<const int64_t>>("stride")
        .Attr<ffi::Span<const int64_t>>("padding")
        .Attr<ffi::Span<const int64_t>>("dilation")
        .Attr<bool>("transposed")
        .Attr<ffi::Span<const int64_t>>("output_padding")
        .Attr<int64_t>("groups")
        .Attr<bool>("grad_input")
        .Attr<bool>("grad_weight")
        .Attr<bool>("grad_bias"));
