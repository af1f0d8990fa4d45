# One image for both daemons:
#   docker build -t hetero .                                   # CPU torch
#   docker build -t hetero --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 .
#   docker run -d --network host -v hetero-coord:/var/lib/hetero hetero coordinator
#   docker run -d --network host --gpus all -v hetero-agent:/var/lib/hetero hetero agent \
#       --coordinator 10.0.0.1:7070
# --network host: torch.distributed ranks on different nodes connect to each other on
# ephemeral ports, which a bridged network would hide. See docs/deploy.md.
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Air-gapped: `make wheelhouse PY=3.12` (plus the torch/torchvision wheels you use) into
# ./wheelhouse/py3.12, then build with
#   --build-arg PIP_ARGS="--no-index --find-links /src/wheelhouse/py3.12" --build-arg HETERO_SPEC=hetero
ARG PIP_ARGS=""
ARG HETERO_SPEC=/src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . /src
RUN python -m venv /opt/hetero/venv \
 && /opt/hetero/venv/bin/pip install --extra-index-url "${TORCH_INDEX_URL}" ${PIP_ARGS} "${HETERO_SPEC}"

FROM ${PYTHON_IMAGE}
RUN groupadd --system hetero \
 && useradd --system --gid hetero --home-dir /var/lib/hetero --shell /usr/sbin/nologin hetero \
 && mkdir -p /var/lib/hetero /etc/hetero \
 && chown hetero:hetero /var/lib/hetero
COPY --from=build /opt/hetero/venv /opt/hetero/venv
COPY docker/entrypoint.sh /usr/local/bin/hetero-entrypoint
ENV PATH=/opt/hetero/venv/bin:$PATH PYTHONUNBUFFERED=1
USER hetero
WORKDIR /var/lib/hetero
VOLUME ["/var/lib/hetero"]
# 7070: coordinator gRPC. The agent's AgentLocal (7071) is for its own ranks only.
EXPOSE 7070
ENTRYPOINT ["hetero-entrypoint"]
CMD ["agent"]
