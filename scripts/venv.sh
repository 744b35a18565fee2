# Sourced by scripts/bench.sh and scripts/test.sh: a cached Python venv holding pinned PyPI
# wheels (DuckDB's Python package for the benchmarks' baselines and tests/it/query.rs).
#
#   ensure_venv DIR "$DUCKDB_PY_PROBE" "duckdb==$DUCKDB_PY_VERSION"   # DIR/bin/python has duckdb 1.5.5
#
# The venv is made once and reused; a probe that fails (missing venv, missing or other
# version) installs the packages into it. Installs are serialised between concurrent callers.
# A machine whose python3 lacks venv/ensurepip (Debian without python3-venv) gets it from apt.
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this one
DUCKDB_PY_VERSION=1.5.5
# A probe for ensure_venv: DuckDB's Python package, of that version.
# shellcheck disable=SC2034
DUCKDB_PY_PROBE="import duckdb; assert duckdb.__version__ == '$DUCKDB_PY_VERSION', duckdb.__version__"

# ensure_venv DIR PROBE PACKAGE...: DIR/bin/python runs PROBE (Python) without error after this.
ensure_venv() {
	local venv="$1" probe="$2"
	shift 2
	if "$venv/bin/python" -c "$probe" 2>/dev/null; then return 0; fi
	mkdir -p "$(dirname "$venv")"
	exec 8>"$venv.lock"
	flock 8
	if ! "$venv/bin/python" -c "$probe" 2>/dev/null; then
		echo "venv.sh: installing $* into $venv" >&2
		venv_python_ok || venv_apt_install python3-venv
		# A venv left broken by an interrupted make (no pip) is made again.
		[ -x "$venv/bin/pip" ] || rm -rf "$venv"
		python3 -m venv "$venv" || { echo "venv.sh: python3 -m venv $venv failed" >&2 && return 1; }
		"$venv/bin/pip" install -q "$@" || { echo "venv.sh: pip install $* failed" >&2 && return 1; }
		"$venv/bin/python" -c "$probe" || { echo "venv.sh: $venv still fails: $probe" >&2 && return 1; }
	fi
	flock -u 8
	exec 8>&-
}

# Can python3 make a venv with pip in it?
venv_python_ok() {
	python3 -c 'import venv, ensurepip' 2>/dev/null
}

# apt-get install, running `apt-get update` only if the first attempt fails.
venv_apt_install() {
	local sudo=()
	[ "$(id -u)" = 0 ] || sudo=(sudo)
	echo "venv.sh: installing Debian packages: $*" >&2
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get install -y -q -o DPkg::Lock::Timeout=300 "$@" >&2 ||
		{ "${sudo[@]}" apt-get update -q >&2 && "${sudo[@]}" apt-get install -y -q -o DPkg::Lock::Timeout=300 "$@" >&2; }
}
