"""Worker URLs: one canonical form per engine (so a duplicate is seen), and a clear refusal
of anything that is not grpc://host:port with a DNS name, IPv4 or [IPv6] host."""

from __future__ import annotations

import pytest

from homing.config.rules import MAX_WORKER_URL, check_worker_url


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("grpc://127.0.0.1:30000", "grpc://127.0.0.1:30000"),
        ("grpc://localhost:30000", "grpc://127.0.0.1:30000"),
        ("grpc://LocalHost:030000", "grpc://127.0.0.1:30000"),
        ("grpc://127.0.0.1:000000000000000000044343", "grpc://127.0.0.1:44343"),
        ("grpc://Worker-3.Pool.internal:50051", "grpc://worker-3.pool.internal:50051"),
        ("grpc://[::1]:5", "grpc://[::1]:5"),
    ],
)
def test_equivalent_spellings_have_one_canonical_url(url: str, canonical: str) -> None:
    assert check_worker_url(url) == canonical


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://127.0.0.1:5", "must look like grpc://host:port"),
        ("grpc://127.0.0.1", "must look like grpc://host:port"),
        ("grpc://127.0.0.1:99999", "needs a port in 1-65535"),
        ("grpc://127.0.0.1:5/", "must end at its port"),
        ("grpc://127.0.0.1:5/v1", "must end at its port"),
        ("grpc://127.0.0.1:0", "needs a port in 1-65535"),
        ("grpc://a:٥٥", "needs a port in 1-65535"),
        ("grpc://a:²", "needs a port in 1-65535"),
        ("grpc://a b:5", "has an invalid host"),
        ("grpc://a\n:5", "has an invalid host"),
        ("grpc://127.0.0.1:46183\x00x:1", "has an invalid host"),
        ("grpc://h\x00x:5", "has an invalid host"),
        ("grpc://héllo:5", "has an invalid host"),
        ("grpc://::1:5", "has an invalid host"),
        ("grpc://unix:/tmp/x:5", "has an invalid host"),
    ],
)
def test_malformed_urls_are_refused_saying_why(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check_worker_url(url)


def test_a_huge_url_is_refused_and_shown_cut() -> None:
    url = "grpc://" + "m" * 3_000_000 + ":5"
    with pytest.raises(ValueError) as err:
        check_worker_url(url)
    assert f"longer than {MAX_WORKER_URL} characters" in str(err.value)
    assert len(str(err.value)) < 200
