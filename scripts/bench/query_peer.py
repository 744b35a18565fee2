"""The query benchmark's baseline: DuckDB 1.5.5 (Python) reading a local lake's listed files with
the read rule written by hand (latest copy per row_id by changed_at, a tie to the tombstone,
tombstones dropped), no file checks. Prints the result's columns, comma-separated, then the
seconds from the manifest read to the result (the process's start-up and `import duckdb` are
not in it).

Usage: query_peer.py <lake dir> <manifest key> <threads> <memory limit> <select list>
"""
import json
import pathlib
import sys
import time

import duckdb

lake, manifest, threads, memory, select = sys.argv[1:6]
con = duckdb.connect(config={"threads": int(threads), "memory_limit": memory})
t0 = time.time()
root = pathlib.Path(lake)
files = [str(root / f["path"]) for f in json.loads((root / manifest).read_text())["files"]]
listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
row = con.execute(f"""
SELECT {select} FROM (
  SELECT *, row_number() OVER (PARTITION BY row_id
                               ORDER BY changed_at DESC, COALESCE(deleted_at, 0) DESC) AS rn
  FROM read_parquet([{listed}], union_by_name = true)
) WHERE rn = 1 AND COALESCE(deleted_at, 0) = 0
""").fetchone()
secs = time.time() - t0
print(",".join(str(v) for v in row) + f",{secs:.3f}")
