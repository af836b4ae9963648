// The eager hot path in C++: the PrivateUse1 kernel of every ATen op on a neuron tensor.
//
// Python (runtime/dispatch.py) decides how each op runs and builds one JAX executable per op
// and argument signature. This kernel repeats the cheap part of that work for the calls it
// has seen before, without entering Python code:
//
//   - view ops run the CPU kernel (metadata over the same storage), as dispatch.py does;
//   - lowered ops whose signature (dtypes, sizes, strides, static arguments, scalar types)
//     has an executable call it directly with the storages' buffers, create the output
//     tensors here and write in-place results back into the storages' payloads.
//
// Everything else, and every first call of a signature, goes to `dispatch_op` in Python,
// with the arguments converted as PyTorch's own Python fallback converts them. After such a
// call Python hands over the executable it used (fastpath.take_last), and the kernel keeps it
// for the signature. Whatever this file cannot describe exactly (lazy conj/neg bits, tensor
// lists, random ops, data-dependent output shapes, a profiler running) takes the Python path,
// so behaviour never depends on this library being built.

#include <Python.h>
#include <structmember.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstring>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace torch::jit {
// Exported by libtorch_python (declared in pybind_utils.h, which is slow to compile).
pybind11::object toPyObject(c10::IValue ivalue);
c10::IValue toIValue(pybind11::handle obj, const c10::TypePtr& type, std::optional<int32_t> N);
}  // namespace torch::jit

c10::Allocator* torchneuron_device_allocator();  // neuron_generator.cpp

namespace torchneuron::fast {
namespace {

// ------------------------------------------------------------------------------------------
// Payload: the device data of one storage (runtime/storage.py documents it). A small C type so
// that neither its creation nor its release runs Python code; memory statistics live here.

struct Stats {
  int64_t allocated = 0;
  int64_t peak = 0;
  int64_t num_alloc = 0;
  int64_t num_free = 0;
};
Stats stats;  // mutated with the GIL held

struct PayloadObject {
  PyObject_HEAD
  PyObject* buf;    // a flat jax.Array in `dtype`, or None (never written: reads as zeros)
  PyObject* dtype;  // a torch.dtype
  int64_t nbytes;
  PyObject* weakrefs;
};

void account(int64_t delta) {
  stats.allocated += delta;
  if (stats.allocated > stats.peak) {
    stats.peak = stats.allocated;
  }
}

PyObject* make_payload(PyTypeObject* type, int64_t nbytes, PyObject* dtype, PyObject* buf) {
  auto* self = reinterpret_cast<PayloadObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->buf = Py_NewRef(buf);
  self->dtype = Py_NewRef(dtype);
  self->nbytes = nbytes;
  self->weakrefs = nullptr;
  stats.num_alloc += 1;
  account(nbytes);
  return reinterpret_cast<PyObject*>(self);
}

PyObject* payload_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"nbytes", "dtype", "buf", nullptr};
  long long nbytes = 0;
  PyObject* dtype = nullptr;
  PyObject* buf = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LO|O", const_cast<char**>(names), &nbytes,
                                   &dtype, &buf)) {
    return nullptr;
  }
  return make_payload(type, nbytes, dtype, buf);
}

void payload_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<PayloadObject*>(obj);
  if (self->weakrefs != nullptr) {
    PyObject_ClearWeakRefs(obj);
  }
  stats.num_free += 1;
  account(-self->nbytes);
  Py_CLEAR(self->buf);
  Py_CLEAR(self->dtype);
  Py_TYPE(obj)->tp_free(obj);
}

PyObject* payload_resize(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<PayloadObject*>(obj);
  long long nbytes = PyLong_AsLongLong(arg);
  if (nbytes == -1 && PyErr_Occurred()) {
    return nullptr;
  }
  account(nbytes - self->nbytes);
  self->nbytes = nbytes;
  Py_RETURN_NONE;
}

PyMemberDef payload_members[] = {
    {"buf", T_OBJECT_EX, offsetof(PayloadObject, buf), 0, "flat jax.Array, or None"},
    {"dtype", T_OBJECT_EX, offsetof(PayloadObject, dtype), 0, "element dtype of buf"},
    {"nbytes", T_LONGLONG, offsetof(PayloadObject, nbytes), READONLY, "storage size"},
    {nullptr, 0, 0, 0, nullptr},
};

