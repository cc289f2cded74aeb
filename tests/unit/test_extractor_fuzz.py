"""JSON operation parser fuzz: >= 10,000 random / truncated / adversarial strings never raise.

Every result must satisfy the contract: a list of at most 3 `Operation`s with known op names, add / update
carrying non-empty text, and stats consistent with the list (invalid -> [] and a reason).
"""

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from crl_jax.extractor.ops import MAX_OPS_JSON, Operation, parse_operations, parse_operations_with_stats

OPS = ("add", "update", "return")
NAMES = ["add", "ADD", " Update ", "return", "RETURN", "delete", "", "adD", "merge", "ret urn", "addd"]
UNICODE = ["é", "中文", "🙂", "\u0130", "\u202e", "\x00", "\ud7ff", "ß", "\n", "\t", "\\", '"', "</answer>",
           "<answer>", "<title>", "</content>"]
ATOMS = ["[", "]", "{", "}", ",", ":", '"', "'", "\\", "null", "true", "1e999", "NaN", "-0", " ", "\n",
         '"op"', '"text"', '"add"', "<answer>", "</answer>", "```", "```json"]


def check(text):
    ops, stats = parse_operations_with_stats(text)
    assert isinstance(ops, list) and len(ops) <= MAX_OPS_JSON
    for o in ops:
        assert isinstance(o, Operation) and o.op in OPS
        if o.op != "return":
            assert isinstance(o.text, str) and o.text.strip()
            assert isinstance(o.title, str) and isinstance(o.content, str)
    if not stats.valid:
        assert ops == [] and stats.error
    assert stats.num_ops == len(ops) == stats.n_add + stats.n_update + stats.n_return
    assert parse_operations(text) == ops
    return ops, stats


def _valid_text(rng):
    items = []
    for _ in range(rng.randint(0, 5)):
        op = rng.choice(OPS)
        item = {"op": op}
        if op != "return":
            item["text"] = f"<title>t{rng.randint(0, 99)}</title><content>{rng.choice(UNICODE) * 3} c</content>"
        items.append(item)
    body = json.dumps(items, ensure_ascii=rng.random() < 0.5)
    return f"{'thinking ' * rng.randint(0, 3)}<answer>{body}</answer>", items


def _random_item(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([None, True, 3, -1.5, "x", rng.choice(NAMES), [], {}])
    if r < 0.5:
        return [_random_item(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["op", "text", "operation", "title", "content", "index", "type", rng.choice(UNICODE)]
    return {rng.choice(keys): _random_item(rng, depth + 1) for _ in range(rng.randint(0, 4))} | (
        {"op": rng.choice(NAMES)} if rng.random() < 0.6 else {})


def _strings(rng):
    """Yield 10,500 fuzz strings in seven families."""
    for _ in range(2000):  # truncated valid outputs (a cut generation)
        t, _ = _valid_text(rng)
        yield t[: rng.randint(0, len(t))]
    for _ in range(2000):  # valid outputs with one random mutation
        t, _ = _valid_text(rng)
        i = rng.randint(0, len(t))
        yield t[:i] + rng.choice(ATOMS + UNICODE) + t[i + rng.randint(0, 3):]
    for _ in range(2000):  # random structures of wrong types / names inside an answer block
        yield "<answer>" + json.dumps(_random_item(rng)) + ("</answer>" if rng.random() < 0.8 else "")
    for _ in range(2000):  # token soup from JSON-ish atoms
        yield "".join(rng.choice(ATOMS + UNICODE + NAMES) for _ in range(rng.randint(0, 40)))
    for _ in range(2000):  # random unicode noise, with and without tags
        s = "".join(chr(rng.randint(1, 0x2FFFF)) for _ in range(rng.randint(0, 60)))
        s = s.encode("utf-8", "replace").decode("utf-8", "replace")
        yield rng.choice(["", "<answer>", "<answer>["]) + s + rng.choice(["", "</answer>", "]</answer>"])
    for d in range(1, 201):  # nested brackets / braces, balanced and not
        yield "<answer>" + "[" * d * 50 + "]" * rng.randint(0, d * 50) + "</answer>"
        yield "<answer>[" + '{"op":' * d + '"add"' + "}" * rng.randint(0, d) + "]</answer>"
    for k in range(100):  # huge texts and huge fields
        n = 10 ** rng.randint(3, 6)
        yield rng.choice([
            "<answer>" + json.dumps([{"op": "add", "text": "x" * n}]) + "</answer>",
            "<answer>" * 50 + "x" * n,
            "<answer>[" + "," * n + "]</answer>",
            "<answer>[" + '{"op":"add","text":"a"},' * (n // 20) + "]</answer>",
            "<answer>" + " " * n + "</answer>",
        ])


def test_fuzz_never_raises_and_respects_contract():
    rng = random.Random(1234)
    n, valid = 0, 0
    for s in _strings(rng):
        _, stats = check(s)
        n += 1
        valid += stats.valid
    assert n >= 10_000
    assert 0 < valid < n  # the corpus exercises both outcomes


def test_non_string_inputs():
    for x in (None, 5, 3.0, ["<answer>[]</answer>"], {"op": "add"}, b'<answer>[{"op":"add","text":"b"}]</answer>',
              b"\xff\xfe<answer>", object()):
        ops, stats = check(x)
    assert parse_operations(b'<answer>[{"op":"add","text":"b"}]</answer>') == [Operation("add", "b")]


def test_truncated_valid_outputs_parse_to_a_prefix_or_nothing():
    rng = random.Random(7)
    for _ in range(300):
        t, items = _valid_text(rng)
        full = check(t)[0]
        want = [Operation(i["op"], i.get("text", "")) for i in items][:MAX_OPS_JSON]
        assert full == want
        cut = check(t[: rng.randint(0, len(t))])[0]
        assert cut in ([], want)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_hypothesis_text_inside_answer(s):
    check(s)
    check("<answer>" + s + "</answer>")
    check('<answer>[{"op":"add","text":' + json.dumps(s) + "}]</answer>")
