"""Property fuzz of every op and `.out` overload (run in its own process by test_fuzz_ops.py, so a
crash fails that test instead of killing the run).

Each example takes one valid call of an op, mutates one or two of its arguments (an int or an
entry of an int list set to -1, 0, 1, 7, 2^62 or 2^63 - 1, an entry dropped or added; a tensor
moved to `meta`, converted to another dtype, emptied, given one more dim, made non-contiguous,
filled with NaN or with out-of-range indices, or an output replaced by a view of an input) and
asserts that the call returns or raises a typed error that names the op (a message starting
with "baracuda::"; an allocation failure for a size that is valid but too large is PyTorch's own
typed error). Where it returns, the result equals PyTorch's on the same arguments whenever
PyTorch accepts them."""

import sys

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import baracuda_ops

ops = torch.ops.baracuda
OURS = (baracuda_ops.BaracudaValueError, baracuda_ops.BaracudaIndexError, baracuda_ops.BaracudaTypeError,
        baracuda_ops.BaracudaNotImplementedError)
INTS = [-1, 0, 1, 7, 2**62, 2**63 - 1]


def _base_calls():
    """(name, op, args, kwargs, reference or None): one valid call per op and overload."""
    x = torch.randn(2, 3, 4)
    w = torch.randn(4)
    y, rstd = ops.rms_norm(x, [4], w)
    weight = torch.randn(10, 4)
    idx = torch.tensor([1, 2, 4, 9, 0])
    off = torch.tensor([0, 2, 2])
    out, o2b, bs, mp = ops.embedding_bag(weight, idx, off, 0)
    g = torch.randn(3, 4)
    img = torch.randn(2, 3, 8, 7)
    s2 = torch.rand(2, 3, 2)
    p2, i2 = ops.fractional_max_pool2d(img, [2, 3], [4, 3], s2)
    vol = torch.randn(1, 2, 5, 6, 7)
    s3 = torch.rand(1, 2, 3)
    p3, i3 = ops.fractional_max_pool3d(vol, [2, 2, 3], [3, 4, 4], s3)
    scores = torch.randn(2, 3, 4, 5)
    slopes = baracuda_ops.alibi_slopes(3)
    ws = torch.empty(1 << 12, dtype=torch.uint8)

    def fmp_ref(dims):
        return lambda t, k, o, s: getattr(F, f"fractional_max_pool{dims}d")(
            t, k, output_size=o, _random_samples=s, return_indices=True)

    def alibi_ref(sc, sl):
        q, k = sc.shape[2], sc.shape[3]
        rel = (torch.arange(k) - torch.arange(q)[:, None]).to(sc.dtype)
        return sc + sl.to(sc.dtype).view(-1, 1, 1) * rel

    return [
        ("repeat", ops.repeat, [x, [2, 1, 1, 2]], {}, lambda t, r: t.repeat(*r)),
        ("repeat", ops.repeat.out, [x, [1, 2, 1]], {"out": torch.empty(2, 6, 4)}, None),
        ("repeat_backward", ops.repeat_backward, [torch.randn(4, 6, 4), [2, 2, 1], [2, 3, 4]], {}, None),
        ("repeat_backward", ops.repeat_backward.out, [torch.randn(4, 6, 4), [2, 2, 1], [2, 3, 4]],
         {"grad_input": torch.empty(2, 3, 4), "workspace": ws}, None),
        ("rms_norm", ops.rms_norm, [x, [4], w, 1e-5], {}, None),
        ("rms_norm", ops.rms_norm.out, [x, [4], w, None], {"output": torch.empty(2, 3, 4), "rstd": torch.empty(2, 3, 1)},
         None),
        ("rms_norm_backward", ops.rms_norm_backward, [torch.randn(2, 3, 4), x, [4], rstd, w, [True, True]], {}, None),
        ("rms_norm_backward", ops.rms_norm_backward.out, [torch.randn(2, 3, 4), x, [4], rstd, w, [True, True]],
         {"grad_input": torch.empty(2, 3, 4), "grad_weight": torch.empty(4), "workspace": ws}, None),
        ("embedding_bag", ops.embedding_bag, [weight, idx, off, 1, None, False, -1], {},
         lambda wt, i, o, m, p, last, pad: F.embedding_bag(i, wt, o, mode=["sum", "mean", "max"][m],
                                                           per_sample_weights=p, include_last_offset=last,
                                                           padding_idx=None if pad == -1 else pad)),
        ("embedding_bag", ops.embedding_bag.out, [weight, idx, off, 0, torch.rand(5), False, 2],
         {"output": torch.empty(3, 4), "offset2bag": torch.empty(5, dtype=torch.long),
          "bag_size": torch.empty(3, dtype=torch.long), "max_positions": torch.empty(0, dtype=torch.long)}, None),
        ("embedding_bag_backward", ops.embedding_bag_backward, [g, idx, o2b, bs, mp, 10, 0, None, -1], {}, None),
        ("embedding_bag_backward", ops.embedding_bag_backward.out, [g, idx, o2b, bs, mp, 10, 0, None, -1],
         {"grad_weight": torch.empty(10, 4), "workspace": ws}, None),
        ("embedding_bag_per_sample_weights_backward", ops.embedding_bag_per_sample_weights_backward,
         [g, weight, idx, o2b, 0, -1], {}, None),
        ("embedding_bag_per_sample_weights_backward", ops.embedding_bag_per_sample_weights_backward.out,
         [g, weight, idx, o2b, 0, -1], {"grad_per_sample_weights": torch.empty(5)}, None),
        ("fractional_max_pool2d", ops.fractional_max_pool2d, [img, [2, 3], [4, 3], s2], {}, fmp_ref(2)),
        ("fractional_max_pool2d", ops.fractional_max_pool2d.out, [img, [2, 3], [4, 3], s2],
         {"output": torch.empty(2, 3, 4, 3), "indices": torch.empty(2, 3, 4, 3, dtype=torch.long)}, None),
        ("fractional_max_pool2d_backward", ops.fractional_max_pool2d_backward,
         [torch.randn_like(p2), img, [2, 3], [4, 3], i2], {}, None),
        ("fractional_max_pool2d_backward", ops.fractional_max_pool2d_backward.out,
         [torch.randn_like(p2), img, [2, 3], [4, 3], i2], {"grad_input": torch.empty_like(img), "workspace": ws}, None),
        ("fractional_max_pool3d", ops.fractional_max_pool3d, [vol, [2, 2, 3], [3, 4, 4], s3], {}, fmp_ref(3)),
        ("fractional_max_pool3d", ops.fractional_max_pool3d.out, [vol, [2, 2, 3], [3, 4, 4], s3],
         {"output": torch.empty(1, 2, 3, 4, 4), "indices": torch.empty(1, 2, 3, 4, 4, dtype=torch.long)}, None),
        ("fractional_max_pool3d_backward", ops.fractional_max_pool3d_backward,
         [torch.randn_like(p3), vol, [2, 2, 3], [3, 4, 4], i3], {}, None),
        ("fractional_max_pool3d_backward", ops.fractional_max_pool3d_backward.out,
         [torch.randn_like(p3), vol, [2, 2, 3], [3, 4, 4], i3],
         {"grad_input": torch.empty_like(vol), "workspace": ws}, None),
        ("alibi", ops.alibi, [scores, slopes], {}, alibi_ref),
        ("alibi", ops.alibi.out, [scores, slopes], {"out": torch.empty(2, 3, 4, 5)}, None),
        ("alibi_inplace", ops.alibi_inplace, [scores.clone(), slopes], {}, None),
        ("alibi_backward", ops.alibi_backward, [scores, slopes, [True, True]], {}, None),
        ("alibi_backward", ops.alibi_backward.out, [scores, slopes, [True, True]],
         {"grad_scores": torch.empty(2, 3, 4, 5), "grad_slopes": torch.empty(3), "workspace": ws}, None),
    ]


