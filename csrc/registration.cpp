// Every baracuda operator schema, in one place. Kernels are registered per
// backend in csrc/cpu/<family>.cpp and csrc/cuda/<family>.cu; fake (meta)
// implementations and autograd live in baracuda_ops/ops/<family>.py.
#include <Python.h>

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/Exceptions.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <tuple>
#include <vector>

#include "baracuda/alibi_policy.h"
#include "baracuda/cpu_utils.h"
#include "baracuda/embedding_bag_policy.h"
#include "baracuda/errors.h"
#include "baracuda/fractional_max_pool_policy.h"
#include "baracuda/launch_policy.h"
#include "baracuda/repeat_policy.h"
#include "baracuda/rms_norm_fused_policy.h"
#include "baracuda/rms_norm_policy.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// The Python class of each ErrorKind (baracuda_ops._errors), set once at import
// by _C._set_error_types; the builtin type until then.
std::array<PyObject*, 4> error_types = {nullptr, nullptr, nullptr, nullptr};

struct TypedError : torch::PyTorchError {
  TypedError(ErrorKind kind, std::string msg) : torch::PyTorchError(std::move(msg)), kind(kind) {}
  PyObject* python_type() override {
    PyObject* t = error_types[static_cast<size_t>(kind)];
    if (t != nullptr) return t;
    switch (kind) {
      case ErrorKind::kIndex: return PyExc_IndexError;
      case ErrorKind::kType: return PyExc_TypeError;
      case ErrorKind::kNotImplemented: return PyExc_NotImplementedError;
      default: return PyExc_ValueError;
    }
  }
  ErrorKind kind;
};

PyObject* set_error_types(PyObject*, PyObject* args) {
  PyObject* types[4];
  if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyType_Type, &types[0], &PyType_Type, &types[1], &PyType_Type, &types[2],
                        &PyType_Type, &types[3])) {
    return nullptr;
  }
  for (size_t k = 0; k < error_types.size(); ++k) {
    Py_INCREF(types[k]);
    Py_XDECREF(error_types[k]);
    error_types[k] = types[k];
  }
  Py_RETURN_NONE;
}

}  // namespace

void throw_error(ErrorKind kind, const std::string& msg) { throw TypedError(kind, msg); }

