"""homing.sim: a simulated SGLang worker that speaks SGLang's exact gRPC protocol.

Functional core (pure, `now` passed in): `timing` (calibrated step durations and KV pool size),
`radix_cache` (paged prefix cache, SGLang block hashes and KV events), `scheduler`
(continuous batching, chunked prefill, fcfs/lpm, KV admission and retraction), `generation`
(deterministic outputs), `faults` (fault bodies and state), `virtual` (the scheduler on a
virtual clock), `discovery` (the GetModelInfo and GetServerInfo answers). Imperative
shell: `engine_loop` (runs the scheduler on a real clock x speedup),
`kv_events` (SubscribeKvEvents streams), `servicer` (the SglangScheduler gRPC service),
`metrics` and `sidecar` (HTTP /metrics and /fault on port + 1), `worker` (`SimWorker`: one
grpc.aio server and its sidecar) and `main` (`homing sim`, `homing sim perf`). How fast a sim
process can run a trace is measured from outside, by `homing.bench.sim_throughput`.
"""
