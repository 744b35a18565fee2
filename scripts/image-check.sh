#!/usr/bin/env bash
# Checks the Dockerfile's build and run steps on a host without a container builder:
#
#   1. parses the Dockerfile: the builder's Rust version equals rust-toolchain.toml's channel,
#      builder and runtime are the same Debian release, the build command, the COPY of the
#      binary, USER (and the Kubernetes securityContext agrees), ENTRYPOINT and CMD;
#   2. runs the builder's cargo command on the host (CARGO_TARGET_DIR honoured);
#   3. lays the binary out in a temporary image root as the runtime stage does
#      (/usr/local/bin/lakecdc) and checks that every shared library it needs, and every glibc /
#      libstdc++ symbol version, is one the runtime base provides;
#   4. runs the entrypoint as the image's user: in a chroot of that image root holding only the
#      binary, the base's libraries and its /etc files (when root), else with setpriv (when
#      root without chroot), else as the current user (said so): the default CMD, --version,
#      --help and `init-db --print-sql` (connects to nothing), asserting their output.
#
#   scripts/image-check.sh              # build, then check
#   scripts/image-check.sh --no-build   # check the binary already in the target dir
#   scripts/image-check.sh --binary PATH  # check another build of it (scripts/test.sh: the
#                                         # debug binary the tests ran, same libraries)
#
# Exits non-zero with a message naming the mismatch. Writes nothing but the cargo build output
# and a temporary directory (removed on exit).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKERFILE="$ROOT/Dockerfile"
BUILD=1
GIVEN_BINARY=""
while (($#)); do
    arg="$1"
    shift
    case "$arg" in
        --no-build) BUILD=0 ;;
        --binary)
            (($#)) || { echo "image-check: --binary needs a path" >&2; exit 2; }
            BUILD=0 GIVEN_BINARY="$1"
            shift
            ;;
        -h | --help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "image-check: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done

fail() { echo "image-check: FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
note() { echo "note: $*"; }

for tool in cargo ldd readelf; do
    command -v "$tool" >/dev/null || fail "$tool is needed"
done
# JSON arrays (exec-form ENTRYPOINT / CMD) -> one element per line.
if command -v jq >/dev/null; then
    json_words() { jq -r '.[]' <<<"$1" 2>/dev/null; }
elif command -v python3 >/dev/null; then
    json_words() { python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$1" 2>/dev/null; }
else
    fail "jq or python3 is needed (to read the exec-form ENTRYPOINT and CMD)"
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/lakecdc-image-check.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

# ---- 1. the Dockerfile ------------------------------------------------------------------------
[[ -f "$DOCKERFILE" ]] || fail "no Dockerfile at $DOCKERFILE"
# One instruction per line: comments dropped, continuation lines joined.
awk '
    /^[[:space:]]*#/ { next }
    { line = line $0 }
    /\\[[:space:]]*$/ { sub(/\\[[:space:]]*$/, "", line); next }
    { if (line ~ /[^[:space:]]/) print line; line = "" }
' "$DOCKERFILE" | sed 's/^[[:space:]]*//' >"$TMP/instructions"

# Stage of each instruction: "<stage index>\t<instruction>"; stage images and names.
declare -a STAGE_IMAGE=() STAGE_NAME=()
: >"$TMP/staged"
stage=-1
while IFS= read -r ins; do
    keyword="$(awk '{print toupper($1)}' <<<"$ins")"
    if [[ "$keyword" == FROM ]]; then
        stage=$((stage + 1))
        read -r _ a b c d <<<"$ins"
        [[ "$a" == --platform=* ]] && { a="$b"; b="$c"; c="$d"; }
        STAGE_IMAGE[stage]="$a"
        if [[ "${b^^}" == AS ]]; then STAGE_NAME[stage]="$c"; else STAGE_NAME[stage]="$stage"; fi
    elif ((stage < 0)) && [[ "$keyword" != ARG ]]; then
        fail "Dockerfile: $keyword before the first FROM"
    fi
    printf '%s\t%s\n' "$stage" "$ins" >>"$TMP/staged"
done <"$TMP/instructions"
((stage >= 1)) || fail "Dockerfile: expected a multi-stage build (a builder and a runtime stage)"
RUNTIME=$stage
# Instructions of one stage, the keyword included.
stage_ins() { awk -F'\t' -v s="$1" '$1 == s { print $2 }' "$TMP/staged"; }
stage_kw() { stage_ins "$1" | awk -v k="$2" 'toupper($1) == k' | sed 's/^[^[:space:]]*[[:space:]]*//'; }

BUILDER=""
for ((i = 0; i < RUNTIME; i++)); do
    [[ "${STAGE_IMAGE[i]}" == rust:* || "${STAGE_IMAGE[i]}" == */rust:* ]] && BUILDER=$i
done
[[ -n "$BUILDER" ]] || fail "Dockerfile: no builder stage FROM rust:<version>"
builder_image="${STAGE_IMAGE[BUILDER]}"
builder_tag="${builder_image##*:}"
rust_version="${builder_tag%%-*}"
builder_distro="${builder_tag#"$rust_version"}"
builder_distro="${builder_distro#-}"

channel="$(sed -n 's/^[[:space:]]*channel[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$ROOT/rust-toolchain.toml")"
[[ -n "$channel" ]] || fail "rust-toolchain.toml: no channel"
[[ "$rust_version" == "$channel" ]] ||
    fail "the builder image $builder_image is Rust $rust_version, rust-toolchain.toml's channel is $channel"
ok "builder $builder_image (stage ${STAGE_NAME[BUILDER]}): Rust $rust_version = rust-toolchain.toml's channel"

# The cargo command of the builder: every `cargo build` of its RUN lines, all the same.
build_cmd=""
while IFS= read -r run; do
    while IFS= read -r part; do
        part="$(sed 's/^[[:space:]]*//; s/[[:space:]]*$//' <<<"$part")"
        [[ "$part" == "cargo build"* ]] || continue
        if [[ -z "$build_cmd" ]]; then
            build_cmd="$part"
        elif [[ "$part" != "$build_cmd" ]]; then
            fail "the builder runs two different builds: '$build_cmd' and '$part'"
        fi
    done < <(sed 's/&&/\n/g; s/;/\n/g' <<<"$run")
done < <(stage_kw "$BUILDER" RUN)
[[ -n "$build_cmd" ]] || fail "the builder stage has no 'cargo build' RUN step"
read -ra BUILD_ARGV <<<"$build_cmd"
for flag in --release --locked; do
    [[ " $build_cmd " == *" $flag "* ]] || fail "the build command lacks $flag: $build_cmd"
done
bin_name="$(sed -n 's/.*--bin[[:space:]=]\([^[:space:]]*\).*/\1/p' <<<"$build_cmd")"
[[ "$bin_name" == lakecdc ]] || fail "the build command must build --bin lakecdc: $build_cmd"
ok "build command: $build_cmd"

# What the build copies in must be in the build context and not excluded by .dockerignore.
while IFS= read -r copy; do
    read -ra words <<<"$copy"
    [[ " ${words[*]} " == *" --from="* ]] && continue
    srcs=()
    for w in "${words[@]}"; do [[ "$w" == --* ]] || srcs+=("$w"); done
    unset 'srcs[${#srcs[@]}-1]'
    for src in "${srcs[@]}"; do
        [[ -e "$ROOT/$src" ]] || fail "the builder copies $src, which the context does not hold"
        top="${src%%/*}"
        if [[ -f "$ROOT/.dockerignore" ]] &&
            grep -qxE "[[:space:]]*/?(${src//./\\.}|${top//./\\.})/?[[:space:]]*" "$ROOT/.dockerignore"; then
            fail "the builder copies $src, which .dockerignore excludes"
        fi
    done
done < <(stage_kw "$BUILDER" COPY)
ok "the builder's COPY sources exist and .dockerignore keeps them"

# The runtime base and what it provides.
runtime_image="${STAGE_IMAGE[RUNTIME]}"
case "${runtime_image%%[:@]*}" in
    gcr.io/distroless/cc-debian12)
        base_distro=bookworm; base_glibc=2.36; base_glibcxx=3.4.30; base_cxxabi=1.3.13 ;;
    gcr.io/distroless/cc-debian13)
        base_distro=trixie; base_glibc=2.41; base_glibcxx=3.4.33; base_cxxabi=1.3.15 ;;
    *) fail "runtime base $runtime_image is not one this script knows the libraries of (distroless cc-debian12/13)" ;;
