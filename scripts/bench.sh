#!/usr/bin/env bash
# Benchmarks, each measured against a baseline taken in the same run on the same machine.
#
#   scripts/bench.sh flush [N]     # N-change backlog (default 1,000,000) → one `lakecdc flush --force`
#   scripts/bench.sh compact [N]   # N base rows + N/10 delta rows → one `lakecdc compact` rewrite
#   scripts/bench.sh init [N]      # N live entities → `lakecdc init` vs the DuckDB postgres peer
#   scripts/bench.sh query [N]     # N entities, init + 10 flushes of N/100 changes → `lakecdc query`
#
# flush: seeds N entities of the docs/benchmarks.md shape (18 bound columns, 3 EAV attributes each) with
# one dirty change_log slot each, measures the read floor (`COPY … (FORMAT binary)` of the
# entity and EAV rows), then times one forced flush to SeaweedFS and an idle run. Prints
# changes/s, the ratio flush / read floor, peak RSS, and the idle-run time.
# Target (docs/benchmarks.md): ≥ 100,000 changes/s; an idle run well under a second.
#
# compact: flushes and promotes N entities into the base tier, updates N/10 of them (writer
# contract) and flushes those, then times one `lakecdc compact` rewrite of base + deltas.
# Target: ≥ 300,000 rows/s.
#
# init: times `lakecdc init` (to SeaweedFS, checksummed, manifest committed) against the read
# floor and the peer — DuckDB 1.5.5's postgres extension doing the same join and pivot into one
# local zstd Parquet file (scripts/bench/peer.py, from PyPI wheels). Targets: lakecdc / peer
# < 1.0, peak RSS ≤ 1 GiB.
#
# query: exports N entities (init), then 10 rounds of N/100 changes (nine in ten updates, one in
# ten hard deletes), each flushed, to SeaweedFS, and copies the lake to a local directory. Times
# `SELECT count(*), sum(i01) FROM wide` — the read rule over every listed copy — three ways:
# A `lakecdc query` on the local lake, B DuckDB 1.5.5 (Python) over the same files with the rule
# written by hand (same threads and memory limit), C `lakecdc query` on the S3 lake: one run with
# an empty cache, then 3 rounds of A, B and C with the cache warm. All must give PostgreSQL's
# count and sum of the live entities. Then a row_id point lookup on S3 with an empty cache:
# files downloaded of those listed. Targets: A / B <= 1.2, C (warm) / A <= 1.3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/lakecdc-target}"
export LAKECDC_SERVICES_DIR="${LAKECDC_BENCH_SERVICES_DIR:-/var/tmp/lakecdc-bench-services}"
# SeaweedFS pauses writes for ~200 ms whenever it grows a volume: at a bucket's first write and
# each time a volume fills. The test services use small volumes (many buckets); the bench uses
# 1 GiB ones and writes one object first, so that the timings measure lakecdc, not the test
# server's volume allocation (S3 has none).
export LAKECDC_WEED_VOLUME_MB="${LAKECDC_WEED_VOLUME_MB:-1024}"
# shellcheck source=scripts/venv.sh
source "$ROOT/scripts/venv.sh"
PEERENV="${LAKECDC_BENCH_VENV:-/var/tmp/lakecdc-bench-venv}"

what="${1:-flush}"
N="${2:-1000000}"
case "$what" in
flush | compact | init | query) ;;
*)
	echo "usage: scripts/bench.sh flush|compact|init|query [N]" >&2
	exit 2
	;;
esac

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.3f}')"; }

command -v /usr/bin/time >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q time >/dev/null
BIN="${LAKECDC_BENCH_BIN:-}" # a prebuilt binary (e.g. to check this script quickly)
if [ -z "$BIN" ]; then
	echo "bench: building lakecdc (release)" >&2
	cargo build --release --locked --bin lakecdc >&2
	BIN="$CARGO_TARGET_DIR/release/lakecdc"
fi

