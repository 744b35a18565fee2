#!/usr/bin/env bash
# Benchmarks, each measured against a baseline taken in the same run on the same machine.
#
#   scripts/bench.sh flush [N]     # N-change backlog (default 1,000,000) → one `lakecdc flush --force`
#   scripts/bench.sh compact [N]   # N base rows + N/10 delta rows → one `lakecdc compact` rewrite
#   scripts/bench.sh compact-scale [N]  # N (default 10,000,000) entities in 20+ bases → three
#                                  # compactions of 1% changes: local, spread thin, full rewrite
#   scripts/bench.sh init [N]      # N live entities → `lakecdc init` vs the DuckDB postgres peer
#   scripts/bench.sh query [N]     # N entities, init + 10 flushes of N/100 changes → `lakecdc query`
#                                  # (--rounds R: R flushes, of N/max(100,R) changes each)
#   scripts/bench.sh matrix [N]    # init and flush in all four cases: UUIDv7/v4 ids × TLS/plain
#   scripts/bench.sh verify-source [N]  # N entities, init + 3 flushed rounds → `verify --source`
#   scripts/bench.sh table [N]     # flush of an N-change (default 1,000,000) table-source backlog,
#                                  # then the capture bench
#   scripts/bench.sh capture [N]   # a table source's triggers: N-row (default 100,000) bulk
#                                  # INSERT and UPDATE and 10,000 one-row transactions, with and
#                                  # without `lakecdc attach`
#
# Options of flush, compact, compact-scale, init, query and verify-source (before or after N):
#   --ids v7|v4                 row ids: time-ordered UUIDv7 (default) or random UUIDv4
#                               (env LAKECDC_BENCH_IDS)
#   --sslmode require|disable   the sslmode of lakecdc's and the peer's connections: TLS without
#                               server verification (default) or plain TCP (env LAKECDC_BENCH_SSLMODE)
# Option of flush:
#   --s3-delay MS               also flush the same backlog again (into another prefix) through a
#                               relay that delays every request to the S3 server by MS ms, as a
#                               distant store would (scripts/bench/delay_proxy.py; env
#                               LAKECDC_BENCH_S3_DELAY_MS; 0, the default, skips that run)
# Option of query:
#   --rounds R                  R flushed rounds of changes (default 10; env LAKECDC_BENCH_ROUNDS),
#                               each its own delta: a lake of hundreds of small deltas with R = 300
# LAKECDC_BENCH_CHANGE (few, every): what compact's and compact-scale's updates change: text_01,
# integer_02 and the version (few, the default), or every bound column and EAV value too (every:
# a rewrite then copies no column chunk of a changed row group, the adverse case for compaction).
# LAKECDC_BENCH_EXPORT_MEMORY (2GB) is the --memory-limit of init and flush and the peer's
# DuckDB memory_limit; LAKECDC_BENCH_RUNS (3, at least 3) the runs per case of the matrix, table and compact-scale.
#
# The schema is bench/schemas' `wide`: every attribute kind — bound text, numbers, a date as epoch
# ms, a datetime as ISO 8601 text, bools as 1/0 and as text, a UUID; in eav_data a number, text, a
# bigint, a datetime, a bool, a UUID, a list of text (1–3 items or the empty-list marker) and a
# list of two numbers. Each run checks from the server log that every session used its sslmode.
#
# flush: seeds N entities of the `wide` shape (21 bound attributes, 8 EAV ones in 9–11 eav_data rows)
# with one dirty change_log slot each, measures the read floor (`COPY … (FORMAT binary)` of the
# entity and EAV rows), then times one forced flush to SeaweedFS and an idle run. Prints
# changes/s (rows exported over the time of the whole process; it fails unless every dirty slot
# was exported and none is left dirty), the ratio flush / read floor, peak RSS, and the idle-run time.
# Target (docs/benchmarks.md): ≥ 100,000 changes/s; an idle run well under a second.
#
# compact: flushes and promotes N entities into the base tier, updates N/10 of them (writer
# contract) and flushes those, then times one `lakecdc compact` rewrite of base + deltas.
# Target: ≥ 300,000 rows/s.
#
# compact-scale: `lakecdc init` of N entities (default 10,000,000) with --target-file-size T,
# --max-file-rows N/24 (so at least 20 base files, whatever the bytes per row) and --page-rows at
# most an eighth of that (init cuts files between pages only), then 3 flushes of N/1000 updates
# each. T is N × 84 bytes (UUIDv7; 142 with UUIDv4: the lake's bytes per row at 1M entities) / 24;
# when init's largest base comes out smaller (init also cuts a file at 96 MiB of staged Arrow,
# about 100,000 `wide` entities), T becomes that size, so that the bases are about T bytes.
# LAKECDC_BENCH_TARGET_BASE_SIZE (bytes) sets T outright. The manifest is saved, and each of
# three cases starts by putting it back (data objects are write-once and compact deletes none, so
# that restores the lake; PostgreSQL keeps every case's updates), updates N/100 entities (writer
# contract), flushes them, and times ONE `lakecdc compact --json --target-base-size T
# --dirty-ratio R --max-deltas 1` (so that every case folds its deltas into one; only if the
# binary has the flag) under
# /usr/bin/time -v, polling `du -sb` of its work dir every 0.05 s for the peak scratch disk:
# (a) R = 0.05, the updates spread evenly over a tenth of the bases (the contiguous run, by
# row-id range, holding the most rows); (b) R = 0.05, every 100th entity by row_id; (c) R = 0,
# the same change as (b): every base rewritten. The three cases run RUNS times, in turn (a, b, c,
# a, b, c, …). Prints per case the median seconds and rows/s (the report's rows_in) with min and
# max, the largest peak RSS and peak scratch and the report's files_in, files_out, bases_rewritten,
# bases_kept ("?" when absent; the plan's figure, marked so, when only the plan has it).
# Targets: time(a)/time(c) ≤ 0.15, time(b)/time(c) ≤ 0.10, peak RSS ≤ 512 MiB and peak scratch
# ≤ 2 × T in every case, each printed PASS or FAIL; (c)'s rows/s is to be compared with the
# compact case's run by the DuckDB-merge build `862c9e4` (target ≥ 2×). With
# LAKECDC_BENCH_BASELINE_BIN set to a release build of that commit, the bench measures it in the
# same run: `scripts/bench.sh compact 1000000` of the baseline build (same --ids and --sslmode)
# before the cases and again after them, each a run of its own (it starts the services afresh,
# so LAKECDC_BENCH_KEEP keeps the baseline's lake, not the cases'), and prints (c)'s median
# against each, PASS only when both ratios reach 2. It exits non-zero when a lakecdc run fails,
# not for a missed target.
#
# init: times `lakecdc init` (to SeaweedFS, checksummed, manifest committed) against the read
# floor and the peer — DuckDB 1.5.5's postgres extension doing the same join and pivot into one
# local zstd Parquet file (scripts/bench/peer.py, from PyPI wheels), both timed as whole processes
# with the same memory limit; both files must hold every live entity. Targets: lakecdc / peer
# < 1.0, peak RSS ≤ 1 GiB.
#
# matrix: seeds N entities with UUIDv7 ids, then with UUIDv4 ids, and runs init (lakecdc and the
# peer) and flush (the whole backlog, made dirty again before each run) RUNS times in each of the
# four cases, TLS and plain taking turns going first, and so do lakecdc and the peer. Prints one
# markdown table: for each case the median (min–max) of the init times, of the ratio lakecdc / peer
# (each lakecdc run over the peer run next to it),
# the peak RSS of both, flush changes/s and flush peak RSS.
#
# verify-source: exports N entities (init), then 3 rounds of N/100 updates, each flushed (deltas
# over every base with UUIDv4 ids), and leaves N/1000 more updated but dirty. Times the source's
# read alone (`COPY (SELECT ltbase_row_id, ltbase_updated_at …) TO STDOUT (FORMAT binary)` by
# psql, the baseline; also in row_id order, for comparison), then RUNS runs of `lakecdc verify
# --source --json` and one of `--deep`, each a whole process under /usr/bin/time -v; every run
# must exit 0 (intact: no divergence, the dirty rows not reported) having compared every row.
# Prints rows compared per second (distinct row ids over the process's wall time; median, min,
# max), the ratio to the baseline's rows/s, and peak RSS. Target: >= 1,000,000 rows/s shallow.
#
# capture: the cost of `lakecdc attach`'s triggers on the application's writes. A 20-column table
# (bigint key; text, integers, numeric(12,2), double, bool, timestamptz, date, uuid, jsonb,
# int[]) is created twice per run, one of them attached; each gets one INSERT … SELECT of N rows,
# one UPDATE of all N rows (two columns) after the touch log is emptied as a flush would (the
# steady state), the same UPDATE again (every row still pending: a backlog), and 10,000 one-row
# UPDATE transactions by one pgbench client; both tables are vacuumed and analysed before each
# step. RUNS runs, the attached table and the plain one taking turns going first; prints the
# median (min–max) seconds (tps for the transactions) of each and the ratio attached / plain of
# the medians, and checks that the touch log holds one touch per row from each bulk UPDATE.
# Target: bulk INSERT and UPDATE ≤ 2×; the one-row transactions' ratio is reported.
#
# table: flush of a table source, six cases in one run. The capture bench's 20-column table,
# attached, with (1) a bigint key, N rows (default 1,000,000), every row updated; (2) a bigint
# key, 4N rows, every 4th row updated (a sparse backlog); (3) a text key (a hashed row id: the
# rows come in random key order), N rows, every row updated — read by table scans; (4) the same
# over a plain connection (`sslmode=disable`; the others use TLS, each run checks which from
# the server log); (5) a text key, 4N rows, every 4th row updated — the adverse case: a
# quarter of the table, in random key order, read by scans that send only the touched rows
# (a row a pass cannot keep is looked up by key); (6) a text key, every 20th row updated —
# the most adverse: a twentieth of the table, under the sixteenth a scan needs, so every row
# is a key lookup in random key order; 2N/5 touched rows of an 8N-row table, to keep its
# load affordable. Each backlog is N
# touched rows but (6)'s; each of RUNS runs flushes it whole (`lakecdc flush --schema t_bench --force`, a
# fresh local lake) as a whole process under /usr/bin/time -v; a run fails unless it exported
# and marked all its rows and left no touch. Prints per case the batches read by key range, the
# rows read by table scans (and the scans), changes per second (rows exported over the
# process's wall time; median, min, max), the median ratio of the flush's time to a baseline
# timed in the same run — PostgreSQL reading the backlog's rows out, one binary COPY over the
# same kind of connection — and peak RSS, then runs the capture bench. Target: >= 100,000
# changes/s in every case.
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
shopt -s inherit_errexit

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

