"""homing.sim: a simulated SGLang worker that speaks SGLang's exact gRPC protocol.

Functional core (pure, `now` passed in): `timing` (roofline step durations and KV pool size),
`radix_cache` (paged prefix cache, SGLang block hashes and KV events), `scheduler`
(continuous batching, chunked prefill, KV admission), `generation` (deterministic outputs).
Imperative shell: `engine_loop` (runs the scheduler on a real clock x speedup), `kv_events`
(SubscribeKvEvents streams), `servicer` (the SglangScheduler gRPC service), `worker`
(`SimWorker`: one grpc.aio server) and `main` (`homing sim`).
"""
