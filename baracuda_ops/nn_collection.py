"""Many embedding tables for recommendation models: ``EmbeddingBagCollection``, with torchrec's
unsharded ``EmbeddingBagCollection`` semantics, and the keyed containers it reads and returns.

Input, a ``KeyedJaggedTensor`` (torchrec's, or this module's of the same methods): ``keys``
(feature names), ``values`` (1-D indices), per-bag ``lengths`` (or ``offsets``, one more) laid
out key-major, ``len(keys) * B`` bags for a batch of ``B``, and, for a weighted collection,
``weights`` (one per value). Each feature ``f`` of table ``t`` pools its ``B`` bags in ``t``
with ``t``'s pooling (sum or mean; an empty bag gives zeros). Output, a ``KeyedTensor``: the
``[B, D_f]`` pooled values of every feature concatenated along dim 1, in the order of the
tables, then of each table's ``feature_names``; ``keys`` in that order, ``length_per_key`` the
dims.

One launch per group of tables: the tables of one embedding dim and pooling are rows of
one weight (table ``t`` at a row offset ``r_t``), so one ``embedding_bag`` call pools every bag
of the group (index ``v`` of feature ``f`` in table ``t`` becomes ``r_t + v``) and its backward
is one call too. The group's bags are ordered feature by feature; when the input's keys are the
group's features in that order (the usual case) the values are used in place, else a stable
permutation (no host sync: its size is the number of values) brings the group's values first,
the other keys' values make one more bag, computed and dropped. ``state_dict`` holds one entry per table,
``embedding_bags.<name>.weight``, as torchrec's does (the rows of its group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

import torch

from ._errors import BaracudaValueError
from .ops.embedding_bag import _EmbeddingBag

__all__ = ["PoolingType", "EmbeddingBagConfig", "KeyedJaggedTensor", "KeyedTensor", "EmbeddingBagCollection"]


class PoolingType(Enum):
    SUM = "SUM"
    MEAN = "MEAN"


_BAG_MODES = {PoolingType.SUM: 0, PoolingType.MEAN: 1}


@dataclass
class EmbeddingBagConfig:
    """One table (torchrec's field names and defaults): ``num_embeddings`` rows of
    ``embedding_dim``, pooled over the bags of each feature in ``feature_names``; initialised
    uniformly in ``[weight_init_min, weight_init_max]`` (default ``±sqrt(1 / num_embeddings)``)."""

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    feature_names: list[str] = field(default_factory=list)
    weight_init_max: float | None = None
    weight_init_min: float | None = None
    pooling: PoolingType = PoolingType.SUM


class KeyedJaggedTensor:
    """Keyed jagged input: ``values`` of every key's bags, key-major, with ``lengths`` or
    ``offsets`` (``lengths.numel() + 1`` of them, from 0); ``weights`` optional, one per value."""

    def __init__(self, keys: Sequence[str], values: torch.Tensor, weights: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None):
        if (lengths is None) == (offsets is None):
            raise BaracudaValueError("baracuda::KeyedJaggedTensor: give exactly one of lengths and offsets")
        self._keys, self._values, self._weights = list(keys), values, weights
        self._lengths = lengths if lengths is not None else offsets[1:] - offsets[:-1]
        self._offsets = offsets
        bags = self._lengths.numel()
        if len(self._keys) == 0 or bags % len(self._keys):
            raise BaracudaValueError(f"baracuda::KeyedJaggedTensor: {bags} bags do not split into "
                                     f"{len(self._keys)} keys")

    @classmethod
    def from_lengths_sync(cls, keys, values, lengths, weights=None) -> "KeyedJaggedTensor":
        return cls(keys, values, weights, lengths=lengths)

    @classmethod
    def from_offsets_sync(cls, keys, values, offsets, weights=None) -> "KeyedJaggedTensor":
        return cls(keys, values, weights, offsets=offsets)

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def stride(self) -> int:
        return self._lengths.numel() // len(self._keys)


class KeyedTensor:
    """Keyed dense output: ``values`` ``[B, sum(length_per_key)]``, key ``k``'s columns after the
    columns of the keys before it."""

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: torch.Tensor, key_dim: int = 1):
        self._keys, self._length_per_key = list(keys), list(length_per_key)
        self._values, self._key_dim = values, key_dim

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def length_per_key(self) -> list[int]:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        return [0, *torch.tensor(self._length_per_key).cumsum(0).tolist()]

    def key_dim(self) -> int:
        return self._key_dim

    def to_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self._keys, self._values.split(self._length_per_key, dim=self._key_dim)))

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.to_dict()[key]


@dataclass(frozen=True)
class _Group:
    """Tables of one dim and pooling in one weight: their names, row offsets and counts,
    and the features pooled in it (feature, row offset of its table) in the group's bag order."""

    tables: tuple[str, ...]
    row_offsets: tuple[int, ...]
    rows: tuple[int, ...]
    features: tuple[str, ...]
    feature_rows: tuple[int, ...]
    mode: int
    dim: int


class EmbeddingBagCollection(torch.nn.Module):
    """Drop-in for torchrec's unsharded ``EmbeddingBagCollection(tables, is_weighted, device)``:
    ``forward(KeyedJaggedTensor) -> KeyedTensor`` (see the module docstring), one
    ``embedding_bag`` launch per group of tables of equal dim and pooling, forward and backward.
    ``is_weighted``: the input's weights scale each value (sum pooling only)."""

    def __init__(self, tables: Sequence[EmbeddingBagConfig], is_weighted: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self._configs = list(tables)
        self._is_weighted = is_weighted
        names = [t.name for t in self._configs]
        if len(set(names)) != len(names):
            raise BaracudaValueError(f"baracuda::EmbeddingBagCollection: table names must be unique, got {names}")
        features = [f for t in self._configs for f in t.feature_names]
        if len(set(features)) != len(features):
            raise BaracudaValueError(f"baracuda::EmbeddingBagCollection: a feature is pooled by two tables: {features}")
        for t in self._configs:
            if t.pooling not in _BAG_MODES:
                raise BaracudaValueError(f"baracuda::EmbeddingBagCollection: table {t.name!r} pooling must be SUM or "
                                         f"MEAN, got {t.pooling}")
            if is_weighted and t.pooling != PoolingType.SUM:
                raise BaracudaValueError(f"baracuda::EmbeddingBagCollection: a weighted collection needs SUM "
                                         f"pooling, table {t.name!r} has {t.pooling}")
        by_kind: dict[tuple[int, PoolingType], list[EmbeddingBagConfig]] = {}
        for t in self._configs:
            by_kind.setdefault((t.embedding_dim, t.pooling), []).append(t)
        self._groups: list[_Group] = []
        self.weights = torch.nn.ParameterList()
        for (dim, pooling), group in by_kind.items():
            rows = tuple(t.num_embeddings for t in group)
            starts = tuple(int(x) for x in torch.tensor((0,) + rows[:-1]).cumsum(0))
            self._groups.append(_Group(
                tables=tuple(t.name for t in group), row_offsets=starts, rows=rows,
                features=tuple(f for t in group for f in t.feature_names),
                feature_rows=tuple(s for t, s in zip(group, starts) for _ in t.feature_names),
                mode=_BAG_MODES[pooling], dim=dim))
            weight = torch.empty(sum(rows), dim, device=device, dtype=dtype)
            with torch.no_grad():
                for t, s in zip(group, starts):
                    bound = math.sqrt(1.0 / t.num_embeddings)
                    low = -bound if t.weight_init_min is None else t.weight_init_min
                    high = bound if t.weight_init_max is None else t.weight_init_max
                    weight[s:s + t.num_embeddings].uniform_(low, high)
            self.weights.append(torch.nn.Parameter(weight))
        self._out_keys = features
        self._out_dims = [t.embedding_dim for t in self._configs for _ in t.feature_names]
        self._register_state_dict_hook(_per_table_state_dict)
        self.register_load_state_dict_pre_hook(_grouped_state_dict)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def table_weight(self, name: str) -> torch.Tensor:
        """Table ``name``'s rows: a view of its group's weight."""
        for g, group in enumerate(self._groups):
            if name in group.tables:
                i = group.tables.index(name)
                return self.weights[g][group.row_offsets[i]:group.row_offsets[i] + group.rows[i]]
        raise BaracudaValueError(f"baracuda::EmbeddingBagCollection: no table {name!r}")

    def forward(self, features) -> KeyedTensor:
        keys = list(features.keys())
        missing = [f for f in self._out_keys if f not in keys]
        if missing:
            raise BaracudaValueError(f"baracuda::EmbeddingBagCollection: input keys {keys} lack features {missing}")
        values, lengths = features.values(), features.lengths()
        weights = features.weights_or_none() if self._is_weighted else None
        if self._is_weighted and weights is None:
            raise BaracudaValueError("baracuda::EmbeddingBagCollection: a weighted collection needs the input's "
                                     "weights, got none")
        batch = lengths.numel() // len(keys)
        lengths = lengths.reshape(len(keys), batch)
        outs = [_pool_group(group, weight, keys, values, lengths, weights).view(len(group.features), batch, group.dim)
                for group, weight in zip(self._groups, self.weights)]
        if len(outs) == 1:  # the group's features are the output's, in order
            return KeyedTensor(self._out_keys, self._out_dims, outs[0].transpose(0, 1).reshape(batch, -1))
        pooled = {f: bags for group, out in zip(self._groups, outs) for f, bags in zip(group.features, out.unbind(0))}
        return KeyedTensor(self._out_keys, self._out_dims, torch.cat([pooled[f] for f in self._out_keys], dim=1))


def _pool_group(group: _Group, weight: torch.Tensor, keys: list[str], values: torch.Tensor,
                lengths: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The group's ``[F_g * B, D]`` pooled bags, feature-major, in one embedding_bag call."""
    rows_of_key = dict(zip(group.features, group.feature_rows))
    key_lengths, n = lengths.sum(1), values.numel()

    def per_value(per_key: list) -> torch.Tensor:
        return torch.repeat_interleave(torch.tensor(per_key, device=values.device), key_lengths, output_size=n)

    # table row offset of each value; values of keys outside the group index row 0 (in the dropped bag)
    indices = values + per_value([rows_of_key.get(k, 0) for k in keys]).to(values.dtype)
    if len(keys) > len(group.features):
        indices = torch.where(per_value([k in rows_of_key for k in keys]), indices, 0)
    if keys[:len(group.features)] != list(group.features):  # the group's values first, in its feature order
        rank = {f: i for i, f in enumerate(group.features)}
        order = torch.argsort(per_value([rank.get(k, len(rank) + i) for i, k in enumerate(keys)]), stable=True)
        indices = indices[order]
        weights = None if weights is None else weights[order]
    group_lengths = lengths[[keys.index(f) for f in group.features]].reshape(-1)
    offsets = torch.cat([group_lengths.new_zeros(1), group_lengths.cumsum(0)]).to(values.dtype)
    if len(keys) == len(group.features):
        return _EmbeddingBag(weight, indices, offsets, group.mode, weights, True, -1)[0]
    # the other keys' values (at row 0) make one more bag, dropped: with include_last_offset,
    # F.embedding_bag's mean would count them in the last bag
    return _EmbeddingBag(weight, indices, offsets, group.mode, weights, False, -1)[0][:-1]


def _per_table_state_dict(module: EmbeddingBagCollection, state_dict: dict, prefix: str, local_metadata) -> None:
    """``weights.<g>`` becomes one ``embedding_bags.<table>.weight`` per table of group g."""
    for g, group in enumerate(module._groups):
        weight = state_dict.pop(f"{prefix}weights.{g}")
        for name, start, rows in zip(group.tables, group.row_offsets, group.rows):
            state_dict[f"{prefix}embedding_bags.{name}.weight"] = weight[start:start + rows]


def _grouped_state_dict(module: EmbeddingBagCollection, state_dict: dict, prefix: str, local_metadata, strict,
                        missing_keys, unexpected_keys, error_msgs) -> None:
    """Loading: the tables' ``embedding_bags.<table>.weight`` become their group's ``weights.<g>``."""
    for g, group in enumerate(module._groups):
        names = [f"{prefix}embedding_bags.{name}.weight" for name in group.tables]
        if all(n in state_dict for n in names):
            state_dict[f"{prefix}weights.{g}"] = torch.cat([state_dict.pop(n) for n in names])
