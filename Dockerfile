# The one qshare image: every service (allocator, API and scheduler extender, preemptor,
# node agent), the C driver's cffi module, the CUDA interposer and the migrations. The
# Kubernetes manifests run it with a command per container (image `qshare` in
# deploy/kubernetes/kustomization.yaml). Build from the repository root:
#   docker build -t ghcr.io/qshare/qshare:0.1.0 .
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc make libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md Makefile ./
COPY services ./services
COPY native ./native
RUN pip install --no-cache-dir cffi setuptools wheel \
    && make image-install PYTHON=python IMAGE_ROOT=/image

FROM python:3.11-slim
COPY --from=build /image/ /
WORKDIR /app
COPY alembic.ini ./
COPY migrations ./migrations
# The allocator's `migrate` (its init container) reads this; the root filesystem is
# read-only in the manifests, so no bytecode is written at run time (pip compiled it).
ENV QSHARE_ALEMBIC_INI=/app/alembic.ini PYTHONDONTWRITEBYTECODE=1
# Root by default: the node agent needs it; the manifests run the control plane as 10001.
CMD ["qshare", "--help"]
