"""Log probabilities of the simulated worker: a pure function of the token, its position and
the request, shaped as SGLang 0.5.23 sends them.

Rule of this file: no state, no I/O; only requests that ask for logprobs pay for them.

The distribution at one position (`position_logprobs`): draws come from
`random.Random(key, position, token)` (SHA-256 of the three, so stable across processes), and
  p0 in [0.35, 0.98)                              the most likely token's probability,
  p_j = (1 - p0) * 0.9 * 2**-j * w_j, j >= 1      w_j in (0.5, 1],
so the probabilities fall strictly (p_j >= 2 p_{j+1} > ... and p_1 < p0), every logprob is
below 0 and the listed probabilities sum to less than 1 - (1 - p0) / 10: a valid prefix of a
distribution, whatever `top_logprobs_num`. The token the answer has at that position takes
rank 0 when the request is greedy (temperature 0: the sampled token is the top-1), else a
drawn rank (0 with odds 0.6, 1..2 with 0.3, 3..7 with 0.1; a rank past `top_logprobs_num`
leaves it out of the top list, as a real sampler's token often is). The other ranks hold
distinct ids of `pool` (the planner's corpus tokens, so alternatives decode to real text).

- Output position p (0-based among the output tokens) of a request: key = the request's draw
  seed (`homing.sim.generation`: the prompt's SHA-256 when greedy, the request seed and the
  worker seed otherwise), so streamed and non-streamed answers carry the same numbers.
- Prompt position i >= 1: key = the id of the token before it, not greedy (the prompt's
  own token need not be the top-1), so a shared prefix has the same logprobs in every prompt.
  As SGLang's, the first position of the requested range (`logprob_start_len`) has no value
  and an empty top list, whatever its index.
"""

from __future__ import annotations

import hashlib
import math
import random
import struct
from collections.abc import Sequence

from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

PROMPT_KEY_SALT = 0x70726F6D7074  # "prompt": keeps prompt keys apart from draw seeds


def position_logprobs(
    key: int, position: int, token: int, top_n: int, greedy: bool, pool: Sequence[int]
) -> tuple[float, list[int], list[float]]:
    """(logprob of `token`, top ids, top logprobs) at one position (see the module docstring);
    the top lists have `top_n` entries in descending order."""
    digest = hashlib.sha256(struct.pack("<QQQ", key & (2**64 - 1), position, token)).digest()
    rng = random.Random(int.from_bytes(digest[:16], "little"))
    if greedy:
        rank = 0
    else:
        u = rng.random()
        rank = 0 if u < 0.6 else 1 + int(rng.random() * 2) if u < 0.9 else 3 + int(rng.random() * 5)
    ranks = max(top_n, rank + 1)
    p0 = 0.35 + 0.63 * rng.random()
    rest = (1.0 - p0) * 0.9
    logprobs = [math.log(p0)]
    scale = rest
    for _ in range(1, ranks):
        scale *= 0.5
        logprobs.append(math.log(scale * (1.0 - 0.5 * rng.random())))
    ids: list[int] = []
    if top_n:
        used = {token}
        for r in range(top_n):
            if r == rank:
                ids.append(token)
                continue
            while True:
                candidate = pool[rng.randrange(len(pool))] if pool else rng.randrange(1000, 100000)
                if candidate not in used:
                    break
            used.add(candidate)
            ids.append(candidate)
    return logprobs[rank], ids, logprobs[:top_n]


def output_logprobs(
    key: int,
    start: int,
    tokens: Sequence[int],
    top_n: int,
    greedy: bool,
    pool: Sequence[int],
) -> pb.OutputLogProbs:
    """`OutputLogProbs` for `tokens`, the output positions `start`.. of one request (SGLang's
    shape: no top rows when `top_n` is 0)."""
    message = pb.OutputLogProbs()
    for offset, token in enumerate(tokens):
        value, ids, values = position_logprobs(key, start + offset, token, top_n, greedy, pool)
        message.token_logprobs.append(value)
        message.token_ids.append(token)
        if top_n:
            message.top_logprobs.add(values=values, token_ids=ids)
    return message


def prefill_only_logprobs(
    key: int, top_n: int, greedy: bool, pool: Sequence[int]
) -> pb.OutputLogProbs:
    """What SGLang sends for a request with no output token (`max_new_tokens` 0): no token,
    and with `top_n` > 0 one top row for the position that would come next."""
    message = pb.OutputLogProbs()
    if top_n:
        _, ids, values = position_logprobs(key, 0, pool[0] if pool else 0, top_n, greedy, pool)
        message.top_logprobs.add(values=values, token_ids=ids)
    return message


def input_logprobs(
    input_ids: Sequence[int], start: int, top_n: int, pool: Sequence[int]
) -> pb.InputLogProbs:
    """`InputLogProbs` of the prompt positions `start`.. (the first without a value)."""
    message = pb.InputLogProbs()
    for i in range(start, len(input_ids)):
        token = input_ids[i]
        message.token_ids.append(token)
        if i == start:
            message.token_logprobs.add()
            if top_n:
                message.top_logprobs.add()
            continue
        key = PROMPT_KEY_SALT ^ input_ids[i - 1]
        value, ids, values = position_logprobs(key, i, token, top_n, False, pool)
        message.token_logprobs.add(value=value)
        if top_n:
            message.top_logprobs.add(values=values, token_ids=ids)
    return message
