"""The plain data that crosses the sandbox's wall, both ways (posttrain/verifiers/code.py).

    out of a sandbox   `<nonce> ["value", 0, ["l", [["i", "2"], ["s", "6869"]]]]`   read_reports, decode
    into one           [2, 'hi']                                                    literal_source

A value is None, bool, int, float, complex, str, bytes, or a list, tuple, set, frozenset or
dict of them, of exact types, at most MAX_DEPTH deep. Out of a sandbox it is tagged JSON,
numbers and text in hex (the probe harness writes it by hand, so no json module of the
sandbox's can be patched to lie); decode rebuilds it into fresh objects of exact builtin
types, so no method of the solution's ever runs in the trainer. Into one it is Python
source, because the other side compiles its program anyway: only literals and displays, no
name but `frozenset` and `complex`, so a value can carry no behaviour either way.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # nesting of a reported value; deeper is refused, never recursed into
PLAIN = (type(None), bool, int, float, complex, str, bytes, list, tuple, set, frozenset, dict)


def decode(node, depth: int = 0):
    """A value the sandbox reported, rebuilt from JSON into fresh objects of exact builtin
    types; raises ValueError (or TypeError: an unhashable set member) on anything else."""
    if depth > MAX_DEPTH or type(node) is not list or not node or type(node[0]) is not str:
        raise ValueError(f"not a reported value: {str(node)[:80]}")
    tag, args = node[0], node[1:]
    if tag == "n" and not args:
        return None
    if tag == "b" and args in ([0], [1]):
        return args[0] == 1
    if len(args) == 1 and type(args[0]) is str:
        if tag == "i" and re.fullmatch(r"-?[0-9a-f]+", args[0]):
            return int(args[0], 16)  # base 16: no limit on digits, linear time
        if tag == "f":
            return float.fromhex(args[0])
        if tag == "s":
            return bytes.fromhex(args[0]).decode("utf-8", "surrogatepass")
        if tag == "y":
            return bytes.fromhex(args[0])
    if tag == "c" and len(args) == 2 and all(type(a) is str for a in args):
        return complex(float.fromhex(args[0]), float.fromhex(args[1]))
    if len(args) == 1 and type(args[0]) is list:
        kind = {"l": list, "t": tuple, "S": set, "F": frozenset}.get(tag)
        if kind is not None:
            return kind(decode(item, depth + 1) for item in args[0])
        if tag == "d" and all(type(p) is list and len(p) == 2 for p in args[0]):
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in args[0]}
    raise ValueError(f"not a reported value: {str(node)[:80]}")


def read_reports(stdout: str, nonce: str) -> list[list]:
    """The probe harness's events, in order: lines that start with the nonce and parse as a
    JSON list whose first item is a str. Anything else on stdout is the solution's own."""
    events = []
    for line in stdout.split("\n"):
        if line.startswith(nonce + " "):
            try:
                event = json.loads(line[len(nonce) + 1:])
            except (ValueError, RecursionError):
                continue  # cut by the output limit, or nested to crash us: not a report
            if type(event) is list and event and type(event[0]) is str:
                events.append(event)
    return events


def literal_source(value: Any, depth: int = 0) -> str:
    """Python source that evaluates to a copy of `value` (plain data, exact types, as decode
    builds them): literals and displays, big ints in hex (a decimal literal past 4,300
    digits does not compile), inf and nan as overflowing literals; TypeError otherwise."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    if value is None or kind is bool or kind is str or kind is bytes:
        return repr(value)
    if kind is int:
        return repr(value) if value.bit_length() <= 3000 else hex(value)  # 3,000 bits: ~900 digits
    if kind is float:
        if value != value:
            return "(1e999-1e999)"  # nan: inf - inf
        return repr(value).replace("inf", "1e999")
    if kind is complex:
        return f"complex({literal_source(value.real)}, {literal_source(value.imag)})"
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        items = [literal_source(item, depth + 1) for item in value]
        if kind is list:
            return "[" + ", ".join(items) + "]"
        if kind is tuple:
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        shown = "{" + ", ".join(items) + "}" if items else "{*()}"  # `{}` is a dict
        return shown if kind is set else f"frozenset({shown})"
    if kind is dict:
        pairs = [f"{literal_source(k, depth + 1)}: {literal_source(v, depth + 1)}" for k, v in value.items()]
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"not plain data: {kind.__name__}")


def hex_text(field) -> str:
    """A hex-coded message from the probe harness, decoded; never raises."""
    try:
        return bytes.fromhex(field).decode("utf-8", "replace")[:300]
    except (TypeError, ValueError):
        return "?"


def probe_result(kind: str, args: list) -> tuple:
    """("value", v) | ("fail" | "error" | "not_plain", message) from one probe event."""
    if kind == "value" and len(args) == 1:
        try:
            return "value", decode(args[0])
        except (ValueError, TypeError, RecursionError, OverflowError) as error:
            return "error", f"an undecodable report: {error}"[:300]
    if kind == "raised" and len(args) == 2:
        return ("fail" if args[0] == "assert" else "error"), hex_text(args[1])
    if kind == "not_plain" and len(args) == 1:
        return "not_plain", hex_text(args[0])
    return "error", f"an unknown report {kind!r}"
