// repeat family: argument checks and the geometry of a tiled copy
// (Tensor.repeat), shared by the CPU and CUDA kernels.
//
// The input, padded on the left with size-1 dims to len(repeats), has extents
// s_d; the output has extents s_d * r_d and y[i] = x[i_d mod s_d for each d].
// Dims with s_d = r_d = 1 are dropped, and a dim with r_{d+1} = 1 is merged into
// the dim before it: output [s_p r_p, s_d] reads (i_p mod s_p) * s_d + i_d, which
// is one dim of extent s_p s_d repeated r_p times. What is left alternates
// "block of contiguous input, repeated" and is usually 1-3 dims.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "baracuda/checks.h"

namespace baracuda {

constexpr int kMaxTileDims = 8;

struct TiledLayout {
  int ndim = 0;
  int64_t size[kMaxTileDims];    // input extent of each collapsed dim
  int64_t repeat[kMaxTileDims];  // how often it is repeated

  int64_t input_numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= size[d];
    return n;
  }
  int64_t tiles() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= repeat[d];
    return n;
  }
  int64_t output_numel() const { return input_numel() * tiles(); }
  // Elements in one output row: the innermost collapsed dim, repeats included.
  int64_t output_row() const { return size[ndim - 1] * repeat[ndim - 1]; }
};

// `op` names the caller in errors. Shapes must already be validated
// (len(repeats) >= input dims, repeats >= 0).
inline TiledLayout collapse_tiling(const char* op, c10::IntArrayRef input_shape, c10::IntArrayRef repeats) {
  const int64_t pad = static_cast<int64_t>(repeats.size()) - static_cast<int64_t>(input_shape.size());
  TiledLayout layout;
  for (int64_t d = 0; d < static_cast<int64_t>(repeats.size()); ++d) {
    const int64_t s = d < pad ? 1 : input_shape[d - pad];
    const int64_t r = repeats[d];
    if (s == 1 && r == 1) continue;
    if (layout.ndim > 0 && r == 1) {
      layout.size[layout.ndim - 1] *= s;
      continue;
    }
    BARACUDA_CHECK_NOT_IMPLEMENTED(layout.ndim < kMaxTileDims, op, ": the input and repeats collapse to more than ",
                                kMaxTileDims, " alternating repeated dims; input shape ", shape_str(input_shape),
                                ", repeats ", shape_str(repeats));
    layout.size[layout.ndim] = s;
    layout.repeat[layout.ndim] = r;
    ++layout.ndim;
  }
  if (layout.ndim == 0) {
    layout.size[0] = 1;
    layout.repeat[0] = 1;
    layout.ndim = 1;
  }
  return layout;
}

constexpr const char* kRepeatOp = "baracuda::repeat";
constexpr const char* kRepeatBackwardOp = "baracuda::repeat_backward";

// Output shape of Tensor.repeat: len(repeats) >= input dims, repeats >= 0.
inline std::vector<int64_t> repeat_output_shape(const char* op, c10::IntArrayRef input_shape,
                                                c10::IntArrayRef repeats) {
  BARACUDA_CHECK_VALUE(repeats.size() >= input_shape.size(), op, ": repeats ", shape_str(repeats), " has ", repeats.size(),
                    " entries but the input has ", input_shape.size(), " dims; expected at least ",
                    input_shape.size());
  const size_t pad = repeats.size() - input_shape.size();
  checked_numel(op, "input_shape", input_shape);
  std::vector<int64_t> out(repeats.size());
  for (size_t d = 0; d < repeats.size(); ++d) {
    BARACUDA_CHECK_VALUE(repeats[d] >= 0, op, ": repeats must be >= 0, got ", shape_str(repeats));
    const int64_t s = d < pad ? 1 : input_shape[d - pad];
    out[d] = checked_mul(op, "an output extent (input size * repeats)", s, repeats[d]);
  }
  checked_numel(op, "the output shape", out);
  return out;
}

// Checks grad against the output shape that input_shape and repeats give.
inline void check_repeat_backward(const at::Tensor& grad, c10::IntArrayRef repeats, c10::IntArrayRef input_shape) {
  check_floating(kRepeatBackwardOp, "grad", grad);
  const auto expected = repeat_output_shape(kRepeatBackwardOp, input_shape, repeats);
  BARACUDA_CHECK_VALUE(grad.sizes() == c10::IntArrayRef(expected), kRepeatBackwardOp, ": grad shape ",
                    shape_str(grad.sizes()), " != expected ", shape_str(expected), " (input_shape ",
                    shape_str(input_shape), " repeated ", shape_str(repeats), ")");
}

}  // namespace baracuda
