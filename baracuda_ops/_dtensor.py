"""DTensor sharding rules of the ``torch.ops.baracuda.*`` ops: the machinery they share.

A family's rules (the section "DTensor sharding" of its file under ``ops/``) say, for one mesh
dim at a time, which placements of its tensor arguments the op takes without communication and
which placements its outputs then have (the form of
``torch.distributed.tensor.experimental.register_sharding``); DTensor expands them over every
mesh dim and redistributes any other input to the cheapest of them. Most ops then run as they
are on the local shards. Where the local shard is not the whole story (alibi's query and key
positions start at the shard's offset; repeat_backward's ``input_shape`` is the global shape;
embedding_bag on a row-sharded table looks up only the rows a rank owns), the rule also gives a
``local`` function that runs instead of the plain op on the local tensors, with a
:class:`Shards` view of the placements to find the rank's offsets and the mesh dims to reduce
over.

``torch.distributed.tensor`` costs seconds to import, so nothing here imports it until a program
does: the rules register right after that import (:func:`when_available`), or at once when it
already happened. Builds of PyTorch without distributed support register nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Any, Callable, Sequence

import torch

_MODULE = "torch.distributed.tensor"
_pending: list[Callable[[], None]] = []
_imported = False  # torch.distributed.tensor is imported (so an input may be a DTensor)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs the pending registrations right after ``torch.distributed.tensor`` is executed."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_pending()

        spec.loader.exec_module = exec_then_register  # this spec's own loader object
        return spec


def _register_pending() -> None:
    global _imported
    _imported = True
    while _pending:
        _pending.pop(0)()


def when_available(register: Callable[[], None]) -> None:
    """Calls ``register()`` (a family's rule registrations) once ``torch.distributed.tensor`` is
    imported: now if it is, else right after a program imports it."""
    if not torch.distributed.is_available():
        return
    _pending.append(register)
    if _MODULE in sys.modules:
        _register_pending()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def rule(ops: Sequence[torch._ops.OpOverload], local: Callable | None = None):
    """Decorator: ``strategy(*args)`` (the op's arguments, a ``DTensorSpec`` for each tensor) returns
    ``[(output placements, argument placements), ...]`` for one mesh dim, as for
    ``register_sharding`` (None for a non-tensor or absent argument and for an absent output). It
    may raise for placements no redistribution should silently fix. With ``local``, the op runs as
    ``local(shards, *local_args)`` on the local tensors (see :class:`Shards`) instead of itself."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor.experimental import register_sharding

    def decorate(strategy):
        register_sharding(list(ops))(strategy)
        dispatcher = DTensor._op_dispatcher
        for op in ops:
            # Every non-tensor argument (shapes, modes, output masks) keys the strategy cache:
            # register_sharding keys only those from the first plain int argument on.
            dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(0, needs_pytree=True)
            if local is not None:
                dispatcher._custom_op_handlers[op] = functools.partial(_run_local, local)
        return strategy

    return decorate


def replicated_like(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor | None:
    """A module's plain-tensor ``weight`` as a Replicate DTensor on the mesh of a DTensor input ``x``
    (else ``weight`` itself), so that a module applied to a sharded input works as on a full one.
    A module's parameter is taken to be the same on every rank (built from the same seed, or
    loaded from the same checkpoint); its gradient is reduced back to the plain tensor."""
    if weight is None or type(x) is torch.Tensor or not _imported:
        return weight
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(x, DTensor) and not isinstance(weight, DTensor):
        return DTensor.from_local(weight, x.device_mesh, [Replicate()] * x.device_mesh.ndim, run_check=False)
    return weight


class Shards:
    """Where this rank's shards of an op's arguments sit, for a ``local`` function: ``specs`` are
    the arguments as the op runs (a ``DTensorSpec`` for each tensor, after redistribution)."""

    def __init__(self, mesh, specs: Sequence[Any], output_specs: Any):
        self.mesh = mesh
        self.specs = specs
        self.output_specs = output_specs if isinstance(output_specs, (tuple, list)) else (output_specs,)

    def mesh_dims(self, arg: int, dim: int) -> list[int]:
        """The mesh dims over which argument ``arg`` is sharded on its dim ``dim``."""
        return [m for m, p in enumerate(self.specs[arg].placements) if p.is_shard(dim)]

    def offset(self, arg: int, dim: int) -> int:
        """The global index of this rank's first element of argument ``arg`` along ``dim``."""
        return _local_shape_and_offset(self.mesh, self.specs[arg])[1][dim]

    def output_rows(self, output: int) -> tuple[int, int]:
        """This rank's (first row, row count) of output ``output``: its dim 0."""
        shape, offset = _local_shape_and_offset(self.mesh, self.output_specs[output])
        return offset[0], shape[0]

    def all_reduce(self, tensor: torch.Tensor, op: str, mesh_dims: Sequence[int]) -> torch.Tensor:
        """``tensor`` reduced (``"sum"``, ``"max"``, ``"min"``) over the ranks of ``mesh_dims``, by
        functional collectives (traceable by torch.compile)."""
        from torch.distributed import _functional_collectives as funcol

        for m in mesh_dims:
            tensor = funcol.all_reduce(tensor, op, (self.mesh, m))
        return tensor


def _local_shape_and_offset(mesh, spec):
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return compute_local_shape_and_global_offset(spec.shape, mesh, spec.placements)


def _run_local(local: Callable, op_call, args, kwargs):
    """DTensor's handler of an op with a ``local`` function: the op's registered strategy picks the
    placements and redistributes the inputs as for any op; ``local`` computes on the shards."""
    from torch.distributed.tensor import DTensor
    from torch.utils import _pytree as pytree

    dispatcher = DTensor._op_dispatcher
    op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    dispatcher.sharding_propagator.propagate(op_info)
    sharding = op_info.output_sharding
    schema = op_info.schema
    if sharding.needs_redistribute:
        # (PyTorch releases before the flag take the first two arguments only)
        flag = getattr(sharding, "use_val_from_redistribute_schema", None)
        dispatcher.redistribute_local_args(op_info, sharding.redistribute_schema, *(() if flag is None else (flag,)))
        schema = sharding.redistribute_schema
    local_args = (pytree.tree_unflatten(list(op_info.local_args), op_info.args_tree_spec)
                  if op_info.args_tree_spec else op_info.local_args)
    shards = Shards(schema.get_mesh_from_args(), schema.args_schema, sharding.output_spec)
    result = local(shards, *local_args, **op_info.local_kwargs)
    return dispatcher.wrap(result, sharding.output_spec)