trap 'scripts/services.sh stop >/dev/null 2>&1 || true' EXIT
scripts/services.sh start >/dev/null
# shellcheck source=/dev/null
source "$LAKECDC_SERVICES_DIR/env"
PSQL="$PGBIN/psql -X -q -v ON_ERROR_STOP=1"
$PSQL "$LAKECDC_TEST_PG_URL" -c "CREATE DATABASE bench"
PGURL="${LAKECDC_TEST_PG_URL%/*}/bench"
S3CURL=(curl -sf --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY")
"${S3CURL[@]}" -X PUT "$LAKECDC_TEST_S3_ENDPOINT/bench" >/dev/null
echo warm | "${S3CURL[@]}" -X PUT -T - "$LAKECDC_TEST_S3_ENDPOINT/bench/warm-up" >/dev/null
export LAKECDC_PG_URL="$PGURL" LAKECDC_LAKE=s3://bench/lake LAKECDC_S3_ENDPOINT="$LAKECDC_TEST_S3_ENDPOINT"
export LAKECDC_S3_PATH_STYLE=true LAKECDC_SCHEMA_DIR="$ROOT/bench/schemas"
"$BIN" -q init-db >/dev/null

# Row ids: UUIDv7 (time-ordered, as the entity store generates them) by default, or random
# UUIDv4 with LAKECDC_BENCH_IDS=v4 (the worst case for index-ordered reads).
case "${LAKECDC_BENCH_IDS:-v7}" in
v7) ROW_ID="(lpad(to_hex(1700000000000 + i), 12, '0') || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid" ;;
v4) ROW_ID="gen_random_uuid()" ;;
*)
	echo "LAKECDC_BENCH_IDS must be v7 or v4" >&2
	exit 2
	;;
esac
echo "bench: seeding $N entities (${LAKECDC_BENCH_IDS:-v7} row ids)" >&2
t0=$(now)
$PSQL "$PGURL" <<SQL
INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at,
  text_01, text_02, text_03, text_04, text_05, text_06, text_07, text_08, text_09, text_10,
  smallint_01, smallint_02, integer_01, integer_02, bigint_01, bigint_02, double_01, double_02)
SELECT 100, $ROW_ID, 1700000000000 + i, 1700000000000 + i,
  'customer ' || i, md5(i::text), 'city-' || (i % 1000), 'street ' || (i % 5000) || ' no ' || (i % 97),
  'segment-' || (i % 12), 'note ' || md5((i * 7)::text), 'EUR', 'tier-' || (i % 4),
  'ref-' || (i % 100000), 'status-' || (i % 5),
  (i % 30000)::smallint, (i % 7)::smallint, i, i % 1000, i::bigint * 1000, i::bigint % 86400000,
  i * 0.5, (i % 1000) / 3.0
FROM generate_series(1, $N) AS i;
-- An entity's EAV rows are written together, as the application writes them.
INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_text, value_numeric)
SELECT 100, m.ltbase_row_id, a.attr_id, '',
       CASE WHEN a.attr_id = 20 THEN 'label-' || (m.ltbase_created_at % 97) END,
       CASE a.attr_id WHEN 19 THEN (m.ltbase_created_at % 1000) / 7.0
                      WHEN 21 THEN m.ltbase_created_at END
FROM (SELECT ltbase_row_id, ltbase_created_at FROM entity_main ORDER BY ltbase_created_at) m
CROSS JOIN (VALUES (19::smallint), (20::smallint), (21::smallint)) AS a(attr_id)
ORDER BY m.ltbase_created_at, a.attr_id;
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at)
SELECT 100, ltbase_row_id, 0, ltbase_updated_at FROM entity_main;
VACUUM ANALYZE;
-- Flush the seed out of the WAL now, so no checkpoint runs during the measurements.
CHECKPOINT;
SQL
echo "bench: seeded in $(secs "$t0" "$(now)")s" >&2
# The cluster runs with fsync off: write the seed's dirty pages out now, so the kernel's
# writeback of them does not run during the measurements.
sync

t0=$(now)
$PSQL "$PGURL" -c "\\copy (SELECT * FROM entity_main) TO '/dev/null' WITH (FORMAT binary)"
$PSQL "$PGURL" -c "\\copy (SELECT * FROM eav_data) TO '/dev/null' WITH (FORMAT binary)"
floor=$(secs "$t0" "$(now)")