usage() {
	echo "usage: scripts/bench.sh flush|compact|compact-scale|init|query|verify-source [--ids v4|v7] [--sslmode disable|require] [N]" >&2
	echo "       scripts/bench.sh query [--rounds R] [--ids v4|v7] [--sslmode disable|require] [N]" >&2
	echo "       scripts/bench.sh capture [N]" >&2
	echo "       scripts/bench.sh table [N]" >&2
	echo "       scripts/bench.sh matrix [N]" >&2
	exit 2
}
what="${1:-flush}"
[ $# -eq 0 ] || shift
IDS="${LAKECDC_BENCH_IDS:-v7}"
SSLMODE="${LAKECDC_BENCH_SSLMODE:-require}"
ROUNDS="${LAKECDC_BENCH_ROUNDS:-10}"
S3_DELAY="${LAKECDC_BENCH_S3_DELAY_MS:-0}"
S3_DELAY_FLAG=""
N=""
while [ $# -gt 0 ]; do
	case "$1" in
	--ids | --sslmode | --rounds | --s3-delay)
		[ $# -ge 2 ] || usage
		case "$1" in
		--ids) IDS="$2" ;;
		--sslmode) SSLMODE="$2" ;;
		--s3-delay) S3_DELAY="$2" S3_DELAY_FLAG=1 ;;
		*) ROUNDS="$2" ;;
		esac
		shift 2
		;;
	--s3-delay=*) S3_DELAY="${1#*=}" S3_DELAY_FLAG=1 && shift ;;
	--ids=*) IDS="${1#*=}" && shift ;;
	--sslmode=*) SSLMODE="${1#*=}" && shift ;;
	--rounds=*) ROUNDS="${1#*=}" && shift ;;
	-*) usage ;;
	*) N="$1" && shift ;;
	esac
done
case "$what" in
flush | compact | compact-scale | init | query | matrix | verify-source | capture | table) ;;
*) usage ;;
esac
if [ -z "$N" ]; then
	case "$what" in
	compact-scale) N=10000000 ;;
	capture) N=100000 ;;
	*) N=1000000 ;;
	esac
fi
CHANGE="${LAKECDC_BENCH_CHANGE:-few}"
case "$CHANGE" in
few | every) ;;
*)
	echo "bench: LAKECDC_BENCH_CHANGE must be few or every" >&2
	exit 2
	;;
esac
case "$IDS" in
v4 | v7) ;;
*)
	echo "bench: the row-id kind (--ids, LAKECDC_BENCH_IDS) must be v7 or v4" >&2
	exit 2
	;;
esac
case "$SSLMODE" in
disable | require) ;;
*)
	echo "bench: the sslmode (--sslmode, LAKECDC_BENCH_SSLMODE) must be disable or require" >&2
	exit 2
	;;
esac
[[ "$N" =~ ^[1-9][0-9]*$ ]] || usage
if ! [[ "$S3_DELAY" =~ ^[0-9]+$ ]] || { [ -n "$S3_DELAY_FLAG" ] && [ "$what" != flush ]; }; then
	echo "bench: --s3-delay (LAKECDC_BENCH_S3_DELAY_MS) takes whole milliseconds, and only for flush" >&2
	exit 2
fi
S3_DELAY=$((10#$S3_DELAY))
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || [ "$ROUNDS" -gt 900 ]; then
	echo "bench: the query's rounds (--rounds, LAKECDC_BENCH_ROUNDS) must be 1 to 900" >&2
	exit 2
fi
# DuckDB's and lakecdc's memory limit, the same for both (init, flush and the matrix).
MEMORY="${LAKECDC_BENCH_EXPORT_MEMORY:-2GB}"
RUNS="${LAKECDC_BENCH_RUNS:-3}"
if ! [[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || [ "$RUNS" -lt 3 ]; then
	echo "bench: LAKECDC_BENCH_RUNS must be 3 or more" >&2
	exit 2
fi
# compact-scale's --target-base-size (and init's --target-file-size) in bytes: the lake's bytes
# per row (about 84 with UUIDv7 ids, 142 with UUIDv4, at 1M entities) × N / 24.
case "$IDS" in
v7) TARGET_BASE=$((N * 84 / 24)) ;;
v4) TARGET_BASE=$((N * 142 / 24)) ;;
esac
TARGET_BASE="${LAKECDC_BENCH_TARGET_BASE_SIZE:-$TARGET_BASE}"
if ! [[ "$TARGET_BASE" =~ ^[1-9][0-9]*$ ]]; then
	echo "bench: LAKECDC_BENCH_TARGET_BASE_SIZE must be a number of bytes" >&2
	exit 2
fi

now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.3f}')"; }

command -v /usr/bin/time >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q time >/dev/null
BIN="${LAKECDC_BENCH_BIN:-}" # a prebuilt binary (e.g. to check this script quickly)
if [ -z "$BIN" ]; then
	echo "bench: building lakecdc (release)" >&2
	cargo build --release --locked --bin lakecdc >&2
	BIN="$CARGO_TARGET_DIR/release/lakecdc"
fi

# compact-scale against its baseline, measured in this run (see the header): the baseline's
# compact bench, the cases, the baseline's compact bench again; each a run of this script.
if [ "$what" = compact-scale ] && [ -n "${LAKECDC_BENCH_BASELINE_BIN:-}" ]; then
	if ! [ -x "$LAKECDC_BENCH_BASELINE_BIN" ]; then
		echo "bench: LAKECDC_BENCH_BASELINE_BIN=$LAKECDC_BENCH_BASELINE_BIN is not an executable: point it at a release build of 862c9e4, or unset it" >&2
		exit 2
	fi
	results=$(mktemp -d)
	baseline_run() {
		LAKECDC_BENCH_BIN="$LAKECDC_BENCH_BASELINE_BIN" LAKECDC_BENCH_BASELINE_BIN="" \
			LAKECDC_BENCH_SUMMARY="$results/baseline-$1.json" \
			"$0" compact --ids "$IDS" --sslmode "$SSLMODE" 1000000
	}
	status=0
	baseline_run 1 || status=$?
	LAKECDC_BENCH_BIN="$BIN" LAKECDC_BENCH_BASELINE_BIN="" LAKECDC_BENCH_SUMMARY="$results/cases.json" \
		"$0" compact-scale --ids "$IDS" --sslmode "$SSLMODE" "$N" || status=$?
	baseline_run 2 || status=$?
	python3 - "$results" "$LAKECDC_BENCH_BASELINE_BIN" <<'PY' || status=$?
import json, sys
results, baseline_bin = sys.argv[1:]
def load(name, key):
    try:
        return json.load(open(f"{results}/{name}.json"))[key]
    except (OSError, ValueError, KeyError):
        return None
c = load("cases", "c_rows_per_s")
bases = [load(f"baseline-{i}", "rows_per_s") for i in (1, 2)]
print(f"compact-scale against its baseline ({baseline_bin}, `scripts/bench.sh compact 1000000` before and after the cases):")
if c is None or None in bases:
    print("  (c) / baseline: ? (a run failed): FAIL")
    sys.exit(1)
for i, b in enumerate(bases, 1):
    print(f"  baseline run {i}: {b:,.0f} rows/s; (c) median {c:,.0f} rows/s = {c / b:.2f}x")
worst = c / max(bases)
print(f"  (c) / the faster baseline run = {worst:.2f}x (target >= 2): {'PASS' if worst >= 2 else 'FAIL'}")
PY
	rm -rf "$results"
	exit "$status"
fi

# LAKECDC_BENCH_KEEP=1 leaves the services (and the bench database and lake) running, to look
# into a run afterwards. Every EXIT trap of this script ends with it.
stop_services() {
	[ "${LAKECDC_BENCH_KEEP:-}" = 1 ] || scripts/services.sh stop >/dev/null 2>&1 || true
}
trap stop_services EXIT
scripts/services.sh start >/dev/null
# shellcheck source=/dev/null
source "$LAKECDC_SERVICES_DIR/env"
PSQL="$PGBIN/psql -X -q -v ON_ERROR_STOP=1"
PGLOG="$LAKECDC_SERVICES_DIR/pg.log"
# Every session is logged with whether it uses TLS, so that each case can check its sslmode.
$PSQL "$LAKECDC_TEST_PG_URL" -c "ALTER SYSTEM SET log_connections = on" -c "SELECT pg_reload_conf()" >/dev/null
PGURL="${LAKECDC_TEST_PG_URL%/*}/bench"
S3CURL=(curl -sf --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY")
"${S3CURL[@]}" -X PUT "$LAKECDC_TEST_S3_ENDPOINT/bench" >/dev/null
echo warm | "${S3CURL[@]}" -X PUT -T - "$LAKECDC_TEST_S3_ENDPOINT/bench/warm-up" >/dev/null
# lakecdc and the DuckDB peer both connect with the URL's sslmode: `require` encrypts without
# verifying the server (neither is given a root certificate), `disable` is plain TCP. No libpq
# variable from the caller's environment may change that for one of them only.
unset PGSSLMODE PGSSLROOTCERT PGSSLCERT PGSSLKEY PGREQUIRESSL
export LAKECDC_PG_URL="$PGURL?sslmode=$SSLMODE" LAKECDC_LAKE=s3://bench/lake LAKECDC_S3_ENDPOINT="$LAKECDC_TEST_S3_ENDPOINT"
export LAKECDC_S3_PATH_STYLE=true LAKECDC_SCHEMA_DIR="$ROOT/bench/schemas"

# (Re)creates database bench with the tables and N entities of the `wide` shape: every attribute
# kind of bench/schemas, bound and in eav_data, one dirty change_log slot each. Row ids are
# UUIDv7 (time-ordered, as the entity store generates them) or random UUIDv4 ($1 = v7 | v4, the
# worst case for index-ordered reads). An entity's number i is ltbase_created_at - 1700000000000.
seed() {
	local ids="$1" row_id t0
	case "$ids" in
	v7) row_id="(lpad(to_hex(1700000000000 + i), 12, '0') || '7' || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid" ;;
	v4) row_id="gen_random_uuid()" ;;
	esac
	$PSQL "$LAKECDC_TEST_PG_URL" -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS bench" \
		-c "CREATE DATABASE bench"
	"$BIN" -q init-db >/dev/null
	echo "bench: seeding $N entities ($ids row ids)" >&2
	t0=$(now)
	$PSQL "$PGURL" <<SQL
INSERT INTO entity_main (ltbase_schema_id, ltbase_row_id, ltbase_created_at, ltbase_updated_at,
  text_01, text_02, text_03, text_04, text_05, text_06, text_07, text_08, text_09, text_10,
  smallint_01, smallint_02, smallint_03, integer_01, integer_02, bigint_01, bigint_02, bigint_03,
  double_01, double_02, uuid_01)
SELECT 100, $row_id, 1700000000000 + i, 1700000000000 + i,
  'customer ' || i, md5(i::text), 'city-' || (i % 1000), 'street ' || (i % 5000) || ' no ' || (i % 97),
  'segment-' || (i % 12), 'note ' || md5((i * 7)::text), 'EUR', 'tier-' || (i % 4),
  -- signed_up_at: a datetime as ISO 8601 text; opted_in: a bool as text, in each accepted form.
  to_char(timestamp '2020-01-01' + i * interval '1 second', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
  (ARRAY['1', '0', 'true', 'false', 't', 'f'])[i % 6 + 1],
  -- active: a bool as 1/0; born_on: a date as epoch ms; external_id: a UUID.
  (i % 30000)::smallint, (i % 7)::smallint, (i % 2)::smallint, i, i % 1000, i::bigint * 1000, i::bigint % 86400000,
  (i % 25000)::bigint * 86400000, i * 0.5, (i % 1000) / 3.0, md5('external ' || i)::uuid
FROM generate_series(1, $N) AS i;
-- An entity's EAV rows are written together, as the application writes them: score, label,
-- counter, seen_at (a datetime as epoch ms), vip (a bool as 1/0), referrer_id (a UUID as text),
-- tags (i % 4 texts; none is the empty-list marker row) and ratings (two numbers).
INSERT INTO eav_data (schema_id, row_id, attr_id, array_indices, value_text, value_numeric)
SELECT 100, m.ltbase_row_id, a.attr_id, a.idx,
       CASE a.attr_id WHEN 20 THEN 'label-' || (m.i % 97)
                      WHEN 29 THEN md5('referrer ' || (m.i % 50000))::uuid::text
                      WHEN 30 THEN 'tag-' || ((m.i + a.pos) % 50) END,
       CASE a.attr_id WHEN 19 THEN (m.i % 1000) / 7.0
                      WHEN 21 THEN m.ltbase_created_at
                      WHEN 27 THEN m.ltbase_created_at + m.i % 86400000
                      WHEN 28 THEN (m.i % 3 = 0)::int
                      WHEN 31 THEN (m.i * (a.pos + 1)) % 101 END
FROM (SELECT ltbase_row_id, ltbase_created_at, ltbase_created_at - 1700000000000 AS i
      FROM entity_main ORDER BY ltbase_created_at) m
CROSS JOIN (VALUES (19::smallint, '', -1), (20::smallint, '', -1), (21::smallint, '', -1),
                   (27::smallint, '', -1), (28::smallint, '', -1), (29::smallint, '', -1),
                   (30::smallint, '', -1), (30::smallint, '0', 0), (30::smallint, '1', 1), (30::smallint, '2', 2),
                   (31::smallint, '0', 0), (31::smallint, '1', 1)) AS a(attr_id, idx, pos)
WHERE a.attr_id <> 30 OR (a.pos < 0 AND m.i % 4 = 0) OR (a.pos >= 0 AND a.pos < m.i % 4)
ORDER BY m.ltbase_created_at, a.attr_id, a.idx;
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
}

# Runs a command under /usr/bin/time -v with its stdout to file $1; prints its wall seconds and
# peak RSS in KiB. lakecdc and the peer are both measured so: whole processes.
measure() {
	local out="$1" t0 t1
	shift
	t0=$(now)
	/usr/bin/time -v -o "$out.time" "$@" >"$out"
	t1=$(now)
	echo "$(secs "$t0" "$t1") $(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$out.time")"
}

