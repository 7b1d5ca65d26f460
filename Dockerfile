# syntax=docker/dockerfile:1
# mutwo images. Targets:
#   server      mutwo-server + the mutwo CLI (CPU only; no LibTorch)
#   worker-cpu  mutwo-worker serve on the CPU (Debian's LibTorch 1.13)
#   worker-gpu  mutwo-worker serve on one NVIDIA GPU (nvidia/cuda runtime base,
#               LibTorch from pip's CUDA PyTorch wheel)
#
#   docker build --target server     -t mutwo-server .
#   docker build --target worker-cpu -t mutwo-worker-cpu .
#   docker build --target worker-gpu -t mutwo-worker-gpu .
#   docker build --target server --build-arg RUN_TESTS=1 .   # + the test suite
#   scripts/build-images.sh    # no Docker, no registry: buildah, debootstrap base
#
# Every build stage runs scripts/bootstrap.sh, the script CI runs (through
# scripts/test.sh): one recipe for the packages and the build. The runtime
# stages install the libraries the built binaries link, as listed by
# deploy/docker/runtime-libs.sh from the binaries themselves. docs/deploy.md
# has ports, volumes and flags.

ARG DEBIAN_IMAGE=debian:bookworm
ARG DEBIAN_RUNTIME_IMAGE=debian:bookworm-slim
# The GPU combination the project checks on its GPU machine: Ubuntu 24.04,
# CUDA 13, PyTorch 2.11 (cu130 wheel).
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
# NVIDIA's apt repository for Debian 12 (the CUDA toolkit that find_package(Torch)
# needs to configure against a CUDA LibTorch; only in the build stage).
ARG CUDA_APT_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
ARG CUDA_TOOLKIT_PACKAGE=cuda-toolkit-13-0

# ---------------------------------------------------------------------------
# build: Debian bookworm, scripts/bootstrap.sh (apt packages + CMake build).
# ---------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build
ARG RUN_TESTS=0
# Parallel compile jobs; empty: one per CPU of the build host.
ARG JOBS=
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# The packages in a layer of their own, before the sources: a source change
# rebuilds from the COPY below, not the apt install.
COPY scripts/bootstrap.sh scripts/
RUN scripts/bootstrap.sh --packages-only
COPY . .
RUN set -eux; \
    export BUILD_DIR=/src/build-docker JOBS="${JOBS:-$(nproc)}"; \
    if [ "${RUN_TESTS}" = 1 ]; then scripts/test.sh; \
    else CMAKE_ARGS="-DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF" scripts/bootstrap.sh; fi; \
    mkdir -p /out/bin; \
    cp build-docker/bin/mutwo-server build-docker/bin/mutwo build-docker/bin/mutwo-worker /out/bin/; \
    deploy/docker/runtime-libs.sh packages /out/bin/mutwo-server /out/bin/mutwo > /out/server.packages; \
    deploy/docker/runtime-libs.sh packages /out/bin/mutwo-worker /out/bin/mutwo > /out/worker-cpu.packages; \
    cat /out/server.packages /out/worker-cpu.packages

# ---------------------------------------------------------------------------
# build-gpu: the same bootstrap, with find_package(Torch) pointed at the
# LibTorch inside pip's CUDA PyTorch (as on the GPU machine:
# CMAKE_PREFIX_PATH=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')).
# ---------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build-gpu
ARG TORCH_VERSION
ARG TORCH_INDEX_URL
ARG CUDA_APT_REPO
ARG CUDA_TOOLKIT_PACKAGE
ENV DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends ca-certificates curl gnupg python3-venv python3-pip; \
    curl -fsSL "${CUDA_APT_REPO}/3bf863cc.pub" | gpg --dearmor -o /usr/share/keyrings/cuda.gpg; \
    echo "deb [signed-by=/usr/share/keyrings/cuda.gpg] ${CUDA_APT_REPO}/ /" > /etc/apt/sources.list.d/cuda.list; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends "${CUDA_TOOLKIT_PACKAGE}"; \
    python3 -m venv /opt/torch; \
    /opt/torch/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"; \
    rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH} CUDA_HOME=/usr/local/cuda
WORKDIR /src
COPY . .
ARG JOBS=
RUN set -eux; \
    torch_prefix="$(/opt/torch/bin/python -c 'import torch;print(torch.utils.cmake_prefix_path)')"; \
    BUILD_DIR=/src/build-gpu JOBS="${JOBS:-$(nproc)}" \
      CMAKE_ARGS="-DMUTWO_BUILD_TESTS=OFF -DMUTWO_BUILD_BENCH=OFF -DMUTWO_WITH_CUDA=ON -DCMAKE_PREFIX_PATH=${torch_prefix}" \
      scripts/bootstrap.sh; \
    mkdir -p /out/bin /out/lib; \
    cp build-gpu/bin/mutwo-worker build-gpu/bin/mutwo /out/bin/; \
    RUNTIME_LIBS_SKIP=/opt/torch deploy/docker/runtime-libs.sh copy /out/lib /out/bin/mutwo-worker /out/bin/mutwo; \
    ls /out/lib; \
    site="$(/opt/torch/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')"; \
    mkdir -p "/out/torch${site}/torch"; \
    cp -a "${site}/torch/lib" "/out/torch${site}/torch/"; \
    for d in "${site}"/nvidia*; do [ ! -d "$d" ] || cp -a "$d" "/out/torch${site}/"; done

