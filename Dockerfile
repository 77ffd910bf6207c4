# The controller image (web and worker): Python 3.11, CPU torch, the project installed in
# place (editable) so settings find templates/, static/ and configs/ next to the code.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# bubblewrap confines the python-sandbox tool (docs/tasks.md, "The sandbox's boundary"); without it
# runs that call the tool are refused. The workers need seccomp and AppArmor lifted for its user
# namespace (docker-compose.yml, docs/controller.md "Production").
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml manage.py ./
COPY learner ./learner
COPY controller ./controller
COPY configs ./configs
COPY templates ./templates
COPY static ./static
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -e ".[distributed]"

# Web and worker run as an unprivileged user that can write only its run directories and its
# model cache, never the code (docs/controller.md, "Production").
RUN useradd --create-home --uid 10001 --user-group thundersync \
    && mkdir -p /data/runs /models \
    && chown thundersync:thundersync /data/runs
ENV THUNDERSYNC_RUN_DIR=/data/runs THUNDERSYNC_MODEL_ROOTS=/models
USER thundersync

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "controller.asgi:application"]