PyMethodDef payload_methods[] = {
    {"set_nbytes", payload_resize, METH_O, "Change the size (storage resize_), kept in the stats."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject PayloadType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* payload_type() {
  static bool ready = false;
  if (!ready) {
    PayloadType.tp_name = "torchneuron.runtime.storage.Payload";
    PayloadType.tp_basicsize = sizeof(PayloadObject);
    PayloadType.tp_flags = Py_TPFLAGS_DEFAULT;
    PayloadType.tp_doc = "The device data of one neuron storage (C implementation).";
    PayloadType.tp_new = payload_new;
    PayloadType.tp_dealloc = payload_dealloc;
    PayloadType.tp_members = payload_members;
    PayloadType.tp_methods = payload_methods;
    PayloadType.tp_weaklistoffset = offsetof(PayloadObject, weakrefs);
    if (PyType_Ready(&PayloadType) < 0) {
      return nullptr;
    }
    ready = true;
  }
  return reinterpret_cast<PyObject*>(&PayloadType);
}

// ------------------------------------------------------------------------------------------
// Pending values and the recorded trace (adaptive eager: runtime/fusion.py)
//
// With fusion on, an op call is recorded instead of run: its executable and inputs join the
// trace, and each result becomes a Pending value (which storages hold as their payload's buf)
// until the trace runs as one program. Inputs are either external (buffers, scalars, offsets)
// or results of earlier nodes of the same trace.

struct PendingObject {
  PyObject_HEAD
  int64_t generation;  // the trace it belongs to
  int32_t value;       // its result index in that trace
};

PyTypeObject PendingType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* pending_repr(PyObject* obj) {
  auto* self = reinterpret_cast<PendingObject*>(obj);
  return PyUnicode_FromFormat("<pending value %d of trace %lld>", static_cast<int>(self->value),
                              static_cast<long long>(self->generation));
}

PyObject* pending_type() {
  static bool ready = false;
  if (!ready) {
    PendingType.tp_name = "torchneuron.runtime.fusion.Pending";
    PendingType.tp_basicsize = sizeof(PendingObject);
    PendingType.tp_flags = Py_TPFLAGS_DEFAULT;
    PendingType.tp_doc = "A value of a recorded trace that has not run yet.";
    PendingType.tp_repr = pending_repr;
    if (PyType_Ready(&PendingType) < 0) {
      return nullptr;
    }
    ready = true;
  }
  return reinterpret_cast<PyObject*>(&PendingType);
}

struct TraceNode {
  PyObject* fn;               // the op's executable (jax.jit)
  std::vector<int32_t> refs;  // per input: >= 0 an external, < 0 the result -(ref + 1)
  int32_t n_results;
  PyObject* site;             // None, or what a failed index check raises with
};

struct Assigned {
  int32_t value;
  PyObject* weak_payload;  // a weak reference to the payload whose buf is `pending`
  PyObject* pending;
};

struct Trace {
  int64_t generation = 1;
  std::vector<TraceNode> nodes;
  std::vector<PyObject*> externals;
  std::unordered_map<PyObject*, int32_t> external_index;  // arrays only
  int32_t n_values = 0;
  std::vector<Assigned> assigned;
};

Trace trace;
bool fusion = false;
size_t fusion_cap = 512;
PyObject* flush_callback = nullptr;  // runtime.fusion.flush

bool is_current_pending(PyObject* obj) {
  return Py_TYPE(obj) == &PendingType &&
         reinterpret_cast<PendingObject*>(obj)->generation == trace.generation;
}

PyObject* new_pending(int32_t value) {
  auto* p = PyObject_New(PendingObject, &PendingType);
  if (p == nullptr) {
    return nullptr;
  }
  p->generation = trace.generation;
  p->value = value;
  return reinterpret_cast<PyObject*>(p);
}

// Adds a node; returns the index of its first result (or -1 with a Python error set).
int32_t record_node(PyObject* fn, PyObject* const* inputs, size_t n_inputs, int32_t n_results,
                    PyObject* site) {
  TraceNode node;
  node.refs.reserve(n_inputs);
  for (size_t i = 0; i < n_inputs; ++i) {
    PyObject* v = inputs[i];
    if (Py_TYPE(v) == &PendingType) {
      if (!is_current_pending(v)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "torchneuron: a value of an earlier trace was never computed "
                        "(an error in that trace's program was raised before)");
        return -1;
      }
      node.refs.push_back(-(reinterpret_cast<PendingObject*>(v)->value + 1));
      continue;
    }
    bool scalar = PyLong_Check(v) || PyFloat_Check(v) || PyComplex_Check(v);
    if (!scalar) {
      auto found = trace.external_index.find(v);
      if (found != trace.external_index.end()) {
        node.refs.push_back(found->second);
        continue;
      }
    }
    auto index = static_cast<int32_t>(trace.externals.size());
    Py_INCREF(v);
    trace.externals.push_back(v);
    if (!scalar) {
      trace.external_index.emplace(v, index);
    }
    node.refs.push_back(index);
  }
  Py_INCREF(fn);
  Py_INCREF(site);
  node.fn = fn;
  node.n_results = n_results;
  node.site = site;
  int32_t first = trace.n_values;
  trace.n_values += n_results;
  trace.nodes.push_back(std::move(node));
  return first;
}

// payload.buf := pending, remembered so that the trace's program returns that value.
bool assign(PyObject* payload, PyObject* pending) {
  PyObject* weak = PyWeakref_NewRef(payload, nullptr);
  if (weak == nullptr) {
    return false;
  }
  auto* p = reinterpret_cast<PayloadObject*>(payload);
  Py_INCREF(pending);
  Py_SETREF(p->buf, pending);
  Py_INCREF(pending);
  trace.assigned.push_back({reinterpret_cast<PendingObject*>(pending)->value, weak, pending});
  return true;
}

// Runs the trace (runtime/fusion.py); false with a Python error set when that raised.
bool flush_trace() {
  if (trace.nodes.empty() || flush_callback == nullptr) {
    return true;
  }
  PyObject* result = PyObject_CallNoArgs(flush_callback);
  if (result == nullptr) {
    return false;
  }
  Py_DECREF(result);
  return true;
}

// Trace structures already seen, by the hash of their words: equal structures come back as the
// same tuple, which the program cache (runtime/fusion.py) then finds by identity instead of
// comparing a few hundred elements. Only a cache, dropped whole past its bounds: twice the
// programs fusion keeps by default (TORCHNEURON_FUSION_PROGRAMS), and 4 MB of words, so that
// traces that never repeat (new shapes run op by op) cannot grow it.
struct InternedStructure {
  std::vector<intptr_t> words;
  PyObject* key;  // owned
};
std::unordered_map<size_t, std::vector<InternedStructure>> interned_structures;
size_t interned_count = 0;
size_t interned_words = 0;
constexpr size_t kInternedKept = 256;
constexpr size_t kInternedWordsKept = size_t{1} << 19;

// The structure tuple of `words` (built by `build` when it was not seen before); new reference.
template <typename Build>
PyObject* interned_structure(std::vector<intptr_t>&& words, Build build) {
  size_t hash = std::hash<std::string_view>{}(std::string_view(
      reinterpret_cast<const char*>(words.data()), words.size() * sizeof(intptr_t)));
  auto& bucket = interned_structures[hash];
  for (auto& entry : bucket) {
    if (entry.words == words) {
      Py_INCREF(entry.key);
      return entry.key;
    }
  }
  PyObject* key = build();
  if (key == nullptr) {
    return nullptr;
  }
  if (interned_count >= kInternedKept || interned_words + words.size() > kInternedWordsKept) {
    for (auto& [_, entries] : interned_structures) {
      for (auto& entry : entries) {
        Py_DECREF(entry.key);
      }
    }
    interned_structures.clear();
    interned_count = 0;
    interned_words = 0;
  }
  Py_INCREF(key);
  interned_count += 1;
  interned_words += words.size();
  interned_structures[hash].push_back({std::move(words), key});
  return key;
}

// A tuple of `items`, whose references it steals (Py_BuildValue's "N" without parsing a
// format at each of the trace's nodes).
template <typename... Items>
PyObject* steal_tuple(Items... items) {
  PyObject* tuple = PyTuple_New(sizeof...(items));
  Py_ssize_t i = 0;
  ((PyTuple_SET_ITEM(tuple, i++, items)), ...);
  return tuple;
}

// (nodes, externals, live, checks, structure) of the trace so far, which starts afresh; None
// when empty. nodes: ((fn, refs, n_results, site), ...); live: ((value, payload, pending), ...)
// for the payloads still alive and still holding their pending value; checks: ((value, site),
// ...) for the nodes with an index check (the value is the node's last result); structure:
// what the trace's program depends on, the key of its program cache: ((id(fn), refs, n), ...),
// the live values, the check values and the externals' types.
PyObject* take_trace() {
  if (trace.nodes.empty()) {
    Py_RETURN_NONE;
  }
  std::vector<intptr_t> words;
  words.reserve(trace.nodes.size() * 6 + trace.assigned.size() + trace.externals.size() + 4);
  words.push_back(static_cast<intptr_t>(trace.nodes.size()));
  PyObject* nodes = PyTuple_New(static_cast<Py_ssize_t>(trace.nodes.size()));
  std::vector<PyObject*> node_refs(trace.nodes.size());
  std::vector<std::pair<int32_t, PyObject*>> checks;  // (value, borrowed site)
  int32_t first = 0;
  for (size_t i = 0; i < trace.nodes.size(); ++i) {
    TraceNode& node = trace.nodes[i];
    words.push_back(reinterpret_cast<intptr_t>(node.fn));
    words.push_back(static_cast<intptr_t>(node.refs.size()));
    PyObject* refs = PyTuple_New(static_cast<Py_ssize_t>(node.refs.size()));
    for (size_t j = 0; j < node.refs.size(); ++j) {
      words.push_back(node.refs[j]);
      PyTuple_SET_ITEM(refs, j, PyLong_FromLong(node.refs[j]));
    }
    words.push_back(node.n_results);
    first += node.n_results;
    if (node.site != Py_None) {
      checks.emplace_back(first - 1, node.site);
    }
    node_refs[i] = refs;
    // steals node.fn and node.site (the tuple keeps them alive for `checks` below)
    PyTuple_SET_ITEM(nodes, i, steal_tuple(node.fn, Py_NewRef(refs), PyLong_FromLong(node.n_results),
                                           node.site));
  }
  std::vector<int32_t> live_values;
  PyObject* live_list = PyList_New(0);
  for (Assigned& a : trace.assigned) {
    PyObject* payload = PyWeakref_GetObject(a.weak_payload);  // borrowed
    if (payload != Py_None && reinterpret_cast<PayloadObject*>(payload)->buf == a.pending) {
      PyObject* item = steal_tuple(PyLong_FromLong(a.value), Py_NewRef(payload), a.pending);
      PyList_Append(live_list, item);
      Py_DECREF(item);
      live_values.push_back(a.value);
    } else {
      Py_DECREF(a.pending);
    }
    Py_DECREF(a.weak_payload);
  }
  words.push_back(static_cast<intptr_t>(live_values.size()));
  words.insert(words.end(), live_values.begin(), live_values.end());
  PyObject* checks_tuple = PyTuple_New(static_cast<Py_ssize_t>(checks.size()));
  words.push_back(static_cast<intptr_t>(checks.size()));
  for (size_t i = 0; i < checks.size(); ++i) {
    words.push_back(checks[i].first);
    PyTuple_SET_ITEM(checks_tuple, i,
                     steal_tuple(PyLong_FromLong(checks[i].first), Py_NewRef(checks[i].second)));
  }
  PyObject* externals = PyTuple_New(static_cast<Py_ssize_t>(trace.externals.size()));
  words.push_back(static_cast<intptr_t>(trace.externals.size()));
  for (size_t i = 0; i < trace.externals.size(); ++i) {
    words.push_back(reinterpret_cast<intptr_t>(Py_TYPE(trace.externals[i])));
    PyTuple_SET_ITEM(externals, i, trace.externals[i]);  // steals
  }
  PyObject* structure = interned_structure(std::move(words), [&]() -> PyObject* {
    PyObject* ops = PyTuple_New(static_cast<Py_ssize_t>(trace.nodes.size()));
    for (size_t i = 0; i < trace.nodes.size(); ++i) {
      PyObject* node = PyTuple_GET_ITEM(nodes, i);
      PyTuple_SET_ITEM(ops, i, Py_BuildValue("(NOO)", PyLong_FromVoidPtr(PyTuple_GET_ITEM(node, 0)),
                                             node_refs[i], PyTuple_GET_ITEM(node, 2)));
    }
    PyObject* values = PyTuple_New(static_cast<Py_ssize_t>(live_values.size()));
    for (size_t i = 0; i < live_values.size(); ++i) {
      PyTuple_SET_ITEM(values, i, PyLong_FromLong(live_values[i]));
    }
    PyObject* check_values = PyTuple_New(static_cast<Py_ssize_t>(checks.size()));
    for (size_t i = 0; i < checks.size(); ++i) {
      PyTuple_SET_ITEM(check_values, i, PyLong_FromLong(checks[i].first));
    }
    PyObject* types = PyTuple_New(PyTuple_GET_SIZE(externals));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(externals); ++i) {
      PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(externals, i)));
      Py_INCREF(type);
      PyTuple_SET_ITEM(types, i, type);
    }
    return Py_BuildValue("(NNNN)", ops, values, check_values, types);
  });
  for (PyObject* refs : node_refs) {
    Py_DECREF(refs);
  }
  trace.nodes.clear();
  trace.externals.clear();
  trace.external_index.clear();
  trace.assigned.clear();
  trace.n_values = 0;
  trace.generation += 1;
  if (structure == nullptr) {
    Py_DECREF(nodes);
    Py_DECREF(externals);
    Py_DECREF(live_list);
    Py_DECREF(checks_tuple);
    return nullptr;
  }
  PyObject* live = PyList_AsTuple(live_list);
  Py_DECREF(live_list);
  return Py_BuildValue("(NNNNN)", nodes, externals, live, checks_tuple, structure);
}

