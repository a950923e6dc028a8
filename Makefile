# Granary's front door. Every target installs the Debian packages it needs that
# are missing first (scripts/install-deps GROUP, as root) and builds what it needs.
#
#   make check        debug build and the unit tests only (no daemons, Kubernetes or Slurm;
#                     a few minutes once built), the format, layering and test-layout checks
#   make test         format, layering and test-layout checks, debug and asan builds with the
#                     whole suite, fuzzers
#                     (each suite followed by scripts/check-test-leftovers: no FUSE mount or
#                     /tmp/granary-test-* directory left behind)
#   make build        debug build only
#   make release      optimised build (benchmarks)
#   make quickstart   single-host Granary + a PyTorch training loop through it (DIR=... for your data)
#   make demo         stage a generated (or DIR=...) dataset with one cache node
#   make demo-slurm   a job with #DW jobdw + stage_in on a real one-node Slurm (2,000 files; as root)
#   make demo-k8s     helm install the chart on a real node here, a Dataset and a training Job (as root; KEEP=1 leaves it up)
#   make bench-manifest  manifest build/load figures at ImageNet scale
#   make bench-core   placement and plan micro-benchmarks
#   make bench-cachenode  cache node staging and serving figures (about 1.5 minutes, 7 GB in /tmp; ARGS=--tls)
#   make bench-auth    what authentication costs per connection on a cache node's port
#   make bench-client  Python client through the sidecar vs local files (ARGS=--small for a smoke run)
#   make bench-multihost  staging and serving across 4 hosts in network namespaces, TCP and libfabric
#                     (as root; about a minute, 2 GB in /tmp; ARGS=--small for a smoke run)
#   make bench        the side-by-side benchmark over a slow source (bench/run-benchmark; ARGS=...)
#   make bench-smoke  bench/run-benchmark --small on the debug build, every contender (part of make test)
#   make image        the container image granary:0.1.0 (Dockerfile) with docker, or buildah/podman on a
#                     Debian base made here (TAG=...; LOAD=1 also imports it into containerd)
#   make image-assemble  the same image from build/release's binaries, no compiling (LOAD=1: into containerd)
#   make images-test  that image, the trainer image (PyTorch) and the Redis image the real-node tests run
#                     (ADDRESS=<containerd socket>: also loads the three there)
#   make test-k8s-versions  the Kubernetes suites (and chart_render_test) against the oldest
#                     Kubernetes the chart claims, v1.34.4 (K8S_VERSIONS=...: others); as root.
#                     Not in make test: the first build of a release's tools takes about 20 minutes
#   make format       reformat project code with clang-format
#   make clean        remove build/

FUZZ_SECONDS ?= 30
SHELL := /bin/bash

.PHONY: deps-build deps-quickstart deps-slurm deps-kubernetes check test-layout-check image image-assemble images-test deps build release quickstart demo demo-slurm demo-k8s test test-debug test-asan test-k8s-versions fuzz format format-check layering-check bench-manifest bench-core bench-cachenode bench-auth bench-operator bench-client bench-multihost bench bench-smoke clean

# What each target needs (scripts/install-deps says what is in each group).
deps:
	@scripts/install-deps test

deps-build:
	@scripts/install-deps build

deps-quickstart:
	@scripts/install-deps quickstart

deps-slurm:
	@scripts/install-deps slurm

deps-kubernetes:
	@scripts/install-deps kubernetes

build: deps-build
	cmake --preset debug >/dev/null
	cmake --build --preset debug

release: deps-build
	cmake --preset release >/dev/null
	cmake --build --preset release

# The unit tests (LABELS unit: no process started, no network but loopback
# in process) on the debug build, and the static checks.
check: deps-build format-check layering-check test-layout-check
	cmake --preset debug >/dev/null
	cmake --build --preset debug
	ctest --preset debug -L unit
	@echo "make check: unit tests passed"

test: deps format-check layering-check test-layout-check test-debug bench-smoke test-asan fuzz
	@echo "make test: all suites passed"

# The Kubernetes suites (LABELS kubernetes) run a real control plane built by
# scripts/k8s-tools into ~/.cache/granary: about 13 minutes the first time
# (needs Go >= 1.26), instant afterwards; the debug pass also the real node's
# kubelet and kube-proxy (--node: about 3 minutes more the first time).
# After ctest, scripts/check-test-leftovers fails if a test left a FUSE mount
# (fuse.granary, fuse.granary-slowfs) or a granary-test-* directory behind.
test-debug: deps
	cmake --preset debug >/dev/null
	cmake --build --preset debug
	k8s_bin=$$(scripts/k8s-tools --node) && GRANARY_K8S_BIN=$$k8s_bin ctest --preset debug
	scripts/check-test-leftovers

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan
	k8s_bin=$$(scripts/k8s-tools) && GRANARY_K8S_BIN=$$k8s_bin ctest --preset asan
	scripts/check-test-leftovers

