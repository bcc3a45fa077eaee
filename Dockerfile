# syntax=docker/dockerfile:1
# ghcr.io/rolloutpool/rolloutpool:<version> — one image for the operator, the session router and
# the engine simulator (`rolloutpool operator|router|engine-sim ...`; pods set the command).
#
#   docker build -t registry.example.com/ml/rolloutpool:0.1.0 .      (then push; the README's install)
#   rolloutpool image build [--archive F]     (no Docker engine: buildah, as root; what CI builds)
#
# PYTHON_IMAGE names another base with Python 3.11, pip and venv: CI builds on one made from
# Debian packages (rolloutpool.dev.image.base) and runs the result as the chart's pods do.
#
# It installs the [operator,router] extras only: engine-sim needs nothing beyond the router's
# packages (aiohttp, prometheus_client), so the simulated engines of the chart and the demo run
# this same image. The simulator and plots ([sim]: numpy, matplotlib) and the dev tools ([dev])
# are not in it; their commands say which extra to install.
#
# Stage 1 builds wheels of this project and its dependencies; stage 2 installs them into a
# virtualenv on a clean base, with no compiler, no pip cache and no build context left behind.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN python -m pip wheel --wheel-dir /wheels ".[operator,router]"

FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/rolloutpool/bin:$PATH \
    HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/rolloutpool \
    && /opt/rolloutpool/bin/pip install --no-index --find-links=/wheels "rolloutpool[operator,router]" \
    && groupadd --gid 65532 rolloutpool \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp \
       --shell /usr/sbin/nologin rolloutpool
# Numeric user so runAsNonRoot can verify it without resolving /etc/passwd.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["rolloutpool"]
CMD ["--help"]

LABEL org.opencontainers.image.title="rolloutpool" \
      org.opencontainers.image.description="RolloutPool operator, session router and engine simulator for vLLM RL-rollout fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