BASE = _base_calls()


def _mutate_tensor(t: torch.Tensor, how: int, inputs: list) -> torch.Tensor:
    if how == 0:
        return t.to("meta")
    if how == 1:
        return t.to(torch.float64 if t.dtype != torch.float64 else torch.float16)
    if how == 2:
        return t.to(torch.int64) if t.is_floating_point() else t.to(torch.float32)
    if how == 3:
        return t.flatten()[:0].view([0] + list(t.shape[1:])) if t.dim() > 0 else t.reshape(1)
    if how == 4:
        return t.unsqueeze(0)
    if how == 5:
        return t.transpose(0, -1) if t.dim() > 1 else t.flip(0)
    if how == 6:
        return torch.full_like(t, float("nan")) if t.is_floating_point() else torch.full_like(t, 10**6)
    if how == 7:
        return torch.full_like(t, -3) if not t.is_floating_point() else t[..., :1]
    # a view of an input's memory (aliasing an output with an input)
    donor = next((i for i in inputs if isinstance(i, torch.Tensor) and i.dtype == t.dtype
                  and i.numel() >= t.numel() > 0), None)
    return donor.flatten()[: t.numel()].view(t.shape) if donor is not None else t


def _mutate(value, how: int, pick: int, inputs: list):
    if isinstance(value, torch.Tensor):
        return _mutate_tensor(value, how % 9, inputs)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return INTS[how % len(INTS)]
    if isinstance(value, float):
        return [float("nan"), -1.0, float("inf")][how % 3]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = list(value)
        if how % 8 == 6:
            return value[:-1]
        if how % 8 == 7:
            return value + [2]
        if value:
            value[pick % len(value)] = INTS[how % len(INTS)]
        return value
    return value  # None, bool lists: left as they are (another type is the schema parser's error)


