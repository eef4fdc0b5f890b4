"""A saved run: its tables and meta in one file. Parquet (``workbench-run/2``): the tables' rows
one after another under one schema of ``<table>.<column>`` columns, their layout in the footer,
each table read on first use (`ParquetTables`); DuckDB reads it too: ``SELECT "events.name" FROM
'run.parquet'``. JSON (``workbench-run/1``, a ``.json`` path): pandas' "table" orient."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .routing import ROUTING_DTYPES

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

PARQUET_FORMAT = "workbench-run/2"
JSON_FORMAT = "workbench-run/1"
KEY = "workbench-run"  # the footer's key-value metadata entry
MAGIC = b"PAR1"
# NOTE: rows per row group: small tables share one (each costs bytes per schema column whatever its
# rows); each is built whole before it is written, so this also bounds the memory a save adds.
ROW_GROUP_ROWS = 1 << 18


def write(path: str | Path, tables: Mapping[str, pd.DataFrame], meta: dict) -> Path:
    """Parquet whatever the suffix, except JSON for a path ending in ``.json``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".json":
        return write_json(path, tables, meta)
    return write_parquet(path, tables, meta)


def read(path: str | Path) -> tuple[Mapping[str, pd.DataFrame], dict]:
    """The tables (read lazily from Parquet) and the meta of a saved run, in either format."""
    # NOTE: not an int: open() takes one for a file descriptor of the caller's, and closes it
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"a saved run's path is a str or a Path, got {path!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no saved run at {str(path)!r}")
    with open(path, "rb") as f:
        magic = f.read(len(MAGIC))
    if magic == MAGIC:
        tables = ParquetTables(path)
        return tables, tables.meta
    try:
        return read_json(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"{path} is not a saved workbench run (neither Parquet nor its JSON: {e})"
        ) from None


def write_parquet(path: Path, tables: Mapping[str, pd.DataFrame], meta: dict) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = {name: _to_arrow(frame) for name, frame in tables.items()}
    schema = pa.schema(
        [pa.field(f"{name}.{f.name}", f.type) for name, t in arrow.items() for f in t.schema]
    )
    layout: dict[str, dict] = {}
    first = 0
    for name, frame in tables.items():
        layout[name] = {
            "rows": [first, first + len(frame)],  # of the file's rows, all row groups together
            "columns": [str(c) for c in frame.columns],
            "dtypes": [str(d) for d in frame.dtypes],
        }
        first += len(frame)
    footer = json.dumps({"format": PARQUET_FORMAT, "tables": layout, "meta": meta})
    # NOTE: written beside the target and moved over it: a run loaded lazily from `path` keeps
    # reading the file it opened, even when it is saved back to the same path.
    part_path = path.with_name(f".{path.name}.part")
    # NOTE: dictionary encoding for text and integers (they repeat), not floats (nearly all
    # distinct); no statistics: nothing filters on them, and every null column chunk has some
    dictionary = [f.name for f in schema if not pa.types.is_floating(f.type)]
    try:
        with pq.ParquetWriter(
            part_path,
            schema,
            compression="zstd",
            compression_level=3,
            use_dictionary=dictionary,
            write_statistics=False,
            store_schema=False,
        ) as writer:
            for group in _row_groups(arrow, schema):
                writer.write_table(group, row_group_size=group.num_rows)
            writer.add_key_value_metadata({KEY: footer})
        os.replace(part_path, path)
    finally:
        part_path.unlink(missing_ok=True)
    return path


