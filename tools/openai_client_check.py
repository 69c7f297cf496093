#!/usr/bin/env python3
"""Reads `wgmoe serve`'s log-probabilities with the official OpenAI Python client.

    python tools/openai_client_check.py --base-url http://127.0.0.1:PORT/v1 --model olmoe-tiny

Completions (`logprobs: N`) and chat (`logprobs` + `top_logprobs`), whole and streamed,
are read through the client's typed objects: responses are validated against its own
pydantic models (`_strict_response_validation`), so a field of the wrong shape fails in
the client, as it would for a user, and every check reads attributes, never raw dicts.
Streamed answers must carry the same tokens and log-probabilities as whole ones (greedy,
same prompt). Exits 1 naming each failed check; prints a summary otherwise.
`tests/serve_openai_client.rs` runs it against a served fixture (CI: `.ci/run`).
"""

import argparse
import math
import sys

import openai
from openai.types import Completion
from openai.types.completion_choice import Logprobs
from openai.types.chat import ChatCompletion, ChatCompletionChunk

PROMPT = "The old clockmaker"
MESSAGES = [{"role": "user", "content": "Hello there"}]
MAX_TOKENS = 4
TOP = 3
# A repeated request reuses the cached prompt: its first row comes from a shorter prefill.
SAME_TOL = 1e-4


