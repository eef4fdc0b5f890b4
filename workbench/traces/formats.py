"""The trace files, each read whole and checked row by row: Azure's CSV, Mooncake's JSON lines,
and a plain CSV or JSON lines of our own. A bad row raises ValueError naming the file, the line
and the field; nothing is returned until every row has passed."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from typing import Any, NamedTuple

from .request import FILE_BLOCK_SIZE, TraceRequest, block_count

FORMATS = ("azure", "mooncake", "csv", "jsonl")
# the fields each format's rows have (the plain formats' hash_ids may be left out)
FIELDS = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "csv": ("arrival_s", "prompt_len", "output_len"),
    "jsonl": ("arrival_s", "prompt_len", "output_len"),
}
PER_SECOND = {"azure": 10**9, "mooncake": 1000, "csv": 1, "jsonl": 1}  # a row's time units
_AZURE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(\.\d+)?")


class Row(NamedTuple):
    """Where a row is, for its errors."""

    path: Path
    line: int

    def error(self, field: str | None, message: str) -> ValueError:
        where = f"{self.path}, line {self.line}" + (f", field {field!r}" if field else "")
        return ValueError(f"{where}: {message}")


def read(path: Path, format: str | None) -> tuple[str, list[TraceRequest]]:
    """The file's format (`format`, or told by its first line) and every request in it, arriving
    in seconds from the first row's time."""
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r} for {path}: one of {FORMATS}")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{path}, line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x}): a trace "
            f"is a CSV or JSON-lines file, one of {FORMATS}"
        ) from None
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise ValueError(f"{path} is empty: no requests")
    format = format or _detect(Row(path, first + 1), lines[first])
    reader = _read_csv if format in ("azure", "csv") else _read_json_lines
    requests = _in_order(format, reader(path, lines, format), PER_SECOND[format])
    if not requests:
        raise ValueError(f"{path} has no requests, only its header")
    return format, requests


def _detect(row: Row, line: str) -> str:
    if line.lstrip().startswith("{"):
        try:
            keys = set(json.loads(line))
        except (json.JSONDecodeError, TypeError):
            raise row.error(None, f"not a JSON object: {line[:80]!r}") from None
        found = {"timestamp": "mooncake", "arrival_s": "jsonl"}
    else:
        keys = set(next(csv.reader([line])))
        found = {"TIMESTAMP": "azure", "arrival_s": "csv"}
    for key, format in found.items():
        if key in keys:
            return format
    raise ValueError(
        f"{row.path}: cannot tell the trace format from its first line {line[:80]!r} (Azure's "
        f"CSV has {FIELDS['azure']}, Mooncake's JSON lines {FIELDS['mooncake']}, a plain CSV or "
        f"JSON lines {(*FIELDS['csv'], 'hash_ids')}): give format=, one of {FORMATS}"
    )


def _read_csv(path: Path, lines: list[str], format: str) -> Iterator[tuple[Row, Any, TraceRequest]]:
    """(row, its time in the format's unit, the request) for each row of a CSV file."""
    reader = csv.reader(lines)
    header = None
    for record in reader:
        row = Row(path, reader.line_num)
        if not record or not "".join(record).strip():
            continue
        if header is None:
            header = [name.strip() for name in record]
            missing = [name for name in FIELDS[format] if name not in header]
            if missing:
                raise row.error(None, f"the header {record} lacks {missing} ({format} format)")
            continue
        if len(record) != len(header):
            raise row.error(None, f"{len(record)} fields where the header has {len(header)}")
        fields = dict(zip(header, (value.strip() for value in record)))
        if format == "azure":
            time = _azure_ns(row, fields["TIMESTAMP"])
            prompt = _length(row, "ContextTokens", fields["ContextTokens"], int)
            output = _length(row, "GeneratedTokens", fields["GeneratedTokens"], int)
            yield row, time, TraceRequest(0.0, prompt, output)
        else:
            time = _time(row, "arrival_s", fields["arrival_s"], float)
            prompt = _length(row, "prompt_len", fields["prompt_len"], int)
            output = _length(row, "output_len", fields["output_len"], int)
            ids = fields.get("hash_ids", "").split()
            yield row, time, TraceRequest(0.0, prompt, output, _hash_ids(row, ids, prompt, int))


