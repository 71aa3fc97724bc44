FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 MUSTER_DATA_DIR=/data
RUN apt-get update && apt-get install -y --no-install-recommends openssh-client && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
# Installed as root, run as `muster`: a process that breaks out of Muster cannot change the image's code.
RUN pip install --no-cache-dir -e . \
    && useradd --system --uid 10001 --no-create-home --home-dir /data muster \
    && mkdir -p /data && chown muster:muster /data && chmod 0700 /data
USER muster
EXPOSE 8000
CMD ["gunicorn", "muster.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2", "--preload"]
