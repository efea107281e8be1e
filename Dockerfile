# syntax=docker/dockerfile:1
#
# The one `sandboxd` image: the daemon (`sandboxd`, dynamically linked
# against glibc), the launcher (`sandbox-init`, native backend only) and the
# statically linked `sandbox-agent`, which the init step of every sandbox
# Pod copies out of this image into the Pod (`sandboxd kube prepare`), so the
# sandbox image itself can be any userland.
#
#   docker build -t sandboxd:0.1.0 .
#
# Not built by this repository's CI (no container engine there); the
# stages and paths below are checked by tests/it/kube_golden.rs.

# Build stage: the workspace's release build. `cargo build` also builds the
# static agent (build.rs runs a second cargo with +crt-static for it) and
# puts all three binaries into target/release/.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
 && mkdir -p /out \
 && cp target/release/sandboxd target/release/sandbox-init target/release/sandbox-agent /out/

# Final stage: distroless "cc" (glibc, libgcc_s, libm and CA certificates,
# nothing else: no shell, no package manager), as the non-root user 65532.
# `sandboxd` needs glibc (its NSS resolves the API server's name); the agent
# needs nothing.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/sandboxd /out/sandbox-init /out/sandbox-agent /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sandboxd"]
CMD ["serve"]
