# One image for the cache job, the assignment server and the trainer client.
#   docker build -t taskdata .
#   docker run --rm -v "$HOME/.cache/taskdata:/home/taskdata/.cache/taskdata" taskdata cache --task c4_span_corruption
#   docker run --rm -p 8000:8000 -e TASKDATA_SERVER_TOKEN=... taskdata serve --cache-root gs://BUCKET/cache --host 0.0.0.0
#   docker run --rm --entrypoint python taskdata -m trainer_client.example.train --help
FROM python:3.11.7-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Pinned third-party packages first (their own layer, reused while only the code changes): the lock's
# lines for the image, not those of the test tools and the extras the image leaves out.
COPY requirements.lock /tmp/requirements.lock
RUN grep -v '# not in the image$' /tmp/requirements.lock > /tmp/image.lock \
 && pip install --no-deps -r /tmp/image.lock \
 && useradd --create-home --uid 10001 taskdata
WORKDIR /opt/taskdata
COPY pyproject.toml README.md LICENSE ./
COPY taskdata ./taskdata
COPY server ./server
COPY trainer_client ./trainer_client
RUN pip install --no-deps . && rm -rf /opt/taskdata/build

USER 10001
WORKDIR /home/taskdata
ENV TASKDATA_HOME=/home/taskdata/.cache/taskdata

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
ENTRYPOINT ["taskdata"]
CMD ["--help"]