# The server log's size: check_ssl looks at the sessions logged after it.
log_mark() { stat -c %s "$PGLOG"; }

# Fails unless every session to database $3 (default bench) logged since mark $1 used TLS
# (sslmode $2 = require) or none did (disable), and there was at least one.
check_ssl() {
	local lines total tls
	lines=$(tail -c +"$(($1 + 1))" "$PGLOG" | grep -E "connection authorized: .*database=${3:-bench}( |$)" || true)
	total=$(grep -c . <<<"$lines" || true)
	tls=$(grep -c 'SSL enabled' <<<"$lines" || true)
	if [ "$total" -eq 0 ] || { [ "$2" = require ] && [ "$tls" -ne "$total" ]; } ||
		{ [ "$2" = disable ] && [ "$tls" -ne 0 ]; }; then
		echo "bench: FAILED: sslmode=$2, but $tls of $total sessions used TLS:" >&2
		echo "$lines" >&2
		exit 1
	fi
}

ensure_peer() {
	ensure_venv "$PEERENV" "$DUCKDB_PY_PROBE; import duckdb_extension_postgres" \
		"duckdb==$DUCKDB_PY_VERSION" "duckdb-extension-postgres==$DUCKDB_PY_VERSION"
}

# One init of the live entities by lakecdc (to SeaweedFS, checksummed, committed) and one by the
# peer (to a local file), with sslmode $1, in directory $2 (peer first when $3 = peer, else
# lakecdc first), lakecdc into lake $4. Checks that both wrote every live entity and used the
# sslmode; prints "lakecdc-seconds lakecdc-RSS-KiB peer-seconds peer-RSS-KiB files MiB".
init_once() {
	local ssl="$1" dir="$2" first="$3" lake="$4" url="$PGURL?sslmode=$1" mark who lk="" pk="" live peer_rows
	mkdir -p "$dir"
	settle_db
	mark=$(log_mark)
	for who in "$first" lakecdc peer; do
		if [ "$who" = peer ] && [ -z "$pk" ]; then
			pk=$(measure "$dir/peer.out" "$PEERENV/bin/python" scripts/bench/peer.py "$url" "$dir/peer.parquet" 100 \
				"$MEMORY" "$ROOT/bench/schemas/wide_attributes.json")
		elif [ "$who" = lakecdc ] && [ -z "$lk" ]; then
			lk=$(LAKECDC_PG_URL="$url" LAKECDC_LAKE="$lake" measure "$dir/report.json" \
				"$BIN" -q init --json --work-dir "$dir" --memory-limit "$MEMORY")
		fi
	done
	check_ssl "$mark" "$ssl"
	live=$($PSQL "$PGURL" -At -c "SELECT count(*) FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_deleted_at IS NULL")
	peer_rows=$("$PEERENV/bin/python" -c 'import duckdb, sys
print(duckdb.sql(f"SELECT count(*) FROM read_parquet({sys.argv[1]!r})").fetchone()[0])' "$dir/peer.parquet")
	python3 - "$dir/report.json" "$live" "$peer_rows" "$lk" "$pk" <<'PY'
import json, sys
report, live, peer_rows, lk, pk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
s = json.load(open(report))["schemas"][0]
if s["outcome"] != "exported" or s["rows"] != live or peer_rows != live:
    sys.exit(f"bench: FAILED: {live} live entities; lakecdc init {s['outcome']} {s.get('rows')} rows, "
             f"the peer wrote {peer_rows} rows")
print(lk, pk, len(s["files"]), f"{s['bytes'] / 2**20:.1f}")
PY
	rm -f "$dir/peer.parquet"
}

# Makes every entity's change_log slot dirty again (as seeded: one dirty slot per entity, the
# flushed ones gone), so that each flush run exports the same backlog.
reset_backlog() {
	$PSQL "$PGURL" <<SQL
TRUNCATE change_log;
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at)
SELECT 100, ltbase_row_id, 0, ltbase_updated_at FROM entity_main;
SQL
	settle_db
}

# Vacuums change_log and writes out dirty buffers before a timed run, so that no run pays for
# the one before it: a flush marks a million slots, and autovacuum then vacuums change_log
# within its one-minute nap, seen running through a following init (docs/benchmarks.md).
settle_db() {
	$PSQL "$PGURL" -c "VACUUM ANALYZE change_log" -c "CHECKPOINT" >/dev/null
	sync
}

