# One image for both daemons (docs/deploy.md#6-containers). With docker or podman:
#   podman build --format docker -t hetero .                   # CPU torch, python:3.12-slim
#   podman build --format docker -t hetero --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu124 .
#   podman run -d --network host -v hetero-coord:/var/lib/hetero -e HETERO_TOKEN hetero coordinator
#   podman run -d --network host --device nvidia.com/gpu=all -v hetero-agent:/var/lib/hetero \
#       -e HETERO_TOKEN -e HETERO_COORDINATOR=10.0.0.1:7070 hetero agent
# --network host: torch.distributed ranks on different hosts connect to each other on
# ephemeral ports, which a bridged network would hide (compose.yaml runs a one-host demo on
# a bridge, where every container reaches every other). --format docker keeps the
# HEALTHCHECK (the OCI image format has none).
#
# Offline (no registry, no index), as `make image` does: a Debian base made with debootstrap
# and `podman import`, and every wheel from a wheelhouse of the base's Python:
#   --build-arg PYTHON_IMAGE=localhost/hetero-base:bookworm \
#   --build-arg PIP_ARGS="--no-index --find-links /src/wheelhouse/py3.11" --build-arg HETERO_SPEC='hetero[train]'
# Both daemons in one image: the agent's ranks train, so torch comes too (the train extra).
ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_ARGS=""
ARG HETERO_SPEC=/src[train]
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . /src
# python3, not python: Debian's interpreter has no `python` name; python:*-slim has both.
# Then PyTorch's own C++ test programs go (torch/test, torch/bin/*Test and test_*: about
# 130 MB that nothing here runs); torch/include stays for C++ extensions and torch.compile.
RUN python3 -m venv /opt/hetero/venv \
 && /opt/hetero/venv/bin/pip install --extra-index-url "${TORCH_INDEX_URL}" ${PIP_ARGS} "${HETERO_SPEC}" \
 && torch=$(/opt/hetero/venv/bin/python -c 'import importlib.util as u; print(u.find_spec("torch").submodule_search_locations[0])') \
 && rm -rf "$torch/test" \
 && find "$torch/bin" -type f \( -name '*Test' -o -name 'test_*' \) -delete

FROM ${PYTHON_IMAGE}
RUN groupadd --system hetero \
 && useradd --system --gid hetero --home-dir /var/lib/hetero --shell /usr/sbin/nologin hetero \
 && mkdir -p /var/lib/hetero /etc/hetero \
 && chown hetero:hetero /var/lib/hetero
COPY --from=build /opt/hetero/venv /opt/hetero/venv
COPY docker/entrypoint.sh /usr/local/bin/hetero-entrypoint
# HETERO_STATE_DIR: daemons and clients in the container agree on the state directory,
# so `hetero-coord health` finds the token a coordinator generated there.
ENV PATH=/opt/hetero/venv/bin:$PATH PYTHONUNBUFFERED=1 HETERO_STATE_DIR=/var/lib/hetero
USER hetero
WORKDIR /var/lib/hetero
VOLUME ["/var/lib/hetero"]
# 7070: coordinator gRPC. The agent's AgentLocal (7071) is for its own ranks only.
EXPOSE 7070
# gRPC health (grpc.health.v1): the coordinator's own, or in an agent's container the
# coordinator it reports to (the agent is PID 1: if it dies, the container stops).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["hetero-entrypoint", "health"]
ENTRYPOINT ["hetero-entrypoint"]
CMD ["agent"]
