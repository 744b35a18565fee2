# The lakecdc image: the binary on a distroless base, entrypoint /usr/local/bin/lakecdc.
#
#   docker build --build-arg VERSION=0.1.0 -t <registry>/lakecdc:0.1.0 .
#
# scripts/image-check.sh runs this file's build and run steps on a host without a container
# builder, and tests/it/deploy.rs checks that it agrees with rust-toolchain.toml and with the
# pods' securityContext in manifests/kubernetes/.

# ---- build ------------------------------------------------------------------------------------
# The Rust version must equal the channel of rust-toolchain.toml (checked by the two files
# above). rust-toolchain.toml itself is not copied in: it would make rustup download clippy and
# rustfmt, which the build does not need. Debian bookworm, as the runtime base below: the
# binary links against this glibc and libstdc++.
FROM rust:1.95.0-bookworm AS build

WORKDIR /src
ENV CARGO_TARGET_DIR=/src/target

# Dependencies first, in a layer of their own that only Cargo.toml / Cargo.lock invalidate:
# DuckDB is bundled and compiled from C++ source (the image's g++), which takes 20-30 minutes
# on 2 cores. The placeholder sources are replaced by the real ones below.
# .cargo/config.toml sets build environment (aws-lc's entropy source): the same as on a host.
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
RUN mkdir -p src cmd/lakecdc \
    && echo '//! placeholder' > src/lib.rs \
    && echo 'fn main() {}' > cmd/lakecdc/main.rs \
    && cargo build --release --locked --bin lakecdc \
    && rm -rf src cmd

# The crate itself (the release build needs nothing else: tests, docs and examples stay out).
COPY src src
COPY cmd cmd
# Newer mtimes than the placeholders', so cargo rebuilds the crate whatever the context's
# (and the check that the binary is the real one, not the placeholder).
RUN touch src/lib.rs cmd/lakecdc/main.rs \
    && cargo build --release --locked --bin lakecdc \
    && /src/target/release/lakecdc --version | grep -q '^lakecdc '

# ---- runtime ----------------------------------------------------------------------------------
# distroless cc (Debian 12): glibc (libc, libm, libdl, libpthread, librt, ld-linux), libgcc_s,
# libstdc++ and libgomp, CA certificates (/etc/ssl/certs/ca-certificates.crt, read for TLS to
# S3 and PostgreSQL), tzdata and /etc/passwd with the user nonroot (65532); no shell. `ldd` of
# the release binary lists libstdc++.so.6, libgcc_s.so.1, libm.so.6, libc.so.6 and
# ld-linux-x86-64.so.2: all provided (scripts/image-check.sh checks it, with the glibc and
# libstdc++ symbol versions).
FROM gcr.io/distroless/cc-debian12:nonroot

ARG VERSION=dev
LABEL org.opencontainers.image.title="lakecdc" \
      org.opencontainers.image.description="Exports a PostgreSQL entity store into a verifiable Parquet lake on S3" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"

COPY --from=build /src/target/release/lakecdc /usr/local/bin/lakecdc

# The pods' securityContext (manifests/kubernetes/) runs as 65532:65532, with runAsNonRoot
# (which needs a numeric USER) and a read-only root filesystem: the jobs' work dir and TMPDIR
# are a mounted volume (/work).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/lakecdc"]
CMD ["--help"]
