"""The init benchmark's peer: DuckDB 1.5.5 with its postgres extension doing the same join and
EAV pivot of the live `wide` entities into one zstd Parquet file (to a local file; no upload, no
checksum). The columns and their casts follow the attributes file the way lakecdc's export does
(src/engine/export.rs): bound attributes from their slot columns, EAV attributes pivoted, lists
aggregated in array_indices order. The bench times this whole process, as it times lakecdc.
Usage: peer.py <postgres url> <out.parquet> <schema_id> <memory limit> <attributes.json>"""
import json
import pathlib
import shutil
import sys
import tempfile
import time

import duckdb
import duckdb_extension_postgres

url, out, schema_id, memory, attrs_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
attrs = json.load(open(attrs_path))

# The loader derives the entry point from the file name: copy it as postgres_scanner.
src = next(pathlib.Path(duckdb_extension_postgres.__file__).parent.glob("extensions/*/postgres.duckdb_extension"))
ext = pathlib.Path(tempfile.mkdtemp()) / "postgres_scanner.duckdb_extension"
shutil.copy(src, ext)

# Beyond the memory limit DuckDB spills next to the output, as lakecdc spills to its --work-dir.
spill = pathlib.Path(out).parent / "peer.tmp"
con = duckdb.connect(config={"allow_unsigned_extensions": "true", "memory_limit": memory, "temp_directory": str(spill)})
con.execute(f"LOAD '{ext}'")
con.execute(f"ATTACH '{url}' AS pg (TYPE postgres, READ_ONLY)")


def column(name):
    for c in "`[]":
        name = name.replace(c, "")
    return name.replace(".", "_").replace(" ", "_") or "attr"


def bound_expr(a):
    b = a["column_binding"]
    c, enc = f"m.{b['col_name']}", b.get("encoding", "default")
    t = a["valueType"]
    if t == "text":
        return f"CAST({c} AS VARCHAR)"
    if t in ("date", "datetime"):
        if enc == "iso8601":
            return f"epoch_ms(CAST(TRY_CAST({c} AS TIMESTAMPTZ) AS TIMESTAMP))"
        return f"TRY_CAST({c} AS BIGINT)"
    if t == "bool":
        if enc == "bool_text":
            return (f"CASE lower(trim({c})) WHEN '1' THEN TRUE WHEN 'true' THEN TRUE WHEN 't' THEN TRUE "
                    f"WHEN '0' THEN FALSE WHEN 'false' THEN FALSE WHEN 'f' THEN FALSE END")
        return f"({c} <> 0)"
    sql_type = {"uuid": "UUID", "smallint": "SMALLINT", "integer": "INTEGER", "bigint": "BIGINT", "numeric": "DOUBLE"}
    return f"TRY_CAST({c} AS {sql_type[t]})"


def eav_cast(t):
    if t == "text":
        return "value_text"
    if t == "uuid":
        return "TRY_CAST(value_text AS UUID)"
    if t in ("smallint", "integer", "numeric"):
        return "value_numeric"
    if t in ("bigint", "date", "datetime"):
        return "TRY_CAST(value_numeric AS BIGINT)"
    return "(value_numeric <> 0)"  # bool


ITEM_TYPE = {"text": "VARCHAR", "uuid": "UUID", "smallint": "DOUBLE", "integer": "DOUBLE", "numeric": "DOUBLE",
             "bigint": "BIGINT", "date": "BIGINT", "datetime": "BIGINT", "bool": "BOOLEAN"}


def eav_agg(a):
    i, t = a["attributeID"], a["valueType"]
    if t == "list":
        item = a.get("items_type", "text")
        return (f"CASE WHEN count(*) FILTER (WHERE attr_id = {i}) > 0 THEN COALESCE("
                f"list({eav_cast(item)} ORDER BY TRY_CAST(array_indices AS BIGINT)) "
                f"FILTER (WHERE attr_id = {i} AND array_indices <> ''), CAST([] AS {ITEM_TYPE[item]}[])) END")
    return f"max(CASE WHEN attr_id = {i} THEN {eav_cast(t)} END)"


bound = sorted((column(n), a) for n, a in attrs.items() if "column_binding" in a)
eav = sorted((column(n), a) for n, a in attrs.items() if "column_binding" not in a)
cols = ", ".join([f"{bound_expr(a)} AS {c}" for c, a in bound] + [f"e.{c}" for c, _ in eav])
pivot = ", ".join(f"{eav_agg(a)} AS {c}" for c, a in eav)
t0 = time.time()
con.execute(f"""
COPY (
  SELECT m.ltbase_schema_id AS schema_id, m.ltbase_row_id AS row_id, m.ltbase_updated_at AS changed_at,
         0::BIGINT AS deleted_at, m.ltbase_created_at, m.ltbase_updated_at, m.ltbase_deleted_at, {cols}
  FROM pg.entity_main m
  LEFT JOIN (
    SELECT row_id, {pivot}
    FROM pg.eav_data WHERE schema_id = {schema_id} GROUP BY row_id
  ) e ON e.row_id = m.ltbase_row_id
  WHERE m.ltbase_schema_id = {schema_id} AND m.ltbase_deleted_at IS NULL
) TO '{out}' (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 3)
""")
# The COPY's own time (without Python's start-up, the import and the extension's load).
print(f"{time.time() - t0:.3f}")
