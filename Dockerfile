# syntax=docker/dockerfile:1
# Build: a static musl binary, so the runtime image needs no libc.
FROM rust:1.95-alpine3.22 AS build
# Unpinned on purpose: Alpine deletes a package revision when it moves on,
# so a pinned one breaks the build without notice; the base image's tag pins
# the release.
# hadolint ignore=DL3018
RUN apk add --no-cache musl-dev
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin \
 && echo 'fn main() {}' > src/main.rs \
 && echo 'fn main() {}' > src/bin/crdgen.rs \
 && touch src/lib.rs \
 && cargo build --release --locked --bin sample-controller \
 && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin sample-controller \
 && strip target/release/sample-controller

# Runtime: nothing but the binary and CA certificates, as a non-root user.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/target/release/sample-controller /sample-controller
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/sample-controller"]
