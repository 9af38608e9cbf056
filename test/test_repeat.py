import math

import pytest
import torch
from expecttest import TestCase

import baracuda_ops
from helpers import FLOAT_DTYPES, assert_close, poison, random, require_free_gpu_memory
from launch_configs import RECORDED_L2_BYTES, launch_config

# (input shape, repeats): plain, extra leading dims, zero repeats, zero-size input,
# odd sizes, the benchmark layouts (bias-like, row/column/image tiling, leading expansion).
CASES = [
    ((3,), (2,)),
    ((3, 4), (2, 1)),
    ((3, 4), (1, 3)),
    ((3, 4), (2, 2, 3)),
    ((2, 3, 5), (2, 1, 2)),
    ((7,), (0,)),
    ((3, 4), (0, 2)),
    ((0, 4), (2, 3)),
    ((), (3, 2)),
    ((1, 1), (1, 1)),
    ((5, 1, 3), (1, 4, 1)),
    ((64,), (33, 1)),
    ((4, 16), (2, 3)),
    ((2, 3, 8, 8), (1, 1, 2, 2)),
    ((16, 16), (3, 1, 1)),
    ((1, 2, 3, 1, 2), (2, 1, 2, 3, 1, 2)),
    ((3, 2, 6), (2, 1, 3)),  # a 6-element run: 4-byte vectors (16-bit), 8-byte (32-bit), 16-byte (64-bit)
    ((2, 5, 12), (1, 2, 2)),  # a 12-element run: 8-byte vectors (16-bit), 16-byte (32-bit)
]

ALL_DTYPES = FLOAT_DTYPES + (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex128)


