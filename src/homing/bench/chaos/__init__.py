"""The chaos suite (`make chaos`, `python -m homing.bench.chaos`): faults injected into real
simulated workers under streaming load through a real gateway, and the checks that no
request hangs and none fails before its first byte while another healthy worker exists.

Modules: `outcome` (the verdict on one request's bytes), `analysis` (a scenario's figures
and checks), `scenarios` (which faults, where, for how long) and `harness` (the processes,
the load, the faults, the table and the command line).
"""
