"""Simulated outputs: real served-tokenizer ids, deterministic, readable, multi-byte, EOS-ended
(or, for a constrained instance longer than the tokens asked for, cut without EOS)."""

from __future__ import annotations

import json
import re
from typing import Any

from homing.sim.chat import REASONING_CORPUS
from homing.sim.generation import CORPUS, OutputPlanner
from homing.sim.grammar import compile_constraint
from homing.sim.instances import instance_errors
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


WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
TOOL_CALL = re.compile(
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>(?P<name>[^<]+)<｜tool▁sep｜>(?P<args>.*?)"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
    re.DOTALL,
)


def chat(messages: list[dict[str, Any]], **variables: Any) -> list[int]:
    return TOKENIZER.encode_chat(messages, variables=variables)


def text_of(tokens: list[int]) -> str:
    return TOKENIZER.decode(tokens, skip_special_tokens=False)


class TestChat:
    def test_a_prompt_offering_tools_is_answered_with_one_call_in_the_templates_format(
        self,
    ) -> None:
        """The whole answer is one call of a declared tool, arguments valid for its schema
        and made of the user's words, then EOS: what the template renders for a call."""
        prompt = chat([{"role": "user", "content": "What is the weather in Paris?"}], tools=TOOLS)
        for temperature, seed in ((0.0, None), (0.8, 1), (0.8, 2)):
            text = text_of(answer(PLANNER, prompt, temperature=temperature, seed=seed))
            match = TOOL_CALL.fullmatch(text)
            assert match, text
            assert match.group("name") == "get_weather"
            arguments = json.loads(match.group("args"))
            assert instance_errors(WEATHER, arguments) == []
            assert arguments["city"] == "Paris"

    def test_a_tool_call_answer_renders_back_through_the_template(self) -> None:
        """The call, put back into the conversation as an assistant message, renders to the
        same text the answer was."""
        messages = [{"role": "user", "content": "Weather in Lyon?"}]
        prompt = chat(messages, tools=TOOLS)
        text = text_of(answer(PLANNER, prompt))
        match = TOOL_CALL.fullmatch(text)
        assert match
        call = {"function": {"name": match.group("name"), "arguments": match.group("args")}}
        history = [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}]
        rendered = TOKENIZER.apply_chat_template(
            history, add_generation_prompt=False, variables={"tools": TOOLS}
        )
        assert rendered.endswith(text)

    def test_tool_call_share_zero_answers_in_plain_text(self) -> None:
        prompt = chat([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
        text = text_of(answer(OutputPlanner(TOKENIZER, tool_call_share=0.0), prompt))
        assert "<｜tool▁calls▁begin｜>" not in text and text.endswith("<｜end▁of▁sentence｜>")

    def test_a_thinking_prompt_is_answered_with_reasoning_then_think_end_then_the_answer(
        self,
    ) -> None:
        prompt = chat([{"role": "user", "content": "Why is the sky blue?"}], thinking=True)
        tokens = answer(PLANNER, prompt)
        reasoning, sep, rest = text_of(tokens).partition("</think>")
        assert sep and reasoning.startswith(REASONING_CORPUS)
        assert rest.strip() and rest.endswith("<｜end▁of▁sentence｜>")
        assert tokens.count(PLANNER.chat_tokens.think_end) == 1  # type: ignore[union-attr]

    def test_a_prompt_ending_after_a_tool_result_quotes_that_result(self) -> None:
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "21 degrees and sunny"},
        ]
        text = text_of(answer(PLANNER, chat(messages, tools=TOOLS)))
        assert text == "The tool returned: 21 degrees and sunny<｜end▁of▁sentence｜>"

    def test_a_constrained_answer_is_one_instance_then_eos(self) -> None:
        constraint = compile_constraint("json_schema", json.dumps(WEATHER))
        prompt = chat([{"role": "user", "content": "Weather in Rome"}])
        tokens = answer(PLANNER, prompt, constraint=constraint)
        assert tokens[-1] == EOS
        assert instance_errors(WEATHER, json.loads(TOKENIZER.decode(tokens[:-1]))) == []

    def test_a_constraint_after_thinking_reasons_only_when_reasoning_is_required(self) -> None:
        constraint = compile_constraint("regex", "(yes|no)")
        prompt = chat([{"role": "user", "content": "Is it?"}], thinking=True)
        plain = text_of(answer(PLANNER, prompt, constraint=constraint))
        assert plain in ("yes<｜end▁of▁sentence｜>", "no<｜end▁of▁sentence｜>")
        reasoned = text_of(answer(PLANNER, prompt, constraint=constraint, require_reasoning=True))
        _, sep, rest = reasoned.partition("</think>")
        assert sep and rest in ("yes<｜end▁of▁sentence｜>", "no<｜end▁of▁sentence｜>")

    def test_chat_features_leave_plain_answers_as_they_were(self) -> None:
        """A chat prompt without tools or thinking gets the plain corpus answer, and every
        answer exposes its draw seed."""
        prompt = chat([{"role": "user", "content": "Hello"}])
        plan = PLANNER.plan(prompt)
        assert type(plan).__name__ == "PlannedOutput"
        assert plan.draw_seed == PLANNER.plan(prompt).draw_seed