@pytest.mark.parametrize("shape,repeats", CASES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_forward_equals_tensor_repeat(device, shape, repeats, dtype):
    x = random(shape, dtype, device)
    torch.testing.assert_close(baracuda_ops.repeat(x, repeats), x.repeat(*repeats), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_non_contiguous_and_offset(device, dtype):
    base = random((9, 6), dtype, device)
    for x in (base.t(), base[1:, 1:], base[:, ::2], base.view(-1)[3:].view(3, 17)):
        torch.testing.assert_close(baracuda_ops.repeat(x, (2, 3)), x.repeat(2, 3), rtol=0, atol=0)


@pytest.mark.parametrize("shape,repeats", CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_float64_reference(device, shape, repeats, dtype):
    x = random(shape, dtype, device, requires_grad=True)
    y = baracuda_ops.repeat(x, repeats)
    grad = random(y.shape, dtype, device)
    (dx,) = torch.autograd.grad(y, x, grad)
    x64 = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(x64.repeat(*repeats), x64, grad.double())
    tiles = max(1, y.numel() // max(1, x.numel()))
    assert dx.dtype == dtype and dx.shape == x.shape
    # A sum of `tiles` values rounded once: the error grows with sqrt(tiles) at most.
    assert_close(dx, ref, scale=max(1.0, tiles**0.5))


@pytest.mark.parametrize("shape,repeats", [((4096,), (8192, 1)), ((8, 256), (1, 16)), ((2, 3, 8, 8), (2, 1, 2, 2))])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_backward_bit_identical_twice(device, shape, repeats, dtype):
    grad = random([s * r for s, r in zip([1] * (len(repeats) - len(shape)) + list(shape), repeats)], dtype, device)
    a = torch.ops.baracuda.repeat_backward(grad, repeats, shape)
    b = torch.ops.baracuda.repeat_backward(grad, repeats, shape)
    assert torch.equal(a.view(torch.uint8) if dtype != torch.float32 else a.view(torch.int32),
                       b.view(torch.uint8) if dtype != torch.float32 else b.view(torch.int32))
    # Accumulated in float32 and rounded once: float32 summation error plus one rounding to dtype.
    x64 = torch.zeros(shape, dtype=torch.float64, device=device, requires_grad=True)
    (ref,) = torch.autograd.grad(x64.repeat(*repeats), x64, grad.double())
    tiles = grad.numel() // a.numel()
    torch.testing.assert_close(a.double(), ref, rtol=torch.finfo(dtype).eps, atol=4 * tiles * 2**-23)


def _tile_sum_in_order(grad, repeats, shape):
    """dx as the CPU kernel defines it: the tiles added one at a time, in row-major order over
    the repeat grid, to a zero of the accumulate type (float64 for float64, else float32), then
    rounded once to grad's dtype."""
    full = [1] * (len(repeats) - len(shape)) + list(shape)
    split = grad.reshape([d for r, s in zip(repeats, full) for d in (r, s)])
    tiles = split.permute(list(range(0, 2 * len(full), 2)) + list(range(1, 2 * len(full), 2))).reshape(-1, *full)
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    acc = torch.zeros(full, dtype=acc_dtype, device=grad.device)
    for tile in tiles:
        acc += tile.to(acc_dtype)
    return acc.to(grad.dtype).reshape(shape)


def _bits(t):
    return t.contiguous().view(-1).view(torch.uint8)


# Rows of every length up to past two 64-byte vectors (the vector loops' tails), rows
# longer than the forward's 16384-element pieces, rows walked across several outer dims
# (a thread's first row found mid-way), many tiles.
THREAD_CASES = [((3, n), (2, 3)) for n in (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 65)] + [
    ((2, 40000), (2, 2)),
    ((5, 7, 3), (3, 4, 5)),
    ((3, 4, 5, 6), (2, 3, 2, 2)),
    ((37, 129, 5), (4, 3, 2)),
    ((200,), (300, 1)),
    ((1, 1, 70), (60, 2, 1, 1)),
    ((2, 3), (257, 256)),  # more tiles than the CPU kernel lists (65536): their offsets walked per block
]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape,repeats", THREAD_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cpu_same_bits_as_the_ordered_tile_sum_on_one_and_two_threads(shape, repeats, dtype, restore_threads):
    x = random(shape, dtype, "cpu")
    grad = random(x.repeat(*repeats).shape, dtype, "cpu")
    grad.view(-1)[::5] = -0.0  # signed zeros: the sums start from +0.0, as the kernel's do
    expected = _tile_sum_in_order(grad, repeats, shape)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        assert torch.equal(_bits(torch.ops.baracuda.repeat(x, list(repeats))), _bits(x.repeat(*repeats)))
        dx = torch.ops.baracuda.repeat_backward(grad, list(repeats), list(shape))
        assert torch.equal(_bits(dx), _bits(expected)), (threads, shape, repeats)


def test_backward_of_non_contiguous_grad(device):
    x = random((3, 5), torch.float64, device, requires_grad=True)
    grad = random((10, 6), torch.float64, device).t()
    assert not grad.is_contiguous()
    (dx,) = torch.autograd.grad(baracuda_ops.repeat(x, (2, 2)), x, grad)
    (ref,) = torch.autograd.grad(x.repeat(2, 2), x, grad)
    assert_close(dx, ref)


def test_vmap_errors(device):
    x = random((3, 4, 5), torch.float32, device)
    with pytest.raises(ValueError, match=r"repeats \[2\] has 1 entries but the input has 2 dims"):
        torch.func.vmap(lambda x: baracuda_ops.repeat(x, (2,)))(x)
    with pytest.raises(ValueError, match=r"grad shape \[8, 10\] != expected \[8, 8\]"):
        torch.func.vmap(lambda g: torch.ops.baracuda.repeat_backward(g, [2, 2], [4, 4]))(random((3, 8, 10),
                                                                                               torch.float32, device))


# ---------------------------------------------------------------------------- Plan API


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_plan_run_writes_every_element(device, dtype):
    desc = baracuda_ops.RepeatDescriptor((5, 6), (2, 3, 1), dtype, device)
    plan = baracuda_ops.RepeatPlan.select(desc)
    x = random((5, 6), dtype, device)
    out = poison(torch.empty(desc.output_shape, dtype=dtype, device=device))
    plan.run(baracuda_ops.RepeatArgs(x, out))
    torch.testing.assert_close(out, x.repeat(2, 3, 1), rtol=0, atol=0)
    sku = plan.sku()
    assert sku.op == "repeat" and sku.device_type == device.type and sku.variant
    assert plan.workspace_size() == 0
    assert plan.precision_guarantee().deterministic


@pytest.mark.parametrize("shape,repeats", [((5, 6), (2, 3, 1)), ((4096,), (8192, 1))])
def test_backward_plan_with_caller_workspace(device, shape, repeats):
    desc = baracuda_ops.RepeatBackwardDescriptor(shape, repeats, torch.float32, device)
    plan = baracuda_ops.RepeatBackwardPlan.select(desc)
    grad = random(desc.grad_shape, torch.float32, device)
    gi = poison(torch.empty(shape, device=device))
    ws = baracuda_ops.Workspace.allocate(plan.workspace_size(), device)
    plan.run(baracuda_ops.RepeatBackwardArgs(grad, gi), ws)
    torch.testing.assert_close(gi, torch.ops.baracuda.repeat_backward(grad, repeats, shape), rtol=0, atol=0)
    assert plan.precision_guarantee().accumulator_dtype == torch.float32
    if plan.workspace_size() > 0:
        assert launch_config("repeat_backward", [len(shape), *shape, *repeats], torch.float32)["splits"] > 1
        with pytest.raises(baracuda_ops.WorkspaceTooSmallError):
            plan.run(baracuda_ops.RepeatBackwardArgs(grad, gi), baracuda_ops.Workspace.allocate(1, device))
        with pytest.raises(baracuda_ops.UnsupportedError):
            baracuda_ops.RepeatBackwardPlan.select(desc, baracuda_ops.PlanPreference(max_workspace_bytes=0))


def test_plan_errors(device):
    plan = baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((3, 4), (2, 2), torch.float32, device))
    x = random((3, 4), torch.float32, device)
    with pytest.raises(baracuda_ops.BufferTooSmallError):
        plan.run(baracuda_ops.RepeatArgs(x, torch.empty(5, 8, device=device)))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.RepeatArgs(x, torch.empty(6, 8, dtype=torch.float64, device=device)))
    with pytest.raises(baracuda_ops.InvalidProblemError):
        plan.run(baracuda_ops.RepeatArgs(x.double(), torch.empty(6, 8, device=device)))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="repeats must be >= 0"):
        baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((3,), (-1,), torch.float32, device))
    with pytest.raises(baracuda_ops.InvalidProblemError, match="float16, bfloat16"):
        baracuda_ops.RepeatBackwardPlan.select(baracuda_ops.RepeatBackwardDescriptor((3,), (2,), torch.int32, device))
    assert issubclass(baracuda_ops.InvalidProblemError, ValueError)
    assert issubclass(baracuda_ops.UnsupportedError, NotImplementedError)