// Where the user's code called the op: the innermost frame outside torch and torchneuron.
PyObject* user_site() {
  PyFrameObject* frame = PyEval_GetFrame();
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* filename = code->co_filename;
    const char* text = PyUnicode_AsUTF8(filename);
    bool internal = text == nullptr || std::strstr(text, "/torch/") || std::strstr(text, "/torchneuron/");
    if (!internal) {
      PyObject* site = PyUnicode_FromFormat("%U:%d", filename, PyFrame_GetLineNumber(frame));
      Py_DECREF(code);
      Py_DECREF(frame);
      return site;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  PyErr_Clear();
  return PyUnicode_FromString("<unknown>");
}

// ------------------------------------------------------------------------------------------
// What Python tells us about ops and executables

enum ArgKind : int8_t { STATIC = 0, SCALAR = 1, TENSOR = 2, OTHER = 3 };
enum Route : int8_t { UNKNOWN = 0, SLOW = 1, VIEW = 2, NATIVE = 3 };

struct OutputMeta {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t nbytes;
};

struct WriteSlot {
  int arg;    // schema index of the written tensor
  bool full;  // the write replaces its whole buffer (no buffer/offset inputs)
};

struct Executable {
  PyObject* fn = nullptr;  // jax.jit: (*inputs, *write inputs) -> (*outputs, *new buffers[, bad])
  std::vector<OutputMeta> outputs;
  std::vector<WriteSlot> writes;
  bool has_check = false;
  PyObject* index_error = nullptr;  // the lowering's index_error (message or (class, message))
  std::vector<bool> none_results;   // results that are always None (masked outputs, writes left alone)
};

struct Return {
  bool fresh;  // a new tensor (the next output), else the argument `arg` itself
  int arg;
};

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& key) const noexcept {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

struct OpEntry {
  Route route = UNKNOWN;
  PyObject* py_op = nullptr;  // the OpOverload
  std::vector<ArgKind> kinds;
  // Per argument: a traced number's schema default as (tag, bits, imaginary bits), tag
  // TAG_NONE (-1) where there is none. A call passing it gets no input for it (plan.is_default).
  std::vector<std::array<int64_t, 3>> defaults;
  std::vector<Return> returns;
  std::unordered_map<Key, std::unique_ptr<Executable>, KeyHash> executables;
  int64_t fast_calls = 0;
};

std::unordered_map<const void*, std::unique_ptr<OpEntry>> entries;  // by &op.schema()

// Python objects the kernel uses (set by `init`, owned for the process lifetime).
PyObject* dispatch_op = nullptr;     // runtime.dispatch.dispatch_op
PyObject* describe_op = nullptr;     // runtime.fastpath.describe(name, overload) -> tuple | None
PyObject* take_last = nullptr;       // runtime.fastpath.take_last(op) -> tuple | None
PyObject* latest_list = nullptr;     // runtime.storage._LATEST (a one-element list)
PyObject* profiler_module = nullptr; // torch.autograd.profiler
PyObject* set_eval_frame = nullptr;  // torch._C._dynamo.eval_frame.set_eval_frame
PyObject* payload_attr = nullptr;    // "_neuron_payload"
PyObject* profiler_flag = nullptr;   // "_is_profiler_enabled"
bool enabled = true;

[[noreturn]] void raise_python() {
  throw python_error();
}

bool profiling() {
  PyObject* flag = PyObject_GetAttr(profiler_module, profiler_flag);
  if (flag == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool on = flag == Py_True;
  Py_DECREF(flag);
  return on;
}

template <typename T>
int64_t bits_of(T v) {
  int64_t out = 0;
  std::memcpy(&out, &v, sizeof(T));
  return out;
}

constexpr int64_t TAG_NONE = -1, TAG_TENSOR = -2, TAG_HOST = -3, TAG_INT = -4, TAG_FLOAT = -5,
                  TAG_BOOL = -6, TAG_COMPLEX = -7, TAG_LIST = -8, TAG_STRING = -9,
                  TAG_DEVICE = -10;

// A number as (its type's tag, its bits, its imaginary part's bits).
std::array<int64_t, 3> scalar_key_of(const c10::Scalar& s) {
  if (s.isBoolean()) {
    return {TAG_BOOL, s.toBool() ? 1 : 0, 0};
  }
  if (s.isIntegral(false)) {
    return {TAG_INT, bits_of(s.toLong()), 0};
  }
  if (s.isComplex()) {
    auto c = s.toComplexDouble();
    return {TAG_COMPLEX, bits_of(c.real()), bits_of(c.imag())};
  }
  return {TAG_FLOAT, bits_of(s.toDouble()), 0};
}

// fastpath.describe's default of one argument (a Python number or None) as scalar_key_of has it.
std::array<int64_t, 3> default_key(PyObject* value) {
  if (PyBool_Check(value)) {
    return scalar_key_of(c10::Scalar(value == Py_True));
  }
  if (PyLong_Check(value)) {
    return scalar_key_of(c10::Scalar(static_cast<int64_t>(PyLong_AsLongLong(value))));
  }
  if (PyFloat_Check(value)) {
    return scalar_key_of(c10::Scalar(PyFloat_AsDouble(value)));
  }
  if (PyComplex_Check(value)) {
    return scalar_key_of(c10::Scalar(c10::complex<double>(PyComplex_RealAsDouble(value),
                                                          PyComplex_ImagAsDouble(value))));
  }
  return {TAG_NONE, 0, 0};
}

OpEntry& entry_for(const c10::OperatorHandle& op) {
  auto& slot = entries[&op.schema()];
  if (!slot) {
    slot = std::make_unique<OpEntry>();
  }
  OpEntry& entry = *slot;
  if (entry.route == UNKNOWN) {
    const auto& name = op.operator_name();
    PyObject* described =
        PyObject_CallFunction(describe_op, "ss", name.name.c_str(), name.overload_name.c_str());
    if (described == nullptr) {
      raise_python();
    }
    // (route, py_op, kinds, returns, defaults) ; returns: ((fresh: bool, arg: int), ...)
    entry.route = SLOW;
    if (PyTuple_Check(described) && PyTuple_GET_SIZE(described) == 5) {
      long route = PyLong_AsLong(PyTuple_GET_ITEM(described, 0));
      entry.py_op = PyTuple_GET_ITEM(described, 1);
      Py_INCREF(entry.py_op);
      PyObject* kinds = PyTuple_GET_ITEM(described, 2);
      PyObject* returns = PyTuple_GET_ITEM(described, 3);
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kinds); ++i) {
        entry.kinds.push_back(static_cast<ArgKind>(PyLong_AsLong(PyTuple_GET_ITEM(kinds, i))));
      }
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(returns); ++i) {
        PyObject* r = PyTuple_GET_ITEM(returns, i);
        entry.returns.push_back(
            {PyTuple_GET_ITEM(r, 0) == Py_True, static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(r, 1)))});
      }
      PyObject* defaults = PyTuple_GET_ITEM(described, 4);
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(defaults); ++i) {
        entry.defaults.push_back(default_key(PyTuple_GET_ITEM(defaults, i)));
      }
      entry.route = static_cast<Route>(route);
    } else if (described != Py_None) {
      Py_DECREF(described);
      PyErr_SetString(PyExc_TypeError, "torchneuron: fastpath.describe returned a bad value");
      raise_python();
    }
    Py_DECREF(described);
  }
  return entry;
}

