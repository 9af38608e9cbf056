"""fractional_max_pool family: ``fractional_max_pool2d`` / ``3d``, bit-exact with PyTorch,
and their backward (deterministic, without atomics).

Per axis, with ``u`` the plane's sample and ``alpha = (in - k) / (out - 1)``, the
window of output ``i`` starts at ``int((i + u) * alpha) - int(u * alpha)``
(``in - k`` for the last), computed in the input's dtype on CPU and in float
(double for float64) on CUDA, as PyTorch does. The output is the window's first
maximum (NaN wins) and the index its position in the plane (``h * W + w``;
3d ``t * H * W + h * W + w``). Samples: 2d ``[..., 0] -> W, [..., 1] -> H``;
3d ``T, H, W``. The backward is ``dx[e] = sum over o with idx[o] == e of dy[o]``
without atomics, in a fixed order: increasing ``o`` on CPU; on CUDA the order of
conflict-free shared-memory rounds (see csrc/cuda/fractional_max_pool/backward_tiles.cuh), which
differs from increasing ``o`` only for inputs picked by three or more cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch

from .. import _dtensor
from .._autograd import DifferentiableOp, differentiable_op
from .._vmap import arg_dims, batch_first, per_sample, sample_meta
from .._errors import BaracudaValueError, check_same_device, raise_typed_error
from .._plan import InvalidProblemError, Plan, PlanPreference, PrecisionGuarantee, Workspace, plan_errors

__all__ = [
    "fractional_max_pool2d",
    "fractional_max_pool3d",
    "FractionalMaxPool2dDescriptor",
    "FractionalMaxPool3dDescriptor",
    "FractionalMaxPoolArgs",
    "FractionalMaxPoolBackwardArgs",
    "FractionalMaxPool2dPlan",
    "FractionalMaxPool2dBackwardPlan",
    "FractionalMaxPool3dPlan",
    "FractionalMaxPool3dBackwardPlan",
]

_AXES = {2: ("height", "width"), 3: ("time", "height", "width")}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _expand(value, dims: int, name: str) -> list:
    """An int (or float) broadcast to ``dims`` entries, or a sequence of exactly ``dims`` entries."""
    if isinstance(value, (list, tuple)):
        if len(value) != dims:
            raise BaracudaValueError(
                f"baracuda::fractional_max_pool{dims}d: {name} must have {dims} entries, got {list(value)}")
        return list(value)
    return [value] * dims


def _functional(dims: int, input, kernel_size, output_size, output_ratio, return_indices, _random_samples):
    op = _POOL[dims]
    if output_size is None and output_ratio is None:
        raise BaracudaValueError(
            f"baracuda::fractional_max_pool{dims}d: requires specifying either an output_size or an output_ratio"
        )
    try:
        if output_size is None:
            ratio = _expand(output_ratio, dims, "output_ratio")
            output_size = [int(input.size(d - dims) * r) for d, r in enumerate(ratio)]
        if _random_samples is None:
            n_batch = 1 if input.dim() == dims + 1 else input.size(0)
            _random_samples = torch.rand(n_batch, input.size(-dims - 1), dims, dtype=input.dtype, device=input.device)
        output, indices = op(input, _expand(kernel_size, dims, "kernel_size"), _expand(output_size, dims, "output_size"),
                             _random_samples)
    except (TypeError, RuntimeError, IndexError, AttributeError) as e:
        raise_typed_error(f"fractional_max_pool{dims}d", e, locals(), ("kernel_size", "output_size"), ("input",))
    return (output, indices) if return_indices else output


def fractional_max_pool2d(input: torch.Tensor, kernel_size, output_size=None, output_ratio=None,
                          return_indices: bool = False, _random_samples: torch.Tensor | None = None):
    """Same as ``torch.nn.functional.fractional_max_pool2d`` (bit-exact given the same
    ``_random_samples``; drawn with ``torch.rand`` like PyTorch when None); differentiable."""
    return _functional(2, input, kernel_size, output_size, output_ratio, return_indices, _random_samples)


def fractional_max_pool3d(input: torch.Tensor, kernel_size, output_size=None, output_ratio=None,
                          return_indices: bool = False, _random_samples: torch.Tensor | None = None):
    """Same as ``torch.nn.functional.fractional_max_pool3d`` (bit-exact given the same
    ``_random_samples``; drawn with ``torch.rand`` like PyTorch when None); differentiable."""
    return _functional(3, input, kernel_size, output_size, output_ratio, return_indices, _random_samples)


def _output_shape(op: str, dims: int, input_shape: Sequence, kernel_size: Sequence, output_size: Sequence) -> list:
    """The op's output shape, with the C++ checks' ValueErrors where they need no guard on symbolic sizes."""
    nd = len(input_shape)
    if nd not in (dims + 1, dims + 2):
        raise BaracudaValueError(
            f"baracuda::{op}: expected a {dims + 1}-D or {dims + 2}-D input, got shape {list(input_shape)}"
        )
    if len(kernel_size) != dims:
        raise BaracudaValueError(f"baracuda::{op}: kernel_size must have {dims} entries, got {list(kernel_size)}")
    if len(output_size) != dims:
        raise BaracudaValueError(f"baracuda::{op}: output_size must have {dims} entries, got {list(output_size)}")
    for axis, size, k, out in zip(_AXES[dims], input_shape[nd - dims:], kernel_size, output_size):
        if all(isinstance(v, int) for v in (size, k, out)) and out + k - 1 > size:
            raise BaracudaValueError(
                f"baracuda::{op}: output_size {out} + kernel_size {k} - 1 > input {axis} {size} "
                f"(need output_size + kernel_size - 1 <= input size)"
            )
    return list(input_shape[: nd - dims]) + list(output_size)


def _register(dims: int) -> tuple[DifferentiableOp, DifferentiableOp]:
    name = f"fractional_max_pool{dims}d"
    bname = f"{name}_backward"

    @torch.library.register_fake(f"baracuda::{name}")
    def _fake(x, kernel_size, output_size, random_samples):
        check_same_device(name, locals())
        shape = _output_shape(name, dims, x.shape, kernel_size, output_size)
        return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)

    @torch.library.register_fake(f"baracuda::{name}.out")
    def _out_fake(x, kernel_size, output_size, random_samples, *, output, indices):
        check_same_device(name, locals())
        return None

    @torch.library.register_fake(f"baracuda::{bname}")
    def _backward_fake(grad_output, x, kernel_size, output_size, indices):
        check_same_device(bname, locals())
        _output_shape(bname, dims, x.shape, kernel_size, output_size)
        return x.new_empty(x.shape)

    @torch.library.register_fake(f"baracuda::{bname}.out")
    def _backward_out_fake(grad_output, x, kernel_size, output_size, indices, *, grad_input, workspace):
        check_same_device(bname, locals())
        return None

    def at_indices(t, indices):
        """t[..., idx[o]] for every output cell o: the pool's derivative (x -> output) applied to
        t, and the adjoint of the backward (grad_output -> grad_input)."""
        return t.flatten(-dims).gather(-1, indices.flatten(-dims)).view_as(indices)

    def setup_context(ctx, inputs, output):
        x, kernel_size, output_size, _ = inputs
        _, indices = output
        ctx.save_for_backward(x, indices)
        ctx.save_for_forward(indices)
        ctx.kernel_size = kernel_size
        ctx.output_size = output_size
        ctx.mark_non_differentiable(indices)

    def backward(ctx, grad_output, _grad_indices):
        x, indices = ctx.saved_tensors
        grad_input = _POOL_BACKWARD[dims](grad_output, x, ctx.kernel_size, ctx.output_size, indices)
        return grad_input, None, None, None

    def jvp(ctx, x_tangent, _kernel_size, _output_size, _samples):
        (indices,) = ctx.saved_tensors  # (jvp sees what setup_context saved for forward)
        return at_indices(x_tangent, indices), None

    def backward_setup_context(ctx, inputs, output):
        _, x, kernel_size, output_size, indices = inputs
        ctx.save_for_backward(x, indices)
        ctx.save_for_forward(x, indices)
        ctx.kernel_size = kernel_size
        ctx.output_size = output_size

    def double_backward(ctx, grad_grad_input):
        # grad_input[idx[o]] += grad_output[o] is linear in grad_output: its adjoint reads
        # grad_grad_input at idx[o].
        _, indices = ctx.saved_tensors
        return at_indices(grad_grad_input, indices), None, None, None, None

    def backward_jvp(ctx, grad_output_tangent, _x, _kernel_size, _output_size, _indices):
        x, indices = ctx.saved_tensors
        return _POOL_BACKWARD[dims](grad_output_tangent, x, ctx.kernel_size, ctx.output_size, indices)  # linear

    # vmap: the samples join the batch of planes ([n * N, C, ...]; a sample of 3-D / 4-D input,
    # [C, ...], makes them the batch), and the random samples with them (each sample's first N).

    pool_op, backward_op = getattr(torch.ops.baracuda, name).default, getattr(torch.ops.baracuda, bname).default

    def fold(t, bdim, n, batched_input):
        t = batch_first(t, bdim, n)
        return t.flatten(0, 1) if batched_input else t

    @torch.library.register_vmap(f"baracuda::{name}")
    def _vmap(info, in_dims, x, kernel_size, output_size, random_samples):
        in_dims = arg_dims(in_dims, 4)
        one, samples_one = sample_meta(x, in_dims[0]), sample_meta(random_samples, in_dims[3])
        _fake(one, kernel_size, output_size, samples_one)  # a sample's shape checks
        batched_input = one.dim() == dims + 2
        planes = one.shape[0] if batched_input else 1
        if list(samples_one.shape[1:]) != [one.shape[-dims - 1], dims] or samples_one.shape[0] < planes:
            return per_sample(pool_op, info.batch_size, in_dims, x, kernel_size, output_size,
                              random_samples)  # the op's error for the random samples
        n = info.batch_size
        samples = batch_first(random_samples, in_dims[3], n)[:, :planes].flatten(0, 1)
        output, indices = pool_op(fold(x, in_dims[0], n, batched_input), kernel_size, output_size, samples)
        if batched_input:
            output, indices = output.unflatten(0, (n, planes)), indices.unflatten(0, (n, planes))
        return (output, indices), (0, 0)

    @torch.library.register_vmap(f"baracuda::{bname}")
    def _backward_vmap(info, in_dims, grad_output, x, kernel_size, output_size, indices):
        in_dims = arg_dims(in_dims, 5)
        one = sample_meta(x, in_dims[1])
        expected = _output_shape(bname, dims, one.shape, kernel_size, output_size)
        given = (sample_meta(grad_output, in_dims[0]).shape, sample_meta(indices, in_dims[4]).shape)
        if any(list(shape) != expected for shape in given):
            return per_sample(backward_op, info.batch_size, in_dims, grad_output, x, kernel_size, output_size,
                              indices)  # the op's shape error
        n = info.batch_size
        batched_input = one.dim() == dims + 2
        shape = [n * one.shape[0], *one.shape[1:]] if batched_input else [n, *one.shape]
        # The backward reads only the shape, dtype and device of x: a stride-0 stand-in of the
        # folded shape saves copying x.
        grad_input = backward_op(
            fold(grad_output, in_dims[0], n, batched_input), x.new_empty(()).expand(shape), kernel_size, output_size,
            fold(indices, in_dims[4], n, batched_input))
        return (grad_input.unflatten(0, (n, one.shape[0])) if batched_input else grad_input), 0

    return (differentiable_op(name, backward, setup_context, jvp),
            differentiable_op(bname, double_backward, backward_setup_context, backward_jvp))


# The ops with their autograd, by dims: module globals, which Dynamo can trace a backward through
# (not closure cells).
_POOL: dict[int, DifferentiableOp] = {}
_POOL_BACKWARD: dict[int, DifferentiableOp] = {}
for _dims in (2, 3):
    _POOL[_dims], _POOL_BACKWARD[_dims] = _register(_dims)


# --------------------------------------------------------------------------- DTensor sharding
#
# Each (sample, channel) plane pools alone with its own random sample: a Shard of the batch or
# channel dim passes through, the samples [N, C, dims] sharded alike, and the indices (positions
# within a plane) and the backward's gradient follow it. The pooled dims are gathered first.


def _register_sharding() -> None:
    from torch.distributed.tensor import Replicate, Shard

    def planes(x_dims: int, dims: int) -> list:
        """(placement of x, of the samples) for each way to shard the planes, Replicate first."""
        found = [(Replicate(), Replicate())]
        if x_dims == dims + 2:
            found += [(Shard(0), Shard(0)), (Shard(1), Shard(1))]
        else:  # an unbatched [C, *spatial] input, samples [1, C, dims]
            found.append((Shard(0), Shard(1)))
        return found

    for dims in (2, 3):
        @_dtensor.rule([getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d").default])
        def _pool_sharding(x, kernel_size, output_size, random_samples, dims=dims):
            return [([p, p], [p, None, None, s]) for p, s in planes(x.ndim, dims)]

        @_dtensor.rule([getattr(torch.ops.baracuda, f"fractional_max_pool{dims}d_backward").default])
        def _pool_backward_sharding(grad_output, x, kernel_size, output_size, indices, dims=dims):
            return [([p], [p, p, None, None, p]) for p, _ in planes(x.ndim, dims)]


_dtensor.when_available(_register_sharding)


# --------------------------------------------------------------------------- Plan API


@dataclass(frozen=True)
class _FractionalMaxPoolDescriptor:
    input_shape: tuple[int, ...]
    kernel_size: tuple[int, ...]
    output_size: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device | str = "cpu"

    dims: ClassVar[int]

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of the output, the indices and grad_output."""
        with plan_errors():
            return tuple(_output_shape(f"fractional_max_pool{self.dims}d", self.dims, self.input_shape,
                                       self.kernel_size, self.output_size))

    @property
    def samples_shape(self) -> tuple[int, ...]:
        batch = self.input_shape[0] if len(self.input_shape) == self.dims + 2 else 1
        return (batch, self.input_shape[-self.dims - 1], self.dims)

    def problem(self) -> list[int]:
        """``[dims, input ndim, *input_shape, *kernel_size, *output_size]``: the kernel choice's input."""
        return [self.dims, len(self.input_shape), *self.input_shape, *self.kernel_size, *self.output_size]


