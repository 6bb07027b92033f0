"""FSDP for the data-parallel trainer ranks: each rank keeps 1/N of the parameters, gradients
and optimizer state (FSDP2 `fully_shard`: one unit per decoder layer, one for the rest), and
whole tensors exist only while a layer runs, when weights are published, or when state is
saved.

Gradients are *summed* across ranks, as in the unsharded path (trainer._all_reduce_grads):
each rank's loss is already divided by the global token count. Everything here that gathers
(`full_weights`, `optimizer_state`) is a collective: every rank calls it, in the same order.
"""
from __future__ import annotations

import torch


def shard(model: torch.nn.Module, world: int) -> None:
    """Shard a Hugging Face causal LM in place over the default process group (gloo on CPU,
    NCCL on GPU). Build the optimizer after this: the parameters become DTensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh("cuda" if next(model.parameters()).is_cuda else "cpu", (world,))
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    # The root too reshards after every forward (FSDP keeps it whole by default), so outside a
    # forward the parameters are always the sharded objects the optimizer holds, also after a
    # no-grad forward (behaviour or reference log-probs).
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)            # a sum, not FSDP's default mean
            m.set_force_sum_reduction_for_comms(True)    # gloo has no pre-multiplied sum
    # FSDP initialises lazily, on the first forward, re-creating the root's sharded parameters;
    # run one now, so an optimizer built next holds the final objects.
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device))


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full(t: torch.Tensor) -> torch.Tensor:
    """A whole tensor from a shard (a collective), or `t` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with whole tensors (on CPU): name -> tensor."""
    return {k: full(v).cpu() for k, v in model.state_dict().items()}


def optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    """The sharded optimizer's state, whole, in `opt.state_dict()`'s own layout (parameters
    numbered in `model.parameters()` order), so an unsharded trainer can load it too. A
    collective; the result is on rank 0 (the other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not by_name:                      # gathered on rank 0 only
        return {}
    index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    return {"state": {index[k]: v for k, v in by_name["state"].items()},
            "param_groups": [{**g, "params": [index[k] for k in g["params"]]} for g in by_name["param_groups"]]}


def load_optimizer_state(model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    """The inverse of `optimizer_state`: every rank passes the whole state, each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = [name for name, _ in model.named_parameters()]
    by_name = {"state": {names[i]: v for i, v in state["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, opt, optim_state_dict=by_name, options=StateDictOptions(full_state_dict=True))
