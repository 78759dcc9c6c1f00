# syntax=docker/dockerfile:1
# The operator's image: one statically linked binary and a CA bundle, run as
# a non-root user. Nothing is compiled or downloaded here, so the same recipe
# builds offline, with or without a Docker engine: hack/build-image.sh builds
# the release binary on the host (glibc linked statically), puts it and the
# host's CA bundle in target/image/context, and builds this file there with
# buildah (or `IMAGE_BUILDER=docker`, i.e. `docker build -f Dockerfile
# target/image/context`).
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY sample-controller /sample-controller
# distroless' "nonroot" user; deploy/ runs it with runAsNonRoot.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/sample-controller"]