class ParquetTables(Mapping):
    """The tables of a Parquet run, each read (its row groups and columns) on first access."""

    def __init__(self, path: str | Path) -> None:
        import pyarrow.parquet as pq

        self.path = Path(path)
        self._file = pq.ParquetFile(self.path)
        footer = self._file.metadata
        doc = json.loads((footer.metadata or {}).get(KEY.encode(), b"{}"))
        if doc.get("format") != PARQUET_FORMAT:
            raise ValueError(f"{path} is a Parquet file but not a saved workbench run")
        self.meta: dict = doc.get("meta", {})
        self._layout: dict[str, dict] = doc["tables"]
        self._group_starts = [0]  # the file's first row of each row group, then its row count
        for g in range(footer.num_row_groups):
            self._group_starts.append(self._group_starts[-1] + footer.row_group(g).num_rows)
        self._frames: dict[str, pd.DataFrame] = {}

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self._frames:
            self._frames[name] = self._read(name, self._layout[name])
        return self._frames[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout)

    def __len__(self) -> int:
        return len(self._layout)

    def loaded(self) -> list[str]:
        return list(self._frames)

    def _read(self, name: str, spec: dict) -> pd.DataFrame:
        import pandas as pd

        columns, dtypes = spec["columns"], dict(zip(spec["columns"], spec["dtypes"]))
        first, stop = spec["rows"]
        if first == stop:
            empty = {c: pd.Series([], dtype=d) for c, d in dtypes.items()}
            return pd.DataFrame(empty, columns=columns, index=pd.RangeIndex(0))
        starts = self._group_starts
        groups = [g for g in range(len(starts) - 1) if starts[g] < stop and starts[g + 1] > first]
        table = self._file.read_row_groups(groups, columns=[f"{name}.{c}" for c in columns])
        table = table.slice(first - starts[groups[0]], stop - first)
        frame = table.rename_columns(columns).to_pandas(types_mapper=_nullable)
        return frame.astype(dtypes)


def write_json(path: Path, tables: Mapping[str, pd.DataFrame], meta: dict) -> Path:
    doc = {"format": JSON_FORMAT, "meta": meta}
    for name, frame in tables.items():
        doc[name] = json.loads(frame.to_json(orient="table", index=False, double_precision=15))
    path.write_text(json.dumps(doc))
    return path


def read_json(path: str | Path) -> tuple[dict[str, pd.DataFrame], dict]:
    import io

    import pandas as pd

    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("format") != JSON_FORMAT:
        raise ValueError(f"{path} is not a saved workbench run")
    meta = doc.pop("meta", {})
    del doc["format"]
    frames = {
        name: pd.read_json(io.StringIO(json.dumps(table)), orient="table", precise_float=True)
        for name, table in doc.items()
    }
    if "routing" in frames:  # NOTE: JSON's schema says "integer"; its columns are narrower
        frames["routing"] = frames["routing"].astype(ROUTING_DTYPES)
    return frames, meta


def _to_arrow(frame: pd.DataFrame) -> pa.Table:
    import pyarrow as pa

    return pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)


def _row_groups(arrow: dict[str, pa.Table], schema: pa.Schema) -> Iterator[pa.Table]:
    """The tables' rows one after another under the whole schema, in `ROW_GROUP_ROWS` groups."""
    import pyarrow as pa

    pieces, count = [], 0
    for name, table in arrow.items():
        start = 0
        while start < table.num_rows:
            take = min(ROW_GROUP_ROWS - count, table.num_rows - start)
            pieces.append(_widen(name, table.slice(start, take), schema))
            start, count = start + take, count + take
            if count == ROW_GROUP_ROWS:
                yield pa.concat_tables(pieces)
                pieces, count = [], 0
    if pieces:
        yield pa.concat_tables(pieces)


def _widen(name: str, rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` of table `name` under the whole schema: the other tables' columns all null."""
    import pyarrow as pa

    prefix = f"{name}."
    nulls: dict[pa.DataType, pa.Array] = {}  # one array of nulls per type, shared by its columns
    columns = []
    for field in schema:
        if field.name.startswith(prefix):
            columns.append(rows.column(field.name.removeprefix(prefix)))
        else:
            if field.type not in nulls:
                nulls[field.type] = pa.nulls(rows.num_rows, field.type)
            columns.append(nulls[field.type])
    return pa.Table.from_arrays(columns, schema=schema)


def _nullable(arrow_type: pa.DataType):
    """Integers and text as pandas' nullable dtypes; `astype` then restores the saved dtypes."""
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        return pd.Int64Dtype()
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return pd.StringDtype()
    return None
