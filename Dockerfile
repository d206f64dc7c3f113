# syntax=docker/dockerfile:1
# cronwell image: one image for every process; ENTRYPOINT is `cronwell`, the chart passes
#   operator | scheduler | worker --pool NAME [--import MODULE] | migrate
# (`operator` and `worker` are commands the operator and worker packages register through
# the `cronwell.cli` entry points; the build checks they are there). `kubectl-cronwell`,
# installed by the same wheel, is a kubectl plugin for users' machines: nothing runs it here.
# Ports: 9090 /metrics (every process), 9443 the operator's admission webhook (HTTPS).
# Build: make docker-build IMG_REPO=registry.example/cronwell IMG_TAG=0.1.0
# Without Docker or a registry: make image (hack/build-image.sh: buildah over a Debian
# bookworm base from debootstrap, passed as BASE_IMAGE). The stages therefore use only what
# both bases have: python3 with venv, useradd.
#
# Handler code (`--import MODULE`) goes in an image built FROM this one; /app is the working
# directory and on PYTHONPATH, so a module copied there imports by name:
#   FROM registry.example/cronwell:0.1.0
#   USER root
#   COPY requirements.txt /tmp/requirements.txt
#   RUN pip install --no-cache-dir -r /tmp/requirements.txt   # the handlers' own dependencies
#   USER 10001:10001
#   COPY --chown=10001:10001 myhandlers/ /app/myhandlers/
# and run `cronwell worker --pool NAME --import myhandlers` (chart: worker.pools[].imports).

# checkov:skip=CKV_DOCKER_2: Kubernetes ignores HEALTHCHECK; the chart's probes check /metrics
# checkov:skip=CKV_DOCKER_7: FROM ${BASE_IMAGE}, whose default below has a version tag

# Any Debian bookworm with Python 3.11 as `python3` (and its venv module) will do.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- builder: wheels for cronwell and every dependency --------------------------------
FROM ${BASE_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cronwell/ cronwell/
COPY operator/ operator/
COPY worker/ worker/
# A venv for pip: Debian's python3 has no pip of its own (the official image's would do).
RUN python3 -m venv /opt/build && /opt/build/bin/pip wheel --wheel-dir /wheels .

# ---- runtime: a virtualenv with the wheels, run as an unprivileged user -----------------
FROM ${BASE_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/cronwell \
    PATH=/opt/cronwell/bin:$PATH \
    PYTHONPATH=/app \
    HOME=/tmp
RUN groupadd --gid 10001 cronwell \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin cronwell \
 && python3 -m venv /opt/cronwell \
 && mkdir -p /app \
 && chown 10001:10001 /app
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    /opt/cronwell/bin/pip install --no-index --find-links=/wheels cronwell \
 && for c in operator scheduler worker migrate; do \
      /opt/cronwell/bin/cronwell "$c" --help > /dev/null || exit 1; done
WORKDIR /app
# Numeric, so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
USER 10001:10001
EXPOSE 9090 9443
ENTRYPOINT ["cronwell"]
CMD ["--help"]
