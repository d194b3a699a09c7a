"""What a careful jraph user writes instead of jgnn: plain JAX, jitted, with node-level transforms, per-edge
gathers and `jax.ops.segment_*` reductions (the ``hand`` system of `benchmarks.compare`).

"Careful" means the choices a user who knows where the FLOPs go makes by hand:

* every dense transform runs on node rows before the gather (``(x @ W)[senders]``, never ``x[senders] @ W``);
* attention scores are dot products at node level, gathered per edge as ``[E, heads]`` scalars;
* the softmax subtracts a per-node maximum under ``stop_gradient`` and divides once per node, after the sum;
* host preprocessing done once: self-loops appended, type blocks and per-relation edge ranges found (typed
  graphs are sorted by type, so a type's rows are a static slice).

Each module's ``forward(params, inputs, static)`` takes the same parameter tree as the matching
`benchmarks.compare.models` module (``params["params"]``), so every system starts from the same weights.
"""