// ------------------------------------------------------------------------------------------
// Reading tensors

// The payload of a neuron tensor's storage (a new reference), or nullptr when it has none.
PyObject* payload_of(const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  PyObject* py_storage = impl->pyobj_slot()->load_pyobj();
  if (py_storage == nullptr) {
    return nullptr;
  }
  PyObject* payload = PyObject_GetAttr(py_storage, payload_attr);
  if (payload == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  if (Py_TYPE(payload) != &PayloadType) {
    Py_DECREF(payload);
    return nullptr;
  }
  return payload;
}

PyObject* dtype_object(c10::ScalarType st) {
  return reinterpret_cast<PyObject*>(torch::getTHPDtype(st));
}


constexpr int64_t MODE_FULL = 0, MODE_SLICE = 1, MODE_STRIDED = 2;

// A static argument's value in the key; false for kinds this file does not describe.
bool key_static(const c10::IValue& v, Key& key) {
  if (v.isNone()) {
    key.push_back(TAG_NONE);
  } else if (v.isBool()) {
    key.push_back(TAG_BOOL);
    key.push_back(v.toBool());
  } else if (v.isInt()) {
    key.push_back(TAG_INT);
    key.push_back(v.toInt());
  } else if (v.isDouble()) {
    double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    key.push_back(TAG_FLOAT);
    key.push_back(bits);
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    key.push_back(TAG_LIST);
    key.push_back(static_cast<int64_t>(list.size()));
    for (int64_t x : list) {
      key.push_back(x);
    }
  } else if (v.isString()) {
    key.push_back(TAG_STRING);
    key.push_back(static_cast<int64_t>(std::hash<std::string_view>()(v.toStringView())));
  } else if (v.isDevice()) {
    key.push_back(TAG_DEVICE);
    key.push_back(static_cast<int64_t>(v.toDevice().type()));
    key.push_back(v.toDevice().index());
  } else {
    return false;
  }
  return true;
}

// ------------------------------------------------------------------------------------------
// Scalar arguments as device arrays (calls run one by one)
//
// JAX turns a Python number argument into a new device buffer at every call (about 2.5 us of a
// 10 us add on the CPU client); an uncommitted weak-typed array of the same value has the same
// abstract value, so the executable is the same and only the transfer goes. A value gets its
// array at its second call (a loop over ever-new values pays nothing for it), and at most
// kScalarArrays values keep one. Recorded traces (fusion) pack their scalars instead.

using ScalarKey = std::array<int64_t, 3>;  // (tag, bits, imaginary bits)

struct ScalarKeyHash {
  size_t operator()(const ScalarKey& k) const noexcept {
    return static_cast<size_t>(static_cast<uint64_t>(k[0]) * 0x9e3779b97f4a7c15ULL ^
                               static_cast<uint64_t>(k[1]) ^ (static_cast<uint64_t>(k[2]) << 1));
  }
};

constexpr size_t kScalarArrays = 1024;
PyObject* scalar_array_fn = nullptr;  // fastpath.scalar_array, or nullptr: no arrays
std::unordered_map<ScalarKey, PyObject*, ScalarKeyHash> scalar_arrays;  // owned references
std::unordered_map<ScalarKey, bool, ScalarKeyHash> scalars_seen;

// The input for a scalar argument (a new reference): `value` itself or its cached array.
PyObject* scalar_input(const ScalarKey& key, PyObject* value) {
  if (fusion || scalar_array_fn == nullptr || value == nullptr) {
    return value;
  }
  auto found = scalar_arrays.find(key);
  if (found != scalar_arrays.end()) {
    Py_DECREF(value);
    return Py_NewRef(found->second);
  }
  if (scalar_arrays.size() >= kScalarArrays) {
    return value;
  }
  if (scalars_seen.emplace(key, true).second) {
    if (scalars_seen.size() > 4 * kScalarArrays) {
      scalars_seen.clear();
    }
    return value;  // first call with this value
  }
  PyObject* array = PyObject_CallOneArg(scalar_array_fn, value);
  if (array == nullptr || array == Py_None) {
    PyErr_Clear();
    Py_XDECREF(array);
    return value;
  }
  // The call ran Python code: another thread may have cached this value meanwhile.
  if (scalar_arrays.emplace(key, array).second) {
    Py_INCREF(array);
  }
  Py_DECREF(value);
  return array;
}

// Python's number for a Scalar, as `tensor.item()` gives it (a new reference).
PyObject* python_number(const c10::Scalar& s) {
  if (s.isBoolean()) {
    return PyBool_FromLong(s.toBool());
  }
  if (s.isIntegral(false)) {
    return PyLong_FromLongLong(s.toLong());
  }
  if (s.isComplex()) {
    auto c = s.toComplexDouble();
    return PyComplex_FromDoubles(c.real(), c.imag());
  }
  return PyFloat_FromDouble(s.toDouble());
}

// A number argument as the executable takes it (a new reference: the Python number, or its
// cached array), and its type's tag in the key.
PyObject* number_input(const c10::Scalar& s, int64_t& tag) {
  ScalarKey key = scalar_key_of(s);
  tag = key[0];
  return scalar_input(key, python_number(s));
}

// The call's key and executable inputs (new references appended to `inputs`); false when the
// call needs the Python path (unusual arguments, an unmaterialized or pending payload).
bool describe_call(const OpEntry& entry, const c10::IValue* args, Key& key,
                   c10::SmallVectorImpl<PyObject*>& inputs) {
  const size_t n = entry.kinds.size();
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[i];
    switch (entry.kinds[i]) {
      case STATIC:
        if (!key_static(v, key)) {
          return false;
        }
        break;
      case SCALAR:
        if (v.isNone()) {
          key.push_back(TAG_NONE);
        } else if (v.isDouble() || v.isBool() || v.isInt() || v.isComplexDouble()) {
          c10::Scalar number = v.toScalar();
          ScalarKey number_key = scalar_key_of(number);
          // A call run now takes a number at its default as a constant; a recorded one keeps
          // it an input (as signature.py keys them).
          if (!fusion && i < entry.defaults.size() && number_key == entry.defaults[i]) {
            key.push_back(TAG_NONE);
            break;
          }
          inputs.push_back(scalar_input(number_key, python_number(number)));
          key.push_back(number_key[0]);
        } else {
          return false;
        }
        break;
      case TENSOR: {
        if (v.isNone()) {
          key.push_back(TAG_NONE);
          break;
        }
        if (!v.isTensor()) {
          return false;
        }
        const at::Tensor& t = v.toTensor();
        if (!t.defined()) {
          key.push_back(TAG_NONE);
          break;
        }
        if (t.device().type() != c10::DeviceType::PrivateUse1) {
          if (t.device().type() == c10::DeviceType::CPU && t.dim() == 0 && !t.is_conj() &&
              !t.is_neg()) {
            key.push_back(TAG_HOST);
            key.push_back(static_cast<int64_t>(t.scalar_type()));
            // A wrapped Python number (`x * 2.0`) promotes as a number, a 0-dim tensor of the
            // same dtype as a tensor (int64 * tensor(2.0, float64) is float64).
            key.push_back(t.unsafeGetTensorImpl()->is_wrapped_number() ? 1 : 0);
            int64_t tag = 0;  // the dtype above says it
            inputs.push_back(number_input(t.item(), tag));
            break;
          }
          return false;  // Python raises PyTorch's device mismatch error
        }
        if (t.is_conj() || t.is_neg()) {
          return false;
        }
        PyObject* payload = payload_of(t);
        if (payload == nullptr) {
          return false;
        }
        auto* p = reinterpret_cast<PayloadObject*>(payload);
        bool ready = p->dtype == dtype_object(t.scalar_type()) && p->buf != Py_None &&
                     (Py_TYPE(p->buf) != &PendingType || is_current_pending(p->buf));
        if (!ready) {
          Py_DECREF(payload);
          return false;
        }
        Py_INCREF(p->buf);
        inputs.push_back(p->buf);
        const int64_t itemsize = static_cast<int64_t>(t.dtype().itemsize());
        const int64_t offset = t.storage_offset();
        int64_t mode;
        if (t.is_contiguous()) {
          mode = (offset == 0 && t.numel() * itemsize == p->nbytes) ? MODE_FULL : MODE_SLICE;
        } else {
          mode = MODE_STRIDED;
        }
        Py_DECREF(payload);
        if (mode != MODE_FULL) {
          inputs.push_back(PyLong_FromLongLong(offset));
        }
        key.push_back(TAG_TENSOR);
        key.push_back(static_cast<int64_t>(t.scalar_type()));
        key.push_back(mode);
        key.push_back(t.dim());
        for (int64_t s : t.sizes()) {
          key.push_back(s);
        }
        for (int64_t s : t.strides()) {
          key.push_back(s);
        }
        break;
      }
      default:
        return false;
    }
  }
  key.push_back(static_cast<int64_t>(c10::get_default_dtype_as_scalartype()));
  return true;
}

