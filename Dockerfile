# syntax=docker/dockerfile:1
# The operator's image: one statically linked binary and a CA bundle, run as
# a non-root user. Nothing is compiled or downloaded here, so the same recipe
# builds offline, with or without a Docker engine: hack/build-image.sh builds
# the release binary on the host (glibc linked statically), puts it and the
# host's CA bundle in target/image/context, and builds this file there with
# buildah (or `IMAGE_BUILDER=docker`, i.e. `docker build -f Dockerfile
# target/image/context`).
FROM scratch
# What the image is, for registries and scanners (OCI annotation keys): the
# script passes the crate's version and license and the commit it was built
# from. Its platform is the binary's, set by the script (--platform).
ARG VERSION=unknown
ARG REVISION=unknown
ARG LICENSES=Apache-2.0
LABEL org.opencontainers.image.title="sample-controller" \
      org.opencontainers.image.description="kubernetes/sample-controller in Rust on kube-rs" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.licenses="$LICENSES"
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY sample-controller /sample-controller
# distroless' "nonroot" user; deploy/ runs it with runAsNonRoot.
USER 65532:65532
# deploy/'s metrics (HTTPS) and probes; a bare run opens the probes' only.
EXPOSE 8443 8081
ENTRYPOINT ["/sample-controller"]
