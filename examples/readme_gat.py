"""The README's example: a two-head GAT layer with message_passing, and what explain says about it."""
import jax
import jax.numpy as jnp

import jgnn
from jgnn.datasets import load_planetoid

data = load_planetoid("cora")
H, D = 2, 8
W = jax.random.normal(jax.random.key(0), (data.graph.nodes.shape[1], H * D)) * 0.05
a_src, a_dst = jax.random.normal(jax.random.key(1), (2, H, D)) * 0.1

def phi(src, dst, edge):                       # one edge
    z_src, z_dst = (src @ W).reshape(H, D), (dst @ W).reshape(H, D)
    logit = jnp.sum(z_src * a_src + z_dst * a_dst, -1)
    return {"z": z_src, "logit": jax.nn.leaky_relu(logit, 0.2)}

def rho(mailbox, node):                         # one node: ragged mailbox
    alpha = jgnn.softmax(mailbox["logit"])
    return jgnn.sum(alpha[:, :, None] * mailbox["z"])

gat = jgnn.message_passing(phi, rho, lambda node, agg: jax.nn.elu(agg.reshape(-1)))
out = jax.jit(gat)(data.graph)
print(out.nodes.shape)
print(jgnn.explain(gat, data.graph))
