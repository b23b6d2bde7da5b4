"""Expert parallelism over two processes on CPU (gloo): each rank owns half of the experts, calls
the layer with its own tokens, and checks its output against the float64 oracle.

    torchrun --standalone --nproc-per-node 2 docs/examples/expert_parallel.py
"""

import torch
import torch.distributed as dist

import hal
from hal.backends.reference.ops import moe_tokens
from hal.synth import random_routing, random_tokens, random_weights
from hal.testing import ACCURACY, rel_err

dist.init_process_group("gloo")  # torchrun sets the rank, the world size and the rendezvous
rank = dist.get_rank()

spec = hal.MoESpec(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128)  # the whole layer
kernel = hal.select_moe_kernel(spec, device="cpu", group=dist.group.WORLD)
weights = random_weights(spec, seed=0)  # every rank reads the same checkpoint
prepared = kernel.prepare_weights(weights)  # and keeps its own experts

num_tokens = 5 + 3 * rank  # each rank its own batch, of its own size
x = random_tokens(spec, num_tokens, seed=rank)
topk_weights, topk_ids = random_routing(spec, num_tokens, seed=rank)
plan = kernel.plan(topk_ids)  # collective: the route counts, the layer does not run
out = kernel(x, topk_weights, topk_ids, prepared)  # collective

ref = moe_tokens(spec, x, topk_weights, topk_ids, weights, compute_dtype=torch.float64)
err = rel_err(out, ref)
print(f"rank {rank}: {kernel.backend} on experts {list(kernel.experts)}, {num_tokens} tokens, "
      f"rows received per rank {list(plan.rows_received)}, relative error vs float64: {err:.1e}",
      flush=True)
dist.barrier()  # no rank tears its connections down while another still reads from them
dist.destroy_process_group()
if err > ACCURACY:
    raise SystemExit(f"rank {rank}: relative error {err:.1e} above {ACCURACY}")