def _read_json_lines(
    path: Path, lines: list[str], format: str
) -> Iterator[tuple[Row, Any, TraceRequest]]:
    names = FIELDS[format] if format == "mooncake" else (*FIELDS[format], "hash_ids")
    time_field, prompt_field, output_field, ids_field = names
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = Row(path, i)
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as exc:
            raise row.error(None, f"not JSON ({exc.msg}): {line[:80]!r}") from None
        if not isinstance(fields, dict):
            raise row.error(None, f"not a JSON object: {line[:80]!r}")
        required = names if format == "mooncake" else names[:3]
        missing = [name for name in required if name not in fields]
        if missing:
            raise row.error(missing[0], f"missing (a {format} row has {required})")
        time = _time(row, time_field, fields[time_field], None)
        prompt = _length(row, prompt_field, fields[prompt_field], None)
        output = _length(row, output_field, fields[output_field], None)
        ids = fields.get(ids_field, [])
        if not isinstance(ids, list):
            raise row.error(ids_field, f"must be a list of block ids, got {ids!r}"[:160])
        yield row, time, TraceRequest(0.0, prompt, output, _hash_ids(row, ids, prompt, None))


def _in_order(format: str, rows: Iterator[tuple[Row, Any, TraceRequest]], per_second: int):
    """The requests, arriving in seconds from the first row's time (a row's time counts
    `per_second` units; differences are taken first, so Azure's 100 ns digits stay exact)."""
    time_field = FIELDS[format][0]
    requests: list[TraceRequest] = []
    start = previous = None
    for row, time, request in rows:
        start = time if start is None else start
        if previous is not None and time < previous[1]:
            raise row.error(
                time_field,
                f"out of order: {(time - start) / per_second:.6g} s from the first row, before "
                f"line {previous[0].line}'s {(previous[1] - start) / per_second:.6g} s (a "
                "trace's rows are in arrival order)",
            )
        previous = (row, time)
        requests.append(request._replace(arrival_s=(time - start) / per_second))
    return requests


def _number(row: Row, field: str, value: Any, parse: Callable | None, integer: bool):
    """`value` as a number: parsed from CSV text by `parse`, or a JSON number as it is."""
    kind = "an integer" if integer else "a number"
    if parse is not None:
        try:
            value = parse(value)
        except ValueError:
            raise row.error(field, f"must be {kind}, got {value!r}") from None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise row.error(field, f"must be {kind}, got {value!r}"[:160])
    if integer and not isinstance(value, int):
        raise row.error(field, f"must be {kind}, got {value!r}")
    if not math.isfinite(value):
        raise row.error(field, f"must be a finite number, got {value!r}")
    return value


def _length(row: Row, field: str, value: Any, parse: Callable | None) -> int:
    length = _number(row, field, value, parse, integer=True)
    if length < 1:
        raise row.error(field, f"must be a length of at least 1 token, got {length}")
    return length


def _time(row: Row, field: str, value: Any, parse: Callable | None) -> float:
    time = _number(row, field, value, parse, integer=False)
    if time < 0:
        raise row.error(field, f"must be a time >= 0, got {time}")
    return time


def _azure_ns(row: Row, text: str) -> int:
    """Nanoseconds of a wall-clock time like "2023-11-16 18:15:46.6805900" (100 ns digits, more
    than `datetime` reads), from a fixed origin: only differences mean anything."""
    match = _AZURE_TIME.fullmatch(text)
    if match is None:
        raise row.error(
            "TIMESTAMP", f"must be a time like 2023-11-16 18:15:46.6805900, got {text!r}"
        )
    y, mo, d, h, mi, s = (int(g) for g in match.groups()[:6])
    try:
        day = date(y, mo, d).toordinal()
    except ValueError as exc:
        raise row.error("TIMESTAMP", f"{exc}: {text!r}") from None
    if h > 23 or mi > 59 or s > 59:
        raise row.error("TIMESTAMP", f"not a time of day: {text!r}")
    fraction = (match.group(7) or ".")[1:10].ljust(9, "0")
    return (day * 86400 + h * 3600 + mi * 60 + s) * 10**9 + int(fraction)


def _hash_ids(row: Row, ids: list, prompt_len: int, parse: Callable | None) -> tuple[int, ...]:
    if not ids:
        return ()
    checked = []
    for value in ids:
        block = _number(row, "hash_ids", value, parse, integer=True)
        if block < 0:
            raise row.error("hash_ids", f"block ids must be >= 0, got {block}")
        checked.append(block)
    blocks = block_count(prompt_len, FILE_BLOCK_SIZE)
    if len(checked) != blocks:
        raise row.error(
            "hash_ids",
            f"{len(checked)} block ids for a prompt of {prompt_len} tokens, which spans {blocks} "
            f"blocks of {FILE_BLOCK_SIZE}",
        )
    return tuple(checked)