// ------------------------------------------------------------------------------------------
// Making outputs

at::Tensor new_output(const OutputMeta& meta, PyObject* buf) {
  c10::Allocator* allocator = torchneuron_device_allocator();
  c10::Storage storage(c10::Storage::use_byte_size_t(), meta.nbytes, allocator->allocate(meta.nbytes),
                       allocator, /*resizable=*/true);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(meta.dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes, meta.strides);
  PyObject* py_storage = THPStorage_Wrap(tensor.storage());
  if (py_storage == nullptr) {
    raise_python();
  }
  bool pending = Py_TYPE(buf) == &PendingType;
  PyObject* payload = make_payload(&PayloadType, meta.nbytes, dtype_object(meta.dtype),
                                   pending ? Py_None : buf);
  if (payload != nullptr && pending && !assign(payload, buf)) {
    Py_CLEAR(payload);
  }
  int status = payload ? PyObject_SetAttr(py_storage, payload_attr, payload) : -1;
  Py_XDECREF(payload);
  Py_DECREF(py_storage);
  if (status < 0) {
    raise_python();
  }
  return tensor;
}

void set_latest(PyObject* buf) {
  Py_INCREF(buf);
  PyList_SetItem(latest_list, 0, buf);  // steals the reference
}

// Whether a written tensor shares its storage with another tensor argument of the call (the
// Python path then runs CPU's overlap check); the in-place `self` itself is fine.
bool writes_alias_inputs(const OpEntry& entry, const Executable& ex, const c10::IValue* args) {
  for (const WriteSlot& w : ex.writes) {
    const at::Tensor& written = args[w.arg].toTensor();
    const c10::StorageImpl* storage = written.storage().unsafeGetStorageImpl();
    for (size_t i = 0; i < entry.kinds.size(); ++i) {
      if (static_cast<int>(i) == w.arg || entry.kinds[i] != TENSOR || !args[i].isTensor()) {
        continue;
      }
      const at::Tensor& other = args[i].toTensor();
      if (!other.defined() || !other.has_storage() ||
          other.unsafeGetTensorImpl() == written.unsafeGetTensorImpl()) {
        continue;  // x.mul_(x): self is read and written
      }
      if (other.storage().unsafeGetStorageImpl() == storage) {
        return true;
      }
    }
  }
  return false;
}

// PyObject_IsTrue on a jax scalar runs Python code (Array.__bool__): with Dynamo's frame hook
// turned off, as dispatch.py does, so that Dynamo does not try to compile JAX.
int is_true_outside_dynamo(PyObject* value) {
  PyObject* prior = PyObject_CallOneArg(set_eval_frame, Py_None);
  if (prior == nullptr) {
    return -1;
  }
  int truth = PyObject_IsTrue(value);
  PyObject *type = nullptr, *error = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &error, &trace);
  if (prior != Py_None) {
    PyObject* restored = PyObject_CallOneArg(set_eval_frame, prior);
    Py_XDECREF(restored);
  }
  Py_DECREF(prior);
  PyErr_Restore(type, error, trace);
  return truth;
}

// Runs a known executable for this call; false when the Python path must take it.
bool run_native(OpEntry& entry, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (fusion && trace.nodes.size() >= fusion_cap && !flush_trace()) {
    raise_python();
  }
  const size_t n = entry.kinds.size();
  const c10::IValue* args = &*(stack->end() - static_cast<std::ptrdiff_t>(n));
  Key key;
  key.reserve(16 + 8 * n);
  c10::SmallVector<PyObject*, 12> inputs;
  struct Releaser {
    c10::SmallVector<PyObject*, 12>& objects;
    ~Releaser() {
      for (PyObject* o : objects) {
        Py_XDECREF(o);
      }
    }
  } release{inputs};
  if (!describe_call(entry, args, key, inputs)) {
    return false;
  }
  auto found = entry.executables.find(key);
  if (found == entry.executables.end()) {
    return false;
  }
  const Executable& ex = *found->second;
  if (!ex.writes.empty() && writes_alias_inputs(entry, ex, args)) {
    return false;  // Python asks CPU whether this overlap is allowed
  }
  c10::SmallVector<PyObject*, 4> payloads(ex.writes.size(), nullptr);
  struct PayloadReleaser {
    c10::SmallVector<PyObject*, 4>& objects;
    ~PayloadReleaser() {
      for (PyObject* o : objects) {
        Py_XDECREF(o);
      }
    }
  } release_payloads{payloads};
  for (size_t w = 0; w < ex.writes.size(); ++w) {
    const at::Tensor& t = args[ex.writes[w].arg].toTensor();
    payloads[w] = payload_of(t);
    if (payloads[w] == nullptr) {
      return false;
    }
    if (!ex.writes[w].full) {
      PyObject* buf = reinterpret_cast<PayloadObject*>(payloads[w])->buf;
      Py_INCREF(buf);
      inputs.push_back(buf);
      inputs.push_back(PyLong_FromLongLong(t.storage_offset()));
    }
  }
  const Py_ssize_t n_out = static_cast<Py_ssize_t>(ex.outputs.size());
  const Py_ssize_t n_write = static_cast<Py_ssize_t>(ex.writes.size());
  const Py_ssize_t n_results = n_out + n_write + (ex.has_check ? 1 : 0);
  // The call's results: computed now, or (fusion) pending values of the trace.
  PyObject* result = nullptr;
  if (fusion) {
    PyObject* site = Py_None;
    if (ex.has_check) {
      PyObject* where = user_site();
      site = Py_BuildValue("(OON)", ex.index_error, entry.py_op, where);
    } else {
      Py_INCREF(site);
    }
    int32_t first = record_node(ex.fn, inputs.data(), inputs.size(), static_cast<int32_t>(n_results), site);
    Py_DECREF(site);
    if (first < 0) {
      raise_python();
    }
    result = PyTuple_New(n_results);
    for (Py_ssize_t i = 0; i < n_results; ++i) {
      PyObject* value = ex.none_results[i] ? Py_NewRef(Py_None) : new_pending(first + static_cast<int32_t>(i));
      PyTuple_SET_ITEM(result, i, value);
    }
  } else {
    result = PyObject_Vectorcall(ex.fn, inputs.data(), inputs.size(), nullptr);
    if (result == nullptr) {
      PyErr_Clear();  // the Python path repeats the call and raises PyTorch's error
      return false;
    }
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != n_results) {
      Py_DECREF(result);
      return false;
    }
    if (ex.has_check) {
      int bad = is_true_outside_dynamo(PyTuple_GET_ITEM(result, n_out + n_write));
      if (bad != 0) {  // out of range (or an error): the Python path raises the op's error
        PyErr_Clear();
        Py_DECREF(result);
        return false;
      }
    }
  }
  for (Py_ssize_t w = 0; w < n_write; ++w) {
    PyObject* buf = PyTuple_GET_ITEM(result, n_out + w);
    if (buf == Py_None) {
      continue;
    }
    if (fusion) {
      if (!assign(payloads[w], buf)) {
        Py_DECREF(result);
        raise_python();
      }
    } else {
      auto* p = reinterpret_cast<PayloadObject*>(payloads[w]);
      Py_INCREF(buf);
      Py_SETREF(p->buf, buf);
      set_latest(buf);
    }
  }
  c10::SmallVector<c10::IValue, 4> returned;
  Py_ssize_t next_output = 0;
  for (const Return& r : entry.returns) {
    if (r.fresh) {
      PyObject* buf = PyTuple_GET_ITEM(result, next_output);
      if (buf == Py_None) {  // an output the op does not produce (output_mask)
        returned.emplace_back(at::Tensor());
      } else {
        returned.emplace_back(new_output(ex.outputs[next_output], buf));
        if (!fusion) {
          set_latest(buf);
        }
      }
      ++next_output;
    } else {
      returned.push_back(args[r.arg]);
    }
  }
  Py_DECREF(result);
  torch::jit::drop(*stack, n);
  for (auto& v : returned) {
    stack->push_back(std::move(v));
  }
  // An op that checks its indices ends the trace, so that its error is raised at the call.
  if (fusion && ex.has_check && !flush_trace()) {
    raise_python();
  }
  entry.fast_calls += 1;
  return true;
}