if [ "$what" = query ]; then
	ensure_venv "$PEERENV" "$DUCKDB_PY_PROBE" "duckdb==$DUCKDB_PY_VERSION"
	threads="${LAKECDC_BENCH_THREADS:-$(nproc)}"
	memory="${LAKECDC_BENCH_MEMORY:-4GB}"
	work=$(mktemp -d)
	"$BIN" -q init --work-dir "$work" >/dev/null
	# init does not touch change_log: the seed's slots are in the base now, so clear them and
	# let each flush export its own round of changes only.
	$PSQL "$PGURL" -c "DELETE FROM change_log"
	changes=$((N / 100))
	echo "bench: 10 rounds of $changes changes, each flushed" >&2
	t0=$(now)
	for round in 1 2 3 4 5 6 7 8 9 10; do
		# Round r changes the entities with i % 100 = r (i = the seed's number): nine in ten
		# updated (writer contract), one in ten hard-deleted (a tombstone slot).
		$PSQL "$PGURL" <<SQL
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms \gset
CREATE TEMP TABLE picked AS
  SELECT ltbase_row_id AS row_id, ltbase_updated_at AS prev,
         (ltbase_created_at - 1700000000000) / 100 % 10 = 0 AS gone
  FROM entity_main
  WHERE ltbase_schema_id = 100 AND (ltbase_created_at - 1700000000000) % 100 = $round;
