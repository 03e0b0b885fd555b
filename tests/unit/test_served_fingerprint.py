"""`system_fingerprint` follows what shapes a model's answers, not how it is served."""

from __future__ import annotations

from homing.app import served_fingerprint
from homing.config import ModelSettings
from homing.text.served import load_served_tokenizer


def test_routing_and_scaling_leave_the_fingerprint_and_answers_change_it() -> None:
    tokenizer = load_served_tokenizer()
    base = ModelSettings(name="m")
    fingerprint = served_fingerprint(base, tokenizer)
    assert fingerprint.startswith("fp_") and len(fingerprint) == 15
    served_alike = [
        ModelSettings(name="m", workers=["grpc://127.0.0.1:1"]),
        ModelSettings(name="m", policy="round_robin", stream_interval=4),
        ModelSettings(name="m", slo={"ttft_p95_s": 9.0}),
    ]
    for spec in served_alike:
        assert served_fingerprint(spec, tokenizer) == fingerprint
    simulated = served_fingerprint(ModelSettings(name="m", sim={"workers": 2}), tokenizer)
    faster = ModelSettings(name="m", sim={"workers": 4, "speedup": 5.0, "gpu": "H200"})
    assert served_fingerprint(faster, tokenizer) == simulated
    answering_otherwise = [
        ModelSettings(name="other"),
        ModelSettings(name="m", tool_call_parser="none"),
        ModelSettings(name="m", reasoning_parser="think"),
        ModelSettings(name="m", version="v2"),
    ]
    for spec in answering_otherwise:
        assert served_fingerprint(spec, tokenizer) != fingerprint
    bigger = ModelSettings(name="m", sim={"model": "llama-3.1-70b"})
    assert served_fingerprint(bigger, tokenizer) != simulated
