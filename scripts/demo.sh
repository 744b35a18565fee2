#!/usr/bin/env bash
# The main job on the embedded default, for a newcomer:
#
#   scripts/demo.sh          # lake in ./lake (a local directory)
#   scripts/demo.sh --s3     # lake in a bucket of a local SeaweedFS S3 server
#
# Builds lakecdc, starts a throwaway PostgreSQL (or uses LAKECDC_PG_URL when set), creates the
# source tables and registers the example schemas (init-db), loads about 100k entities over two
# schemas, exports them as the base tier (init), applies a burst of application
# writes (updates, deletes, recreates), shows what the next flush would do (--dry-run), flushes,
# rewrites the base ranges the deltas touch (compact), shows what gc would delete, verifies the lake
# (against its manifest, then against PostgreSQL: verify --source --deep) and queries it
# (`lakecdc query`); inspect shows the state in between. Finally a plain table (`orders`) is
# attached, exported and flushed into the same lake.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/lakecdc-target}"
export LAKECDC_SERVICES_DIR="${LAKECDC_DEMO_SERVICES_DIR:-/var/tmp/lakecdc-demo-services}"
CUSTOMERS="${LAKECDC_DEMO_CUSTOMERS:-60000}"
ORDERS="${LAKECDC_DEMO_ORDERS:-40000}"
S3=0
case "${1:-}" in
--s3) S3=1 ;;
"") ;;
*)
	echo "usage: scripts/demo.sh [--s3]" >&2
	exit 2
	;;
esac

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building lakecdc"
cargo build --locked --bin lakecdc
BIN="$CARGO_TARGET_DIR/debug/lakecdc"

if [ -z "${LAKECDC_PG_URL:-}" ] || [ $S3 = 1 ]; then
	say "starting throwaway services (scripts/services.sh)"
	trap 'scripts/services.sh stop >/dev/null 2>&1 || true' EXIT
	scripts/services.sh start >/dev/null
	# shellcheck source=/dev/null
	source "$LAKECDC_SERVICES_DIR/env"
	export LAKECDC_PG_URL="${LAKECDC_PG_URL:-$LAKECDC_TEST_PG_URL}"
fi
PSQL="$(command -v psql || echo "${PGBIN:-/usr/bin}/psql") -X -q -v ON_ERROR_STOP=1"

if [ $S3 = 1 ]; then
	bucket="demo-$(date +%s)"
	curl -sf -X PUT --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
		"$LAKECDC_TEST_S3_ENDPOINT/$bucket" >/dev/null
	export LAKECDC_LAKE="s3://$bucket/demo" LAKECDC_S3_ENDPOINT="$LAKECDC_TEST_S3_ENDPOINT"
	export LAKECDC_S3_PATH_STYLE=true
else
	# The demo owns ./lake only if it made it.
	if [ -e lake ] && [ ! -e lake/.lakecdc-demo ]; then
		echo "demo.sh: ./lake exists and was not made by the demo; move it away first" >&2
		exit 1
	fi
	rm -rf lake
	mkdir -p lake
	touch lake/.lakecdc-demo
	export LAKECDC_LAKE=./lake
fi
export LAKECDC_SCHEMA_DIR="$ROOT/examples/schemas"

say "lakecdc init-db --schema-dir examples/schemas"
"$BIN" init-db
customer=$($PSQL "$LAKECDC_PG_URL" -At -c "SELECT schema_id FROM schema_registry WHERE schema_name = 'customer'")
order=$($PSQL "$LAKECDC_PG_URL" -At -c "SELECT schema_id FROM schema_registry WHERE schema_name = 'order'")

say "loading $CUSTOMERS customers and $ORDERS orders"
$PSQL "$LAKECDC_PG_URL" -v customer="$customer" -v order="$order" \
	-v customers="$CUSTOMERS" -v orders="$ORDERS" -f scripts/demo/load.sql

say "lakecdc init   (every live entity → base files; the schema enters the lake)"
"$BIN" -q init

say "a burst of application writes: updates, deletes, recreates"
$PSQL "$LAKECDC_PG_URL" -v customer="$customer" -v order="$order" \
	-v customers="$CUSTOMERS" -v orders="$ORDERS" -f scripts/demo/burst.sql

say "lakecdc inspect   (what each job would do now; read-only)"
"$BIN" -q inspect

say "lakecdc flush   (the cron job: below --min-records 20000 and --max-age 1h, nothing is due yet)"
"$BIN" -q flush