@dataclass(frozen=True)
class FractionalMaxPool2dDescriptor(_FractionalMaxPoolDescriptor):
    """input_shape [C, H, W] or [N, C, H, W]; kernel_size and output_size (H, W)."""

    dims: ClassVar[int] = 2


@dataclass(frozen=True)
class FractionalMaxPool3dDescriptor(_FractionalMaxPoolDescriptor):
    """input_shape [C, T, H, W] or [N, C, T, H, W]; kernel_size and output_size (T, H, W)."""

    dims: ClassVar[int] = 3


@dataclass
class FractionalMaxPoolArgs:
    input: torch.Tensor
    random_samples: torch.Tensor
    output: torch.Tensor
    indices: torch.Tensor


@dataclass
class FractionalMaxPoolBackwardArgs:
    grad_output: torch.Tensor
    input: torch.Tensor
    indices: torch.Tensor
    grad_input: torch.Tensor


class _FractionalMaxPoolPlanBase(Plan):
    index_dtype = torch.int64
    dims: ClassVar[int]
    descriptor: ClassVar[type]

    @classmethod
    def select(cls, desc: _FractionalMaxPoolDescriptor, pref: PlanPreference = PlanPreference()):
        if not isinstance(desc, cls.descriptor):
            raise InvalidProblemError(f"baracuda::{cls.op}: expected a {cls.descriptor.__name__}, got {desc!r}")
        desc.output_shape  # validates
        if desc.dtype not in _FLOATS:
            raise InvalidProblemError(
                f"baracuda::{cls.op}: dtype must be float16, bfloat16, float32 or float64, got {desc.dtype}"
            )
        return cls(desc, pref, desc.problem())