# One forced flush of the whole backlog with sslmode $1 into lake $2, its report to file $3.
# Fails unless it exported every dirty slot and left none dirty; prints "seconds RSS-KiB
# rows-exported files MiB batches-by-range".
flush_once() {
	local ssl="$1" lake="$2" report="$3" url="$PGURL?sslmode=$1" mark backlog res dirty
	backlog=$($PSQL "$PGURL" -At -c "SELECT count(*) FROM change_log WHERE flushed_at = 0")
	mark=$(log_mark)
	res=$(LAKECDC_PG_URL="$url" LAKECDC_LAKE="$lake" measure "$report" \
		"$BIN" -q flush --force --time-budget 1h --json --memory-limit "$MEMORY")
	check_ssl "$mark" "$ssl"
	dirty=$($PSQL "$PGURL" -At -c "SELECT count(*) FROM change_log WHERE flushed_at = 0")
	python3 - "$report" "$backlog" "$dirty" "$res" <<'PY'
import json, sys
report, backlog, dirty, res = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = json.load(open(report))["schemas"][0]
if s["outcome"] != "flushed" or s["rows_exported"] != backlog or s["rows_left_dirty"] != 0 or dirty != 0:
    sys.exit(f"bench: FAILED: a backlog of {backlog}; flush {s['outcome']}, {s.get('rows_exported')} rows exported, "
             f"{s.get('rows_left_dirty')} left dirty by its report, {dirty} dirty slots in change_log")
print(res, s["rows_exported"], len(s["files"]), f"{s['bytes'] / 2**20:.1f}", s["batches_by_range"])
PY
}

# Updates the entities of schema 100 that SQL condition $1 selects (on entity_main's columns) as
# the application writes (the writer contract, docs/design.md §2.2): a new version
# GREATEST(now_ms, previous + 1) as ltbase_updated_at, text_01 and integer_02 changed (with
# LAKECDC_BENCH_CHANGE=every, every bound column and every EAV value too), and in the same
# statement the row's dirty change_log slot upserted with that version.
update_rows() {
	local every=""
	if [ "$CHANGE" = every ]; then
		every="text_02 = text_02 || 'u', text_03 = text_03 || 'u', text_04 = text_04 || 'u',
		 text_05 = text_05 || 'u', text_06 = text_06 || 'u', text_07 = text_07 || 'u',
		 text_08 = text_08 || 'u', text_09 = text_09 || 'u', text_10 = text_10 || 'u',
		 smallint_01 = smallint_01 / 2 + 1, smallint_02 = smallint_02 + 1, smallint_03 = 1 - smallint_03,
		 integer_01 = integer_01 + 1, bigint_01 = bigint_01 + 1, bigint_02 = bigint_02 + 1,
		 bigint_03 = bigint_03 + 86400000, double_01 = double_01 + 0.25, double_02 = double_02 + 0.25,
		 uuid_01 = md5(uuid_01::text)::uuid,"
	fi
	$PSQL "$LAKECDC_PG_URL" <<SQL
WITH upd AS (
  UPDATE entity_main SET text_01 = text_01 || ' (updated)', integer_02 = integer_02 + 1, $every
         ltbase_updated_at = GREATEST((extract(epoch FROM clock_timestamp()) * 1000)::bigint, ltbase_updated_at + 1)
  WHERE ltbase_schema_id = 100 AND ($1)
  RETURNING ltbase_row_id, ltbase_updated_at),
eav AS (
  UPDATE eav_data e SET value_text = e.value_text || 'u', value_numeric = e.value_numeric + 1
  FROM upd WHERE '$CHANGE' = 'every' AND e.schema_id = 100 AND e.row_id = upd.ltbase_row_id
  RETURNING 1)
INSERT INTO change_log (schema_id, row_id, flushed_at, changed_at)
SELECT 100, ltbase_row_id, 0, ltbase_updated_at FROM upd
ON CONFLICT (schema_id, row_id, flushed_at) DO UPDATE SET changed_at = EXCLUDED.changed_at, deleted_at = NULL;
SQL
}

# Writes the largest `du -sb` of directory $1 seen so far to file $2, sampling every 0.05 s
# until file $3 exists (compact-scale's peak scratch disk; run in the background).
watch_du() {
	local dir="$1" out="$2" stop="$3" peak=0 bytes
	echo 0 >"$out"
	while [ ! -e "$stop" ]; do
		# Files vanish while du walks the tree (spill files, finished uploads): it then warns
		# and exits 1, still printing the total of what it saw.
		bytes=$(du -sb "$dir" 2>/dev/null | cut -f1) || true
		if [ -n "$bytes" ] && [ "$bytes" -gt "$peak" ]; then
			peak="$bytes"
			echo "$peak" >"$out"
		fi
		sleep 0.05
	done
}

if [ "$what" = capture ]; then
	CAPURL="${LAKECDC_TEST_PG_URL%/*}/bench_capture"
	$PSQL "$LAKECDC_TEST_PG_URL" -c "DROP DATABASE IF EXISTS bench_capture" -c "CREATE DATABASE bench_capture"
	"$BIN" -q init-db --pg-url "$CAPURL" >/dev/null
	cols="id bigint PRIMARY KEY, c1 text, c2 text, c3 integer, c4 bigint, c5 numeric(12,2), c6 double precision,
	      c7 boolean, c8 timestamptz, c9 date, c10 uuid, c11 jsonb, c12 integer[], c13 text, c14 smallint,
	      c15 numeric(12,2), c16 text, c17 bigint, c18 timestamptz, c19 text"
	vals="g, 'name ' || g, md5(g::text), g % 1000, g * 7, (g % 100000) / 100.0, g / 3.0, g % 2 = 0, now(),
	      current_date, md5(g::text)::uuid, jsonb_build_object('k', g), ARRAY[g, g + 1], 'x', (g % 100)::smallint,
	      g / 7.0, 'tag', g, now(), 'end'"
	one_row=$(mktemp)
	results=$(mktemp)
	# One run of one table: seconds of the bulk INSERT, of the bulk UPDATE of exported rows and
	# of dirty ones, one-row tps.
	capture_run() {
		local table="$1" attach="$2" t0 ins upd redo tps
		$PSQL "$CAPURL" -c "DROP TABLE IF EXISTS $table" -c "CREATE TABLE $table ($cols)"
		if [ "$attach" = 1 ]; then "$BIN" -q attach "$table" --pg-url "$CAPURL" >/dev/null; fi
		$PSQL "$CAPURL" -c "VACUUM ANALYZE"
		t0=$(now)
		$PSQL "$CAPURL" -c "INSERT INTO $table SELECT $vals FROM generate_series(1, $N) g"
		ins=$(secs "$t0" "$(now)")
		if [ "$attach" = 1 ]; then
			# As a flush leaves it: the touches exported and deleted.
			$PSQL "$CAPURL" -c "DELETE FROM lakecdc_touch"
		fi
		$PSQL "$CAPURL" -c "VACUUM ANALYZE"
		t0=$(now)
		$PSQL "$CAPURL" -c "UPDATE $table SET c3 = c3 + 1, c1 = c1 || '!'"
		upd=$(secs "$t0" "$(now)")
		$PSQL "$CAPURL" -c "VACUUM ANALYZE"
		t0=$(now)
		$PSQL "$CAPURL" -c "UPDATE $table SET c3 = c3 + 1, c1 = c1 || '?'"
		redo=$(secs "$t0" "$(now)")
		$PSQL "$CAPURL" -c "VACUUM ANALYZE"
		printf '\\set id random(1, %d)\nUPDATE %s SET c4 = c4 + 1 WHERE id = :id;\n' "$N" "$table" >"$one_row"
		tps=$("$PGBIN/pgbench" -n -c 1 -t 10000 -f "$one_row" "$CAPURL" 2>/dev/null | awk '/^tps/ {print $3; exit}')
		echo "$ins $upd $redo $tps"
	}
	for run in $(seq 1 "$RUNS"); do
		order="plain attached"
		[ $((run % 2)) = 0 ] && order="attached plain"
		for kind in $order; do
			echo "bench: capture run $run, $kind table" >&2
			if [ "$kind" = attached ]; then
				$PSQL "$CAPURL" -c "DROP TABLE IF EXISTS lakecdc_touch" -c "DROP SEQUENCE IF EXISTS lakecdc_touch_seq" \
					-c "DROP TABLE IF EXISTS lakecdc_sources"
				read -r ins upd redo tps <<<"$(capture_run t_attached 1)"
				# Every row has one touch from each bulk UPDATE (the one-row updates add 10,000).
				touches=$($PSQL -At "$CAPURL" -c "SELECT count(*) FILTER (WHERE seq < (SELECT max(seq) - 9999 FROM lakecdc_touch)), count(DISTINCT row_id) FROM lakecdc_touch")
				[ "$touches" = "$((2 * N))|$N" ] || { echo "bench: the touch log holds $touches bulk touches|rows, not $((2 * N))|$N" >&2; exit 1; }
			else
				read -r ins upd redo tps <<<"$(capture_run t_plain 0)"
			fi
			echo "$kind $ins $upd $redo $tps" >>"$results"
		done
	done
	python3 - "$results" "$N" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kind, *vals = line.split()
    runs.setdefault(kind, []).append([float(v) for v in vals])
n = int(sys.argv[2])
def col(kind, i):
    return [r[i] for r in runs[kind]]
