// Every baracuda operator schema, in one place. Kernels are registered per
// backend in csrc/cpu/<family>.cpp and csrc/cuda/<family>.cu; fake (meta)
// implementations and autograd live in baracuda_ops/ops/<family>.py.
#include <Python.h>

#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "baracuda/cpu_utils.h"
#include "baracuda/variant.h"

namespace baracuda {
namespace {

// The kernel a launcher would choose for `problem` on `device`, and its
// workspace bytes. Errors if the op has no kernel for that device type.
std::tuple<std::string, int64_t> kernel_choice(c10::string_view op, c10::Device device, c10::IntArrayRef problem,
                                               c10::ScalarType dtype) {
  const auto& selectors = variant_selectors();
  const auto it = selectors.find({std::string(op), device.type()});
  TORCH_CHECK_NOT_IMPLEMENTED(it != selectors.end(), "baracuda::_kernel_choice: no ", device.type(),
                              " kernel is registered for ", op, " in this build");
  c10::OptionalDeviceGuard guard;
  if (device.has_index()) guard.reset_device(device);
  KernelChoice choice = it->second(problem, dtype);
  return {choice.variant, choice.workspace_bytes};
}

}  // namespace
}  // namespace baracuda

TORCH_LIBRARY(baracuda, m) {
  m.def("_kernel_choice(str op, Device device, int[] problem, ScalarType dtype) -> (str, int)",
        &baracuda::kernel_choice);

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
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "baracuda_ops native kernels", -1, nullptr};
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