HUGE: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "array", "minItems": 100_000_000, "items": {"type": "string"}}},
    "required": ["a"],
}
"""A schema whose smallest instance is a hundred million strings long."""


def planned(planner: OutputPlanner, prompt: list[int], count: int, **kw: Any) -> list[int]:
    """The first `count` tokens of the answer (drawn within the character budget: drawing
    the whole instance would take hours)."""
    plan = planner.plan(prompt, **kw)
    return [plan.token_at(i) for i in range(count)]


class TestConstraintBudget:
    def test_a_huge_instance_is_cut_without_eos_as_long_as_the_tokens_asked_for(self) -> None:
        """The scheduler ends the answer at "length": its first max_new_tokens tokens hold no
        EOS, and they are the start of the instance."""
        constraint = compile_constraint("json_schema", json.dumps(HUGE))
        prompt = chat([{"role": "user", "content": "List things"}])
        tokens = planned(PLANNER, prompt, 50, constraint=constraint, max_new_tokens=50)
        assert EOS not in tokens
        text = TOKENIZER.decode(tokens)
        assert text.startswith('{"a": ["')
        closed = json.loads(text[: text.rindex('", "') + 1] + "]}")
        assert len(closed["a"]) > 3
        again = planned(PLANNER, prompt, 50, constraint=constraint, max_new_tokens=50)
        assert again == tokens

    def test_a_small_instance_still_ends_with_eos_as_before(self) -> None:
        constraint = compile_constraint("json_schema", json.dumps(WEATHER))
        prompt = chat([{"role": "user", "content": "Weather in Rome"}])
        tokens = answer(PLANNER, prompt, constraint=constraint, max_new_tokens=50)
        assert tokens == answer(PLANNER, prompt, constraint=constraint)
        assert tokens[-1] == EOS
        assert instance_errors(WEATHER, json.loads(TOKENIZER.decode(tokens[:-1]))) == []

    def test_the_reasoning_before_a_cut_instance_leaves_it_the_rest_of_the_tokens(self) -> None:
        constraint = compile_constraint("json_schema", json.dumps(HUGE))
        prompt = chat([{"role": "user", "content": "Think, then list"}], thinking=True)
        kw: dict[str, Any] = {"constraint": constraint, "require_reasoning": True}
        tokens = planned(PLANNER, prompt, 80, max_new_tokens=80, **kw)
        assert EOS not in tokens
        _, sep, rest = text_of(tokens).partition("</think>")
        assert sep and rest.startswith('{"a": ["')

    def test_a_cut_text_of_long_tokens_is_drawn_again_until_it_holds_enough(self) -> None:
        """Runs of spaces take 128 characters a token, far more than the first budget's 8:
        the text is drawn again with a larger budget, and still fills the tokens asked for."""
        constraint = compile_constraint("regex", " {999999999}")
        tokens = planned(PLANNER, [5, 6, 7], 200, constraint=constraint, max_new_tokens=200)
        assert EOS not in tokens
        assert set(TOKENIZER.decode(tokens)) == {" "}

    def test_a_tool_whose_arguments_are_huge_is_called_with_empty_arguments(self) -> None:
        tools = [{"type": "function", "function": {"name": "f", "parameters": HUGE}}]
        prompt = chat([{"role": "user", "content": "Call f"}], tools=tools)
        text = text_of(answer(PLANNER, prompt, max_new_tokens=50))
        match = TOOL_CALL.fullmatch(text)
        assert match and match.group("name") == "f"
        assert json.loads(match.group("args")) == {}
