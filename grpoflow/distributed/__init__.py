"""Distributed: worker groups over a local pool or Ray actors; the one dispatch rule.

    worker_group.py        WorkerGroup: the one dispatch rule (split by rank, Batch texts stripped, gather), submit,
                           transfer
    host.py                RankHost (a rank's role objects in one process), LocalPool, RankFailure
    ray_pool.py            RayPool: ranks as Ray actors in a placement group, one process group, dead-rank detection
"""