say "lakecdc flush --force --dry-run   (what a forced flush would do; writes nothing)"
"$BIN" -q flush --force --dry-run

say "lakecdc flush --force"
"$BIN" -q flush --force

say "lakecdc compact --dry-run --dirty-ratio 1%   (which base ranges the deltas touch past 1%)"
"$BIN" -q compact --dry-run --dirty-ratio 1%

say "lakecdc compact --dirty-ratio 1%   (rewrite those ranges, fold the other delta rows into one delta)"
"$BIN" -q compact --dirty-ratio 1%

say "lakecdc gc --dry-run   (merged sources are kept for the 15m grace period)"
"$BIN" -q gc --dry-run || true

say "the lake ($LAKECDC_LAKE)"
if [ $S3 = 0 ]; then
	python3 - <<'PY'
import json, pathlib
root = pathlib.Path("lake")
for m in sorted(root.glob("manifest/*.json")):
    doc = json.loads(m.read_text())
    files = doc["files"]
    print(f"{m}: schema {doc['schema_id']}, manifest version {doc['version']}, "
          f"{len(files)} files, {sum(f['row_count'] for f in files)} rows, "
          f"{sum(f['size_bytes'] for f in files) / 2**20:.1f} MiB")
PY
fi
say "lakecdc verify"
"$BIN" -q verify

say "lakecdc verify --source --deep   (the lake against PostgreSQL: every row not dirty, values too)"
"$BIN" -q verify --source --deep

# Each schema is a view of its current state (one row per live entity, its latest copy) and
# <name>__history of every copy in the lake. `order` is an SQL keyword: quote it.
query=("$BIN" -q query --format table)
# An S3 lake's files are cached locally; the demo's cache goes with the services' state dir.
[ $S3 = 0 ] || query+=(--cache-dir "$LAKECDC_SERVICES_DIR/query-cache")
say "lakecdc query   (SQL over the lake: live rows and stored copies per schema; one copy each after the rewrite)"
"${query[@]}" "SELECT 'customer' AS schema, (SELECT count(*) FROM customer) AS live_rows,
	(SELECT count(*) FROM customer__history) AS copies
UNION ALL SELECT 'order', (SELECT count(*) FROM \"order\"), (SELECT count(*) FROM \"order__history\")"
say "lakecdc query   (a few customers)"
"${query[@]}" "SELECT row_id, name, email, loyalty_points FROM customer ORDER BY row_id LIMIT 5"

# A plain table joins the same lake: attach installs statement-level triggers (no replication
# slot), init exports what is there, and the same cron flush exports what the application writes.
say "a plain table: orders (bigint key), 5000 rows"
$PSQL "$LAKECDC_PG_URL" <<'SQL'
DROP TABLE IF EXISTS orders;
CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2),
                     status text, placed_at timestamptz DEFAULT now(), items jsonb);
INSERT INTO orders (id, customer, amount, status, items)
SELECT g, 'c' || (g % 700), round((random() * 500)::numeric, 2), 'placed',
       jsonb_build_object('skus', jsonb_build_array(g % 13, g % 17))
FROM generate_series(1, 5000) g;
SQL
say "lakecdc attach orders   (a table source: triggers record every touched row)"
"$BIN" attach orders
say "lakecdc init --schema orders   (the rows already there → base files)"
"$BIN" -q init --schema orders
say "the application writes: a bulk update, deletes, new orders, a key change"
$PSQL "$LAKECDC_PG_URL" <<'SQL'
UPDATE orders SET status = 'shipped' WHERE id % 3 = 0;
DELETE FROM orders WHERE id % 50 = 0;
INSERT INTO orders (id, customer, amount, status)
SELECT g, 'new', 9.99, 'placed' FROM generate_series(5001, 5200) g;
UPDATE orders SET id = 90001 WHERE id = 1;
SQL
say "lakecdc flush --schema orders --force"
"$BIN" -q flush --schema orders --force
say "lakecdc query   (the table's current state, from the lake)"
"${query[@]}" "SELECT status, count(*) AS orders, sum(amount) AS amount FROM orders GROUP BY status ORDER BY status"
$PSQL "$LAKECDC_PG_URL" -c "SELECT status, count(*) AS orders, sum(amount) AS amount FROM orders GROUP BY status ORDER BY status"
say "done: the lake is in $LAKECDC_LAKE"