class CheckFailed(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def is_num(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_logprob(what, lp):
    expect(is_num(lp) and lp <= 0.0, f"{what}: logprob {lp!r} is not a finite float <= 0")


def descending(what, values):
    expect(
        all(a >= b for a, b in zip(values, values[1:])),
        f"{what}: not most likely first: {values}",
    )


def text_matches(what, tokens, text):
    """The tokens' texts make up the text. A token holding part of a UTF-8 character
    decodes to U+FFFD alone, so with one the other pieces need only appear in order."""
    joined = "".join(tokens)
    if "\ufffd" not in joined:
        expect(joined == text, f"{what}: tokens {tokens!r} do not join to the text {text!r}")
        return
    at = 0
    for piece in joined.split("\ufffd"):
        found = text.find(piece, at)
        expect(found >= 0, f"{what}: {piece!r} of tokens {tokens!r} not in {text!r}")
        at = found + len(piece)


class Ctx:
    def __init__(self, args):
        self.model = args.model
        self.base_url = args.base_url
        # Strict: the client validates every response (and chunk) against its models.
        self.client = openai.OpenAI(
            base_url=args.base_url,
            api_key="none",
            max_retries=0,
            timeout=120,
            _strict_response_validation=True,
        )
        # As users get it (no validation): for shapes the API returns but the client's
        # models do not declare (prompt scoring's null first `token_logprobs`).
        self.lax_client = openai.OpenAI(
            base_url=args.base_url, api_key="none", max_retries=0, timeout=120
        )
        self.results = {}

    def needs(self, name):
        expect(name in self.results, f"needs the result of check {name}, which failed")
        return self.results[name]


# --- Completions ---------------------------------------------------------------------


def completion_entries(what, lp, n_top, first_offset=None):
    """A completions `logprobs` object as [(token, logprob, [(alt, logprob)...], offset)],
    checked: equal lengths, logprobs <= 0, at most `n_top` alternatives, offsets advancing
    by each token's length in characters (the alternatives' order: `top_first`)."""
    expect(lp is not None, f"{what}: choices[0].logprobs is null")
    tokens, lps, tops, offs = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    for name, v in [("tokens", tokens), ("token_logprobs", lps), ("top_logprobs", tops),
                    ("text_offset", offs)]:
        expect(isinstance(v, list), f"{what}: logprobs.{name} is {v!r}, not a list")
    expect(
        len(tokens) == len(lps) == len(tops) == len(offs),
        f"{what}: lengths differ: tokens {len(tokens)}, token_logprobs {len(lps)}, "
        f"top_logprobs {len(tops)}, text_offset {len(offs)}",
    )
    out = []
    for i, (tok, l, top, off) in enumerate(zip(tokens, lps, tops, offs)):
        w = f"{what}: token {i} {tok!r}"
        expect(isinstance(tok, str), f"{w}: not a string")
        check_logprob(w, l)
        expect(isinstance(top, dict), f"{w}: top_logprobs entry {top!r} is not a dict")
        expect(1 <= len(top) <= n_top, f"{w}: {len(top)} alternatives, want 1..={n_top}")
        for alt, v in top.items():
            check_logprob(f"{w}: alternative {alt!r}", v)
        expect(isinstance(off, int) and not isinstance(off, bool), f"{w}: text_offset {off!r}")
        if i == 0 and first_offset is not None:
            expect(off == first_offset, f"{w}: text_offset {off}, want {first_offset}")
        if i > 0:
            prev = out[-1]
            expect(
                off == prev[3] + len(prev[0]),
                f"{w}: text_offset {off} after {prev[0]!r} at {prev[3]}",
            )
        out.append((tok, l, list(top.items()), off))
    return out


def top_first(what, entries):
    """Each `top_logprobs` object lists the most likely first, as OpenAI's API writes it
    (checked apart, so the other checks still run when only the order is wrong)."""
    for i, (tok, _, top, _) in enumerate(entries):
        descending(f"{what}: token {i} {tok!r}: top_logprobs {dict(top)}", [v for _, v in top])


def greedy_entries(what, entries):
    """A greedy token is the most likely: its own text among the alternatives, and none
    more likely (distinct ids may share a text, so not always the first key)."""
    for tok, l, top, _ in entries:
        keys = [k for k, _ in top]
        expect(tok in keys, f"{what}: greedy token {tok!r} not among its alternatives {keys}")
        expect(l >= top[0][1] - 1e-6, f"{what}: greedy token {tok!r} {l} below {top[0]}")


def same_entries(what, got, want):
    expect(
        [e[0] for e in got] == [e[0] for e in want],
        f"{what}: tokens {[e[0] for e in got]} != {[e[0] for e in want]}",
    )
    for (t, l, top, off), (_, l2, top2, off2) in zip(got, want):
        expect(abs(l - l2) < SAME_TOL, f"{what}: {t!r} logprob {l} != {l2}")
        expect(off == off2, f"{what}: {t!r} text_offset {off} != {off2}")
        expect(
            [k for k, _ in top] == [k for k, _ in top2],
            f"{what}: {t!r} alternatives {top} != {top2}",
        )
        for (k, v), (_, v2) in zip(top, top2):
            expect(abs(v - v2) < SAME_TOL, f"{what}: {t!r} alternative {k!r} {v} != {v2}")


def check_models(ctx):
    ids = [m.id for m in ctx.client.models.list().data]
    expect(ctx.model in ids, f"/v1/models lists {ids}, not {ctx.model!r}")
    return f"/v1/models lists {ids}"


def check_completion(ctx):
    r = ctx.client.completions.create(
        model=ctx.model, prompt=PROMPT, max_tokens=MAX_TOKENS, logprobs=TOP, temperature=0
    )
    expect(isinstance(r, Completion), f"parsed as {type(r)}")
    expect(r.model == ctx.model, f"model {r.model!r}")
    c = r.choices[0]
    entries = completion_entries("completion", c.logprobs, TOP, first_offset=0)
    n = len(entries)
    expect(1 <= n <= MAX_TOKENS, f"{n} tokens for max_tokens {MAX_TOKENS}")
    if c.finish_reason == "length":
        expect(n == MAX_TOKENS, f"finish_reason length after {n} tokens")
    greedy_entries("completion", entries)
    text_matches("completion", [e[0] for e in entries], c.text)
    expect(r.usage is not None and r.usage.completion_tokens == n, f"usage {r.usage}")
    ctx.results["completion"] = (c.text, entries)
    top_first("completion", entries)
    return f"{n} tokens {c.text!r}, logprobs {[round(e[1], 4) for e in entries]}"


def check_completion_stream(ctx):
    text_w, want = ctx.needs("completion")
    # The lax client: the client's `Completion`, which it also parses completion chunks
    # as, declares `finish_reason` never null, yet every chunk before the last has it null
    # (OpenAI's own streams too), so strict validation refuses any such stream. Each
    # chunk's `logprobs` is validated against the client's model instead.
    stream = ctx.lax_client.completions.create(
        model=ctx.model, prompt=PROMPT, max_tokens=MAX_TOKENS, logprobs=TOP, temperature=0,
        stream=True,
    )
    text, got, chunks, with_lp, finish = "", [], 0, 0, None
    for chunk in stream:
        chunks += 1
        expect(isinstance(chunk, Completion), f"chunk {chunks} parsed as {type(chunk)}")
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        if c.logprobs is not None:
            with_lp += 1
            Logprobs.model_validate(c.logprobs.to_dict())
            got += completion_entries(f"chunk {chunks}", c.logprobs, TOP, first_offset=len(text))
        text += c.text
        finish = c.finish_reason or finish
    expect(with_lp > 0, f"none of {chunks} chunks carried logprobs")
    expect(finish is not None, "no chunk had a finish_reason")
    expect(text == text_w, f"streamed text {text!r} != whole {text_w!r}")
    same_entries("streamed vs whole", got, want)
    top_first("completion stream", got)
    return f"{chunks} chunks, {with_lp} with logprobs, {len(got)} tokens equal to the whole answer"


# --- Chat ----------------------------------------------------------------------------


def chat_token(what, t, cls_name):
    expect(type(t).__name__ == cls_name, f"{what}: parsed as {type(t).__name__}, not {cls_name}")
    expect(isinstance(t.token, str), f"{what}: token {t.token!r}")
    check_logprob(what, t.logprob)
    expect(
        t.bytes == list(t.token.encode("utf-8")),
        f"{what}: bytes {t.bytes} are not the UTF-8 of {t.token!r}",
    )


def chat_entries(what, logprobs, n_top):
    """A chat `logprobs` object as [(token, logprob, [(alt, logprob)...], None)], checked:
    bytes the UTF-8 of each text, at most `n_top` alternatives most likely first."""
    expect(logprobs is not None, f"{what}: choices[0].logprobs is null")
    expect(isinstance(logprobs.content, list), f"{what}: logprobs.content {logprobs.content!r}")
    out = []
    for i, t in enumerate(logprobs.content):
        w = f"{what}: token {i} {t.token!r}"
        chat_token(w, t, "ChatCompletionTokenLogprob")
        expect(isinstance(t.top_logprobs, list), f"{w}: top_logprobs {t.top_logprobs!r}")
        expect(1 <= len(t.top_logprobs) <= n_top, f"{w}: {len(t.top_logprobs)} alternatives")
        for j, a in enumerate(t.top_logprobs):
            chat_token(f"{w}: top_logprobs[{j}]", a, "TopLogprob")
        descending(w, [a.logprob for a in t.top_logprobs])
        out.append((t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs], None))
    return out


def chat_greedy(what, entries):
    for tok, l, top, _ in entries:
        expect(top[0][0] == tok, f"{what}: greedy token {tok!r} is not top_logprobs[0] {top[0]}")
        expect(abs(top[0][1] - l) < 1e-6, f"{what}: {tok!r} logprob {l} != top {top[0][1]}")


def check_chat(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=MESSAGES, max_tokens=MAX_TOKENS, logprobs=True,
        top_logprobs=TOP, temperature=0,
    )
    expect(isinstance(r, ChatCompletion), f"parsed as {type(r)}")
    c = r.choices[0]
    entries = chat_entries("chat", c.logprobs, TOP)
    n = len(entries)
    expect(1 <= n <= MAX_TOKENS, f"{n} tokens for max_tokens {MAX_TOKENS}")
    if c.finish_reason == "length":
        expect(n == MAX_TOKENS, f"finish_reason length after {n} tokens")
    chat_greedy("chat", entries)
    text_matches("chat", [e[0] for e in entries], c.message.content)
    ctx.results["chat"] = (c.message.content, entries)
    return f"{n} tokens {c.message.content!r}, logprobs {[round(e[1], 4) for e in entries]}"


def check_chat_stream(ctx):
    text_w, want = ctx.needs("chat")
    stream = ctx.client.chat.completions.create(
        model=ctx.model, messages=MESSAGES, max_tokens=MAX_TOKENS, logprobs=True,
        top_logprobs=TOP, temperature=0, stream=True,
    )
    text, got, chunks, with_lp, finish = "", [], 0, 0, None
    for chunk in stream:
        chunks += 1
        expect(isinstance(chunk, ChatCompletionChunk), f"chunk {chunks} parsed as {type(chunk)}")
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        if c.logprobs is not None:
            with_lp += 1
            got += chat_entries(f"chunk {chunks}", c.logprobs, TOP)
        text += c.delta.content or ""
        finish = c.finish_reason or finish
    expect(with_lp > 0, f"none of {chunks} chunks carried logprobs")
    expect(finish is not None, "no chunk had a finish_reason")
    expect(text == text_w, f"streamed text {text!r} != whole {text_w!r}")
    same_entries("streamed vs whole", got, want)
    return f"{chunks} chunks, {with_lp} with logprobs, {len(got)} tokens equal to the whole answer"


# --- Prompt scoring (`echo` + `logprobs`, `max_tokens: 0`), as evaluation harnesses
# score a continuation. ----------------------------------------------------------------


def check_prompt_scoring(ctx):
    # The lax client: OpenAI's API answers a null first `token_logprobs` (no token before
    # it), which the client's model (List[float]) does not declare.
    r = ctx.lax_client.completions.create(
        model=ctx.model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2
    )
    expect(isinstance(r, Completion), f"parsed as {type(r)}")
    c = r.choices[0]
    lp = c.logprobs
    expect(lp is not None, "choices[0].logprobs is null")
    tokens, lps, tops, offs = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    expect(isinstance(tokens, list) and tokens, f"tokens {tokens!r}")
    expect(
        isinstance(lps, list) and isinstance(tops, list) and isinstance(offs, list)
        and len(tokens) == len(lps) == len(tops) == len(offs),
        f"lengths differ: {lp}",
    )
    expect(lps[0] is None, f"token_logprobs[0] is {lps[0]!r}, want None (nothing before it)")
    for i, l in enumerate(lps[1:], 1):
        check_logprob(f"prompt token {i} {tokens[i]!r}", l)
    expect(tops[0] is None or tops[0] == {}, f"top_logprobs[0] {tops[0]!r}, want null")
    for i, top in enumerate(tops[1:], 1):
        expect(isinstance(top, dict) and 1 <= len(top) <= 2, f"top_logprobs[{i}] {top!r}")
        for v in top.values():
            check_logprob(f"prompt token {i} alternative", v)
    expect(all(isinstance(o, int) for o in offs), f"text_offset {offs}")
    expect(all(a <= b for a, b in zip(offs, offs[1:])), f"text_offset {offs} decreases")
    # The tokens cover the prompt (a BOS, where the model adds one, in front).
    joined = "".join(tokens)
    expect(
        joined == PROMPT or "".join(tokens[1:]) == PROMPT,
        f"tokens {tokens!r} do not cover the prompt {PROMPT!r}",
    )
    expect(c.text == PROMPT, f"text {c.text!r}, want the echoed prompt {PROMPT!r}")
    for i, top in enumerate(tops[1:], 1):
        descending(f"prompt token {i} {tokens[i]!r}: top_logprobs {top}", list(top.values()))
    return f"{len(tokens)} prompt tokens, logprobs {lps}"


CHECKS = [
    ("models", check_models, None),
    ("completion", check_completion, None),
    ("completion_stream", check_completion_stream, None),
    ("chat", check_chat, None),
    ("chat_stream", check_chat_stream, None),
    # (name, function, the flag that enables it); add new cases here.
    ("prompt_scoring", check_prompt_scoring, None),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--model", default="olmoe-tiny", help="the served model's name")
    args = ap.parse_args()
    ctx = Ctx(args)
    failed, ran = [], 0
    for name, fn, flag in CHECKS:
        if flag and not getattr(args, flag):
            print(f"-- {name}: off (--{flag.replace('_', '-')})", flush=True)
            continue
        ran += 1
        try:
            print(f"ok {name}: {fn(ctx)}", flush=True)
        except CheckFailed as e:
            failed.append(name)
            print(f"FAIL {name}: {e}", flush=True)
        except Exception as e:  # the client's parsing, an attribute access, the HTTP call
            failed.append(name)
            cause = f" ({e.__cause__})" if e.__cause__ else ""
            print(f"FAIL {name}: {type(e).__module__}.{type(e).__name__}: {e}{cause}", flush=True)
    if failed:
        print(f"openai {openai.__version__} against {args.base_url}: {len(failed)} of {ran} "
              f"checks failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)
    print(f"openai {openai.__version__} against {args.base_url}: all {ran} checks passed")


if __name__ == "__main__":
    main()
