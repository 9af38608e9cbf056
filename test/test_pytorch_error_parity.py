"""PyTorch's own error checks for these ops, run against our drop-ins.

The misuses come from PyTorch's test material: OpInfo ``error_inputs`` (rms_norm), and
test/nn/test_embedding.py and test/nn/test_pooling.py (embedding_bag, fractional_max_pool2d/3d),
plus Tensor.repeat's argument checks. Each case calls PyTorch and our drop-in with the same
arguments: ours must raise an instance of the class PyTorch raises (what PyTorch's tests and
user code catch), and our message names the op. Messages differ from PyTorch's by design
(ours say ``baracuda::<op>: expected vs given``)."""

import pytest
import torch
import torch.nn.functional as F

import baracuda_ops


def _embedding_bag_cases():
    a = torch.tensor([[1, 3, 2], [0, 2, 1]])
    emb = torch.rand(4, 3)
    cases = []
    # test_embedding_bag_padding_idx_error: padding_idx outside [-4, 4)
    for padding_idx in (-6, -5, 4, 5):
        cases.append((f"padding_idx={padding_idx}", (a, emb), dict(padding_idx=padding_idx)))
    # test_embedding_bag_out_of_bounds_idx (CPU): negative and too large indices, every mode
    weight = torch.randn(10, 2)
    for mode in ("sum", "mean", "max"):
        for idx in (torch.tensor([[-1, 1]]), torch.tensor([[11, 8]])):
            cases.append((f"out_of_bounds_{mode}_{idx[0, 0].item()}", (idx, weight), dict(mode=mode, padding_idx=0)))
            if mode == "sum":
                cases.append((f"out_of_bounds_psw_{idx[0, 0].item()}", (idx, weight),
                              dict(mode=mode, padding_idx=0, per_sample_weights=torch.randn(1, 2))))
    # test_embedding_bag_dimension_errors
    w26 = torch.zeros(2, 6, dtype=torch.float64)
    idx5 = torch.full((2, 0, 0, 6, 6), 2)
    cases.append(("indices_5d", (idx5, w26, torch.full((2, 0, 0, 6, 6), 0)), {}))
    cases.append(("offsets_5d", (torch.full((2,), 1), torch.zeros(2, 2, dtype=torch.float64),
                                 torch.full((2, 0, 0, 6, 6), 0)), {}))
    cases.append(("weight_3d", (torch.full((2,), 1), torch.zeros(2, 2, 2, dtype=torch.float64),
                                torch.full((2,), 0)), {}))
    # test_EmbeddingBag_per_sample_weights_failures
    w52 = torch.randn(5, 2)
    inp = torch.tensor([3, 1, 1, 1, 4, 0])
    offsets = torch.tensor([0, 0, 3, 3, 6])
    cases.append(("psw_dtype", (inp, w52, offsets), dict(mode="sum", per_sample_weights=torch.randn(6).double())))
    cases.append(("psw_shape_1d", (inp, w52, offsets), dict(mode="sum", per_sample_weights=torch.randn(5))))
    cases.append(("psw_shape_2d", (torch.randint(5, (7, 3)), w52), dict(mode="sum", per_sample_weights=torch.randn(21))))
    for mode in ("max", "mean"):
        cases.append((f"psw_mode_{mode}", (torch.randint(5, (7, 3)), w52),
                      dict(mode=mode, per_sample_weights=torch.randn(7, 3))))
    # _test_EmbeddingBag: illegal input combinations and bad offsets (CPU)
    w1020 = torch.randn(10, 20)
    ones = torch.ones(3, 4, dtype=torch.long)
    for mode in ("sum", "mean", "max"):
        cases.append((f"2d_with_offsets_{mode}", (ones, w1020, torch.arange(0, 3)), dict(mode=mode)))
        cases.append((f"1d_without_offsets_{mode}", (ones.view(-1), w1020), dict(mode=mode)))
        cases.append((f"first_offset_1_{mode}", (ones.view(-1), w1020, torch.tensor([1, 1, 2])), dict(mode=mode)))
        cases.append((f"offset_past_end_{mode}", (ones.view(-1), w1020, torch.tensor([0, 1, 100])), dict(mode=mode)))
        if mode != "max":  # PyTorch accepts decreasing offsets in max mode (we do not)
            cases.append((f"decreasing_offsets_{mode}", (ones.view(-1), w1020, torch.tensor([0, 5, 2])),
                          dict(mode=mode)))
    cases.append(("bad_mode", (a, emb), dict(mode="median")))
    cases.append(("max_mode_sparse", (a, emb), dict(mode="max", sparse=True)))
    cases.append(("float_indices", (a.float(), emb), {}))
    cases.append(("weight_0d", (a, torch.tensor(1.0)), {}))
    return cases


