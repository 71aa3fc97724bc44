FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 MUSTER_DATA_DIR=/data
RUN apt-get update && apt-get install -y --no-install-recommends openssh-client && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir -e . && mkdir -p /data
EXPOSE 8000
CMD ["gunicorn", "muster.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2"]