print(f"capture bench: a 20-column table, bigint key; {len(runs['plain'])} runs each, median (min–max)")
print(f"| statement | plain | attached | attached / plain | target |")
print(f"|---|---|---|---|---|")
ok = True
for i, (what, unit, target) in enumerate([(f"INSERT … SELECT of {n:,} rows", "s", 2.0),
                                          (f"UPDATE of {n:,} exported rows", "s", 2.0),
                                          (f"UPDATE of {n:,} rows still dirty", "s", 2.0),
                                          ("10,000 one-row UPDATE transactions", "tps", None)]):
    p, a = col("plain", i), col("attached", i)
    mp, ma = statistics.median(p), statistics.median(a)
    ratio = ma / mp if unit == "s" else mp / ma
    verdict = "reported" if target is None else ("PASS" if ratio <= target else "FAIL")
    ok = ok and verdict != "FAIL"
    fmt = (lambda v: f"{v:.2f} s") if unit == "s" else (lambda v: f"{v:,.0f} tps")
    print(f"| {what} | {fmt(mp)} ({fmt(min(p))}–{fmt(max(p))}) | {fmt(ma)} ({fmt(min(a))}–{fmt(max(a))}) "
          f"| {ratio:.2f}× | {'≤ 2×' if target else '—'} {verdict} |")
print("capture bench: " + ("targets met" if ok else "a target is missed"))
PY
	rm -f "$one_row" "$results"
	exit 0
fi

if [ "$what" = table ]; then
	TURL="${LAKECDC_TEST_PG_URL%/*}/bench_table"
	results=$(mktemp)
	work=$(mktemp -d)
	# One case: a table of SPREAD × CHANGES rows (CHANGES: N unless given) with a KEY key,
	# attached; each run's backlog is an UPDATE of every SPREAD-th row (the first run's, the
	# load's touches kept for those rows), flushed over a connection of sslmode SSL.
	table_case() {
		local name=$1 key=$2 spread=$3 ssl=$4 changes=${5:-$N} id
		local rows=$(($changes * $spread))
		case "$key" in
		bigint) id="g" ;;
		text) id="'k' || g" ;;
		esac
		$PSQL "$LAKECDC_TEST_PG_URL" -c "DROP DATABASE IF EXISTS bench_table" -c "CREATE DATABASE bench_table"
		"$BIN" -q init-db --pg-url "$TURL" >/dev/null
		$PSQL "$TURL" -c "CREATE TABLE t_bench (id $key PRIMARY KEY, c1 text, c2 text, c3 integer, c4 bigint,
		      c5 numeric(12,2), c6 double precision, c7 boolean, c8 timestamptz, c9 date, c10 uuid, c11 jsonb,
		      c12 integer[], c13 text, c14 smallint, c15 numeric(12,2), c16 text, c17 bigint, c18 timestamptz, c19 text)"
		"$BIN" -q attach t_bench --pg-url "$TURL" >/dev/null
		echo "bench: table case $name: loading $rows rows" >&2
		$PSQL "$TURL" -c "INSERT INTO t_bench SELECT $id, 'name ' || g, md5(g::text), g, g * 7, (g % 100000) / 100.0,
		      g / 3.0, g % 2 = 0, now(), current_date, md5(g::text)::uuid, jsonb_build_object('k', g), ARRAY[g, g + 1],
		      'x', (g % 100)::smallint, g / 7.0, 'tag', g, now(), 'end' FROM generate_series(1, $rows) g"
		# As if the load were flushed; c3 holds g: each backlog is the rows whose g is a
		# multiple of SPREAD.
		$PSQL "$TURL" -c "TRUNCATE lakecdc_touch"
		for run in $(seq 1 "$RUNS"); do
			$PSQL "$TURL" -c "UPDATE t_bench SET c4 = c4 + 1 WHERE c3 % $spread = 0"
			$PSQL "$TURL" -c "VACUUM ANALYZE"
			rm -rf "$work/lake" && mkdir -p "$work/lake"
			echo "bench: table case $name, flush run $run" >&2
			mark=$(log_mark)
			read -r wall rss <<<"$(measure "$work/report.json" "$BIN" -q flush --json --schema t_bench --force \
				--time-budget 1h --pg-url "$TURL?sslmode=$ssl" --lake "$work/lake" --work-dir "$work")"
			check_ssl "$mark" "$ssl" bench_table
			read -r exported marked ranged batches scanned scans <<<"$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["schemas"][0]; print(s["rows_exported"], s["rows_marked"], s["batches_by_range"], s["batches"], s["rows_by_scan"], s["table_scans"])' "$work/report.json")"
			dirty=$($PSQL -At "$TURL" -c "SELECT count(*) FROM lakecdc_touch")
			if [ "$exported" != "$changes" ] || [ "$marked" != "$changes" ] || [ "$dirty" != 0 ]; then
				echo "bench: case $name: the flush exported $exported and marked $marked of $changes rows, $dirty left dirty" >&2
				exit 1
			fi
			# The baseline, same connection kind: PostgreSQL reading the backlog's rows out
			# (one binary COPY, discarded), so machines of other speeds compare.
			t0=$(now)
			$PSQL "$TURL?sslmode=$ssl" -c "COPY (SELECT * FROM ONLY t_bench WHERE c3 % $spread = 0) TO STDOUT (FORMAT binary)" >/dev/null
			base=$(secs "$t0" "$(now)")
			echo "$name|$wall|$rss|$ranged/$batches|$scanned in $scans|$base|$changes" >>"$results"
		done
	}
	table_case "bigint key, every row touched" bigint 1 require
	table_case "bigint key, every 4th row of 4N touched" bigint 4 require
	table_case "text key (hashed row id), every row touched" text 1 require
	table_case "text key (hashed row id), every row touched, plain connection" text 1 disable
	table_case "text key (hashed row id), every 4th row of 4N touched" text 4 require
	table_case "text key (hashed row id), every 20th row of 8N touched, 2N/5 changes" text 20 require $(($N * 2 / 5))
	python3 - "$results" "$N" <<'PY'
import statistics, sys
n = int(sys.argv[2])
cases = {}
for l in open(sys.argv[1]):
    name, wall, rss, ranged, scanned, base, changes = l.rstrip("\n").split("|")
    cases.setdefault(name, []).append((float(wall), float(rss), ranged, scanned, float(base), int(changes)))
print(f"table bench: flush of a {n:,}-change backlog (unless the case says less), 20-column table, {len(next(iter(cases.values())))} runs per case")
print("| case | batches by range | rows by table scan, in scans | changes/s median | min | max | flush / COPY of the rows | peak RSS | target |")
print("|---|---|---|---|---|---|---|---|---|")
ok = True
for name, runs in cases.items():
    rates = [c / w for w, _, _, _, _, c in runs]
    ratio = statistics.median(w / b for w, _, _, _, b, _ in runs)
    m = statistics.median(rates)
    ok = ok and m >= 100000
    print(f"| {name} | {runs[0][2]} | {runs[0][3]} | {m:,.0f} | {min(rates):,.0f} | {max(rates):,.0f} "
          f"| {ratio:.2f}× | {max(r for _, r, _, _, _, _ in runs) / 1024:.0f} MiB | ≥ 100,000: {'PASS' if m >= 100000 else 'FAIL'} |")
print("table bench: " + ("targets met" if ok else "a target is missed"))
PY
	rm -rf "$results" "$work"
	exec "$0" capture
fi

if [ "$what" != matrix ]; then
	seed "$IDS"
fi
if [ "$what" != matrix ] && [ "$what" != compact-scale ]; then
	t0=$(now)
	$PSQL "$LAKECDC_PG_URL" -c "\\copy (SELECT * FROM entity_main) TO '/dev/null' WITH (FORMAT binary)"
	$PSQL "$LAKECDC_PG_URL" -c "\\copy (SELECT * FROM eav_data) TO '/dev/null' WITH (FORMAT binary)"
	floor=$(secs "$t0" "$(now)")
fi