def _check_outcome(name, op, args, kwargs, reference):
    try:
        result = op(*args, **kwargs)
    except OURS as e:
        assert str(e).startswith("baracuda::"), f"{type(e).__name__} without the op name: {e}"
        return
    except RuntimeError as e:
        message = str(e)
        allocation = "allocate" in message or "Storage size calculation overflowed" in message
        assert message.startswith("baracuda::") or allocation, f"untyped {type(e).__name__} from {name}: {e}"
        return
    if reference is None or any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in args):
        return
    try:
        expected = reference(*args, **kwargs)
    except Exception:  # PyTorch rejects what we accept: nothing to compare
        return
    got = result if isinstance(result, (tuple, list)) else (result,)
    want = expected if isinstance(expected, (tuple, list)) else (expected,)
    for a, b in zip(got, want):
        if a.dtype.is_floating_point and b.dtype.is_floating_point and a.shape == b.shape:
            torch.testing.assert_close(a, b.to(a.dtype), equal_nan=True, rtol=1e-3, atol=1e-3,
                                       msg=lambda m: f"{name}: {m}")
        else:
            assert a.shape == b.shape, f"{name}: shape {list(a.shape)} != PyTorch's {list(b.shape)}"


@settings(derandomize=True, max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 400, deadline=None,
          suppress_health_check=list(HealthCheck), database=None)
@given(case=st.integers(0, len(BASE) - 1),
       mutations=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 17), st.integers(0, 7)), min_size=1,
                          max_size=2))
def fuzz(case, mutations):
    name, op, args, kwargs, reference = BASE[case]
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    kwargs = {k: v.clone() for k, v in kwargs.items()}
    inputs = list(args)
    keys = list(kwargs)
    for slot, how, pick in mutations:
        slot %= len(args) + len(keys)
        if slot < len(args):
            args[slot] = _mutate(args[slot], how, pick, inputs)
        else:
            kwargs[keys[slot - len(args)]] = _mutate(kwargs[keys[slot - len(args)]], how, pick, inputs)
    _check_outcome(name, op, args, kwargs, reference)


if __name__ == "__main__":
    torch.manual_seed(0)
    fuzz()
    print("fuzz: ok")