bool run_view(const OpEntry& entry, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = entry.kinds.size();
  const c10::IValue* args = &*(stack->end() - static_cast<std::ptrdiff_t>(n));
  for (size_t i = 0; i < n; ++i) {
    if (args[i].isTensor()) {
      const at::Tensor& t = args[i].toTensor();
      if (t.defined() && t.device().type() != c10::DeviceType::PrivateUse1 && t.dim() != 0) {
        return false;  // Python raises PyTorch's device mismatch error
      }
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  return true;
}

// ------------------------------------------------------------------------------------------
// The Python path

// An argument as PyTorch's Python fallback passes it: dtypes, layouts and memory formats are
// ints in an IValue but torch.dtype / torch.layout / torch.memory_format objects in Python.
pybind11::object argument_to_python(const c10::Argument& arg, c10::IValue&& value) {
  if (value.isNone()) {
    return pybind11::none();
  }
  c10::TypePtr type = arg.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  switch (type->kind()) {
    case c10::TypeKind::ScalarTypeType:
      return pybind11::reinterpret_borrow<pybind11::object>(
          dtype_object(static_cast<c10::ScalarType>(value.toInt())));
    case c10::TypeKind::LayoutType:
      return pybind11::reinterpret_borrow<pybind11::object>(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(value.toInt()))));
    case c10::TypeKind::MemoryFormatType:
      return pybind11::reinterpret_borrow<pybind11::object>(
          torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(value.toInt())));
    default:
      return torch::jit::toPyObject(std::move(value));
  }
}

void learn_executable(OpEntry& entry, Key key) {
  PyObject* last = PyObject_CallOneArg(take_last, entry.py_op);
  if (last == nullptr) {
    raise_python();
  }
  // (fn, ((dtype, sizes, strides, nbytes), ...), ((arg, full), ...), index_error or None,
  //  (result is always None, ...)) or None
  if (PyTuple_Check(last) && PyTuple_GET_SIZE(last) == 5) {
    auto ex = std::make_unique<Executable>();
    ex->fn = PyTuple_GET_ITEM(last, 0);
    Py_INCREF(ex->fn);
    PyObject* outs = PyTuple_GET_ITEM(last, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outs); ++i) {
      PyObject* o = PyTuple_GET_ITEM(outs, i);
      OutputMeta meta;
      meta.dtype = reinterpret_cast<THPDtype*>(PyTuple_GET_ITEM(o, 0))->scalar_type;
      PyObject* sizes = PyTuple_GET_ITEM(o, 1);
      PyObject* strides = PyTuple_GET_ITEM(o, 2);
      for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(sizes); ++d) {
        meta.sizes.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, d)));
        meta.strides.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(strides, d)));
      }
      meta.nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 3));
      ex->outputs.push_back(std::move(meta));
    }
    PyObject* writes = PyTuple_GET_ITEM(last, 2);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(writes); ++i) {
      PyObject* w = PyTuple_GET_ITEM(writes, i);
      ex->writes.push_back({static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(w, 0))),
                            PyTuple_GET_ITEM(w, 1) == Py_True});
    }
    ex->index_error = PyTuple_GET_ITEM(last, 3);
    Py_INCREF(ex->index_error);
    ex->has_check = ex->index_error != Py_None;
    PyObject* nones = PyTuple_GET_ITEM(last, 4);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nones); ++i) {
      ex->none_results.push_back(PyTuple_GET_ITEM(nones, i) == Py_True);
    }
    entry.executables.emplace(std::move(key), std::move(ex));
  }
  Py_DECREF(last);
}

void run_python(OpEntry& entry, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  // Describe the call before the arguments are consumed: if Python runs it with a reusable
  // executable, the next call of this signature will not need Python.
  Key key;
  bool keyed = false;
  if (entry.route == NATIVE && enabled) {
    c10::SmallVector<PyObject*, 12> inputs;
    keyed = describe_call(entry, &*(stack->end() - static_cast<std::ptrdiff_t>(n)), key, inputs);
    for (PyObject* o : inputs) {
      Py_XDECREF(o);
    }
  }
  if (entry.py_op == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "torchneuron: no Python op for this overload");
    raise_python();
  }
  size_t n_positional = 0;
  for (const auto& a : schema.arguments()) {
    n_positional += a.kwarg_only() ? 0 : 1;
  }
  pybind11::tuple py_args(n_positional + 1);
  pybind11::dict py_kwargs;
  py_args[0] = pybind11::reinterpret_borrow<pybind11::object>(entry.py_op);
  auto first = stack->end() - static_cast<std::ptrdiff_t>(n);
  size_t pos = 1;
  for (size_t i = 0; i < n; ++i) {
    const auto& a = schema.arguments()[i];
    pybind11::object value = argument_to_python(a, std::move(first[i]));
    if (a.kwarg_only()) {
      py_kwargs[a.name().c_str()] = value;
    } else {
      py_args[pos++] = value;
    }
  }
  torch::jit::drop(*stack, n);
  PyObject* out = PyObject_Call(dispatch_op, py_args.ptr(), py_kwargs.ptr());
  if (out == nullptr) {
    raise_python();
  }
  pybind11::object result = pybind11::reinterpret_steal<pybind11::object>(out);
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(result, returns[0].type(), std::nullopt));
  } else if (returns.size() > 1) {
    pybind11::tuple items = pybind11::reinterpret_borrow<pybind11::tuple>(result);
    for (size_t i = 0; i < returns.size(); ++i) {
      stack->push_back(torch::jit::toIValue(items[i], returns[i].type(), std::nullopt));
    }
  }
  if (keyed) {
    learn_executable(entry, std::move(key));
  }
}

void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  pybind11::gil_scoped_acquire gil;
  OpEntry& entry = entry_for(op);
  if (enabled && !profiling()) {
    if (entry.route == VIEW && run_view(entry, op, stack)) {
      return;
    }
    if (entry.route == NATIVE && run_native(entry, op, stack)) {
      return;
    }
  }
  run_python(entry, op, stack);
}

// ------------------------------------------------------------------------------------------
// The Python module

std::unique_ptr<torch::Library> fallback_library;
std::unique_ptr<torch::Library> direct_library;