namespace {

// The kernel a launcher would choose for `problem` on `device`, and its
// workspace bytes. Errors if the op has no kernel for that device type.
std::tuple<std::string, int64_t> kernel_choice(c10::string_view op, c10::Device device, c10::IntArrayRef problem,
                                               c10::ScalarType dtype) {
  const auto& selectors = variant_selectors();
  const auto it = selectors.find({std::string(op), device.type()});
  BARACUDA_CHECK_NOT_IMPLEMENTED(it != selectors.end(), "baracuda::_kernel_choice: no ", device.type(),
                              " kernel is registered for ", op, " in this build");
  c10::OptionalDeviceGuard guard;
  if (device.has_index()) guard.reset_device(device);
  KernelChoice choice = it->second(problem, dtype);
  return {choice.variant, choice.workspace_bytes};
}

// The CUDA launch config that `op`'s policy returns for `problem` with the
// recorded facts of `facts` ("h100" or "h200"), on any build: (kind, parameter
// names, parameter values, workspace bytes).
std::tuple<std::string, std::vector<std::string>, std::vector<int64_t>, int64_t> launch_config(
    c10::string_view op, c10::IntArrayRef problem, c10::ScalarType dtype, c10::string_view facts) {
  const auto& policies = launch_policies();
  const auto it = policies.find(std::string(op));
  BARACUDA_CHECK_NOT_IMPLEMENTED(it != policies.end(), "baracuda::_launch_config: no CUDA launch policy for ", op);
  BARACUDA_CHECK_VALUE(facts == "h100" || facts == "h200", "baracuda::_launch_config: facts must be \"h100\" or "
                       "\"h200\", got \"", facts, "\"");
  const LaunchConfigView view = it->second(problem, dtype, facts == "h100" ? kH100Facts : kH200Facts);
  std::vector<std::string> names;
  std::vector<int64_t> values;
  for (const auto& [name, value] : view.params) {
    names.push_back(name);
    values.push_back(value);
  }
  return {view.kind, names, values, view.workspace_bytes};
}

// Every family's launch policy, by op name (baracuda/<family>_policy.h).
void register_launch_policies() {
  auto& policies = launch_policies();
  (void)policies;  // families add: policies["op"] = &op_launch_view;
  policies["alibi"] = &alibi_launch_view;
  policies["alibi_backward"] = &alibi_backward_launch_view;
  policies["repeat"] = &repeat_launch_view;
  policies["repeat_backward"] = &repeat_backward_launch_view;
  policies["embedding_bag"] = &embedding_bag_launch_view;
  policies["embedding_bag_backward"] = &embedding_bag_backward_launch_view;
  policies["embedding_bag_per_sample_weights_backward"] = &embedding_bag_psw_backward_launch_view;
  policies["fractional_max_pool2d"] = &fmp_launch_view;
  policies["fractional_max_pool3d"] = &fmp_launch_view;
  policies["fractional_max_pool2d_backward"] = &fmp_backward_launch_view;
  policies["fractional_max_pool3d_backward"] = &fmp_backward_launch_view;
  policies["rms_norm"] = &rms_norm_launch_view;
  policies["rms_norm_backward"] = &rms_norm_backward_launch_view;
  policies["rms_norm_fused"] = &rms_norm_fused_launch_view;
  policies["rms_norm_quant"] = &rms_norm_fused_launch_view;
  policies["rms_norm_fused_backward"] = &rms_norm_fused_backward_launch_view;
}

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY(baracuda, m) {
  m.def("_kernel_choice(str op, Device device, int[] problem, ScalarType dtype) -> (str, int)",
        &baracuda::kernel_choice);
  baracuda::register_launch_policies();
  m.def("_launch_config(str op, int[] problem, ScalarType dtype, str facts) -> (str, str[], int[], int)",
        &baracuda::launch_config);

  // repeat
  m.def("repeat(Tensor self, SymInt[] repeats) -> Tensor");
  m.def("repeat.out(Tensor self, SymInt[] repeats, *, Tensor(a!) out) -> ()");
  m.def("repeat_backward(Tensor grad, SymInt[] repeats, SymInt[] input_shape) -> Tensor");
  m.def(
      "repeat_backward.out(Tensor grad, SymInt[] repeats, SymInt[] input_shape, *, Tensor(a!) grad_input, "
      "Tensor(b!) workspace) -> ()");

  // rms_norm
  m.def("rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> (Tensor output, Tensor rstd)");
  m.def(
      "rms_norm.out(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None, *, "
      "Tensor(a!) output, Tensor(b!) rstd) -> ()");
  m.def(
      "rms_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor rstd, Tensor? weight, "
      "bool[2] output_mask) -> (Tensor grad_input, Tensor grad_weight)");
  m.def(
      "rms_norm_backward.out(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor rstd, Tensor? weight, "
      "bool[2] output_mask, *, Tensor(a!) grad_input, Tensor(b!) grad_weight, Tensor(c!) workspace) -> ()");
  // (rms_norm schemas end)

  // rms_norm_fused: residual add, weight offset, per-head weight, Hugging Face casting
  // (baracuda/rms_norm_fused.h). residual_out is h = input + residual in the residual's dtype,
  // an empty [0] tensor without a residual. casting: "torch", "llama" or "gemma".
  m.def(
      "rms_norm_fused(Tensor input, Tensor? residual, SymInt[] normalized_shape, Tensor? weight=None, "
      "float? eps=None, float weight_offset=0., str casting=\"torch\") -> "
      "(Tensor output, Tensor residual_out, Tensor rstd)");
  m.def(
      "rms_norm_fused.out(Tensor input, Tensor? residual, SymInt[] normalized_shape, Tensor? weight=None, "
      "float? eps=None, float weight_offset=0., str casting=\"torch\", *, Tensor(a!) output, "
      "Tensor(b!) residual_out, Tensor(c!) rstd) -> ()");
  // h: residual_out, or the input without a residual; output_mask: grad_input, grad_residual, grad_weight.
  m.def(
      "rms_norm_fused_backward(Tensor grad_out, Tensor? grad_residual_out, Tensor h, SymInt[] normalized_shape, "
      "Tensor rstd, Tensor? weight, float weight_offset, str casting, ScalarType input_dtype, bool[3] output_mask) "
      "-> (Tensor grad_input, Tensor grad_residual, Tensor grad_weight)");
  m.def(
      "rms_norm_fused_backward.out(Tensor grad_out, Tensor? grad_residual_out, Tensor h, SymInt[] normalized_shape, "
      "Tensor rstd, Tensor? weight, float weight_offset, str casting, ScalarType input_dtype, bool[3] output_mask, "
      "*, Tensor(a!) grad_input, Tensor(b!) grad_residual, Tensor(c!) grad_weight, Tensor(d!) workspace) -> ()");
  // rms_norm_quant: rms_norm_fused's y as float8_e4m3fn, y / scale saturated to +-448; scale: a float32
  // tensor of one element, or None for a scale per row (max|y| / 448), returned in scale_out (else [0]).
  m.def(
      "rms_norm_quant(Tensor input, Tensor? residual, SymInt[] normalized_shape, Tensor? weight=None, "
      "float? eps=None, float weight_offset=0., str casting=\"torch\", Tensor? scale=None) -> "
      "(Tensor output, Tensor residual_out, Tensor scale_out)");
  m.def(
      "rms_norm_quant.out(Tensor input, Tensor? residual, SymInt[] normalized_shape, Tensor? weight=None, "
      "float? eps=None, float weight_offset=0., str casting=\"torch\", Tensor? scale=None, *, Tensor(a!) output, "
      "Tensor(b!) residual_out, Tensor(c!) scale_out) -> ()");
  // (rms_norm_fused schemas end)

  // embedding_bag
  // bag_mode: 0 sum, 1 mean, 2 max; padding_idx: -1 none, else in [0, num_embeddings).
  // offsets: None exactly when indices is 2-D [num_bags, bag_length]. max_positions: [B, D] in
  // max mode (position in the flattened indices, -1 for an empty bag), [0] otherwise.
  m.def(
      "embedding_bag(Tensor weight, Tensor indices, Tensor? offsets, int bag_mode=0, Tensor? per_sample_weights=None, "
      "bool include_last_offset=False, int padding_idx=-1) -> "
      "(Tensor output, Tensor offset2bag, Tensor bag_size, Tensor max_positions)");
  m.def(
      "embedding_bag.out(Tensor weight, Tensor indices, Tensor? offsets, int bag_mode=0, "
      "Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1, *, Tensor(a!) output, "
      "Tensor(b!) offset2bag, Tensor(c!) bag_size, Tensor(d!) max_positions) -> ()");
  m.def(
      "embedding_bag_backward(Tensor grad, Tensor indices, Tensor offset2bag, Tensor bag_size, "
      "Tensor max_positions, SymInt num_weights, int bag_mode, Tensor? per_sample_weights=None, int padding_idx=-1) "
      "-> Tensor");
  m.def(
      "embedding_bag_backward.out(Tensor grad, Tensor indices, Tensor offset2bag, Tensor bag_size, "
      "Tensor max_positions, SymInt num_weights, int bag_mode, Tensor? per_sample_weights=None, int padding_idx=-1, *, "
      "Tensor(a!) grad_weight, Tensor(b!) workspace) -> ()");
  m.def(
      "embedding_bag_per_sample_weights_backward(Tensor grad, Tensor weight, Tensor indices, Tensor offset2bag, "
      "int bag_mode, int padding_idx=-1) -> Tensor");
  m.def(
      "embedding_bag_per_sample_weights_backward.out(Tensor grad, Tensor weight, Tensor indices, "
      "Tensor offset2bag, int bag_mode, int padding_idx=-1, *, Tensor(a!) grad_per_sample_weights) -> ()");
  // F.embedding_bag's weight gradient with scale_grad_by_freq (dense, rows divided by their counts
  // in indices) or sparse (a COO tensor, one entry per position); neither: embedding_bag_backward's.
  m.def(
      "embedding_bag_weight_backward(Tensor grad, Tensor indices, Tensor offset2bag, Tensor bag_size, "
      "Tensor max_positions, SymInt num_weights, int bag_mode, Tensor? per_sample_weights, int padding_idx, "
      "bool scale_grad_by_freq, bool sparse) -> Tensor");
  // embedding_bag whose weight gradient is embedding_bag_weight_backward's (F.embedding_bag's
  // scale_grad_by_freq / sparse); the forward is embedding_bag's.
  m.def(
      "embedding_bag_with_options(Tensor weight, Tensor indices, Tensor? offsets, int bag_mode, "
      "Tensor? per_sample_weights, bool include_last_offset, int padding_idx, bool scale_grad_by_freq, "
      "bool sparse) -> (Tensor output, Tensor offset2bag, Tensor bag_size, Tensor max_positions)");
  // embedding_bag's output alone, for calls that want no gradient (F.embedding_bag's
  // _embedding_bag_forward_only): the CPU kernel writes neither offset2bag nor bag_size; other
  // devices run embedding_bag. No gradient flows through it.
  m.def(
      "embedding_bag_forward_only(Tensor weight, Tensor indices, Tensor? offsets, int bag_mode=0, "
      "Tensor? per_sample_weights=None, bool include_last_offset=False, int padding_idx=-1) -> Tensor");
  // (embedding_bag schemas end)

  // fractional_max_pool
  m.def(
      "fractional_max_pool2d(Tensor self, int[2] kernel_size, SymInt[2] output_size, Tensor random_samples) -> "
      "(Tensor output, Tensor indices)");
  m.def(
      "fractional_max_pool2d.out(Tensor self, int[2] kernel_size, SymInt[2] output_size, Tensor random_samples, *, "
      "Tensor(a!) output, Tensor(b!) indices) -> ()");
  m.def(
      "fractional_max_pool2d_backward(Tensor grad_output, Tensor self, int[2] kernel_size, SymInt[2] output_size, "
      "Tensor indices) -> Tensor");
  m.def(
      "fractional_max_pool2d_backward.out(Tensor grad_output, Tensor self, int[2] kernel_size, SymInt[2] "
      "output_size, Tensor indices, *, Tensor(a!) grad_input, Tensor(b!) workspace) -> ()");
  m.def(
      "fractional_max_pool3d(Tensor self, int[3] kernel_size, SymInt[3] output_size, Tensor random_samples) -> "
      "(Tensor output, Tensor indices)");
  m.def(
      "fractional_max_pool3d.out(Tensor self, int[3] kernel_size, SymInt[3] output_size, Tensor random_samples, *, "
      "Tensor(a!) output, Tensor(b!) indices) -> ()");
  m.def(
      "fractional_max_pool3d_backward(Tensor grad_output, Tensor self, int[3] kernel_size, SymInt[3] output_size, "
      "Tensor indices) -> Tensor");
  m.def(
      "fractional_max_pool3d_backward.out(Tensor grad_output, Tensor self, int[3] kernel_size, SymInt[3] "
      "output_size, Tensor indices, *, Tensor(a!) grad_input, Tensor(b!) workspace) -> ()");
  // (fractional_max_pool schemas end)

  // alibi
  m.def("alibi(Tensor scores, Tensor slopes) -> Tensor");
  m.def("alibi.out(Tensor scores, Tensor slopes, *, Tensor(a!) out) -> ()");
  // In-place variant (baracuda_ops.alibi_). Not named `alibi_`: torch.compile treats a
  // trailing underscore as ATen's in-place convention (returns self), and a custom
  // op returning an alias of its input cannot be functionalized on torch 2.11.
  m.def("alibi_inplace(Tensor(a!) scores, Tensor slopes) -> ()");
  m.def("alibi_backward(Tensor grad, Tensor slopes, bool[2] output_mask) -> (Tensor grad_scores, Tensor grad_slopes)");
  m.def(
      "alibi_backward.out(Tensor grad, Tensor slopes, bool[2] output_mask, *, Tensor(a!) grad_scores, "
      "Tensor(b!) grad_slopes, Tensor(c!) workspace) -> ()");
  // (alibi schemas end)
}

// The extension module itself only carries build facts; importing it runs the
// registrations above.
#ifdef BARACUDA_WITH_CUDA
#define BARACUDA_PY_WITH_CUDA 1
#else
#define BARACUDA_PY_WITH_CUDA 0
#define BARACUDA_CUDA_ARCHS ""
#endif
// at::parallel_for runs its loops on ATen's threads only in code built with OpenMP.
#ifdef _OPENMP
#define BARACUDA_PY_OPENMP 1
#else
#define BARACUDA_PY_OPENMP 0
#endif

extern "C" PyObject* PyInit__C(void) {
  static PyMethodDef methods[] = {
      {"_set_error_types", baracuda::set_error_types, METH_VARARGS,
       "_set_error_types(value, index, type, not_implemented): the Python classes the ops' errors raise"},
      {nullptr, nullptr, 0, nullptr}};
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "baracuda_ops native kernels", -1, methods};
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  if (PyModule_AddIntConstant(m, "with_cuda", BARACUDA_PY_WITH_CUDA) < 0 ||
      PyModule_AddIntConstant(m, "with_openmp", BARACUDA_PY_OPENMP) < 0 ||
      PyModule_AddStringConstant(m, "cuda_archs", BARACUDA_CUDA_ARCHS) < 0 ||
      PyModule_AddStringConstant(m, "cpu_vector_isa", baracuda::cpu::vector_isa_name(baracuda::cpu::vector_isa())) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