class _FractionalMaxPoolPlan(_FractionalMaxPoolPlanBase):
    """Writes the pooled output and the int64 per-plane indices into ``args``.

    Variants: CPU ``cpu_plane_window_max``. CUDA: the launch config of
    csrc/include/baracuda/fractional_max_pool_policy.h, described as ``kind<name=value,...>``.
    ``window_max_segments`` and ``window_max_resident``: windows unrolled when every pooled
    axis has kernel size 2 or 3 (``k``; all of a thread's window loads issued before the
    first compare), scanned in loops otherwise (``k=0``); each block keeps its plane's window
    starts in shared memory (``table=1``) unless the output axes hold more of them than a
    block has cells to pool (256 to 1024); disjoint windows (kernel size <= stride) get a
    block per segment of cells (``window_max_segments``), overlapping ones spread their
    segments over two waves of resident blocks (``window_max_resident``).
    ``band_window_max`` (2d): bands of output rows whose input rows are staged in shared
    memory. ``index32=0``: 64-bit index math. No workspace.
    """

    def precision_guarantee(self) -> PrecisionGuarantee:
        # A selection, not arithmetic: exact in every dtype.
        return PrecisionGuarantee(self.desc.dtype, self.desc.dtype, True, True)

    def can_implement(self, args: FractionalMaxPoolArgs) -> None:
        d = self.desc
        self._check_tensor("input", args.input, d.input_shape, d.dtype)
        self._check_tensor("random_samples", args.random_samples, d.samples_shape, d.dtype)
        self._check_tensor("output", args.output, d.output_shape, d.dtype)
        self._check_tensor("indices", args.indices, d.output_shape, torch.int64)

    def run(self, args: FractionalMaxPoolArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        d = self.desc
        with plan_errors():
            getattr(torch.ops.baracuda, self.op).out(
                args.input, list(d.kernel_size), list(d.output_size), args.random_samples,
                output=args.output, indices=args.indices,
            )


class _FractionalMaxPoolBackwardPlan(_FractionalMaxPoolPlanBase):
    """Writes the gradient w.r.t. the input into ``args.grad_input`` (deterministic: bit-identical run to run).

    Variants: CPU ``cpu_plane_ordered_scatter`` (no workspace). CUDA: the launch config of
    csrc/include/baracuda/fractional_max_pool_policy.h, described as ``kind<name=value,...>``
    (``index32=0``: 64-bit index math). ``tile_counts``: each block writes one tile of a plane. Each
    output cell whose window can reach the tile counts itself at the element its index
    names, and the first to reach an element stores its gradient there; an element of
    two contributions then adds the second (either order gives the same sum), one of more
    is summed again from zero over the cells that can reach it, in increasing output-cell
    order, as the CPU kernel adds (the results are bit-identical).
    ``tile_stores`` when the windows are disjoint (kernel size <=
    stride on every axis): each cell stores its gradient, a shared-memory bitmap marking
    the elements already written; a second contribution to an element is added after the
    stores. ``owned_boxes`` when the stride is an integer from the
    kernel size to 4 on every axis, and 2 (= the kernel size) along W: the boxes of
    ``stride`` elements per axis that start at each cell's window partition the plane,
    and each cell writes its box whole (its gradient at its index, zeros elsewhere; no
    shared memory, no atomics). The workspace is one int32 flag per tile (per block of
    1024 cells for ``owned_boxes``; ``planes * tiles_per_plane * 4`` bytes), set when a
    tile sees an index outside the plane, or in another tile and outside its cell's
    window (indices not made by the forward); in ``tile_counts`` also an element of three
    or more contributions one of which lies outside its cell's window;
    in ``tile_stores`` a third contribution to one element: such planes are recomputed by
    an ordered full scan (by a second kernel; where a plane is one tile, by that tile's
    block itself, and the second kernel is not launched). In ``owned_boxes`` an index
    moved into a neighbouring box by float rounding of the window start only has its
    element summed again, in order.
    """

    def can_implement(self, args: FractionalMaxPoolBackwardArgs) -> None:
        d = self.desc
        self._check_tensor("grad_output", args.grad_output, d.output_shape, d.dtype)
        self._check_tensor("input", args.input, d.input_shape, d.dtype)
        self._check_tensor("indices", args.indices, d.output_shape, torch.int64)
        self._check_tensor("grad_input", args.grad_input, d.input_shape, d.dtype)

    def run(self, args: FractionalMaxPoolBackwardArgs, workspace: Workspace | None = None) -> None:
        self.can_implement(args)
        buffer = self._workspace(workspace)
        d = self.desc
        with plan_errors():
            getattr(torch.ops.baracuda, self.op).out(
                args.grad_output, args.input, list(d.kernel_size), list(d.output_size), args.indices,
                grad_input=args.grad_input, workspace=buffer,
            )


class FractionalMaxPool2dPlan(_FractionalMaxPoolPlan):
    op = "fractional_max_pool2d"
    dims = 2
    descriptor = FractionalMaxPool2dDescriptor


class FractionalMaxPool2dBackwardPlan(_FractionalMaxPoolBackwardPlan):
    op = "fractional_max_pool2d_backward"
    dims = 2
    descriptor = FractionalMaxPool2dDescriptor


class FractionalMaxPool3dPlan(_FractionalMaxPoolPlan):
    op = "fractional_max_pool3d"
    dims = 3
    descriptor = FractionalMaxPool3dDescriptor


class FractionalMaxPool3dBackwardPlan(_FractionalMaxPoolBackwardPlan):
    op = "fractional_max_pool3d_backward"
    dims = 3
    descriptor = FractionalMaxPool3dDescriptor