PyObject* py_init(PyObject* /*self*/, PyObject* args) {
  PyObject *dispatch, *describe, *last, *latest, *flush;
  if (!PyArg_ParseTuple(args, "OOOOO", &dispatch, &describe, &last, &latest, &flush)) {
    return nullptr;
  }
  for (PyObject* o : {dispatch, describe, last, latest, flush}) {
    Py_INCREF(o);
  }
  flush_callback = flush;
  dispatch_op = dispatch;
  describe_op = describe;
  take_last = last;
  latest_list = latest;
  profiler_module = PyImport_ImportModule("torch.autograd.profiler");
  PyObject* eval_frame = PyImport_ImportModule("torch._C._dynamo.eval_frame");
  if (eval_frame == nullptr) {
    return nullptr;
  }
  set_eval_frame = PyObject_GetAttrString(eval_frame, "set_eval_frame");
  Py_DECREF(eval_frame);
  if (set_eval_frame == nullptr) {
    return nullptr;
  }
  payload_attr = PyUnicode_InternFromString("_neuron_payload");
  profiler_flag = PyUnicode_InternFromString("_is_profiler_enabled");
  if (profiler_module == nullptr) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

// install(names): the kernel becomes the PrivateUse1 fallback, and the PrivateUse1 kernel of
// each "name.overload" listed (ops whose composite kernels must not take the call).
PyObject* py_install(PyObject* /*self*/, PyObject* names) {
  try {
    if (!fallback_library) {
      fallback_library = std::make_unique<torch::Library>(
          torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
      fallback_library->fallback(torch::CppFunction::makeFromBoxedFunction<&kernel>());
      direct_library = std::make_unique<torch::Library>(
          torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    }
    PyObject* iter = PyObject_GetIter(names);
    if (iter == nullptr) {
      return nullptr;
    }
    while (PyObject* item = PyIter_Next(iter)) {
      const char* name = PyUnicode_AsUTF8(item);
      if (name != nullptr) {
        direct_library->impl(name, torch::CppFunction::makeFromBoxedFunction<&kernel>());
      }
      Py_DECREF(item);
      if (name == nullptr) {
        Py_DECREF(iter);
        return nullptr;
      }
    }
    Py_DECREF(iter);
    if (PyErr_Occurred()) {
      return nullptr;
    }
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// record(fn, inputs, n_results, site) -> pending results (the Python path's recording)
PyObject* py_record(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "record(fn, inputs: tuple, n_results, site)");
    return nullptr;
  }
  long n_results = PyLong_AsLong(args[2]);
  PyObject* inputs = args[1];
  int32_t first = record_node(args[0], &PyTuple_GET_ITEM(inputs, 0), PyTuple_GET_SIZE(inputs),
                              static_cast<int32_t>(n_results), args[3]);
  if (first < 0) {
    return nullptr;
  }
  PyObject* out = PyTuple_New(n_results);
  for (long i = 0; i < n_results; ++i) {
    PyTuple_SET_ITEM(out, i, new_pending(first + static_cast<int32_t>(i)));
  }
  return out;
}

PyObject* py_assign(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || Py_TYPE(args[0]) != &PayloadType || !is_current_pending(args[1])) {
    PyErr_SetString(PyExc_TypeError, "assign(payload, pending of the current trace)");
    return nullptr;
  }
  if (!assign(args[0], args[1])) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* py_take_trace(PyObject* /*self*/, PyObject* /*unused*/) {
  return take_trace();
}

// Whether the trace has reached its cap (the Python path flushes before it records).
PyObject* py_trace_full(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyBool_FromLong(trace.nodes.size() >= fusion_cap);
}

PyObject* py_set_fusion(PyObject* /*self*/, PyObject* args) {
  int on = 0;
  long long cap = 512;
  if (!PyArg_ParseTuple(args, "pL", &on, &cap)) {
    return nullptr;
  }
  if (!on && !flush_trace()) {
    return nullptr;
  }
  fusion = on != 0;
  fusion_cap = static_cast<size_t>(cap > 0 ? cap : 1);
  Py_RETURN_NONE;
}

// set_scalar_arrays(fn or None): fn(number) -> an uncommitted jax.Array of it (or None).
PyObject* py_set_scalar_arrays(PyObject* /*self*/, PyObject* fn) {
  for (auto& [key, array] : scalar_arrays) {
    Py_DECREF(array);
  }
  scalar_arrays.clear();
  scalars_seen.clear();
  Py_CLEAR(scalar_array_fn);
  if (fn != Py_None) {
    scalar_array_fn = Py_NewRef(fn);
  }
  Py_RETURN_NONE;
}

PyObject* py_scalar_array_count(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyLong_FromSize_t(scalar_arrays.size());
}

PyObject* py_set_enabled(PyObject* /*self*/, PyObject* flag) {
  enabled = PyObject_IsTrue(flag) == 1;
  Py_RETURN_NONE;
}

PyObject* py_counts(PyObject* /*self*/, PyObject* /*unused*/) {
  PyObject* out = PyDict_New();
  for (const auto& [schema, entry] : entries) {
    if (entry->fast_calls && entry->py_op) {
      PyObject* name = PyObject_Str(entry->py_op);
      PyObject* count = PyLong_FromLongLong(entry->fast_calls);
      PyDict_SetItem(out, name, count);
      Py_DECREF(name);
      Py_DECREF(count);
    }
  }
  return out;
}

PyObject* py_reset_counts(PyObject* /*self*/, PyObject* /*unused*/) {
  for (auto& [schema, entry] : entries) {
    entry->fast_calls = 0;
  }
  Py_RETURN_NONE;
}

PyObject* py_forget(PyObject* /*self*/, PyObject* /*unused*/) {
  // Drop every learned executable and op description (the Python caches were cleared).
  for (auto& [schema, entry] : entries) {
    for (auto& [key, ex] : entry->executables) {
      Py_XDECREF(ex->fn);
      Py_XDECREF(ex->index_error);
    }
    entry->executables.clear();
    entry->route = UNKNOWN;
    entry->kinds.clear();
    entry->returns.clear();
  }
  Py_RETURN_NONE;
}

// forget_executable(fn): drop the learned executables that call `fn` (the Python cache evicted it).
PyObject* py_forget_executable(PyObject* /*self*/, PyObject* fn) {
  for (auto& [schema, entry] : entries) {
    for (auto it = entry->executables.begin(); it != entry->executables.end();) {
      if (it->second->fn == fn) {
        Py_XDECREF(it->second->fn);
        Py_XDECREF(it->second->index_error);
        it = entry->executables.erase(it);
      } else {
        ++it;
      }
    }
  }
  Py_RETURN_NONE;
}

// runtime/signature.tensor_key for the common arguments of a compiled graph: a neuron tensor
// whose storage holds a buffer in its dtype, without lazy conj/neg bits, and a 0-dim CPU
// tensor. Appends its inputs (the buffer, and the storage offset of a view; the CPU tensor's
// value) to `inputs` and returns its key, (dtype, ViewSpec(shape, stride, mode)) or ("host",
// dtype); None for anything else (Python keys it).
PyObject* view_spec_type = nullptr;  // runtime.strided.ViewSpec, imported at first use

PyObject* py_tensor_key(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "tensor_key(tensor, inputs: list)");
    return nullptr;
  }
  if (!THPVariable_Check(args[0])) {
    Py_RETURN_NONE;
  }
  const at::Tensor& t = THPVariable_Unpack(args[0]);
  if (!t.defined() || t.is_conj() || t.is_neg()) {
    Py_RETURN_NONE;
  }
  if (t.device().type() == c10::DeviceType::CPU && t.dim() == 0 && !t.requires_grad()) {
    // A 0-dim CPU tensor (an optimizer's step counter): its value is the input, as
    // Python's `t.item()`, keyed ("host", dtype).
    const at::Scalar value = t.item();
    if (value.isComplex()) {
      Py_RETURN_NONE;  // Python keys it
    }
    PyObject* item = python_number(value);
    if (item == nullptr || PyList_Append(args[1], item) < 0) {
      Py_XDECREF(item);
      return nullptr;
    }
    Py_DECREF(item);
    static PyObject* host_tag = PyUnicode_InternFromString("host");
    return Py_BuildValue("(OO)", host_tag, dtype_object(t.scalar_type()));
  }
  if (t.device().type() != c10::DeviceType::PrivateUse1) {
    Py_RETURN_NONE;
  }
  PyObject* payload = payload_of(t);
  if (payload == nullptr) {
    Py_RETURN_NONE;
  }
  auto* p = reinterpret_cast<PayloadObject*>(payload);
  PyObject* dtype = dtype_object(t.scalar_type());
  if (p->dtype != dtype || p->buf == Py_None) {
    Py_DECREF(payload);
    Py_RETURN_NONE;
  }
  if (view_spec_type == nullptr) {
    PyObject* module = PyImport_ImportModule("torchneuron.runtime.strided");
    if (module == nullptr) {
      Py_DECREF(payload);
      return nullptr;
    }
    view_spec_type = PyObject_GetAttrString(module, "ViewSpec");
    Py_DECREF(module);
    if (view_spec_type == nullptr) {
      Py_DECREF(payload);
      return nullptr;
    }
  }
  const int64_t offset = t.storage_offset();
  int64_t mode = MODE_STRIDED;
  if (t.is_contiguous()) {
    mode = offset == 0 && t.numel() * static_cast<int64_t>(t.element_size()) == p->nbytes
               ? MODE_FULL
               : MODE_SLICE;
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
  PyObject* stride = PyTuple_New(static_cast<Py_ssize_t>(strides.size()));
  for (size_t d = 0; d < sizes.size(); ++d) {
    PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(sizes[d]));
    PyTuple_SET_ITEM(stride, d, PyLong_FromLongLong(strides[d]));
  }
  // ViewSpec(shape, stride, mode) as tuple.__new__(ViewSpec, ...) makes it: a NamedTuple's
  // own __new__ is a Python function, most of this call's cost.
  PyObject* fields = Py_BuildValue("(NNL)", shape, stride, static_cast<long long>(mode));
  PyObject* new_args = fields == nullptr ? nullptr : PyTuple_Pack(1, fields);
  Py_XDECREF(fields);
  PyObject* spec = new_args == nullptr
                       ? nullptr
                       : PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(view_spec_type),
                                             new_args, nullptr);
  Py_XDECREF(new_args);
  if (spec == nullptr || PyList_Append(args[1], p->buf) < 0) {
    Py_XDECREF(spec);
    Py_DECREF(payload);
    return nullptr;
  }
  Py_DECREF(payload);
  if (mode != MODE_FULL) {
    PyObject* start = PyLong_FromLongLong(offset);
    int failed = PyList_Append(args[1], start);
    Py_DECREF(start);
    if (failed < 0) {
      Py_DECREF(spec);
      return nullptr;
    }
  }
  return Py_BuildValue("(ON)", dtype, spec);
}

