# syntax=docker/dockerfile:1
# The Granary image: granary-operator, granary-cachenode, granary-sidecar, the
# granary CLI and the Python package (granary, granary.torch), on Debian 12.
# The Helm chart's default image (charts/granary, image granary:0.1.0) and a
# CachePool's default spec.image name this build:
#
#   docker build -t granary:0.1.0 .   # with a registry: the base is debian:12-slim
#   make image                        # buildah or podman, on a Debian base made here
#                                     # from Debian's packages (scripts/image/build)
#
# DEBIAN_IMAGE names the base of both stages: any Debian 12 image whose apt
# sources work (make image passes one made by debootstrap, scripts/image/debian-base).
#
# Stage 1 builds with the release preset (RelWithDebInfo, warnings as errors),
# without the tests and benchmarks. Stage 2 holds the binaries, the shared
# libraries they link (found with ldd and mapped to their Debian packages, so the
# list cannot drift from what is linked), python3 and fuse3 (the sidecar's POSIX
# view), and runs as the non-root user granary (uid/gid 65532). The operator's
# pods run as that user (the chart's securityContext); cache-node and sidecar
# containers run as their pod spec says (a Dataset's runAs for sidecars).

ARG DEBIAN_IMAGE=debian:12-slim

FROM ${DEBIAN_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates \
      libzstd-dev libxxhash-dev libsqlite3-dev libhiredis-dev \
      libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev \
      libboost-dev libssl-dev libfabric-dev prometheus-cpp-dev libcpp-httplib-dev \
      libfuse3-dev python3-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# granary_python: the stable-ABI module granary._native and the package's .py
# files, in build/release/python/granary/ (client/CMakeLists.txt).
RUN cmake --preset release -DGRANARY_BUILD_TESTS=OFF -DGRANARY_BUILD_BENCH=OFF \
    && cmake --build build/release -j"$(nproc)" --target \
         granary-operator granary-cachenode granary-sidecar granary granary_python
# /out: the binaries and the Python package (without their debug sections), and the Debian packages of the shared
# libraries they link (usr-merged paths are tried both ways for dpkg -S).
RUN set -eu; mkdir -p /out/bin /out/python; \
    cp build/release/operator/granary-operator build/release/cachenode/granary-cachenode \
       build/release/sidecar/granary-sidecar build/release/cli/granary /out/bin/; \
    cp -r build/release/python/granary /out/python/; \
    find /out/python -name __pycache__ -prune -exec rm -rf {} +; \
    strip --strip-debug /out/bin/* /out/python/granary/*.so; \
    for f in /out/bin/* /out/python/granary/*.so; do ldd "$f" | awk '/=> \//{print $3}'; done \
      | sort -u | while read -r lib; do \
          dpkg -S "$lib" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null || dpkg -S "${lib#/usr}" \
            || { echo "no Debian package owns $lib" >&2; exit 1; }; \
        done | cut -d: -f1 | sort -u > /out/runtime-packages; \
    cat /out/runtime-packages

FROM ${DEBIAN_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
COPY --from=build /out/runtime-packages /tmp/runtime-packages
RUN apt-get update \
    && apt-get install -y --no-install-recommends $(cat /tmp/runtime-packages) \
         python3 python3-numpy fuse3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/runtime-packages \
    && groupadd --system --gid 65532 granary \
    && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/granary --create-home \
         --shell /usr/sbin/nologin granary
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/python/granary /usr/lib/python3/dist-packages/granary
LABEL org.opencontainers.image.title="granary" \
      org.opencontainers.image.description="Granary: a deep-learning data cache for GPU clusters" \
      org.opencontainers.image.version="0.1.0"
USER 65532:65532
WORKDIR /var/lib/granary
# Each pod names its command (granary-operator, granary-cachenode, granary-sidecar).
CMD ["granary", "--help"]
