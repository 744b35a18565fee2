#!/usr/bin/env bash
# The project's test command (CI runs it through .ci/run):
#   lint (rustfmt, clippy) -> start PostgreSQL + S3 -> cargo test -> summary.
# Extra arguments go to `cargo test`, e.g. `scripts/test.sh store::` runs only
# tests whose name contains store::, and `scripts/test.sh -- --nocapture`
# passes --nocapture to the test binaries.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/lakecdc-target}"
# Tests get their own services dir, so a demo instance started with the
# default dir (scripts/services.sh start) is left alone.
export LAKECDC_SERVICES_DIR="${LAKECDC_TEST_SERVICES_DIR:-/var/tmp/lakecdc-test-services}"

step() { echo "=== test.sh: $*"; }
die() {
	echo "test.sh: error: $*" >&2
	exit 1
}

# ensure_pkg PROBE PACKAGE: apt-get install PACKAGE unless PROBE (a command
# name or a path glob) exists. `apt-get update` runs only if the install fails.
ensure_pkg() {
	local probe="$1" pkg="$2"
	if [[ "$probe" == /* ]]; then
		compgen -G "$probe" >/dev/null && return 0
	else
		command -v "$probe" >/dev/null && return 0
	fi
	step "installing Debian package $pkg"
	export DEBIAN_FRONTEND=noninteractive
	local sudo=()
	[ "$(id -u)" = 0 ] || sudo=(sudo)
	"${sudo[@]}" apt-get install -y -q -o DPkg::Lock::Timeout=300 "$pkg" ||
		{ "${sudo[@]}" apt-get update -q && "${sudo[@]}" apt-get install -y -q -o DPkg::Lock::Timeout=300 "$pkg"; } ||
		die "could not install $pkg"
}

# --- 1. tools ------------------------------------------------------------------
# The Rust toolchain comes with the machine. No cmake: aws-lc-sys and the
# bundled DuckDB build with the cc crate.
ensure_pkg curl curl
ensure_pkg '/usr/lib/postgresql/*/bin/initdb' postgresql
cargo fmt --version >/dev/null 2>&1 || die "rustfmt is missing (rustup component add rustfmt)"
cargo clippy --version >/dev/null 2>&1 || die "clippy is missing (rustup component add clippy)"
echo "test.sh: $(cargo --version); $(rustc --version); CARGO_TARGET_DIR=$CARGO_TARGET_DIR"
# tests/it/query.rs runs the views' SQL in DuckDB's Python package too, and tests/it/metrics.rs
# parses the metrics with Prometheus' own Python text parser: a cached venv (the one the
# benchmarks use), unless LAKECDC_TEST_PYTHON names an interpreter already.
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
PROMETHEUS_PY_VERSION=0.26.0
if [ -z "${LAKECDC_TEST_PYTHON:-}" ]; then
	venv="${LAKECDC_TEST_VENV:-/var/tmp/lakecdc-bench-venv}"
	step "python venv with duckdb==$DUCKDB_PY_VERSION and prometheus_client==$PROMETHEUS_PY_VERSION in $venv"
	probe="$DUCKDB_PY_PROBE; import prometheus_client.parser; from importlib.metadata import version; assert version('prometheus_client') == '$PROMETHEUS_PY_VERSION'"
	ensure_venv "$venv" "$probe" "duckdb==$DUCKDB_PY_VERSION" "prometheus_client==$PROMETHEUS_PY_VERSION" ||
		die "could not set up $venv"
	export LAKECDC_TEST_PYTHON="$venv/bin/python"
fi

LOCKED=()
[ -f Cargo.lock ] && LOCKED=(--locked)

# --- 2. lint -------------------------------------------------------------------
step "cargo fmt --check"
cargo fmt --all -- --check || die "code is not formatted: run cargo fmt --all"
step "cargo clippy"
cargo clippy --all-targets "${LOCKED[@]}" -- -D warnings || die "clippy found problems"

# --- 3. services ---------------------------------------------------------------
stop_services() { scripts/services.sh stop || true; }
trap stop_services EXIT
trap 'exit 130' INT # make sure the EXIT trap runs on ^C / kill
trap 'exit 143' TERM
step "starting services in $LAKECDC_SERVICES_DIR"
scripts/services.sh start >/dev/null
# shellcheck source=/dev/null
source "$LAKECDC_SERVICES_DIR/env"

# --- 4. tests ------------------------------------------------------------------
# Our libtest flags go after a `--`; reuse the caller's `--` if it gave one.
args=("$@")
has_sep=0
for a in "${args[@]}"; do [ "$a" = -- ] && has_sep=1; done
[ $has_sep = 1 ] || args+=(--)
args+=(--test-threads=4)

log="$(mktemp -t lakecdc-test.XXXXXX.log)"
step "cargo test --all-targets --no-fail-fast ${LOCKED[*]} ${args[*]}"
set +e
cargo test --all-targets --no-fail-fast "${LOCKED[@]}" "${args[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

# Stop the services now (not in the EXIT trap) so the summary is the last line.
trap - EXIT INT TERM
stop_services

# The image's run steps (its user, its libraries, its entrypoint) on the binary the tests ran;
# a full run only (a release build of the same code links the same libraries).
image_rc=0
if [ "${#args[@]}" -eq 2 ] && [ "$rc" -eq 0 ]; then
	step "scripts/image-check.sh --binary $CARGO_TARGET_DIR/debug/lakecdc"
	scripts/image-check.sh --binary "$CARGO_TARGET_DIR/debug/lakecdc" || image_rc=$?
fi

# Sum "test result: ok. 3 passed; 0 failed; 1 ignored; ..." over all binaries.
read -r passed failed ignored < <(awk '
	/^test result: / {
		for (i = 1; i <= NF; i++) {
			if ($(i + 1) ~ /^passed;?$/) p += $i
			if ($(i + 1) ~ /^failed;?$/) f += $i
			if ($(i + 1) ~ /^ignored;?$/) g += $i
		}
	}
	END { printf "%d %d %d\n", p, f, g }' "$log")

echo
if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ] || [ "$passed" -eq 0 ] || [ "$image_rc" -ne 0 ]; then
	# Each failing test's panic message (without its backtrace), last, where a truncated view
	# of the output (the tail) still shows it.
	awk '
		/panicked at / { n = 12; print "  " $0; next }
		/^stack backtrace:/ { n = 0 }
		n > 0 { print "  " $0; n-- }' "$log" | tail -n 60 || true
	grep -E '^test .* \.\.\. FAILED$' "$log" | sed 's/^/  /' || true
	if [ "$rc" -ne 0 ]; then why="cargo test exited with $rc"; else why="no test ran"; fi
	[ "$failed" -eq 0 ] || why="$failed failed"
	[ "$image_rc" -eq 0 ] || why="scripts/image-check.sh failed"
	echo "test.sh: FAILED: $why (output kept in $log)"
	echo "summary: $passed passed, $failed failed, $ignored skipped"
	exit 1
fi
rm -f "$log"
note=""
[ "$ignored" -eq 0 ] || note=" ($ignored ignored)"
noun=tests
[ "$passed" -ne 1 ] || noun="test"
echo "test.sh: $passed $noun passed$note"
echo "summary: $passed passed, 0 failed, $ignored skipped"
