# warmslot on NVIDIA GPUs: llama-cpp-python built with CUDA.
#   docker build -t warmslot .
#   docker run --gpus all -p 8080:8080 -v /path/to/models:/models warmslot -m /models/model.gguf
ARG CUDA_VERSION=12.6.3

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/warmslot
RUN python3 -m venv $VIRTUAL_ENV
ENV PATH=$VIRTUAL_ENV/bin:$PATH
# build llama-cpp-python for the common data-center and desktop GPU generations
ARG CUDA_ARCHITECTURES="75;80;86;89;90"
ENV CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}"
# the driver's libcuda is only present at run time; link against the stub while building
ENV LDFLAGS="-L/usr/local/cuda/lib64/stubs"
RUN ln -s /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/lib64/stubs/libcuda.so.1 \
    && LD_LIBRARY_PATH=/usr/local/cuda/lib64/stubs pip install --no-cache-dir llama-cpp-python==0.3.36
WORKDIR /src
COPY pyproject.toml README.md ./
COPY server ./server
COPY slots ./slots
COPY cache ./cache
RUN pip install --no-cache-dir .

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 libgomp1 \
    && rm -rf /var/lib/apt/lists/*
ENV VIRTUAL_ENV=/opt/warmslot
COPY --from=build /opt/warmslot /opt/warmslot
ENV PATH=$VIRTUAL_ENV/bin:$PATH \
    WARMSLOT_HOST=0.0.0.0 \
    WARMSLOT_PORT=8080
RUN useradd --create-home --uid 10001 warmslot && mkdir -p /models && chown warmslot /models
USER warmslot
# mount your GGUF files here and pass -m /models/<file>.gguf
VOLUME ["/models"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s CMD python3 -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/health').status != 200)"
ENTRYPOINT ["warmslot"]
