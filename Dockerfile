# syntax=docker/dockerfile:1
# pglimit's container image: built in a Rust image, run from distroless
# (glibc and CA certificates, no shell, no package manager) as a non-root
# user. Needs BuildKit (the default builder of current Docker) for the cache
# mounts. See README, "Container image".

# The images to build in and to run from. The defaults are the public ones;
# scripts/container passes local equivalents (made from Debian's packages
# and the host's toolchain) to build and test this same file offline.
ARG BUILDER=rust:1.95-slim-bookworm
ARG RUNTIME=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILDER} AS build
WORKDIR /src
COPY . .
# Cache mounts keep the crates downloaded and the dependencies compiled
# between builds, so a change to pglimit's own code recompiles only pglimit.
# The binary is copied out because the target directory is a cache, not a
# layer. Its debug info goes (the image: 19 MB instead of 101); symbols stay,
# so a panic's backtrace still names functions.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin pglimit \
    && strip --strip-debug -o /usr/local/bin/pglimit target/release/pglimit

FROM ${RUNTIME}
COPY --from=build /usr/local/bin/pglimit /usr/local/bin/pglimit
# The policy file is mounted here (compose.yaml mounts policies.default.toml);
# without it the built-in policies apply.
ENV PGLIMIT_BIND=0.0.0.0:8080 \
    PGLIMIT_LOG_FORMAT=json
# nonroot: uid and gid 65532 in distroless images.
USER 65532:65532
EXPOSE 8080 8081
# No curl in the image: the binary probes its own /healthz on PGLIMIT_BIND.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/pglimit", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/pglimit"]
CMD ["serve"]