@pytest.mark.parametrize("name,args,kwargs", _embedding_bag_cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_embedding_bag_raises_what_pytorch_raises(name, args, kwargs):
    _check_same_error(F.embedding_bag, baracuda_ops.embedding_bag, "embedding_bag", args, kwargs)


def _fractional_max_pool_cases():
    cases = []
    for dims in (2, 3):
        spatial = (50, 32) if dims == 2 else (50, 32, 32)
        k = [3, 2] if dims == 2 else [3, 2, 2]
        # test_FractionalMaxPool{2,3}d_zero_batch: an empty channel dim
        cases.append((dims, "empty_channels", (torch.randn(1, 0, *spatial), 3), dict(output_ratio=(0.5,) * dims)))
        # test_FractionalMaxPool{2,3}d_zero_samples: too few samples for the batch
        cases.append((dims, "too_few_samples", (torch.randn(1, 16, *spatial), k),
                      dict(output_size=1, _random_samples=torch.rand(0, 16, dims))))
        # output_size + kernel_size - 1 > input size, kernel too large, non-positive kernel
        cases.append((dims, "output_too_large", (torch.randn(1, 2, *spatial), 3), dict(output_size=49)))
        cases.append((dims, "kernel_too_large", (torch.randn(1, 2, *spatial), 51), dict(output_size=1)))
        cases.append((dims, "kernel_zero", (torch.randn(1, 2, *spatial), 0), dict(output_size=2)))
        cases.append((dims, "kernel_negative", (torch.randn(1, 2, *spatial), -2), dict(output_size=2)))
        # wrong _random_samples: dtype, last dim, channels
        cases.append((dims, "samples_dtype", (torch.randn(1, 2, *spatial), 2),
                      dict(output_size=4, _random_samples=torch.rand(1, 2, dims, dtype=torch.float64))))
        cases.append((dims, "samples_last_dim", (torch.randn(1, 2, *spatial), 2),
                      dict(output_size=4, _random_samples=torch.rand(1, 2, dims + 1))))
        cases.append((dims, "samples_channels", (torch.randn(1, 2, *spatial), 2),
                      dict(output_size=4, _random_samples=torch.rand(1, 3, dims))))
        # input rank, no output size, integer input
        cases.append((dims, "input_rank", (torch.randn(*spatial), 2), dict(output_size=4)))
        cases.append((dims, "no_output_size", (torch.randn(1, 2, *spatial), 2), {}))
        cases.append((dims, "integer_input", (torch.ones(1, 2, *spatial, dtype=torch.long), 2), dict(output_size=4)))
        cases.append((dims, "kernel_entries", (torch.randn(1, 2, *spatial), [2] * (dims + 1)), dict(output_size=4)))
    return cases


@pytest.mark.parametrize("dims,name,args,kwargs", _fractional_max_pool_cases(),
                         ids=lambda c: str(c) if isinstance(c, (str, int)) else "")
def test_fractional_max_pool_raises_what_pytorch_raises(dims, name, args, kwargs):
    theirs = getattr(F, f"fractional_max_pool{dims}d")
    ours = getattr(baracuda_ops, f"fractional_max_pool{dims}d")
    _check_same_error(theirs, ours, f"fractional_max_pool{dims}d", args, kwargs)


def _rms_norm_cases():
    return [
        # OpInfo error_inputs_rms_norm
        ("normalized_shape_empty", (torch.randn(1, 2, 3), ()), dict(weight=None, eps=1e-5)),
        ("weight_shape", (torch.randn(1, 2, 3), (1, 2, 3)), dict(weight=torch.randn(1, 2), eps=1e-5)),
        ("normalized_shape_mismatch", (torch.randn(2, 2, 3), (2, 2)), dict(weight=None, eps=1e-5)),
        ("normalized_shape_too_long", (torch.randn(2, 3), (1, 2, 3)), {}),
        ("integer_input", (torch.ones(2, 3, dtype=torch.long), (3,)), {}),
    ]


@pytest.mark.parametrize("name,args,kwargs", _rms_norm_cases(), ids=lambda c: c if isinstance(c, str) else "")
def test_rms_norm_raises_what_pytorch_raises(name, args, kwargs):
    _check_same_error(F.rms_norm, baracuda_ops.rms_norm, "rms_norm", args, kwargs)


@pytest.mark.parametrize("shape,repeats", [
    ((2, 3), (2,)),          # fewer repeats than dims
    ((2, 3), (2, -1)),       # negative repeat
    ((4,), (2**62,)),        # output size overflows int64
    ((2**31, 0), (2**33, 1)),
])
def test_repeat_raises_what_pytorch_raises(shape, repeats):
    x = torch.empty(shape) if 0 in shape else torch.randn(shape)
    _check_same_error(lambda t, r: t.repeat(*r), baracuda_ops.repeat, "repeat", (x, repeats), {})


def _check_same_error(theirs, ours, op: str, args, kwargs) -> None:
    try:
        theirs(*args, **kwargs)
    except Exception as e:  # noqa: BLE001  (whatever PyTorch raises, ours must be an instance of it)
        expected = type(e)
    else:  # an older PyTorch accepts it (fractional_max_pool's kernel size 0 before 2.14): ours refuses, typed
        expected = (ValueError, RuntimeError)
    with pytest.raises(expected) as got:
        ours(*args, **kwargs)
    assert str(got.value).startswith(f"baracuda::{op}"), f"{type(got.value).__name__}: {got.value}"