# ---------------------------------------------------------------------------- schemas and errors


class TestRepeatMessages(TestCase):
    def test_schemas(self):
        self.assertExpectedInline(
            "\n".join(
                str(op._schema)
                for op in (
                    torch.ops.baracuda.repeat.default,
                    torch.ops.baracuda.repeat.out,
                    torch.ops.baracuda.repeat_backward.default,
                    torch.ops.baracuda.repeat_backward.out,
                )
            ),
            """\
baracuda::repeat(Tensor self, SymInt[] repeats) -> Tensor
baracuda::repeat.out(Tensor self, SymInt[] repeats, *, Tensor(a!) out) -> ()
baracuda::repeat_backward(Tensor grad, SymInt[] repeats, SymInt[] input_shape) -> Tensor
baracuda::repeat_backward.out(Tensor grad, SymInt[] repeats, SymInt[] input_shape, *, Tensor(a!) grad_input, Tensor(b!) workspace) -> ()""",
        )

    def test_negative_repeats(self):
        x = torch.randn(3, 4)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.repeat(x, [2, -1]),
            """baracuda::repeat: repeats must be >= 0, got [2, -1]""",
        )

    def test_fewer_repeats_than_dims(self):
        x = torch.randn(3, 4)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.repeat(x, [2]),
            """baracuda::repeat: repeats [2] has 1 entries but the input has 2 dims; expected at least 2""",
        )

    def test_wrong_grad_shape(self):
        g = torch.randn(6, 7)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.repeat_backward(g, [2, 2], [3, 4]),
            """baracuda::repeat_backward: grad shape [6, 7] != expected [6, 8] (input_shape [3, 4] repeated [2, 2])""",
        )

    def test_integer_grad(self):
        g = torch.ones(6, 8, dtype=torch.int32)
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.repeat_backward(g, [2, 2], [3, 4]),
            """baracuda::repeat_backward: grad must be float16, bfloat16, float32 or float64, got Int""",
        )

    def test_out_dtype_mismatch(self):
        x = torch.randn(3, 4)
        out = torch.empty(6, 8, dtype=torch.float64)
        self.assertExpectedRaisesInline(
            TypeError,
            lambda: torch.ops.baracuda.repeat.out(x, [2, 2], out=out),
            """baracuda::repeat: out dtype Double != expected Float""",
        )

    def test_grad_input_shape_mismatch(self):
        g = torch.randn(6, 8)
        gi = torch.empty(3, 5)
        ws = torch.empty(0, dtype=torch.uint8)
        self.assertExpectedRaisesInline(
            ValueError,
            lambda: torch.ops.baracuda.repeat_backward.out(g, [2, 2], [3, 4], grad_input=gi, workspace=ws),
            """baracuda::repeat_backward: grad_input shape [3, 5] != expected [3, 4]""",
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_mismatch_cuda():
    x = torch.randn(3, 4, device="cuda")
    with pytest.raises(ValueError, match=r"baracuda::repeat: out is on cpu, expected cuda:0"):
        torch.ops.baracuda.repeat.out(x, [2, 2], out=torch.empty(6, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape,repeats,dtype,width", [
    ((4, 20), (1, 2), torch.bfloat16, 8),  # 40-byte runs: 8-byte vectors
    ((5, 6), (2, 3), torch.bfloat16, 4),
    ((5, 6), (2, 3), torch.float32, 8),
    ((5, 3), (2, 3), torch.float32, 4),  # odd runs: one element
    ((5, 8), (2, 3), torch.float32, 16),
])
def test_cuda_vector_width_is_the_widest_dividing_the_run(shape, repeats, dtype, width):
    problem = [len(shape), *shape, *repeats]
    assert launch_config("repeat", problem, dtype)["vec_bytes"] == width
    assert launch_config("repeat_backward", problem, dtype)["vec_bytes"] == width
    x = random(shape, dtype, "cuda")
    assert torch.equal(torch.ops.baracuda.repeat(x, list(repeats)), x.repeat(*repeats))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_backward_one_step_sums_take_8_byte_vectors(dtype):
    # At most 4 tiles a thread: one step of loads, 8-byte vectors; more tiles loop, 16 bytes.
    def bwd(shape, repeats):
        c = launch_config("repeat_backward", [len(shape), *shape, *repeats], dtype)
        return c["vec_bytes"], c["unroll"], c["one_step"]

    assert launch_config("repeat", [2, 64, 64, 2, 2], dtype)["vec_bytes"] == 16
    assert bwd((64, 64), (2, 2)) == (8, 4, 1)
    assert bwd((64, 64), (2, 1)) == (8, 2, 1)
    for more_tiles in ((1, 5), (16, 1)):
        assert bwd((64, 64), more_tiles)[::2] == (16, 0)
    for shape, repeats in (((64, 64), (2, 2)), ((3, 64), (1, 3)), ((7, 8, 64), (2, 1, 2)), ((5, 64), (1, 1))):
        g = random([r * s for r, s in zip(repeats, shape)], dtype, "cuda")
        ref = g.double().reshape([d for r, s in zip(repeats, shape) for d in (r, s)]).sum((0, 2, 4)[:len(shape)])
        torch.testing.assert_close(torch.ops.baracuda.repeat_backward(g, list(repeats), list(shape)).double(),
                                   ref, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_forward_gathers_many_tiles_past_l2(dtype):
    # Rows of >= 128 bytes are broadcast, unless 16 tiles or more make an output larger
    # than L2 (the recorded H200's): then gathered, as narrow rows are; both copy alike.
    l2 = RECORDED_L2_BYTES
    cases = (((4096,), (8192, 1)), ((1024, 1024), (16, 1, 1)), ((8192, 1024), (4, 1)), ((64, 64), (16, 1)))
    for shape, repeats in cases:
        out_bytes = math.prod(shape) * math.prod(repeats) * dtype.itemsize
        gathered = math.prod(repeats) >= 16 and out_bytes > l2
        config = launch_config("repeat", [len(shape), *shape, *repeats], dtype)
        assert config.kind == ("tile_gather" if gathered else "tile_broadcast"), (shape, repeats)
        x = random(shape, dtype, "cuda")
        assert torch.equal(torch.ops.baracuda.repeat(x, list(repeats)), x.repeat(*repeats))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_backward_dx_stays_in_l2_up_to_a_third_of_it():
    # dx is stored plainly (left in L2) up to a third of L2 (the recorded H200's),
    # evict-first past it; both sum alike.
    rows = RECORDED_L2_BYTES // (3 * 1024 * 4)  # float32 rows of 1024 that fit a third of L2
    for m, evict_first in ((rows, 0), (rows + 1, 1)):
        assert launch_config("repeat_backward", [2, m, 1024, 2, 1], torch.float32)["evict_first_dx"] == evict_first
        g = random((2 * m, 1024), torch.float32, "cuda")
        dx = torch.ops.baracuda.repeat_backward(g, [2, 1], [m, 1024])
        assert torch.equal(dx, g[:m] + g[m:])


@pytest.mark.big_memory
def test_cuda_64bit_index_paths():
    require_free_gpu_memory(10)
    # Outputs past 2^31 elements take the 64-bit index kernels.
    x = torch.randint(0, 255, (1 << 16,), dtype=torch.uint8, device="cuda")
    reps = ((1 << 15) + 3, 1)
    y = torch.ops.baracuda.repeat(x, list(reps))
    assert y.numel() > 2**31
    assert torch.equal(y, x.repeat(*reps))
    assert launch_config("repeat", [1, 1 << 16, *reps], torch.uint8)["index32"] == 0
    del y
    g = torch.randn(((1 << 15) + 3) * 2, 1 << 15, device="cuda", dtype=torch.float16)
    dx = torch.ops.baracuda.repeat_backward(g, [(1 << 15) + 3, 1], [2, 1 << 15])
    ref = g.view(-1, 2, 1 << 15).float().sum(0)
    torch.testing.assert_close(dx.float(), ref, rtol=2e-3, atol=0.5)
