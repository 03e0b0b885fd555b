"""Simulated outputs: real served-tokenizer ids, deterministic, readable, multi-byte, EOS-ended."""

from __future__ import annotations

from homing.sim.generation import CORPUS, OutputPlanner
from homing.text.served import load_served_tokenizer

TOKENIZER = load_served_tokenizer()
PLANNER = OutputPlanner(TOKENIZER)
EOS = TOKENIZER.eos_token_ids[0]


def answer(planner: OutputPlanner, prompt: list[int], limit: int = 2000, **kw: object) -> list[int]:
    """The planned tokens up to and including the EOS (or `limit` tokens)."""
    plan = planner.plan(prompt, **kw)  # type: ignore[arg-type]
    out: list[int] = []
    for i in range(limit):
        out.append(plan.token_at(i))
        if out[-1] == EOS:
            break
    return out


class TestDeterminism:
    def test_greedy_output_depends_on_the_prompt_only(self) -> None:
        """At temperature 0 request id, seed and worker seed do not matter; the prompt does."""
        prompt = TOKENIZER.encode("Say hello in Chinese")
        a = answer(PLANNER, prompt, request_id="a")
        b = answer(OutputPlanner(TOKENIZER, worker_seed=7), prompt, request_id="b", seed=3)
        assert a == b
        assert a != answer(PLANNER, [*prompt, 13])

    def test_sampled_output_follows_the_request_seed(self) -> None:
        """At temperature > 0 the same seed repeats the answer and other seeds vary it."""
        prompt = TOKENIZER.encode("Tell me a story")
        same = answer(PLANNER, prompt, temperature=0.8, seed=42, request_id="x")
        assert same == answer(PLANNER, prompt, temperature=0.8, seed=42, request_id="y")
        others = {tuple(answer(PLANNER, prompt, temperature=0.8, seed=s)) for s in range(8)}
        assert len(others) > 1


class TestContent:
    def test_answers_are_whole_sentences_of_20_to_120_tokens_then_eos(self) -> None:
        """Every answer ends with the tokenizer's EOS after roughly 20-120 tokens and decodes
        to readable text."""
        for n in range(30):
            tokens = answer(PLANNER, [100 + n, 200, 300])
            assert tokens[-1] == EOS
            assert 20 <= len(tokens) - 1 <= 120 + 40  # whole sentences: may overrun the draw
            text = TOKENIZER.decode(tokens)
            assert "\ufffd" not in text and text.strip()
            assert all(0 <= t < TOKENIZER.vocab_size for t in tokens)

    def test_some_characters_are_split_across_tokens(self) -> None:
        """The corpus holds Chinese and emoji whose bytes span several tokens, so a
        token-by-token decode shows replacement characters an incremental detokenizer must
        hold back."""
        texts = ["".join(TOKENIZER.decode([t]) for t in answer(PLANNER, [n])) for n in range(60)]
        assert any("\ufffd" in t for t in texts)
        full = "".join(TOKENIZER.decode(answer(PLANNER, [n])) for n in range(60))
        assert any("\u4e00" <= ch <= "\u9fff" for ch in full)
        assert any(ord(ch) > 0xFFFF for ch in full)  # emoji outside the BMP

    def test_ignore_eos_never_emits_eos(self) -> None:
        """Under ignore_eos the sentences continue for as long as asked."""
        plan = PLANNER.plan([5, 6, 7], ignore_eos=True)
        tokens = [plan.token_at(i) for i in range(1500)]
        assert EOS not in tokens


class TestLogitBias:
    def test_banned_tokens_never_appear(self) -> None:
        """A bias of -100 bans its token: the most common tokens of the unbiased answers are
        absent from every biased one, and the answer still ends with the EOS."""
        prompts = [[100 + n, 200, 300] for n in range(20)]
        counts: dict[int, int] = {}
        for prompt in prompts:
            for token in answer(PLANNER, prompt)[:-1]:
                counts[token] = counts.get(token, 0) + 1
        banned = sorted(counts, key=lambda t: -counts[t])[:5]
        for prompt in prompts:
            tokens = answer(PLANNER, prompt, logit_bias={t: -100.0 for t in banned})
            assert tokens[-1] == EOS and len(tokens) > 1
            assert not set(banned) & set(tokens)

    def test_a_banned_eos_never_ends_the_answer(self) -> None:
        """Banning the only EOS id leaves an answer without end, as ignore_eos does."""
        plan = PLANNER.plan([5, 6, 7], logit_bias={EOS: -100.0})
        assert EOS not in [plan.token_at(i) for i in range(1500)]

    def test_forced_tokens_are_the_whole_answer(self) -> None:
        """With +100 biases every token is one of the forced ids, drawn deterministically."""
        forced = {19923: 100.0, 270: 100.0}
        plan = PLANNER.plan([5, 6, 7], temperature=0.7, request_id="r", logit_bias=forced)
        tokens = [plan.token_at(i) for i in range(200)]
        assert set(tokens) == {19923, 270}
        again = PLANNER.plan([5, 6, 7], temperature=0.7, request_id="r", logit_bias=forced)
        assert [again.token_at(i) for i in range(200)] == tokens

    def test_a_forced_eos_ends_the_answer_at_once(self) -> None:
        """Forcing only the EOS makes the answer empty."""
        assert answer(PLANNER, [5, 6, 7], logit_bias={EOS: 100.0}) == [EOS]

    def test_small_biases_change_nothing(self) -> None:
        """Biases strictly between -100 and 100 leave the answer as it was."""
        prompt = [9, 8, 7]
        assert answer(PLANNER, prompt, logit_bias={270: -99.0, 19923: 50.0}) == answer(
            PLANNER, prompt
        )

    def test_banning_every_corpus_token_leaves_the_eos(self) -> None:
        """When no sentence survives the bans the answer is the EOS alone."""
        corpus = {t for s in CORPUS for t in TOKENIZER.encode(s) + TOKENIZER.encode(" " + s)}
        bias = dict.fromkeys(corpus, -100.0)
        assert answer(PLANNER, [1, 2], logit_bias=bias) == [EOS]
