"""EmbeddingBag in recommendation models: baracuda_ops.nn.EmbeddingBagCollection against
torchrec's documented semantics (each feature pooled by F.embedding_bag in its table), one
embedding_bag launch per group of tables forward and backward; and the module and functional
forms under torch.compile over many tables and both index dtypes."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import baracuda_ops
from baracuda_ops.nn import EmbeddingBagCollection
from baracuda_ops.nn_collection import EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

# t0 and t1 share a group (dim 4, sum); t2 (dim 8, mean) and t3 (dim 4, mean) are groups of their own
_TABLES = [
    EmbeddingBagConfig(num_embeddings=10, embedding_dim=4, name="t0", feature_names=["f0", "f1"]),
    EmbeddingBagConfig(num_embeddings=7, embedding_dim=4, name="t1", feature_names=["f2"]),
    EmbeddingBagConfig(num_embeddings=5, embedding_dim=8, name="t2", feature_names=["f3"], pooling=PoolingType.MEAN),
    EmbeddingBagConfig(num_embeddings=6, embedding_dim=4, name="t3", feature_names=["f4"], pooling=PoolingType.MEAN),
]
_ROWS = {f: t for t in _TABLES for f in t.feature_names}


def _features(keys, batch=3, index_dtype=torch.int64, weighted=False, seed=0, tables=None):
    """A KeyedJaggedTensor over ``keys`` (their tables: ``tables`` or ``_ROWS``) with random
    lengths (empty bags included), and the per-key (values, offsets, weights) a reference pools."""
    tables = tables or _ROWS
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys), batch), generator=g)
    lengths[0, 0] = 0
    per_key, values, weights = {}, [], []
    for k, row in zip(keys, lengths):
        v = torch.randint(0, tables[k].num_embeddings, (int(row.sum()),), generator=g)
        w = torch.rand(v.shape, generator=g, dtype=torch.float64)
        per_key[k] = (v, torch.cat([row.new_zeros(1), row.cumsum(0)[:-1]]), w)
        values.append(v)
        weights.append(w)
    kjt = KeyedJaggedTensor(keys, torch.cat(values).to(index_dtype), torch.cat(weights) if weighted else None,
                            lengths=lengths.reshape(-1).to(index_dtype))
    return kjt, per_key


def _reference(ebc, per_key, weighted=False):
    """Each feature pooled by F.embedding_bag in a leaf copy of its table; the output in the
    order of the tables, then of their features."""
    leaves = {t.name: ebc.table_weight(t.name).detach().clone().requires_grad_() for t in ebc.embedding_bag_configs()}
    outs = []
    for t in ebc.embedding_bag_configs():
        for f in t.feature_names:
            v, offsets, w = per_key[f]
            outs.append(F.embedding_bag(v, leaves[t.name], offsets, mode=t.pooling.value.lower(),
                                        per_sample_weights=w.to(leaves[t.name].dtype) if weighted else None))
    return torch.cat(outs, dim=1), leaves


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("keys", [["f0", "f1", "f2", "f3", "f4"], ["f3", "f0", "f4", "f2", "f1", "extra"]],
                         ids=["in_order", "shuffled_with_extra_key"])
def test_matches_each_table_pooled_by_f_embedding_bag(keys, dtype, index_dtype):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_TABLES, dtype=dtype)
    kjt, per_key = _features(keys, index_dtype=index_dtype, tables={**_ROWS, "extra": _TABLES[0]})
    with _CountOps() as counts:
        out = ebc(kjt)
        grad = torch.randn_like(out.values())
        out.values().backward(grad)
    # one forward and one backward launch per group (t0+t1, t2, t3)
    assert counts.calls.get("embedding_bag") == 3 and counts.calls.get("embedding_bag_backward") == 3
    want, leaves = _reference(ebc, per_key)
    want.backward(grad)
    assert out.keys() == ["f0", "f1", "f2", "f3", "f4"] and out.length_per_key() == [4, 4, 4, 8, 4]
    torch.testing.assert_close(out.values(), want)
    for t in _TABLES:
        group = next(g for g, grp in enumerate(ebc._groups) if t.name in grp.tables)
        start = ebc._groups[group].row_offsets[ebc._groups[group].tables.index(t.name)]
        torch.testing.assert_close(ebc.weights[group].grad[start:start + t.num_embeddings], leaves[t.name].grad,
                                   msg=lambda m: f"{t.name}: {m}")
    torch.testing.assert_close(out["f3"], want[:, 12:20])
    assert list(out.to_dict()) == out.keys() and out.offset_per_key() == [0, 4, 8, 12, 20, 24]


def test_one_group_is_one_launch_and_a_view_of_the_pooled_bags():
    tables = [EmbeddingBagConfig(num_embeddings=5 + i, embedding_dim=4, name=f"t{i}", feature_names=[f"f{i}"])
              for i in range(7)]
    ebc = EmbeddingBagCollection(tables)
    keys = [f"f{i}" for i in range(7)]
    kjt, per_key = _features(keys, batch=5, tables=dict(zip(keys, tables)))
    with _CountOps() as counts:
        out = ebc(kjt)
    assert counts.calls.get("embedding_bag") == 1 and len(ebc.weights) == 1
    for i, t in enumerate(tables):
        v, offsets, _ = per_key[f"f{i}"]
        torch.testing.assert_close(out[f"f{i}"], F.embedding_bag(v, ebc.table_weight(t.name), offsets, mode="sum"))


def test_weighted_collection():
    tables = _TABLES[:2]
    ebc = EmbeddingBagCollection(tables, is_weighted=True, dtype=torch.float64)
    kjt, per_key = _features(["f2", "f0", "f1"], weighted=True)
    out = ebc(kjt)
    want, _ = _reference(ebc, per_key, weighted=True)
    torch.testing.assert_close(out.values(), want)
    with pytest.raises(ValueError, match="baracuda::EmbeddingBagCollection: a weighted collection needs SUM pooling"):
        EmbeddingBagCollection(_TABLES, is_weighted=True)


def test_state_dict_has_torchrec_keys_and_loads():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_TABLES)
    state = ebc.state_dict()
    assert list(state) == [f"embedding_bags.{t.name}.weight" for t in _TABLES]
    for t in _TABLES:
        assert state[f"embedding_bags.{t.name}.weight"].shape == (t.num_embeddings, t.embedding_dim)
        bound = (1.0 / t.num_embeddings) ** 0.5  # torchrec's default initialisation
        assert state[f"embedding_bags.{t.name}.weight"].abs().max() <= bound
    torch.manual_seed(1)
    other = EmbeddingBagCollection(_TABLES)
    other.load_state_dict(state)
    for t in _TABLES:
        assert torch.equal(other.table_weight(t.name), ebc.table_weight(t.name))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"baracuda::EmbeddingBagCollection: a feature is pooled by two tables"):
        EmbeddingBagCollection([_TABLES[0], EmbeddingBagConfig(3, 4, "x", ["f0"])])
    with pytest.raises(ValueError, match=r"baracuda::EmbeddingBagCollection: input keys \['f0'\] lack features"):
        EmbeddingBagCollection(_TABLES[:1])(KeyedJaggedTensor(["f0"], torch.tensor([1]), lengths=torch.tensor([1])))
    with pytest.raises(ValueError, match=r"baracuda::KeyedJaggedTensor: 3 bags do not split into 2 keys"):
        KeyedJaggedTensor(["a", "b"], torch.tensor([1]), lengths=torch.tensor([1, 0, 0]))


def test_collection_compiles_fullgraph():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(_TABLES)
    kjt, _ = _features(["f3", "f0", "f4", "f2", "f1"])
    want = ebc(kjt).values()
    torch._dynamo.reset()
    compiled = torch.compile(lambda kjt: ebc(kjt).values(), fullgraph=True)
    torch.testing.assert_close(compiled(kjt), want)


# --------------------------------------------------------------------------- many tables under torch.compile


class _SevenTables(torch.nn.Module):
    """A recommendation model's embedding stage: 7 tables of different shapes, one bag batch each."""

    def __init__(self, form: str, sparse: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.form = form
        self.tables = torch.nn.ModuleList(
            baracuda_ops.nn.EmbeddingBag(10 + 3 * i, 4 + 2 * (i % 3), mode="sum", sparse=sparse) for i in range(7))

    def forward(self, indices, offsets):
        if self.form == "module":
            return torch.cat([t(indices, offsets) for t in self.tables], dim=1)
        return torch.cat([baracuda_ops.embedding_bag(indices, t.weight, offsets, mode="sum") for t in self.tables],
                         dim=1)


def _bags(index_dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10, (9,), generator=g).to(index_dtype), torch.tensor([0, 2, 2, 6], dtype=index_dtype)


def _compiled_runs(model, limit):
    """The model compiled (graph breaks allowed) and run on int64 then int32 indices, forward and
    backward, with at most ``limit`` compiled entries per code object (an error past it); returns
    the compiled graphs' count."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter)
    with torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True):
        for index_dtype in (torch.int64, torch.int32):
            indices, offsets = _bags(index_dtype)
            model.zero_grad()
            model(indices, offsets).pow(2).sum().backward()
            want = [t.weight.grad.to_dense() for t in model.tables]
            model.zero_grad()
            got = compiled(indices, offsets)
            torch.testing.assert_close(got, model(indices, offsets))
            got.pow(2).sum().backward()
            for t, w in zip(model.tables, want):
                assert t.weight.grad.is_sparse == t.sparse
                torch.testing.assert_close(t.weight.grad.to_dense(), w)
    return counter.frame_count


@pytest.mark.parametrize("form", ["module", "functional"])
def test_seven_tables_compile_once_per_index_dtype(form):
    # one graph per index dtype (the dtype is guarded), none per table: two entries per code object
    assert _compiled_runs(_SevenTables(form), limit=2) == 2


def test_sparse_gradients_compile_without_graph_breaks_or_recompiles_per_table():
    model = _SevenTables("module", sparse=True)
    torch._dynamo.reset()
    # the sparse gradient's node is C++ (embedding_bag_with_options): Dynamo traces the op whole
    explanation = torch._dynamo.explain(model)(*_bags(torch.int64))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    # no table recompiles its frames: two entries (the two index dtypes) per code object
    _compiled_runs(model, limit=2)
