"""The init benchmark's peer: DuckDB 1.5.5 with its postgres extension doing the same join and
EAV pivot of the live `wide` entities into one zstd Parquet file (to a local file; no upload, no
checksum). Usage: peer.py <postgres url> <out.parquet> <schema_id>"""
import pathlib
import shutil
import sys
import tempfile
import time

import duckdb
import duckdb_extension_postgres

url, out, schema_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
# The loader derives the entry point from the file name: copy it as postgres_scanner.
src = next(pathlib.Path(duckdb_extension_postgres.__file__).parent.glob("extensions/*/postgres.duckdb_extension"))
ext = pathlib.Path(tempfile.mkdtemp()) / "postgres_scanner.duckdb_extension"
shutil.copy(src, ext)

con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
con.execute(f"LOAD '{ext}'")
con.execute(f"ATTACH '{url}' AS pg (TYPE postgres, READ_ONLY)")
cols = ", ".join(
    [f"m.text_{i:02d} AS t{i:02d}" for i in range(1, 11)]
    + [f"m.smallint_{i:02d} AS s{i:02d}" for i in (1, 2)]
    + [f"m.integer_{i:02d} AS i{i:02d}" for i in (1, 2)]
    + [f"m.bigint_{i:02d} AS b{i:02d}" for i in (1, 2)]
    + [f"m.double_{i:02d} AS d{i:02d}" for i in (1, 2)]
)
t0 = time.time()
con.execute(f"""
COPY (
  SELECT m.ltbase_schema_id AS schema_id, m.ltbase_row_id AS row_id, m.ltbase_updated_at AS changed_at,
         0::BIGINT AS deleted_at, m.ltbase_created_at, m.ltbase_updated_at, m.ltbase_deleted_at,
         {cols}, e.counter, e.label, e.score
  FROM pg.entity_main m
  LEFT JOIN (
    SELECT row_id,
           max(CASE WHEN attr_id = 21 THEN TRY_CAST(value_numeric AS BIGINT) END) AS counter,
           max(CASE WHEN attr_id = 20 THEN value_text END) AS label,
           max(CASE WHEN attr_id = 19 THEN value_numeric::DOUBLE END) AS score
    FROM pg.eav_data WHERE schema_id = {schema_id} GROUP BY row_id
  ) e ON e.row_id = m.ltbase_row_id
  WHERE m.ltbase_schema_id = {schema_id} AND m.ltbase_deleted_at IS NULL
) TO '{out}' (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 3)
""")
print(f"{time.time() - t0:.3f}")
