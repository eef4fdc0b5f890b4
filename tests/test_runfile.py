"""Run files: a run saved as Parquet loads back with exactly the live tables and meta, one table at
a time; a path ending in .json still writes (and every run still loads from) the older JSON."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from workbench import Workbench, load_run
from workbench.history import runfile

from .conftest import PROMPTS, greedy


def _run(record: str, tokens: int) -> Workbench:
    """Chunked prompts, a late arrival, one request aborted while running and one before it was
    ever scheduled (its first-scheduled columns stay <NA>)."""
    wb = Workbench("tiny-llama", record=record, max_extend_tokens=16, max_running_reqs=3)
    for p in PROMPTS[:4]:
        wb.add_request(p, greedy(tokens))
    waiting = wb.add_request(PROMPTS[4], greedy(tokens))
    wb.add_request(PROMPTS[0], greedy(tokens), arrival_step=5)
    wb.step(3)
    wb.abort(0)
    wb.abort(waiting)
    wb.run(progress=False)
    return wb


@pytest.fixture(scope="module")
def runs() -> dict[str, Workbench]:
    return {
        "full": _run("full", 6),
        "light": _run("light", 24),
        "empty": Workbench("tiny-llama", record="full"),
    }


def assert_same_run(live: Workbench, run) -> None:
    tables = live.history.tables()
    assert list(run.tables()) == list(tables)
    for name, frame in tables.items():
        pd.testing.assert_frame_equal(run.tables()[name], frame, check_exact=True, obj=name)
    assert run.meta == json.loads(json.dumps(live.run_meta()))


@pytest.mark.parametrize("kind", ["full", "light", "empty"])
def test_parquet_gives_back_the_live_tables_exactly(runs, kind, tmp_path):
    wb = runs[kind]
    history = wb.history
    if kind == "empty":
        assert all(frame.empty for frame in history.tables().values())
    else:
        requests = history.requests.set_index("uid")
        assert requests.loc[0, "finish_reason"] == "abort"
        assert requests.first_scheduled_step.isna().sum() == 1  # aborted while waiting
        assert history.ledger.token.isna().any()  # chunks sample no token
        assert (kind == "full") == (len(history.events) > 0) == (len(history.pages) > 0)
    path = wb.save(tmp_path / "run.parquet")
    assert path.read_bytes()[:4] == b"PAR1"
    assert_same_run(wb, load_run(path))


def test_the_suffix_does_not_choose_the_format_except_json(runs, tmp_path):
    wb = runs["light"]
    for name in ("run", "run.data", "run.parquet.bak"):
        path = wb.save(tmp_path / name)
        assert path.read_bytes()[:4] == b"PAR1"
        assert_same_run(wb, load_run(path))


def test_json_is_the_format_of_older_runs_and_still_loads(runs, tmp_path):
    for kind in ("full", "light"):
        wb = runs[kind]
        path = wb.save(tmp_path / f"{kind}.json")
        # what `save` wrote before Parquet, byte for byte
        doc = {"format": "workbench-run/1", "meta": wb.run_meta()}
        for name, frame in wb.history.tables().items():
            doc[name] = json.loads(frame.to_json(orient="table", index=False, double_precision=15))
        assert path.read_text() == json.dumps(doc)
        assert_same_run(wb, load_run(path))


def test_tables_across_and_inside_row_groups(runs, tmp_path, monkeypatch):
    """Row groups of 7 rows: large tables span several, small ones share one."""
    monkeypatch.setattr(runfile, "ROW_GROUP_ROWS", 7)
    wb = runs["full"]
    path = wb.save(tmp_path / "run.parquet")
    groups = pq.ParquetFile(path).metadata.num_row_groups
    sizes = [len(frame) for frame in wb.history.tables().values()]
    # NOTE: the profiler's event count varies with threads and load (about 500 to 700 here)
    assert max(sizes) > 7 * 10 and min(sizes) < 7
    assert groups == -(-sum(sizes) // 7)
    assert_same_run(wb, load_run(path))


def test_a_table_is_read_from_its_own_row_groups_and_columns_alone(runs, tmp_path, monkeypatch):
    """Every byte of the file's other column chunks is overwritten: the ledger still loads
    exactly, and nothing was read until a table was asked for."""
    monkeypatch.setattr(runfile, "ROW_GROUP_ROWS", 16)
    wb = runs["full"]
    path = wb.save(tmp_path / "run.parquet")
    meta = pq.ParquetFile(path).metadata
    first, stop = json.loads(meta.metadata[b"workbench-run"])["tables"]["ledger"]["rows"]
    data = bytearray(path.read_bytes())
    group_start, kept = 0, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        holds_ledger = group_start < stop and group_start + group.num_rows > first
        group_start += group.num_rows
        for c in range(group.num_columns):
            chunk = group.column(c)
            if holds_ledger and chunk.path_in_schema.startswith("ledger."):
                kept += 1
                continue
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
            start = start or chunk.data_page_offset
            data[start : start + chunk.total_compressed_size] = bytes(chunk.total_compressed_size)
    assert meta.num_row_groups > 10 and kept > len(wb.history.ledger.columns)  # 2+ row groups
    path.write_bytes(bytes(data))
    run = load_run(path)
    assert run.tables().loaded() == []
    pd.testing.assert_frame_equal(run.ledger, wb.history.ledger, check_exact=True)
    assert run.tables().loaded() == ["ledger"]
    for name in ("steps", "events"):
        with pytest.raises(OSError):  # the wiped bytes are not a Parquet page
            run.tables()[name]


def test_a_loaded_run_saves_back_over_its_own_file(runs, tmp_path):
    wb = runs["full"]
    path = wb.save(tmp_path / "run.parquet")
    run = load_run(path)
    run.steps  # noqa: B018 (one table read, the others not yet)
    run.save(path)
    assert_same_run(wb, load_run(path))
    assert [p.name for p in tmp_path.iterdir()] == ["run.parquet"]


@pytest.mark.parametrize("kind", ["full", "light"])
def test_parquet_is_smaller_than_json(runs, kind, tmp_path):
    wb = runs[kind]
    parquet, json_ = wb.save(tmp_path / "run.parquet"), wb.save(tmp_path / "run.json")
    assert parquet.stat().st_size < json_.stat().st_size / 2


def test_a_parquet_file_that_is_not_a_run_is_refused(tmp_path):
    path = tmp_path / "other.parquet"
    pd.DataFrame({"a": [1, 2]}).to_parquet(path)
    with pytest.raises(ValueError, match="not a saved workbench run"):
        load_run(path)
    with pytest.raises(ValueError, match="not a saved workbench run"):
        runfile.read_json(_write(tmp_path / "other.json", {"format": "something/1"}))


def test_what_is_not_a_saved_run_is_refused_naming_it(tmp_path):
    """Text, JSON of something else, a missing path: each refused naming the path; an int is
    refused before anything is opened (open() would take it for a file descriptor, and close
    the caller's)."""
    text = tmp_path / "notes.parquet"
    text.write_text("not a run\n")
    lines = tmp_path / "trace.jsonl"
    lines.write_text('{"a": 1}\n{"a": 2}\n')
    listed = _write(tmp_path / "list.json", [1, 2])
    binary = tmp_path / "blob.json"
    binary.write_bytes(bytes(range(256)))
    for path in (text, lines, listed, binary):
        with pytest.raises(ValueError, match=f"{path.name} is not a saved workbench run"):
            load_run(path)
    with pytest.raises(FileNotFoundError, match="no saved run at .*missing.parquet"):
        load_run(tmp_path / "missing.parquet")
    with open(tmp_path / "mine.txt", "w+") as mine:
        with pytest.raises(TypeError, match="a str or a Path, got 3"):
            load_run(3)
        with pytest.raises(TypeError, match="a str or a Path"):
            load_run(mine.fileno())
        mine.write("still open")  # (its descriptor was not closed)


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path
