# The training image the recipes are tested with, for docker users and registries (NGC Base Command,
# Kubernetes): a NeMo or NGC PyTorch base plus the stack declared in conf/stack.yaml. The container stage
# (python main.py stages=[container]) builds the same image with enroot or Apptainer.
#
#   docker build -t llama31-recipes .
#   docker build --build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:26.06-py3 -t llama31-recipes .
#   air-gapped: put the wheels in ./wheels, then  docker build --build-arg WHEEL_DIR=wheels -t llama31-recipes .
#
# `python -m recipes.stack install` installs only what the base lacks or has outside the declared range (it
# never replaces the base's torch), so a base that already has the stack is left as it is. The labels name
# the declared versions (a test keeps them equal to conf/stack.yaml): `docker inspect` shows them.
ARG BASE_IMAGE=nvcr.io/nvidia/nemo:25.09
FROM ${BASE_IMAGE}
ARG WHEEL_DIR=
LABEL org.opencontainers.image.title="Llama 3.1 pretraining recipes" \
      io.llama31-recipes.megatron-core="0.19.2" \
      io.llama31-recipes.transformer-engine="2.20.2" \
      io.llama31-recipes.torch-tested="2.11.0" \
      io.llama31-recipes.python-tested="3.12"
COPY . /opt/llama31-recipes
WORKDIR /opt/llama31-recipes
RUN python -m recipes.stack install ${WHEEL_DIR:+--wheel-dir /opt/llama31-recipes/$WHEEL_DIR}

