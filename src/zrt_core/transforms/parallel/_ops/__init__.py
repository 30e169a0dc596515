"""Sharding rules by op family (as PyTorch's DTensor keeps its op strategies in ``_ops/``): each
rule maps a node's input layouts to its output layouts; :mod:`.registry` is the one dispatch."""