WITH upd AS (
  UPDATE entity_main m SET text_01 = text_01 || ' (round $round)', integer_01 = integer_01 + $round,
         ltbase_updated_at = GREATEST(:now_ms, ltbase_updated_at + 1)
  FROM picked p WHERE m.ltbase_schema_id = 100 AND m.ltbase_row_id = p.row_id AND NOT p.gone
  RETURNING m.ltbase_row_id, m.ltbase_updated_at)
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at)
SELECT 100, ltbase_row_id, 0, ltbase_updated_at FROM upd;
DELETE FROM eav_data e USING picked p WHERE e.schema_id = 100 AND e.row_id = p.row_id AND p.gone;
DELETE FROM entity_main m USING picked p WHERE m.ltbase_schema_id = 100 AND m.ltbase_row_id = p.row_id AND p.gone;
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at, deleted_at)
SELECT 100, row_id, 0, GREATEST(:now_ms, prev + 1), GREATEST(:now_ms, prev + 1) FROM picked WHERE gone;
SQL
		"$BIN" -q flush --force --time-budget 1h --work-dir "$work" >/dev/null
	done
	echo "bench: changed and flushed in $(secs "$t0" "$(now)")s" >&2
	read -r want_count want_sum < <($PSQL "$PGURL" -At -F ' ' \
		-c "SELECT count(*), sum(integer_01) FROM entity_main WHERE ltbase_schema_id = 100")

	# The same files in a local lake: every object under the S3 lake's root copied to the same
	# key under a local directory. The manifest lists keys with the root (lake/data/100/…), so
	# the local lake is the directory with that data prefix and manifest template.
	lake="$work/copy"
	local_lake=(--lake "$lake" --data-prefix lake/data --manifest-template 'lake/manifest/{schema_id}.json')
	mkdir -p "$lake"
	listing=$("${S3CURL[@]}" "$LAKECDC_TEST_S3_ENDPOINT/bench?list-type=2&prefix=lake%2F")
	if ! grep -q '<IsTruncated>false</IsTruncated>' <<<"$listing"; then
		echo "bench: the S3 lake has more than 1000 objects; this copy lists only one page" >&2
		exit 1
	fi
	grep -o '<Key>[^<]*</Key>' <<<"$listing" | sed 's/<Key>//; s/<\/Key>//' | while read -r key; do
		"${S3CURL[@]}" --create-dirs -o "$lake/$key" "$LAKECDC_TEST_S3_ENDPOINT/bench/$key"
	done
	manifest=$(cd "$lake" && echo lake/manifest/*.json)
	"$BIN" -q verify "${local_lake[@]}" >/dev/null
	read -r files listed mib < <(python3 - "$lake/$manifest" <<'PY'
import json, sys
files = json.load(open(sys.argv[1]))["files"]
print(len(files), sum(f["row_count"] for f in files), f'{sum(f["size_bytes"] for f in files) / 2**20:.1f}')
PY
	)

	select="count(*), sum(i01)"
	sql="SELECT $select FROM wide"
	q=("$BIN" -q query --format csv --threads "$threads" --memory-limit "$memory")
	# Runs a command, printing the last line of its output, its seconds and its CPU seconds
	# (user + system: steadier than the wall time on a shared machine).
	timed() {
		local t0 t1 out
		t0=$(now)
		out=$(/usr/bin/time -f '%U %S' -o "$work/cpu" "$@" | tail -n 1) || return 1
		t1=$(now)
		echo "$out $(secs "$t0" "$t1") $(awk '{print $1 + $2}' "$work/cpu")"
	}
	a=() b=() b_in=() c=() a_cpu=() b_cpu=() c_cpu=()
	results=()
	cache="$work/cache"
	got=$(timed "${q[@]}" --cache-dir "$cache" "$sql")
	read -r res cold cpu <<<"$got"
	results+=("C-cold=$res")
	# A, B and warm C take turns, so that a burst of load on the shared machine hits all three.
	for run in 1 2 3; do
		got=$(timed "${q[@]}" "${local_lake[@]}" "$sql")
		read -r res t cpu <<<"$got"
		a+=("$t") a_cpu+=("$cpu") results+=("A$run=$res")
		got=$(timed "$PEERENV/bin/python" scripts/bench/query_peer.py "$lake" "$manifest" "$threads" "$memory" "$select")
		read -r res t cpu <<<"$got"
		b+=("$t") b_cpu+=("$cpu") b_in+=("${res##*,}") results+=("B$run=${res%,*}")
		got=$(timed "${q[@]}" --cache-dir "$cache" "$sql")
		read -r res t cpu <<<"$got"
		c+=("$t") c_cpu+=("$cpu") results+=("C$run=$res")
	done

	# A point lookup of an updated entity on S3, the cache empty: which files it fetched.
	id=$($PSQL "$PGURL" -At -c "SELECT ltbase_row_id FROM entity_main WHERE ltbase_schema_id = 100
		AND (ltbase_created_at - 1700000000000) % 100 = 5 ORDER BY ltbase_created_at LIMIT 1 OFFSET $((N / 200))")
	log="$work/point.log"
	t0=$(now)
	point=$(NO_COLOR=1 "$BIN" -v query --format csv --threads "$threads" --memory-limit "$memory" \
		--cache-dir "$work/cache-point" "SELECT row_id, i01 FROM wide WHERE row_id = '$id'" 2>"$log" | tail -n +2)
	point_secs=$(secs "$t0" "$(now)")
	point_read=$(grep -o 'files_listed=[0-9]* files_read=[0-9]* downloaded=[0-9]*' "$log" | tail -n 1) || {
		cat "$log" >&2
		echo "bench: no files_listed=… files_read=… downloaded=… in the point lookup's -v log" >&2
		exit 1
	}
	# The cache holds exactly the files the lookup downloaded.
	point_mib=$(find "$work/cache-point" -name '*.parquet' -printf '%s\n' | awk '{b += $1} END {printf "%.1f", b / 2^20}')
	want_i01=$($PSQL "$PGURL" -At -c "SELECT integer_01 FROM entity_main WHERE ltbase_row_id = '$id'")
	ids=$($PSQL "$PGURL" -At -c "SELECT CASE WHEN count(*) FILTER (WHERE substr(ltbase_row_id::text, 15, 1) = '4') = count(*)
		THEN 'random UUIDv4' WHEN count(*) FILTER (WHERE substr(ltbase_row_id::text, 15, 1) = '7') = count(*)
		THEN 'time-ordered UUIDv7' ELSE 'mixed' END FROM entity_main WHERE ltbase_schema_id = 100")

	python3 - "$N" "$changes" "$files" "$listed" "$mib" "$threads" "$memory" "$want_count,$want_sum" \
		"${a[*]}" "${b[*]}" "${b_in[*]}" "$cold" "${c[*]}" "${a_cpu[*]}" "${b_cpu[*]}" "${c_cpu[*]}" "${results[*]}" \
		"$id" "$want_i01" "$point" "$point_secs" "$point_read" "$point_mib" "$ids" <<'PY'
import statistics, sys
(n, changes, files, listed, mib, threads, memory, want, a, b, b_in, cold, c, a_cpu, b_cpu, c_cpu, results,
 pid, want_i01, point, point_secs, point_read, point_mib, ids) = sys.argv[1:]
n, changes, files, listed = int(n), int(changes), int(files), int(listed)
a, b, b_in, c, a_cpu, b_cpu, c_cpu = ([float(x) for x in v.split()] for v in (a, b, b_in, c, a_cpu, b_cpu, c_cpu))
cold, point_secs = float(cold), float(point_secs)
bad = [r for r in results.split() if r.split("=", 1)[1] != want]
if bad:
    sys.exit(f"query bench: FAILED: PostgreSQL's live entities give count,sum {want}; these differ: {' '.join(bad)}")
if point != f"{pid},{want_i01}":
    sys.exit(f"query bench: FAILED: the point lookup gave {point!r}, PostgreSQL {pid},{want_i01}")
med = statistics.median
print(f"query bench: {n} entities ({ids} row ids), init + 10 flushes of {changes} changes "
      f"(9/10 updates, 1/10 deletes); {files} files, {listed} rows listed, {mib} MiB")
print(f"  SELECT count(*), sum(i01) FROM wide = {want} (PostgreSQL's live entities: the same), "
      f"threads {threads}, memory limit {memory}")
def line(label, xs):
    return (f"  {label:<48} best {min(xs):.3f} s, median {med(xs):.3f} s "
            f"= {listed / min(xs):,.0f} rows/s  ({', '.join(f'{x:.3f}' for x in xs)})")
print(line("A lakecdc query, local lake:", a))
print(line("B DuckDB by hand, same files (process):", b))
print(line("  B's query alone (no start-up, no import):", b_in))
print(f"  {'C lakecdc query, S3 lake, empty cache:':<48} {cold:.3f} s")
print(line("C lakecdc query, S3 lake, warm cache:", c))
print(f"  ratio A / B (medians):   {med(a) / med(b):.2f} (target <= 1.2); best: {min(a) / min(b):.2f}; "
      f"against B's query alone {med(a) / med(b_in):.2f}")
print(f"  ratio C / A (medians):   {med(c) / med(a):.2f} (target <= 1.3); best: {min(c) / min(a):.2f}")
print(f"  CPU s (user + system), medians: A {med(a_cpu):.2f}, B {med(b_cpu):.2f} (with Python's start-up), "
      f"C warm {med(c_cpu):.2f}")
print(f"  point lookup row_id = '{pid}', S3, empty cache: {point_secs:.3f} s, {point_read} "
      f"({point_mib} of {mib} MiB)")
PY
	rm -rf "$work"
	exit 0
fi

if [ "$what" = init ]; then
	ensure_venv "$PEERENV" "$DUCKDB_PY_PROBE; import duckdb_extension_postgres" \
		"duckdb==$DUCKDB_PY_VERSION" "duckdb-extension-postgres==$DUCKDB_PY_VERSION"
	work=$(mktemp -d)
	peer=$("$PEERENV/bin/python" scripts/bench/peer.py "$PGURL" "$work/peer.parquet" 100)
	report=$(mktemp)
	timing=$(mktemp)
	t0=$(now)
	/usr/bin/time -v -o "$timing" "$BIN" -q init --json --work-dir "$work" --memory-limit 512MB >"$report"
	init=$(secs "$t0" "$(now)")
	rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$timing")
	python3 - "$report" "$N" "$floor" "$peer" "$init" "$rss_kb" "$(stat -c %s "$work/peer.parquet")" <<'PY'
import json, sys
report, n, floor, peer, init, rss_kb, peer_bytes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
s = json.load(open(report))["schemas"][0]
assert s["outcome"] == "exported" and s["rows"] == n, s
print(f"init bench: {n} live entities (18 bound columns, 3 EAV attributes each)")
print(f"  read floor (COPY binary entity_main + eav_data):    {floor:.2f} s")
print(f"  peer: DuckDB 1.5.5 postgres scanner → local file:   {peer:.2f} s  ({peer_bytes / 2**20:.1f} MiB)")
print(f"  lakecdc init → SeaweedFS, checksummed, committed:   {init:.2f} s  = {n / init:,.0f} rows/s, "
      f"{len(s['files'])} files, {s['bytes'] / 2**20:.1f} MiB")
print(f"  ratio lakecdc / peer:                               {init / peer:.2f} (target < 1.0)")
print(f"  ratio lakecdc / read floor:                         {init / floor:.2f} (target <= 2.0)")
print(f"  peak RSS:                                           {rss_kb / 1024:.0f} MiB (target <= 1024)")
PY
	rm -rf "$report" "$timing" "$work"
	exit 0
fi

if [ "$what" = compact ]; then
	work=$(mktemp -d)
	"$BIN" -q flush --force --time-budget 1h --work-dir "$work" >/dev/null
	"$BIN" -q compact --target-base-size 1 --work-dir "$work" >/dev/null
	echo "bench: updating $((N / 10)) rows" >&2
	$PSQL "$PGURL" <<SQL
WITH upd AS (
  UPDATE entity_main SET text_01 = text_01 || ' (updated)', integer_02 = integer_02 + 1,
         ltbase_updated_at = GREATEST((extract(epoch FROM clock_timestamp()) * 1000)::bigint, ltbase_updated_at + 1)
  WHERE ltbase_schema_id = 100 AND ltbase_created_at % 10 = 0
  RETURNING ltbase_row_id, ltbase_updated_at)
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at)
SELECT 100, ltbase_row_id, 0, ltbase_updated_at FROM upd;
SQL
	"$BIN" -q flush --force --time-budget 1h --work-dir "$work" >/dev/null
	report=$(mktemp)
	timing=$(mktemp)
	t0=$(now)
	/usr/bin/time -v -o "$timing" "$BIN" -q compact --json --work-dir "$work" --memory-limit 1GB >"$report"
	compact=$(secs "$t0" "$(now)")
	rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$timing")
	python3 - "$report" "$compact" "$rss_kb" "$floor" <<'PY'
import json, sys
report, secs, rss_kb, floor = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = json.load(open(report))["schemas"][0]
assert s["outcome"] == "done" and s["plan"]["decision"] == "rewrite", s
print(f"compact bench: rewrite of {s['plan']['base_rows']} base rows + {s['plan']['delta_rows']} delta rows "
      f"({s['files_in']} files) into {s['rows_out']} rows, {s['bytes_out'] / 2**20:.1f} MiB")
print(f"  lakecdc compact (download, verify, merge, upload, commit): {secs:.2f} s "
      f"= {s['rows_in'] / secs:,.0f} rows/s (target >= 300,000)")
print(f"  PostgreSQL read floor of the same rows (COPY binary):      {floor:.2f} s")
print(f"  peak RSS:                                                  {rss_kb / 1024:.0f} MiB")
PY
	rm -rf "$report" "$timing" "$work"
	exit 0
fi

report=$(mktemp)
timing=$(mktemp)
t0=$(now)
/usr/bin/time -v -o "$timing" "$BIN" -q flush --force --time-budget 1h --json >"$report"
flush=$(secs "$t0" "$(now)")
rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$timing")
# lakecdc's own CPU (user + system): steadier than wall time on a shared machine.
cpu=$(awk -F: '/(User|System) time \(seconds\)/ {sum += $2} END {printf "%.2f", sum}' "$timing")

t0=$(now)
"$BIN" -q flush --json >/dev/null
idle=$(secs "$t0" "$(now)")

python3 - "$report" "$N" "$floor" "$flush" "$rss_kb" "$idle" "$cpu" <<'PY'
import json, sys
report, n, floor, flush, rss_kb, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
cpu = float(sys.argv[7])
r = json.load(open(report))
s = r["schemas"][0]
assert s["outcome"] == "flushed", s
print(f"flush bench: {n} changes, {s['batches']} batches, {len(s['files'])} files, {s['bytes'] / 2**20:.1f} MiB")
print(f"  rows exported / marked / left dirty: {s['rows_exported']} / {s['rows_marked']} / {s['rows_left_dirty']}")
print(f"  read floor (COPY binary entity_main + eav_data): {floor:.2f} s")
print(f"  lakecdc flush --force:                          {flush:.2f} s  = {n / flush:,.0f} changes/s (target >= 100,000)")
print(f"  ratio flush / read floor:                       {flush / floor:.2f}")
print(f"  lakecdc CPU (user + system):                  {cpu:.2f} s")
print(f"  peak RSS:                                       {rss_kb / 1024:.0f} MiB")
print(f"  idle run (nothing to flush):                    {idle:.3f} s")
PY
rm -f "$report" "$timing"
