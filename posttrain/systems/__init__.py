"""Systems calculators and simulators: memory, KV cache, rooflines, stragglers, pipelines.

Pure functions of a model's shape, a device's ceilings and a workload's sizes, with units
in their names (bytes, seconds, flops, tokens); small frozen dataclasses in and out; the
standard library only (torch only to measure this machine, hardware.measure_cpu). Each
formula is worked by hand in tests/test_systems_*.py, and checked against this machine in
tests/test_systems_measured.py.

    shapes       ModelShape from a transformers config.json or a preset; parameter counts
    hardware     Device (memory, FLOP/s, bandwidth, link), Cluster, published GPUs; this
                 CPU's ceilings measured (what benchmarks/ measure against)
    kv_cache     bytes per token under MHA/GQA/MQA; paged vs contiguous; prefix sharing
    roofline     decode, prefill and training FLOPs and bytes; the crossover batch
    memory       bytes per parameter, ZeRO stages, activations, LoRA
    rl_memory    the four copies of PPO / GRPO / DPO per GPU; fits; our step's envelope
    stragglers   the longest of K·B log-normal lengths; packing, cap, dynamic K; mismatch
    gantt        rollout / train / sync lanes for colocated, sync, async; weight sync's four ops
    scheduling   continuous batching, prefix caching, chunked prefill, speculative decoding
    throughput   τ_step from five terms by topology; per-role rooflines; levers ranked
    wallclock    "where is my wall-clock going": a decision tree over a run's time/* metrics
    plan         does model M fit on cluster C, and where will the time go (`posttrain systems`)
    placement    colocated, disaggregated, async: which GPUs hold which copy, the bytes of
                 the four paths (weights, trajectories, collectives, control), the step
"""