esac
# glibc (libc, libm, libdl, libpthread, librt, libresolv, libutil, the dynamic loader),
# libgcc_s, libstdc++ and libgomp: distroless cc = base (libc6, ca-certificates, tzdata) +
# libgcc-s1, libstdc++6, libgomp1.
BASE_LIBS=(linux-vdso.so.1 libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1
    libresolv.so.2 libutil.so.1 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1
    libgcc_s.so.1 libstdc++.so.6 libgomp.so.1)
[[ -z "$builder_distro" || "$builder_distro" == "$base_distro" ]] ||
    fail "the builder is Debian $builder_distro, the runtime base $runtime_image is $base_distro: the binary would need another glibc/libstdc++"
ok "runtime base $runtime_image (Debian $base_distro: glibc $base_glibc, GLIBCXX $base_glibcxx); builder on $base_distro too"

copy_line="$(stage_kw "$RUNTIME" COPY | grep -E -- "--from=(${STAGE_NAME[BUILDER]}|$BUILDER)([[:space:]]|$)" || true)"
[[ -n "$copy_line" && "$(wc -l <<<"$copy_line")" -eq 1 ]] ||
    fail "the runtime stage must COPY --from=${STAGE_NAME[BUILDER]} the binary once"
read -ra words <<<"$copy_line"
copy_dest="${words[-1]}"
copy_src="${words[-2]}"
[[ "$copy_src" == */release/"$bin_name" ]] || fail "the runtime stage copies $copy_src, not the release build of $bin_name"
[[ "$copy_dest" == /usr/local/bin/lakecdc ]] ||
    fail "the binary goes to $copy_dest; the manifests and docs expect /usr/local/bin/lakecdc"