if [ "$what" = verify-source ]; then
	work=$(mktemp -d)
	echo "bench: lakecdc init of $N entities" >&2
	"$BIN" -q init --work-dir "$work" --memory-limit "$MEMORY" >/dev/null
	# init exports live entities whatever change_log says: the seed's slots are in the bases now.
	$PSQL "$PGURL" -c "UPDATE change_log SET flushed_at = 1 WHERE flushed_at = 0"
	for round in 1 2 3; do
		echo "bench: round $round: $((N / 100)) updates, flushed" >&2
		update_rows "(ltbase_created_at - 1700000000000) % 100 = $round" >/dev/null
		"$BIN" -q flush --force --time-budget 1h --work-dir "$work" --memory-limit "$MEMORY" >/dev/null
	done
	update_rows "(ltbase_created_at - 1700000000000) % 1000 = 7" >/dev/null
	read -r live dirty < <($PSQL "$PGURL" -At -F ' ' -c "SELECT
		(SELECT count(*) FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_deleted_at IS NULL),
		(SELECT count(*) FROM change_log WHERE schema_id = 100 AND flushed_at = 0)")
	$PSQL "$PGURL" -c "VACUUM ANALYZE" -c "CHECKPOINT"
	mark=$(log_mark)
	# The baseline: the rows verify compares, read as cheaply as PostgreSQL can send them (in
	# heap order); and, for comparison, in row_id order.
	t0=$(now)
	$PSQL "$LAKECDC_PG_URL" -c "\\copy (SELECT ltbase_row_id, ltbase_updated_at FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_deleted_at IS NULL) TO '/dev/null' WITH (FORMAT binary)"
	base=$(secs "$t0" "$(now)")
	t0=$(now)
	$PSQL "$LAKECDC_PG_URL" -c "\\copy (SELECT ltbase_row_id, ltbase_updated_at FROM entity_main WHERE ltbase_schema_id = 100 AND ltbase_deleted_at IS NULL ORDER BY ltbase_row_id) TO '/dev/null' WITH (FORMAT binary)"
	ordered=$(secs "$t0" "$(now)")
	runs=()
	for ((run = 1; run <= RUNS; run++)); do
		res=$(measure "$work/shallow-$run.json" "$BIN" -q verify --source --json --work-dir "$work") || {
			cat "$work/shallow-$run.json" >&2
			echo "bench: FAILED: lakecdc verify --source did not exit 0 (run $run)" >&2
			exit 1
		}
		runs+=("$res")
	done
	deep=$(measure "$work/deep.json" "$BIN" -q verify --source --deep --json --work-dir "$work" --memory-limit "$MEMORY") || {
		cat "$work/deep.json" >&2
		echo "bench: FAILED: lakecdc verify --source --deep did not exit 0" >&2
		exit 1
	}
	check_ssl "$mark" "$SSLMODE"
	python3 - "$N" "$IDS" "$SSLMODE" "$live" "$dirty" "$base" "$ordered" "$work" "$deep" "${runs[@]}" <<'PY'
import json, statistics, sys
n, ids, ssl, live, dirty, base, ordered, work, deep, *runs = sys.argv[1:]
live, dirty, base, ordered = int(live), int(dirty), float(base), float(ordered)
def check(path):
    s = json.load(open(path))["schemas"][0]
    c = s["source"]
    div = sum(c[k]["count"] for k in ("missing", "extra", "stale")) + (c["values"] or {"count": 0})["count"]
    if s["outcome"] != "intact" or div or c["source_rows"] != live or c["dirty_rows"] != dirty:
        sys.exit(f"verify-source bench: FAILED: {path}: outcome {s['outcome']}, {div} divergent, "
                 f"{c['source_rows']} source rows of {live} live, {c['dirty_rows']} dirty of {dirty}")
    return c
shallow = []
for i, r in enumerate(runs, 1):
    secs, rss = r.split()
    c = check(f"{work}/shallow-{i}.json")
    shallow.append((c["rows_compared"] / float(secs), float(secs), int(rss) / 1024, c))
    order = c["source_order"]
dsecs, drss = deep.split()
dc = check(f"{work}/deep.json")
rates = [x[0] for x in shallow]
med = statistics.median(rates)
c = shallow[0][3]
print(f"verify-source bench: {n} entities ({ids} ids, sslmode={ssl}), init + 3 flushed rounds of {int(n) // 100} "
      f"updates; {c['lake_rows']} lake rows, {live} live in the source, {dirty} dirty (not compared)")
print(f"  baseline: the source read alone (psql COPY of row_id, version; heap order): {base:.3f} s = "
      f"{live / base:,.0f} rows/s; in row_id order: {ordered:.3f} s = {live / ordered:,.0f} rows/s")
print(f"  verify --source (process, source read in {order} order): median {med:,.0f} rows compared/s (min {min(rates):,.0f}, max {max(rates):,.0f}) "
      f"over {len(rates)} runs; {statistics.median(x[1] for x in shallow):.3f} s; "
      f"peak RSS {max(x[2] for x in shallow):.0f} MiB; "
      f"target >= 1,000,000: {'PASS' if med >= 1_000_000 else 'FAIL'}")
print(f"  ratio to the baseline's rows/s: {med / (live / base):.2f}")
print(f"  verify --source --deep (process): {float(dsecs):.3f} s = {dc['rows_compared'] / float(dsecs):,.0f} rows/s; "
      f"peak RSS {int(drss) / 1024:.0f} MiB")
PY
	rm -rf "$work"
	exit 0
fi

if [ "$what" = query ]; then
	ensure_venv "$PEERENV" "$DUCKDB_PY_PROBE" "duckdb==$DUCKDB_PY_VERSION"
	threads="${LAKECDC_BENCH_THREADS:-$(nproc)}"
	memory="${LAKECDC_BENCH_MEMORY:-4GB}"
	work=$(mktemp -d)
	"$BIN" -q init --work-dir "$work" >/dev/null
	# init does not touch change_log: the seed's slots are in the base now, so clear them and
	# let each flush export its own round of changes only.
	$PSQL "$PGURL" -c "DELETE FROM change_log"
	# Round r changes the entities with i % M = r (i = the seed's number), M = max(100, R).
	modulus=$((ROUNDS > 100 ? ROUNDS : 100))
	changes=$((N / modulus))
	echo "bench: $ROUNDS rounds of $changes changes, each flushed" >&2
	t0=$(now)
	for round in $(seq 1 "$ROUNDS"); do
		# Round r changes the entities with i % M = r: nine in ten updated (writer contract),
		# one in ten hard-deleted (a tombstone slot).
		$PSQL "$PGURL" <<SQL
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms \gset
CREATE TEMP TABLE picked AS
  SELECT ltbase_row_id AS row_id, ltbase_updated_at AS prev,
         (ltbase_created_at - 1700000000000) / $modulus % 10 = 0 AS gone
  FROM entity_main
  WHERE ltbase_schema_id = 100 AND (ltbase_created_at - 1700000000000) % $modulus = $round;
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
		AND (ltbase_created_at - 1700000000000) % $modulus = 5 ORDER BY ltbase_created_at LIMIT 1 OFFSET $((N / modulus / 2))")
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

	python3 - "$N" "$ROUNDS" "$changes" "$files" "$listed" "$mib" "$threads" "$memory" "$want_count,$want_sum" \
		"${a[*]}" "${b[*]}" "${b_in[*]}" "$cold" "${c[*]}" "${a_cpu[*]}" "${b_cpu[*]}" "${c_cpu[*]}" "${results[*]}" \
		"$id" "$want_i01" "$point" "$point_secs" "$point_read" "$point_mib" "$ids" <<'PY'
import statistics, sys
(n, rounds, changes, files, listed, mib, threads, memory, want, a, b, b_in, cold, c, a_cpu, b_cpu, c_cpu, results,
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
print(f"query bench: {n} entities ({ids} row ids), init + {rounds} flushes of {changes} changes "
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


if [ "$what" = matrix ]; then
	ensure_peer
	work=$(mktemp -d)
	table="$work/results"
	: >"$table"
	for ids in v7 v4; do
		seed "$ids"
		for ((run = 1; run <= RUNS; run++)); do
			# TLS and plain take turns going first, and so do the peer and lakecdc, so that a
			# burst of load on the shared machine does not always hit the same side.
			if [ $((run % 2)) = 1 ]; then
				order="require disable" first=peer
			else
				order="disable require" first=lakecdc
			fi
			for ssl in $order; do
				case_="$ids-$ssl-$run"
				echo "bench: $ids ids, sslmode=$ssl, run $run of $RUNS: init ($first first)" >&2
				res=$(init_once "$ssl" "$work/init-$case_" "$first" "s3://bench/init-$case_")
				echo "init $ids $ssl $res" >>"$table"
				echo "bench: $(date +%T) init $ids $ssl run $run: $res" >&2
				rm -rf "$work/init-$case_"
				echo "bench: $ids ids, sslmode=$ssl, run $run of $RUNS: flush" >&2
				reset_backlog
				res=$(flush_once "$ssl" "s3://bench/flush-$case_" "$work/flush.json")
				echo "flush $ids $ssl $res" >>"$table"
				echo "bench: $(date +%T) flush $ids $ssl run $run: $res" >&2
			done
		done
	done
	python3 - "$table" "$N" "$RUNS" "$MEMORY" <<'PY'
import statistics, sys
results, n, runs, memory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
init, flush = {}, {}
for line in open(results):
    kind, ids, ssl, *v = line.split()
    (init if kind == "init" else flush).setdefault((ids, ssl), []).append(v)
def fig(xs, f):
    return f"{f(statistics.median(xs))} ({f(min(xs))}–{f(max(xs))})"
sec = lambda x: f"{x:.2f}"
mib = lambda x: f"{x / 1024:.0f}"
rate = lambda x: f"{x:,.0f}"
print(f"matrix bench: {n} entities of bench/schemas `wide`, {runs} runs per case, medians (min–max); "
      f"--memory-limit {memory} for lakecdc and the peer")
print()
print("| ids | connection | init lakecdc s | init peer s | lakecdc / peer | init peak RSS lakecdc MiB "
      "| init peak RSS peer MiB | flush changes/s | flush peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|")
for ids in ("v7", "v4"):
    for ssl in ("require", "disable"):
        i = [[float(x) for x in r] for r in init[ids, ssl]]
        f = [[float(x) for x in r] for r in flush[ids, ssl]]
        conn = "TLS (sslmode=require)" if ssl == "require" else "plain (sslmode=disable)"
        kind = "UUIDv7" if ids == "v7" else "UUIDv4"
        print(f"| {kind} | {conn} | {fig([r[0] for r in i], sec)} | {fig([r[2] for r in i], sec)} "
              f"| {fig([r[0] / r[2] for r in i], sec)} | {fig([r[1] for r in i], mib)} | {fig([r[3] for r in i], mib)} "
              f"| {fig([r[2] / r[0] for r in f], rate)} | {fig([r[1] for r in f], mib)} |")
print()
for ids in ("v7", "v4"):
    i, f = init[ids, "require"][0], flush[ids, "require"][0]
    print(f"{ids}: init {int(float(i[4]))} files, {i[5]} MiB; flush {int(float(f[2]))} rows, "
          f"{int(float(f[3]))} files, {f[4]} MiB, {int(float(f[5]))} batches read by row-id range")
PY
	rm -rf "$work"
	exit 0
fi

if [ "$what" = init ]; then
	ensure_peer
	work=$(mktemp -d)
	res=$(init_once "$SSLMODE" "$work/init" peer s3://bench/lake)
	read -r init rss_kb peer peer_rss_kb files mib <<<"$res"
	python3 - "$N" "$floor" "$peer" "$init" "$rss_kb" "$peer_rss_kb" "$files" "$mib" "$IDS" "$SSLMODE" "$MEMORY" <<'PY'
import sys
n, floor, peer, init, rss_kb, peer_rss_kb = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
files, mib, ids, ssl, memory = sys.argv[7:]
print(f"init bench: {n} live entities ({ids} row ids, sslmode={ssl}, --memory-limit {memory} for both)")
print(f"  read floor (COPY binary entity_main + eav_data):    {floor:.2f} s")
print(f"  peer: DuckDB 1.5.5 postgres scanner → local file:   {peer:.2f} s  (whole process; {peer_rss_kb / 1024:.0f} MiB peak RSS)")
print(f"  lakecdc init → SeaweedFS, checksummed, committed:   {init:.2f} s  = {n / init:,.0f} rows/s, "
      f"{files} files, {mib} MiB")
print(f"  ratio lakecdc / peer:                               {init / peer:.2f} (target < 1.0)")
print(f"  ratio lakecdc / read floor:                         {init / floor:.2f} (target <= 2.0)")
print(f"  peak RSS:                                           {rss_kb / 1024:.0f} MiB (target <= 1024)")
PY
	rm -rf "$work"
	exit 0
fi

if [ "$what" = compact-scale ]; then
	work=$(mktemp -d)
	T="$TARGET_BASE"
	U=$((N / 100))
	manifest_url="$LAKECDC_TEST_S3_ENDPOINT/bench/lake/manifest/100.json"
	# A du poller left running by a failure stops with the script.
	poller=""
	trap '[ -z "$poller" ] || kill "$poller" 2>/dev/null || true; stop_services' EXIT
	compact_help=$("$BIN" compact --help)
	max_deltas=()
	if grep -q -- --max-deltas <<<"$compact_help"; then
		max_deltas=(--max-deltas 1)
	else
		echo "bench: this lakecdc's compact has no --max-deltas: the cases run without it" >&2
	fi
	mark=$(log_mark)

	# The lake: bases of at most T bytes and N/24 rows (at least 20 files whatever the bytes per
	# row; init cuts a file only between keyset pages, so a page is at most an eighth of that),
	# then three flushes of N/1000 updates each, spread over all the ranges.
	max_rows=$((N / 24 > 0 ? N / 24 : 1))
	page_rows=$((max_rows / 8 > 50000 ? 50000 : (max_rows / 8 > 0 ? max_rows / 8 : 1)))
	echo "bench: lakecdc init of $N entities, --target-file-size $T --max-file-rows $max_rows --page-rows $page_rows" >&2
	t0=$(now)
	"$BIN" -q init --json --work-dir "$work" --memory-limit "$MEMORY" --target-file-size "$T" \
		--max-file-rows "$max_rows" --page-rows "$page_rows" >"$work/init.json"
	init_secs=$(secs "$t0" "$(now)")
	# init does not touch change_log: the seed's slots are in the bases now.
	$PSQL "$LAKECDC_PG_URL" -c "DELETE FROM change_log"
	for round in 1 2 3; do
		update_rows "(ltbase_created_at - 1700000000000) % 1000 = $round"
		"$BIN" -q flush --force --time-budget 1h --work-dir "$work" >/dev/null
	done
	# The saved manifest: each case starts by putting it back. Data objects are write-once and
	# compact deletes none, so the lake is then as it was here.
	"${S3CURL[@]}" -o "$work/manifest.json" "$manifest_url"
	# Line 1: the row-id range of a tenth of the bases (contiguous by row-id range), for case (a),
	# the first and last of those bases (1-based), their rows, and compact's T; line 2: the lake.
	# init also cuts a file at 96 MiB of staged Arrow (about 100,000 `wide` entities): when its
	# largest base is smaller than T, T becomes that size rounded up to 64 KiB, so that a base is
	# about T whichever limit cut it (not when LAKECDC_BENCH_TARGET_BASE_SIZE gives T).
	picked=$(python3 - "$work/manifest.json" "$T" "${LAKECDC_BENCH_TARGET_BASE_SIZE:+fixed}" <<'PY'
import json, statistics, sys
m, t, fixed = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3] == "fixed"
bases = sorted((f for f in m["files"] if f["tier"].lower() == "base"), key=lambda f: f["row_id_min"])
deltas = [f for f in m["files"] if f["tier"].lower() != "base"]
if len(bases) < 20:
    sys.exit(f"bench: FAILED: init wrote {len(bases)} base files, not at least 20 "
             f"(set LAKECDC_BENCH_TARGET_BASE_SIZE below {t})")
# A tenth of the bases, contiguous: the run of them holding the most rows (each init reader's
# first file and its last are small, and the readers' ranges meet in the middle).
k = max(1, len(bases) // 10)
first = max(range(len(bases) - k + 1), key=lambda i: sum(f["row_count"] for f in bases[i:i + k]))
chosen = bases[first:first + k]
mib = [f["size_bytes"] / 2**20 for f in bases]
largest = -(-max(f["size_bytes"] for f in bases) // 65536) * 65536
print(chosen[0]["row_id_min"], chosen[-1]["row_id_max"], first + 1, first + k, sum(f["row_count"] for f in chosen),
      t if fixed else min(t, largest))
print(f"{len(bases)} bases of {sum(f['row_count'] for f in bases):,} rows, {sum(mib):.1f} MiB "
      f"({min(mib):.2f} / {statistics.median(mib):.2f} / {max(mib):.2f} MiB min / median / max), "
      f"{len(deltas)} deltas of {sum(f['row_count'] for f in deltas):,} rows")
PY
	)
	T_init="$T"
	{
		read -r a_lo a_hi a_first a_last a_rows T
		read -r lake
	} <<<"$picked"
	echo "bench: the lake: $lake; compact's --target-base-size $T" >&2

	# (a): U entities of the bases a_first..a_last, evenly by row id (k * U / r steps U times).
	rows_a="ltbase_row_id IN (SELECT row_id FROM (SELECT ltbase_row_id AS row_id,
		row_number() OVER (ORDER BY ltbase_row_id) AS k, count(*) OVER () AS r FROM entity_main
		WHERE ltbase_schema_id = 100 AND ltbase_row_id BETWEEN '$a_lo' AND '$a_hi') s
		WHERE k * $U / r <> (k - 1) * $U / r)"
	# (b) and (c): every 100th entity by row id.
	rows_b="ltbase_row_id IN (SELECT row_id FROM (SELECT ltbase_row_id AS row_id,
		row_number() OVER (ORDER BY ltbase_row_id) AS k FROM entity_main WHERE ltbase_schema_id = 100) s
		WHERE k % 100 = 0)"

	# One case: the saved manifest put back, the entities SQL condition $3 selects updated and
	# flushed, then one compaction with --dirty-ratio $2 timed, run $4; appends "label run
	# exit-code seconds peak-RSS-KiB peak-scratch-bytes" to $work/results.
	compact_case() {
		local label="$1" ratio="$2" rows="$3" run="$4" dirty scratch t0 t1 rc=0
		"${S3CURL[@]}" -X PUT -T "$work/manifest.json" "$manifest_url" >/dev/null
		echo "bench: case ($label), run $run: updating $U entities and flushing them" >&2
		update_rows "$rows"
		dirty=$($PSQL "$LAKECDC_PG_URL" -At -c "SELECT count(*) FROM change_log WHERE schema_id = 100 AND flushed_at = 0")
		if [ "$dirty" -ne "$U" ]; then
			echo "bench: FAILED: case ($label) made $dirty dirty slots, not $U" >&2
			exit 1
		fi
		"$BIN" -q flush --force --time-budget 1h --work-dir "$work" >/dev/null
		scratch="$work/scratch-$label-$run"
		mkdir "$scratch"
		watch_du "$scratch" "$scratch.peak" "$scratch.stop" &
		poller=$!
		echo "bench: case ($label), run $run: lakecdc compact --dirty-ratio $ratio" >&2
		t0=$(now)
		/usr/bin/time -v -o "$work/$label-$run.time" "$BIN" -q compact --json --work-dir "$scratch" \
			--target-base-size "$T" --dirty-ratio "$ratio" "${max_deltas[@]}" >"$work/$label-$run.json" || rc=$?
		t1=$(now)
		touch "$scratch.stop"
		wait "$poller"
		poller=""
		[ "$rc" = 0 ] || echo "bench: FAILED: lakecdc compact exited $rc in case ($label), run $run" >&2
		echo "$label $run $rc $(secs "$t0" "$t1") $(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); v = $2}
			END {print (v == "" ? "?" : v)}' "$work/$label-$run.time") $(cat "$scratch.peak")" >>"$work/results"
		rm -rf "$scratch"
	}
	for run in $(seq 1 "$RUNS"); do
		compact_case a 0.05 "$rows_a" "$run"
		compact_case b 0.05 "$rows_b" "$run"
		compact_case c 0 "$rows_b" "$run"
	done
	# Every session (lakecdc's and psql's) used the sslmode.
	check_ssl "$mark" "$SSLMODE"

	status=0
	python3 - "$work" "$N" "$U" "$T" "$IDS" "$SSLMODE" "$init_secs" "$lake" "${max_deltas[*]}" \
		"$a_first" "$a_last" "$a_rows" "$T_init" "$max_rows" "$page_rows" <<'PY' || status=$?
import json, statistics, sys
(work, n, u, t, ids, ssl, init_secs, lake, max_deltas, a_first, a_last, a_rows, t_init, max_rows,
 page_rows) = sys.argv[1:]
n, u, t, a_rows, t_init = int(n), int(u), int(t), int(a_rows), int(t_init)
runs = {}
for line in open(f"{work}/results"):
    label, run, rc, secs, rss_kb, scratch = line.split()
    try:
        s = json.load(open(f"{work}/{label}-{run}.json"))["schemas"][0]
    except (OSError, ValueError, KeyError, IndexError):
        s = {}
    runs.setdefault(label, []).append(dict(
        rc=int(rc), secs=float(secs), rss=None if rss_kb == "?" else int(rss_kb) / 1024,
        scratch=int(scratch) / 2**20, s=s))
what = {
    "a": f"(a) {u:,} rows in bases {a_first}-{a_last} by row-id range ({a_rows:,} rows), --dirty-ratio 0.05",
    "b": f"(b) {u:,} rows, every 100th by row_id, --dirty-ratio 0.05",
    "c": "(c) the same change as (b), --dirty-ratio 0 (every base rewritten)",
}
def field(s, k):
    if k in s:
        return str(s[k])
    # Not in the schema's report: the plan's figure if it has one, marked as such.
    plan = s.get("plan") or {}
    return f"{plan[k]} (plan)" if k in plan else "?"
print(f"compact-scale bench: {n:,} entities ({ids} row ids, sslmode={ssl}), "
      f"T = --target-base-size {t} ({t / 2**20:.2f} MiB)")
print(f"  lake: init (--target-file-size {t_init} --max-file-rows {max_rows} --page-rows {page_rows}) in "
      f"{float(init_secs):.2f} s, then 3 flushes of {n // 1000:,} updates: {lake}")
import os
change = os.environ.get("LAKECDC_BENCH_CHANGE", "few")
print(f"  each case: the saved manifest put back, {u:,} entities updated (writer contract; changing "
      f"{'every column' if change == 'every' else 'text_01, integer_02 and the version'}) and flushed, "
      f"then one `lakecdc compact --json --target-base-size {t} --dirty-ratio R {max_deltas or '(no --max-deltas)'}`; "
      f"{len(next(iter(runs.values()), []))} runs of each, in turn; median (min-max)")
cases = {}
for label, rs in runs.items():
    ok = [r for r in rs if r["rc"] == 0]
    s = (ok or rs)[0]["s"]
    rows_in = s.get("rows_in")
    secs = [r["secs"] for r in ok]
    # Each run's own rows over its own time.
    rates = [r["s"]["rows_in"] / r["secs"] for r in ok
             if isinstance(r["s"].get("rows_in"), int) and r["secs"] > 0]
    cases[label] = dict(
        failed=len(ok) != len(rs), secs=statistics.median(secs) if secs else None,
        rss=max((r["rss"] for r in ok if r["rss"] is not None), default=None),
        scratch=max((r["scratch"] for r in ok), default=None), s=s, rate=statistics.median(rates) if rates else None)
    plan = s.get("plan") or {}
    if not ok:
        outcome = f"FAILED: lakecdc compact exited {rs[0]['rc']}"
    else:
        outcome = (f"outcome {s.get('outcome', '?')}, plan {plan.get('decision', '?')} "
                   f"({plan.get('base_files', '?')} bases, {plan.get('delta_files', '?')} deltas)"
                   + (f"; {len(rs) - len(ok)} of {len(rs)} runs FAILED" if len(ok) != len(rs) else ""))
    print(f"  {what[label]}: {outcome}")
    if ok:
        c = cases[label]
        rss = "?" if c["rss"] is None else f"{c['rss']:.0f}"
        rate = (f"{c['rate']:,.0f} ({min(rates):,.0f}-{max(rates):,.0f})" if rates else "?")
        print(f"      {c['secs']:.2f} s ({min(secs):.2f}-{max(secs):.2f}), {rate} rows/s (rows_in {field(s, 'rows_in')}), "
              f"peak RSS {rss} MiB, peak scratch {c['scratch']:.1f} MiB; files_in {field(s, 'files_in')}, "
              f"files_out {field(s, 'files_out')}, bases_rewritten {field(s, 'bases_rewritten')}, "
              f"bases_kept {field(s, 'bases_kept')}, chunks_copied {field(s, 'chunks_copied')}")
def check(name, ok):
    print(f"  {name}: {'PASS' if ok else 'FAIL'}")
ok_runs = {k: c for k, c in cases.items() if c["secs"] is not None}
for label, target in (("a", 0.15), ("b", 0.10)):
    if label in ok_runs and "c" in ok_runs:
        r = cases[label]["secs"] / cases["c"]["secs"]
        check(f"time({label})/time(c) = {r:.3f} of the medians (target <= {target:.2f})", r <= target)
        if not cases[label]["s"].get("files_in"):
            print(f"    note: ({label}) compacted nothing (plan {(cases[label]['s'].get('plan') or {}).get('decision', '?')}): "
                  f"its deltas stay listed")
    else:
        check(f"time({label})/time(c) = ? (a run failed; target <= {target:.2f})", False)
for label, c in cases.items():
    if label not in ok_runs or c["rss"] is None:
        check(f"({label}) peak RSS ? MiB (the run failed; target <= 512)", False)
    else:
        check(f"({label}) peak RSS {c['rss']:.0f} MiB (target <= 512)", c["rss"] <= 512)
for label, c in cases.items():
    if label not in ok_runs:
        check(f"({label}) peak scratch ? MiB (the run failed; target <= 2 x T = {2 * t / 2**20:.1f} MiB)", False)
    else:
        check(f"({label}) peak scratch {c['scratch']:.1f} MiB (target <= 2 x T = {2 * t / 2**20:.1f} MiB)",
              c["scratch"] * 2**20 <= 2 * t)
import os
if os.environ.get("LAKECDC_BENCH_SUMMARY"):
    json.dump({"c_rows_per_s": cases.get("c", {}).get("rate")}, open(os.environ["LAKECDC_BENCH_SUMMARY"], "w"))
else:
    print("  compare (c) rows/s with `scripts/bench.sh compact` of the DuckDB-merge build 862c9e4 (target ≥ 2×; "
          "LAKECDC_BENCH_BASELINE_BIN=<its release build> measures it in this run)")
if any(c["failed"] for c in cases.values()):
    sys.exit(f"compact-scale bench: FAILED: lakecdc compact failed in case "
             f"{', '.join(k for k, c in cases.items() if c['failed'])}")
PY
	rm -rf "$work"
	exit "$status"
fi

if [ "$what" = compact ]; then
	work=$(mktemp -d)
	"$BIN" -q flush --force --time-budget 1h --work-dir "$work" >/dev/null
	# The flushed deltas become the base tier: relabelled (or, when they overlap, merged into
	# ranged bases) by a compaction told to take any number of deltas; a lakecdc without
	# --max-deltas promotes once the deltas reach --target-base-size.
	if "$BIN" compact --help | grep -q -- --max-deltas; then
		"$BIN" -q compact --max-deltas 0 --work-dir "$work" >/dev/null
	else
		"$BIN" -q compact --target-base-size 1 --work-dir "$work" >/dev/null
	fi
	echo "bench: updating $((N / 10)) rows" >&2
	update_rows "ltbase_created_at % 10 = 0"
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
import os
if os.environ.get("LAKECDC_BENCH_SUMMARY"):
    json.dump({"rows_per_s": s["rows_in"] / secs}, open(os.environ["LAKECDC_BENCH_SUMMARY"], "w"))
PY
	rm -rf "$report" "$timing" "$work"
	exit 0
fi

work=$(mktemp -d)
res=$(flush_once "$SSLMODE" s3://bench/lake "$work/report.json")
read -r flush rss_kb exported files mib by_range <<<"$res"
# lakecdc's own CPU (user + system): steadier than wall time on a shared machine.
cpu=$(awk -F: '/(User|System) time \(seconds\)/ {sum += $2} END {printf "%.2f", sum}' "$work/report.json.time")

t0=$(now)
"$BIN" -q flush --json >/dev/null
idle=$(secs "$t0" "$(now)")

# The same backlog again, through a relay that delays every request to the S3 server.
delayed=0
if [ "$S3_DELAY" != 0 ]; then
	reset_backlog
	s3=${LAKECDC_TEST_S3_ENDPOINT#http://}
	python3 scripts/bench/delay_proxy.py "${s3%:*}" "${s3##*:}" "$S3_DELAY" >"$work/relay" &
	relay=$!
	trap 'kill "$relay" 2>/dev/null || true; stop_services' EXIT
	for _ in $(seq 50); do [ -s "$work/relay" ] && break; sleep 0.1; done
	[ -s "$work/relay" ] || { echo "bench: the S3 delay relay did not start" >&2; exit 1; }
	res=$(LAKECDC_S3_ENDPOINT="http://127.0.0.1:$(head -1 "$work/relay")" \
		flush_once "$SSLMODE" s3://bench/lake-delayed "$work/delayed.json")
	kill "$relay" 2>/dev/null || true
	wait "$relay" 2>/dev/null || true
	trap stop_services EXIT
	read -r delayed _ <<<"$res"
fi

python3 - "$exported" "$floor" "$flush" "$rss_kb" "$idle" "$cpu" "$files" "$mib" "$IDS" "$SSLMODE" "$by_range" "$S3_DELAY" "$delayed" <<'PY'
import sys
n, floor, flush, rss_kb, idle, cpu = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
files, mib, ids, ssl, by_range = sys.argv[7:12]
s3_delay, delayed = int(sys.argv[12]), float(sys.argv[13])
print(f"flush bench: {n} changes ({ids} row ids, sslmode={ssl}), all exported, none left dirty; {files} files "
      f"({by_range} read by their row-id range), {mib} MiB")
print(f"  read floor (COPY binary entity_main + eav_data): {floor:.2f} s")
print(f"  lakecdc flush --force:                          {flush:.2f} s  = {n / flush:,.0f} changes/s (target >= 100,000)")
print(f"  ratio flush / read floor:                       {flush / floor:.2f}")
print(f"  lakecdc CPU (user + system):                  {cpu:.2f} s")
print(f"  peak RSS:                                       {rss_kb / 1024:.0f} MiB")
print(f"  idle run (nothing to flush):                    {idle:.3f} s")
if s3_delay:
    print(f"  the same backlog, each S3 request delayed {s3_delay} ms: {delayed:.2f} s  = {n / delayed:,.0f} changes/s "
          f"({delayed / flush:.2f} x the direct run)")
PY
rm -rf "$work"
