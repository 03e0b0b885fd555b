"""Trace loaders and deterministic prompt construction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homing.bench.traces import (
    MOONCAKE_BLOCK_TOKENS,
    PromptBuilder,
    TraceFormatError,
    TraceRequest,
    load_trace,
    parse_azure,
    trace_format,
)

SHARED_TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def mooncake_file(tmp_path: Path) -> Path:
    return _write_jsonl(
        tmp_path / "trace.jsonl",
        [
            {"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]},
            {"timestamp": 1500, "input_length": 700, "output_length": 3, "hash_ids": [0, 3]},
            {"timestamp": 4000, "input_length": 1024, "output_length": 7, "hash_ids": [0, 1]},
            {"timestamp": 9000, "input_length": 10, "output_length": 1, "hash_ids": [9]},
        ],
    )


class TestMooncake:
    def test_rows_become_requests_with_arrivals_from_the_first_row(
        self, mooncake_file: Path
    ) -> None:
        """Timestamps in ms become seconds after the first row; lengths and ids are kept."""
        reqs = load_trace(mooncake_file)
        assert [r.arrival_s for r in reqs] == [0.0, 0.5, 3.0, 8.0]
        assert reqs[1] == TraceRequest(
            index=1, arrival_s=0.5, prompt_tokens=700, output_tokens=3, hash_ids=(0, 3)
        )

    def test_limit_takes_the_first_n_rows(self, mooncake_file: Path) -> None:
        """`limit` keeps the first N rows in file order."""
        reqs = load_trace(mooncake_file, limit=2)
        assert [r.prompt_tokens for r in reqs] == [1100, 700]

    def test_prompt_has_exactly_input_length_tokens(self, mooncake_file: Path) -> None:
        """Every prompt is exactly `input_length` ids long, the last block cut."""
        builder = PromptBuilder()
        for req in load_trace(mooncake_file):
            assert len(builder.prompt_ids(req)) == req.prompt_tokens

    def test_equal_hash_ids_give_identical_prefixes(self, mooncake_file: Path) -> None:
        """Requests sharing leading hash ids share exactly those blocks of tokens."""
        a, b, c, _ = load_trace(mooncake_file)
        builder = PromptBuilder()
        pa, pb, pc = builder.prompt_ids(a), builder.prompt_ids(b), builder.prompt_ids(c)
        block = MOONCAKE_BLOCK_TOKENS
        assert pa[:block] == pb[:block] == pc[:block]
        assert pa[block : 2 * block] != pb[block : 2 * block]  # ids 1 and 3 differ
        assert pc == pa[: 2 * block]  # ids [0, 1] are a prefix of [0, 1, 2]

    def test_last_block_is_the_start_of_its_full_block(self, mooncake_file: Path) -> None:
        """The partial last block is the head of the same id's full 512-token block."""
        req = load_trace(mooncake_file)[0]  # 1100 tokens = 512 + 512 + 76 of id 2
        builder = PromptBuilder()
        assert builder.prompt_ids(req)[2 * MOONCAKE_BLOCK_TOKENS :] == list(
            builder.mooncake_block(2)[:76]
        )

    def test_prompts_are_reproducible_across_builders(self, mooncake_file: Path) -> None:
        """Two independent builders (cache or none) produce the same ids for the same row."""
        req = load_trace(mooncake_file)[0]
        assert PromptBuilder().prompt_ids(req) == PromptBuilder(cache_blocks=0).prompt_ids(req)

    def test_token_ids_stay_in_the_vocab_range(self, mooncake_file: Path) -> None:
        """All ids lie in [vocab_low, vocab_limit)."""
        builder = PromptBuilder(vocab_low=5, vocab_limit=37)
        ids = [t for r in load_trace(mooncake_file) for t in builder.prompt_ids(r)]
        assert min(ids) >= 5 and max(ids) < 37
        assert len(set(ids)) == 32  # the whole range is used

    def test_hash_id_count_must_match_input_length(self, tmp_path: Path) -> None:
        """A row whose hash ids cannot cover its input length is rejected with its line."""
        path = _write_jsonl(
            tmp_path / "bad.jsonl",
            [
                {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]},
                {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]},
            ],
        )
        with pytest.raises(TraceFormatError, match=r"bad\.jsonl:2"):
            load_trace(path)

    def test_malformed_json_is_a_format_error(self, tmp_path: Path) -> None:
        """A line that is not JSON raises TraceFormatError, not a bare JSON error."""
        path = tmp_path / "t.jsonl"
        path.write_text("{not json\n")
        with pytest.raises(TraceFormatError, match="not JSON"):
            load_trace(path)

    def test_shared_trace_loads_with_consistent_lengths(self) -> None:
        """The real Mooncake conversation trace loads and builds prompts of the right length."""
        path = SHARED_TRACES / "mooncake" / "conversation_trace.jsonl"
        if not path.exists():
            pytest.skip("shared traces not present")
        reqs = load_trace(path, limit=20)
        assert len(reqs) == 20 and all(r.hash_ids and r.hash_ids[0] == 0 for r in reqs)
        builder = PromptBuilder()
        prompts = [builder.prompt_ids(r) for r in reqs[:3]]
        assert [len(p) for p in prompts] == [r.prompt_tokens for r in reqs[:3]]
        assert prompts[0][:512] == prompts[1][:512]


class TestAzure:
    CSV = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:17:05.4799600,110,27\n"
    )

    def test_wall_clock_becomes_seconds_since_the_first_row(self) -> None:
        """TIMESTAMP differences from the first row give arrival_s."""
        reqs = parse_azure(self.CSV.splitlines(keepends=True))
        assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.052, 1.5])
        assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [
            (4808, 10),
            (3180, 8),
            (110, 27),
        ]
        assert all(r.hash_ids is None for r in reqs)

    def test_limit_and_extension_dispatch(self, tmp_path: Path) -> None:
        """A .csv file loads as Azure and `limit` keeps the first rows."""
        path = tmp_path / "azure.csv"
        path.write_text(self.CSV)
        assert trace_format(path) == "azure"
        assert [r.index for r in load_trace(path, limit=2)] == [0, 1]

    def test_rows_share_no_prefix(self) -> None:
        """Azure prompts are per-row random: two rows differ from their first token block."""
        reqs = parse_azure(self.CSV.splitlines(keepends=True))
        builder = PromptBuilder()
        a, b = builder.prompt_ids(reqs[0]), builder.prompt_ids(reqs[1])
        assert len(a) == 4808 and len(b) == 3180
        assert a[:16] != b[:16]
        assert builder.prompt_ids(reqs[0]) == a  # yet deterministic

    def test_missing_column_is_reported(self) -> None:
        """A csv without GeneratedTokens raises TraceFormatError naming the column."""
        with pytest.raises(TraceFormatError, match="GeneratedTokens"):
            parse_azure(["TIMESTAMP,ContextTokens\n", "2023-11-16 18:17:03,5\n"])


def test_unknown_extension_is_rejected(tmp_path: Path) -> None:
    """Only .jsonl and .csv are trace formats."""
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        trace_format(tmp_path / "trace.txt")