ok "runtime stage copies $copy_src -> $copy_dest"

user="$(stage_kw "$RUNTIME" USER | tail -1)"
[[ "$user" =~ ^([0-9]+):([0-9]+)$ ]] ||
    fail "the runtime stage's USER must be numeric uid:gid (runAsNonRoot needs a number), got '$user'"
IMG_UID="${BASH_REMATCH[1]}"
IMG_GID="${BASH_REMATCH[2]}"
((IMG_UID != 0)) || fail "USER is root"
k8s_dir="$ROOT/manifests/kubernetes"
for key_want in "runAsUser:$IMG_UID" "runAsGroup:$IMG_GID"; do
    key="${key_want%%:*}"
    want="${key_want#*:}"
    found="$(grep -hE "^[[:space:]]*$key:" "$k8s_dir"/*.yaml | awk '{print $2}' | sort -u)"
    [[ -n "$found" ]] || fail "manifests/kubernetes sets no $key"
    [[ "$found" == "$want" ]] ||
        fail "manifests/kubernetes sets $key $(tr '\n' ' ' <<<"$found")but the image's USER is $user"
done
ok "USER $user = the Kubernetes securityContext (runAsUser/runAsGroup)"

entry_json="$(stage_kw "$RUNTIME" ENTRYPOINT | tail -1)"
cmd_json="$(stage_kw "$RUNTIME" CMD | tail -1)"
mapfile -t ENTRYPOINT < <(json_words "$entry_json") || true
mapfile -t DEFAULT_CMD < <(json_words "${cmd_json:-[]}") || true
[[ ${#ENTRYPOINT[@]} -eq 1 && "${ENTRYPOINT[0]}" == "$copy_dest" ]] ||
    fail "ENTRYPOINT must be the exec form [\"$copy_dest\"] (the Kubernetes args are the subcommand), got: $entry_json"
[[ ${#DEFAULT_CMD[@]} -ge 1 ]] || fail "the runtime stage has no exec-form CMD: $cmd_json"
ok "ENTRYPOINT $entry_json, CMD $cmd_json"

# ---- 2. the build -----------------------------------------------------------------------------
cd "$ROOT"
toolchain="$(rustc --version)"
[[ "$toolchain" == "rustc $channel "* ]] || fail "the host's rustc here is '$toolchain', not $channel"
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
binary="${GIVEN_BINARY:-$target_dir/release/$bin_name}"
if ((BUILD)); then
    echo "building: CARGO_TARGET_DIR=$target_dir ${BUILD_ARGV[*]}  ($toolchain)"
    [[ -d "$target_dir/release/build" ]] ||
        note "a cold build compiles DuckDB from C++: 20-30 minutes on 2 cores"
    if ! CARGO_TARGET_DIR="$target_dir" "${BUILD_ARGV[@]}" >"$TMP/build.log" 2>&1; then
        tail -40 "$TMP/build.log" | sed 's/^/  cargo: /' >&2
        fail "the build failed: ${BUILD_ARGV[*]}"
    fi
    tail -1 "$TMP/build.log" | sed 's/^[[:space:]]*/  cargo: /'
    ok "built $binary"
else
    note "not built here: checking the binary at $binary"
fi
[[ -x "$binary" ]] || fail "no binary at $binary"

# ---- 3. the image root and its libraries -------------------------------------------------------
IMG="$TMP/image"
install -d -m 0755 "$IMG" "$IMG/usr/local/bin" "$IMG/etc" "$IMG/etc/ssl/certs"
install -d -m 1777 "$IMG/tmp"
install -m 0755 "$binary" "$IMG$copy_dest"

mapfile -t needed < <(readelf -d "$IMG$copy_dest" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
interp="$(readelf -l "$IMG$copy_dest" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
[[ -n "$interp" ]] || fail "the binary has no program interpreter (not dynamically linked?)"
for lib in "${needed[@]}" "$(basename "$interp")"; do
    provided=0
    for b in "${BASE_LIBS[@]}"; do [[ "$lib" == "$b" ]] && provided=1; done
    ((provided)) || fail "the binary needs $lib, which $runtime_image does not provide"
done
ldd_out="$(ldd "$IMG$copy_dest")"
if grep -q 'not found' <<<"$ldd_out"; then
    fail "ldd: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ')"
fi
while read -r lib _ path _; do
    [[ "$lib" == linux-vdso* ]] && continue
    [[ "$lib" == /* ]] && path="$lib"
    [[ -n "$path" && "$path" == /* ]] || continue
    provided=0
    for b in "${BASE_LIBS[@]}"; do [[ "$(basename "$lib")" == "$b" ]] && provided=1; done
    ((provided)) || fail "ldd: the binary loads $lib ($path), which $runtime_image does not provide"
    # The base's copy of the library, in the image root (the host's stands in for it).
    install -d -m 0755 "$IMG$(dirname "$path")"
    cp -L "$path" "$IMG$path"
done <<<"$ldd_out"
ok "shared libraries (ldd): $(awk '{print $1}' <<<"$ldd_out" | grep -v vdso | xargs -n1 basename | tr '\n' ' ')- all in $runtime_image"

# Symbol versions: the newest glibc / libstdc++ interfaces the binary uses.
version_le() { [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -1)" == "$2" ]]; }
if command -v objdump >/dev/null; then
    symbols="$(objdump -T "$IMG$copy_dest")"
    for pair in GLIBC:$base_glibc GLIBCXX:$base_glibcxx CXXABI:$base_cxxabi; do
        prefix="${pair%%:*}"
        have="${pair#*:}"
        newest="$(grep -oE "\b${prefix}_[0-9][0-9.]*" <<<"$symbols" | sed "s/^${prefix}_//" | sort -uV | tail -1)"
        [[ -z "$newest" ]] && continue
        version_le "$newest" "$have" ||
            fail "the binary needs ${prefix}_$newest; $runtime_image has ${prefix}_$have (build on $base_distro)"
        ok "needs ${prefix}_$newest <= ${prefix}_$have"
    done
else
    note "objdump not found: symbol versions not checked"
fi

# The rest of what the base gives the binary: its user, CA certificates.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$IMG/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$IMG/etc/group"
install -d -m 0700 -o "$IMG_UID" -g "$IMG_GID" "$IMG/home/nonroot" 2>/dev/null || install -d -m 0700 "$IMG/home/nonroot"
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    cp /etc/ssl/certs/ca-certificates.crt "$IMG/etc/ssl/certs/"
fi
chmod -R a+rX,go-w "$IMG/usr" "$IMG/etc"
chmod 0755 "$IMG"
for d in lib lib64 usr/lib usr/lib64; do [[ -d "$IMG/$d" ]] && chmod -R a+rX,go-w "$IMG/$d"; done

# ---- 4. run the entrypoint as the image's user -------------------------------------------------
# The base's environment (distroless): PATH, SSL_CERT_FILE; HOME of nonroot.
IMAGE_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt HOME=/home/nonroot)
if [[ "$(id -u)" -eq 0 ]] && command -v chroot >/dev/null; then
    how="as uid $IMG_UID:$IMG_GID in a chroot of the image root (nothing else of the host visible)"
    run_image() {
        env -i "${IMAGE_ENV[@]}" chroot --userspec="$IMG_UID:$IMG_GID" --groups="$IMG_GID" "$IMG" \
            "${ENTRYPOINT[@]}" "$@"
    }
elif [[ "$(id -u)" -eq 0 ]] && command -v setpriv >/dev/null; then
    how="as uid $IMG_UID:$IMG_GID (setpriv), from the image root on the host's filesystem"
    run_image() {
        (cd / && env -i "${IMAGE_ENV[@]}" setpriv --reuid="$IMG_UID" --regid="$IMG_GID" --clear-groups \
            "$IMG${ENTRYPOINT[0]}" "$@")
    }
else
    how="as $(id -un) (uid $(id -u)), NOT as $IMG_UID: run this script as root to check the image's user"
    run_image() { (cd / && env -i "${IMAGE_ENV[@]}" "$IMG${ENTRYPOINT[0]}" "$@"); }
fi
echo "running the entrypoint $how"

# run_checked <description> <grep -E pattern on stdout> -- args...
run_checked() {
    local what="$1" pattern="$2"
    shift 3
    local rc=0
    run_image "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    ((rc == 0)) || fail "$what: exit $rc: $(head -c 2000 "$TMP/err")"
    grep -qE -- "$pattern" "$TMP/out" || fail "$what: stdout lacks /$pattern/: $(head -c 2000 "$TMP/out")"
    ok "$what: exit 0, $(wc -l <"$TMP/out") lines on stdout, /$pattern/ found"
}

crate_version="$(sed -n 's/^version[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$ROOT/Cargo.toml" | head -1)"
run_checked "default CMD (${DEFAULT_CMD[*]})" '^Usage: lakecdc ' -- "${DEFAULT_CMD[@]}"
run_checked "--version" "^lakecdc ${crate_version//./\\.}\$" -- --version
run_checked "--help" '^Usage: lakecdc ' -- --help
for sub in flush compact gc init verify init-db; do
    grep -qE "^  $sub " "$TMP/out" || fail "--help does not list the subcommand $sub"
done
ok "--help lists flush, compact, gc, init, verify, init-db"
run_checked "init-db --print-sql" '^CREATE TABLE IF NOT EXISTS "change_log"' -- init-db --print-sql
grep -q 'CREATE INDEX IF NOT EXISTS' "$TMP/out" || fail "init-db --print-sql prints no CREATE INDEX"
[[ ! -s "$TMP/err" ]] || fail "init-db --print-sql wrote to stderr: $(head -c 2000 "$TMP/err")"
ok "init-db --print-sql: the tables and the change_log index, nothing on stderr"

echo "image-check: OK ($runtime_image, $(du -h "$binary" | cut -f1) binary, $toolchain)"