// set_buffers(tensors, buffers): each neuron tensor's storage takes the new buffer (a fresh
// jax.Array in the tensor's dtype), as storage.set_storage_buffer does; a compiled graph's
// writes into its plain mutated inputs. False, with nothing changed, when a tensor has no
// payload (Python then writes them).
PyObject* py_set_buffers(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
    PyErr_SetString(PyExc_TypeError, "set_buffers(tensors: list, buffers: list)");
    return nullptr;
  }
  const Py_ssize_t n = PyList_GET_SIZE(args[0]);
  c10::SmallVector<PyObject*, 32> payloads;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* obj = PyList_GET_ITEM(args[0], i);
    PyObject* payload = nullptr;
    if (THPVariable_Check(obj)) {
      const at::Tensor& t = THPVariable_Unpack(obj);
      if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) {
        payload = payload_of(t);
      }
    }
    if (payload == nullptr) {
      for (PyObject* p : payloads) {
        Py_DECREF(p);
      }
      Py_RETURN_FALSE;
    }
    payloads.push_back(payload);
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    auto* p = reinterpret_cast<PayloadObject*>(payloads[i]);
    const at::Tensor& t = THPVariable_Unpack(PyList_GET_ITEM(args[0], i));
    PyObject* dtype = dtype_object(t.scalar_type());
    Py_INCREF(dtype);
    Py_SETREF(p->dtype, dtype);
    PyObject* buf = PyList_GET_ITEM(args[1], i);
    Py_INCREF(buf);
    Py_SETREF(p->buf, buf);
    if (i == n - 1) {
      set_latest(buf);
    }
    Py_DECREF(payloads[i]);
  }
  Py_RETURN_TRUE;
}

// A tuple or list of Python ints as a vector; false (a Python error set) otherwise.
bool int_vector(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (fast == nullptr) {
    return false;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
  }
  Py_DECREF(fast);
  return !PyErr_Occurred();
}

// new_tensor(dtype, sizes, strides, nbytes, buf): a neuron tensor (device 0) on a new storage
// of `nbytes` holding `buf`, made as the fast path makes an op's output (storage.new_tensor
// without the Python-level storage construction and `set_` redispatch).
PyObject* py_new_tensor(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !THPDtype_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "new_tensor(dtype, sizes, strides, nbytes, buf)");
    return nullptr;
  }
  OutputMeta meta;
  meta.dtype = reinterpret_cast<THPDtype*>(args[0])->scalar_type;
  meta.nbytes = PyLong_AsLongLong(args[3]);
  if (PyErr_Occurred() || !int_vector(args[1], meta.sizes) || !int_vector(args[2], meta.strides)) {
    return nullptr;
  }
  if (meta.sizes.size() != meta.strides.size()) {
    PyErr_SetString(PyExc_ValueError, "new_tensor: sizes and strides differ in length");
    return nullptr;
  }
  PyObject* buf = args[4];
  try {
    at::Tensor tensor = new_output(meta, buf);
    if (buf != Py_None && Py_TYPE(buf) != &PendingType) {
      set_latest(buf);
    }
    return THPVariable_Wrap(std::move(tensor));
  } catch (const python_error&) {
    return nullptr;
  } catch (const std::exception& err) {
    PyErr_SetString(PyExc_RuntimeError, err.what());
    return nullptr;
  }
}

PyObject* py_memory_stats(PyObject* /*self*/, PyObject* /*unused*/) {
  return Py_BuildValue("(LLLL)", static_cast<long long>(stats.allocated),
                       static_cast<long long>(stats.peak), static_cast<long long>(stats.num_alloc),
                       static_cast<long long>(stats.num_free));
}

PyObject* py_reset_peak(PyObject* /*self*/, PyObject* /*unused*/) {
  stats.peak = stats.allocated;
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS, "init(dispatch_op, describe, take_last, latest_list)"},
    {"install", py_install, METH_O, "install(names): register the kernel"},
    {"set_enabled", py_set_enabled, METH_O, "turn the C++ fast path on or off"},
    {"set_scalar_arrays", py_set_scalar_arrays, METH_O,
     "set_scalar_arrays(fn or None): pass repeated scalar arguments as cached device arrays"},
    {"scalar_array_count", py_scalar_array_count, METH_NOARGS, "how many scalar values have an array"},
    {"record", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_record)), METH_FASTCALL,
     "record(fn, inputs, n_results, site) -> pending results"},
    {"assign", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_assign)), METH_FASTCALL,
     "assign(payload, pending): payload.buf := pending, tracked by the trace"},
    {"take_trace", py_take_trace, METH_NOARGS, "(nodes, externals, live, checks, structure) or None; starts a new trace"},
    {"trace_full", py_trace_full, METH_NOARGS, "whether the trace has reached its cap"},
    {"set_fusion", py_set_fusion, METH_VARARGS, "set_fusion(on, cap): record op calls instead of running them"},
    {"fast_counts", py_counts, METH_NOARGS, "op name -> calls served without Python"},
    {"reset_fast_counts", py_reset_counts, METH_NOARGS, "clear fast_counts()"},
    {"forget", py_forget, METH_NOARGS, "drop every learned executable"},
    {"forget_executable", py_forget_executable, METH_O, "drop the learned executables calling fn"},
    {"memory_stats", py_memory_stats, METH_NOARGS, "(allocated, peak, num_alloc, num_free)"},
    {"new_tensor", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_new_tensor)),
     METH_FASTCALL, "new_tensor(dtype, sizes, strides, nbytes, buf): a neuron tensor holding buf"},
    {"set_buffers", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_set_buffers)),
     METH_FASTCALL, "set_buffers(tensors, buffers): new storage buffers, or False"},
    {"tensor_key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_tensor_key)),
     METH_FASTCALL, "tensor_key(tensor, inputs): a plain neuron tensor's key, or None"},
    {"reset_peak", py_reset_peak, METH_NOARGS, "peak := allocated"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "torchneuron_native", nullptr, -1, methods};

}  // namespace
}  // namespace torchneuron::fast

extern "C" {

// The module object of the fast path (called once, with the GIL held, through ctypes.PyDLL).
PyObject* torchneuron_fastpath_module() {
  PyObject* module = PyModule_Create(&torchneuron::fast::module_def);
  if (module == nullptr) {
    return nullptr;
  }
  PyObject* type = torchneuron::fast::payload_type();
  if (type == nullptr) {
    Py_DECREF(module);
    return nullptr;
  }
  Py_INCREF(type);
  PyModule_AddObject(module, "Payload", type);
  PyObject* pending = torchneuron::fast::pending_type();
  if (pending == nullptr) {
    Py_DECREF(module);
    return nullptr;
  }
  Py_INCREF(pending);
  PyModule_AddObject(module, "Pending", pending);
  return module;
}

}  // extern "C"
