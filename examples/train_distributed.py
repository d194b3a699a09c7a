"""Partitioned full-graph training with `jgnn.distributed`: GAT on Cora or RGCN on AIFB over P devices, each
device aggregating its part's edges with the fused ops and reading its halo rows from their owners; the losses
are checked against the same training on one device.

    python examples/train_distributed.py --model gat --devices 8          # 8 forced CPU devices, one process
    python examples/train_distributed.py --model rgcn --devices 8
    # two processes of 4 devices each (one command per process, same port):
    python examples/train_distributed.py --model gat --devices 4 --num-processes 2 --process-id 0 \
        --coordinator 127.0.0.1:12355 &
    python examples/train_distributed.py --model gat --devices 4 --num-processes 2 --process-id 1 \
        --coordinator 127.0.0.1:12355

Data from ``$JGNN_DATA_DIR`` (cora.npz, aifb.npz). ``--devices`` is the number of CPU devices per process
(forced with ``--xla_force_host_platform_device_count`` before JAX starts).
"""

from __future__ import annotations

import argparse
import os
import sys


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gat", choices=["gat", "rgcn"])
    p.add_argument("--devices", type=int, default=8, help="CPU devices per process")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--method", default="auto", choices=["auto", "metis", "ldg"])
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--coordinator", default=None, help="host:port of process 0 (multi-process mode)")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest relative loss difference allowed")
    return p.parse_args(argv)


# Parsed before JAX starts: the forced host device count must be in XLA_FLAGS by then. Imported (the README
# flag check), the module parses nothing here and `main` parses its own argv.
ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={ARGS.devices}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

import jgnn  # noqa: E402
from jgnn import distributed  # noqa: E402
from jgnn.datasets import load_entities, load_planetoid  # noqa: E402


def task(model: str):
    """(graph, node inputs [N, ...], the two layers, labels [N] (-1: not trained on))."""
    if model == "gat":
        data = load_planetoid("cora")
        x = data.graph.nodes / np.maximum(data.graph.nodes.sum(1, keepdims=True), 1)
        labels = np.where(data.train_mask, data.labels, -1)
        layers = (jgnn.nn.GATConv(8, num_heads=8), jgnn.nn.GATConv(data.num_classes, num_heads=1, concat=False))
        return data.graph._replace(nodes=None), x.astype(np.float32), layers, labels
    data = load_entities("aifb")
    n = data.num_nodes
    labels = np.full(n, -1, np.int32)
    labels[data.train_idx] = data.train_labels
    layers = (jgnn.nn.RGCNConv(16, data.num_relations, input_dim=n),
              jgnn.nn.RGCNConv(data.num_classes, data.num_relations))
    return data.graph._replace(nodes=None), np.arange(n, dtype=np.int32), layers, labels


def forward(layers, params, apply_graph, h):
    """The two layers with a ReLU between; ``apply_graph(h)`` makes the graph a layer runs on and returns
    (graph, take) where ``take`` keeps the rows this caller owns."""
    for k, layer in enumerate(layers):
        g, take = apply_graph(h)
        h = take(layer.apply({"params": params[k]}, g).nodes)
        h = nn.relu(h) if k + 1 < len(layers) else h
    return h


def strategies(pg, layers, x, h0) -> list:
    """The cost model's choice per layer (these layers are opaque to `distributed.aggregate`: they send source
    rows whatever the cost, and the record says so)."""
    heads = [getattr(layer, "num_heads", 0) for layer in layers]
    widths = [x.shape[1] if x.ndim == 2 else 1, h0.shape[1]]
    outs = [h0.shape[1], layers[1].features]
    return [distributed.choose(pg, layer=f"{k}:{type(layer).__name__}", in_width=widths[k], out_width=outs[k],
                               softmax_heads=heads[k]) for k, layer in enumerate(layers)]


def loss_of(logits, labels):
    mask = labels >= 0
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, np.maximum(labels, 0))
    return jnp.sum(jnp.where(mask, ce, 0.0)) / mask.sum()


def train(step, params, opt_state, steps, *data):
    losses = []
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, *data)
        losses.append(float(np.asarray(loss.addressable_data(0))))
    return losses


def main(argv=None) -> int:
    global ARGS
    if argv is not None or ARGS is None:
        ARGS = _args(argv)
    if ARGS.coordinator:
        if hasattr(jax.config, "jax_cpu_collectives_implementation"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(ARGS.coordinator, num_processes=ARGS.num_processes, process_id=ARGS.process_id)
    graph, x, layers, labels = task(ARGS.model)
    edges = graph.edges
    tx = optax.adam(0.01)
    params = [layers[0].init(jax.random.key(0), graph._replace(nodes=x))["params"]]
    h0 = layers[0].apply({"params": params[0]}, graph._replace(nodes=x)).nodes
    params.append(layers[1].init(jax.random.key(1), graph._replace(nodes=h0))["params"])

    # One device: the whole graph.
    def single_step(params, opt_state, x):
        def loss_fn(params):
            logits = forward(layers, params, lambda h: (graph._replace(nodes=h), lambda y: y), x)
            return loss_of(logits, labels)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    on_local = jax.device_put((params, x), jax.local_devices()[0])  # this process's first device
    single = train(jax.jit(single_step), on_local[0], tx.init(on_local[0]), ARGS.steps, on_local[1])

    # P devices: one part each.
    devices = jax.devices()
    part = distributed.partition(graph, len(devices), method=ARGS.method)
    pg = distributed.build_parts(graph, part)
    mesh = Mesh(np.array(devices), ("parts",))
    arrays = distributed.structure(pg, mesh, edges=pg.edge_values(edges))
    x_parts = distributed.put(np.asarray(pg.to_padded(x)), mesh, PartitionSpec("parts"))
    params_rep = distributed.put(jax.device_get(params), mesh, PartitionSpec())
    labels_padded = np.asarray(pg.to_padded(labels + 1)) - 1  # unused rows: -1, never trained on

    def per_part(local, params, owned):
        return forward(layers, params, lambda h: (local.graph(h), local.owned), owned)

    def dist_step(params, opt_state, x_parts, arrays):
        def loss_fn(params):
            return loss_of(distributed.run(per_part, pg, mesh, arrays, params, x_parts), labels_padded)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = jax.jit(tx.init)(params_rep)
    dist = train(jax.jit(dist_step), params_rep, opt_state, ARGS.steps, x_parts, arrays)
    st = part.stats
    if jax.process_index() == 0:
        for choice in strategies(pg, layers, x, h0):
            print(f"layer {choice.layer}: sends {choice.strategy} ({choice.code.value}; source rows "
                  f"{choice.source_bytes:,} B, partial aggregates {choice.partial_bytes:,} B per step)")
        print(f"{ARGS.model}: {len(devices)} devices ({jax.process_count()} process(es)), {st.method} partition: "
              f"edge cut {st.edge_cut} ({st.cut_fraction:.1%}), node imbalance {st.node_imbalance:.3f}, "
              f"halo rows {sum(st.halo)}")
        for k, (a, b) in enumerate(zip(single, dist, strict=True)):
            print(f"step {k:3d}  loss {b:.6f}  one device {a:.6f}  rel diff {abs(a - b) / abs(a):.2e}")
    worst = max(abs(a - b) / abs(a) for a, b in zip(single, dist, strict=True))
    ok = worst <= ARGS.tolerance
    if jax.process_index() == 0:
        print(f"losses equal one device to {worst:.2e} (tolerance {ARGS.tolerance:g}): {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