# The Kubernetes suites (control plane and real node) and chart_render_test
# on build/debug against other Kubernetes releases than the default v1.37.2
# that make test runs: the oldest one the chart's kubeVersion claims (the
# oldest minor the Go module proxy serves). Each release's tools are built by
# scripts/k8s-tools --kube-version into a cache directory of their own (about
# 20 minutes the first time here, niced), and GRANARY_KUBE_VERSION makes every
# `scripts/k8s-tools --no-build` a test runs find the same ones.
# Only the debug tree: the release build that `deps` makes is not needed.
K8S_VERSIONS ?= v1.34.4
test-k8s-versions:
	@scripts/install-deps test
	cmake --preset debug >/dev/null
	cmake --build --preset debug
	set -e; for v in $(K8S_VERSIONS); do \
	  k8s_bin=$$(nice -n 10 scripts/k8s-tools --kube-version $$v --node); \
	  echo "make test-k8s-versions: Kubernetes $$v ($$k8s_bin)"; \
	  GRANARY_KUBE_VERSION=$$v GRANARY_K8S_BIN=$$k8s_bin ctest --preset debug -L kubernetes; \
	  GRANARY_KUBE_VERSION=$$v GRANARY_K8S_BIN=$$k8s_bin ctest --preset debug -R '^chart_render_test$$'; \
	  scripts/check-test-leftovers; \
	done
	@echo "make test-k8s-versions: the Kubernetes suites passed on $(K8S_VERSIONS)"

fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz
	scripts/run-fuzzers build/fuzz $(FUZZ_SECONDS)

# No deps: the image builds inside the Dockerfile's own Debian stage; without a
# registry on a Debian base made by debootstrap (scripts/image/build).
image:
	scripts/image/build $(TAG) $(if $(LOAD),--load-containerd)

# The offline recipe: this build's release binaries and their Debian packages.
image-assemble: deps-build
	cmake --preset release >/dev/null
	cmake --build build/release -j2 --target granary-operator granary-cachenode granary-sidecar granary granary_python
	scripts/image/assemble $(if $(LOAD),--load)

# granary, granary-trainer (PyTorch) and granary.local/redis, all offline (scripts/image/test-images).
images-test: deps-build
	cmake --preset release >/dev/null
	cmake --build build/release -j2 --target granary-operator granary-cachenode granary-sidecar granary granary_python
	scripts/image/test-images $(if $(ADDRESS),--address $(ADDRESS))

# Includes and links against the allowed graph of docs/architecture.md.
layering-check: deps-build
	scripts/check-layering

# Every production source tested in its mirrored place (docs/development.md).
test-layout-check:
	scripts/check-test-layout

format-check: deps-build
	scripts/format-check

format: deps-build
	scripts/format-check --fix

quickstart: deps-quickstart release
	/usr/bin/python3 scripts/quickstart $(DIR)

demo: deps-quickstart release
	scripts/demo-staging $(DIR)

demo-slurm: deps-slurm release
	scripts/demo-slurm

demo-k8s: deps-kubernetes release
	KEEP=$(KEEP) scripts/demo-k8s

bench-manifest: release
	build/release/bench/manifest_bench

bench-core: release
	build/release/bench/core_bench

bench-cachenode: release
	build/release/bench/cachenode_bench $(ARGS)

bench-auth: release
	build/release/bench/auth_bench $(ARGS)

# The operator at scale on a real control plane with kwok (docs/benchmarks.md,
# "The operator at scale"): 1,000 fake nodes, 1,000 Datasets in 100
# namespaces and 10 pools. About 15 minutes; figures, no pass condition.
bench-operator: deps-kubernetes build
	GRANARY_K8S_BIN=$$(scripts/k8s-tools) build/debug/tests/integration/kubernetes/granary-operator-load \
	  --datasets 1000 --namespaces 100 --nodes 1000 --pools 10 --seconds 60 \
	  --json build/debug/operator-load.json $(ARGS)

bench-client: deps-quickstart release
	/usr/bin/python3 bench/client_bench.py $(ARGS)

bench-multihost: deps release
	/usr/bin/python3 bench/multihost-benchmark --json build/release/multihost-benchmark.json $(ARGS)

bench: deps release
	/usr/bin/python3 bench/run-benchmark --build-dir build/release --json build/release/benchmark.json $(ARGS)

bench-smoke: deps
	cmake --preset debug >/dev/null
	cmake --build --preset debug
	# The peers' venvs (pinned wheels, cached outside the work tree: Mosaic
	# Streaming and WebDataset's, and the torch 2.x one LitData runs in, which
	# the Python tests use too), so that every contender runs here, exactly
	# once per epoch, as in CI.
	scripts/bench-peers-venv >/dev/null
	scripts/cached-venv client/python/requirements/torch2.txt >/dev/null
	/usr/bin/python3 bench/run-benchmark --small --build-dir build/debug

clean:
	rm -rf build
