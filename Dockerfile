# tierbroker's image: `docker compose up` builds it for docker-compose.yml's brokers.
# The wheel is built with a C compiler (the produce path's record walk), then installed
# into a slim runtime image with nothing else.
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY tierbroker ./tierbroker
COPY protocol ./protocol
COPY storage ./storage
COPY rlm ./rlm
COPY broker ./broker
COPY pipeline ./pipeline
COPY testing ./testing
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
RUN useradd --system --create-home tierbroker \
    && mkdir -p /var/lib/tierbroker && chown tierbroker /var/lib/tierbroker
USER tierbroker
VOLUME /var/lib/tierbroker
EXPOSE 9092 9404
CMD ["tierbroker", "serve", "--override", "listeners=PLAINTEXT://0.0.0.0:9092", "--override", "log.dirs=/var/lib/tierbroker"]
