"""Data-parallel GradManager training on torch.distributed (gloo on CPU, NCCL on CUDA).

    device = engine.distributed.init("cpu")                  # joins what torchrun describes
    gm = engine.GradManager(model, device=device)
    engine.distributed.broadcast_params(gm)                  # ranks start from rank 0's weights
    gm.attach(names, callbacks=engine.distributed.make_allreduce_cb("MEAN"))
    ...
    gm.save(path)                                            # rank 0 writes

See docs/gradmanager.md, "Data-parallel training".
"""
from .allreduce import AllreduceCallback, BackwardStats, BucketPlan, make_allreduce_cb, plan_buckets
from .group import broadcast_params, init, rank, world_size

__all__ = ["init", "broadcast_params", "make_allreduce_cb", "AllreduceCallback", "BucketPlan", "BackwardStats",
           "plan_buckets", "rank", "world_size"]