# ---------------------------------------------------------------------------
# Runtime stages: non-root uid 1000, tini as PID 1 (signals and zombies),
# SIGTERM drains, data under a volume.
# ---------------------------------------------------------------------------
FROM ${DEBIAN_RUNTIME_IMAGE} AS server
COPY --from=build /out/server.packages /tmp/runtime.packages
RUN set -eux; \
    apt-get update -qq; \
    xargs -a /tmp/runtime.packages apt-get install -y -qq --no-install-recommends tini ca-certificates; \
    rm -rf /var/lib/apt/lists/* /tmp/runtime.packages; \
    useradd --uid 1000 --user-group --home-dir /var/lib/mutwo --no-create-home --shell /usr/sbin/nologin mutwo; \
    install -d -o 1000 -g 1000 -m 0750 /var/lib/mutwo
COPY --from=build /out/bin/mutwo-server /out/bin/mutwo /usr/local/bin/
USER 1000:1000
WORKDIR /var/lib/mutwo
VOLUME ["/var/lib/mutwo"]
# 50051 gRPC (Planner, WorkerHub, grpc.health.v1, reflection); 9464 /metrics
EXPOSE 50051 9464
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["mutwo", "health", "--server=127.0.0.1:50051", "--tls_ca=/etc/mutwo/tls/ca.crt", "--timeout_ms=3000"]
ENTRYPOINT ["/usr/bin/tini", "--", "mutwo-server"]
# Tokens and TLS from files mounted at /etc/mutwo (deploy/gen-auth.sh makes
# them; docs/deploy.md): without them the server refuses to start.
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--data_dir=/var/lib/mutwo", "--auth_tokens_file=/etc/mutwo/auth/tokens.txt", "--tls_cert=/etc/mutwo/tls/tls.crt", "--tls_key=/etc/mutwo/tls/tls.key"]

FROM ${DEBIAN_RUNTIME_IMAGE} AS worker-cpu
COPY --from=build /out/worker-cpu.packages /tmp/runtime.packages
RUN set -eux; \
    apt-get update -qq; \
    xargs -a /tmp/runtime.packages apt-get install -y -qq --no-install-recommends tini ca-certificates curl; \
    rm -rf /var/lib/apt/lists/* /tmp/runtime.packages; \
    useradd --uid 1000 --user-group --home-dir /var/lib/mutwo-worker --no-create-home --shell /usr/sbin/nologin mutwo; \
    install -d -o 1000 -g 1000 -m 0750 /var/lib/mutwo-worker
COPY --from=build /out/bin/mutwo-worker /out/bin/mutwo /usr/local/bin/
USER 1000:1000
WORKDIR /var/lib/mutwo-worker
VOLUME ["/var/lib/mutwo-worker"]
# 9465 /metrics of the worker
EXPOSE 9465
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:9465/metrics"]
ENTRYPOINT ["/usr/bin/tini", "--", "mutwo-worker", "serve"]
CMD ["--server=mutwo-server:50051", "--device=cpu", "--metrics_listen=0.0.0.0:9465", "--work_dir=/var/lib/mutwo-worker"]

FROM ${CUDA_RUNTIME_IMAGE} AS worker-gpu
ENV DEBIAN_FRONTEND=noninteractive
RUN set -eux; \
    apt-get update -qq; \
    apt-get install -y -qq --no-install-recommends tini ca-certificates curl; \
    rm -rf /var/lib/apt/lists/*; \
    if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi; \
    useradd --uid 1000 --user-group --home-dir /var/lib/mutwo-worker --no-create-home --shell /usr/sbin/nologin mutwo; \
    install -d -o 1000 -g 1000 -m 0750 /var/lib/mutwo-worker
# LibTorch's libraries (and the CUDA libraries of the wheel's nvidia-*
# dependencies) at the paths the binary was linked against (its RUNPATH, and
# libtorch's own $ORIGIN-relative RUNPATH); the bookworm libraries beside.
COPY --from=build-gpu /out/torch/ /
COPY --from=build-gpu /out/lib /opt/mutwo/lib
COPY --from=build-gpu /out/bin/mutwo-worker /out/bin/mutwo /usr/local/bin/
# The bookworm libraries fill in what Ubuntu lacks (the conf file sorts
# after the system's, so a library both have comes from Ubuntu). Every
# library must resolve now, except the CUDA driver's (mounted at run time).
RUN set -eux; \
    echo /opt/mutwo/lib > /etc/ld.so.conf.d/zz-mutwo.conf; \
    ldconfig; \
    for b in /usr/local/bin/mutwo-worker /usr/local/bin/mutwo; do \
      if ldd "$b" | grep "not found" | grep -v "libcuda.so"; then exit 1; fi; \
    done
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 1000:1000
WORKDIR /var/lib/mutwo-worker
VOLUME ["/var/lib/mutwo-worker"]
EXPOSE 9465
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:9465/metrics"]
ENTRYPOINT ["/usr/bin/tini", "--", "mutwo-worker", "serve"]
CMD ["--server=mutwo-server:50051", "--device=cuda:0", "--metrics_listen=0.0.0.0:9465", "--work_dir=/var/lib/mutwo-worker"]
