FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY queueadmin ./queueadmin
COPY queues ./queues
RUN pip install --no-cache-dir ".[server]"
COPY . .
# collectstatic with production settings, so that WhiteNoise's compressed, hashed files and
# their manifest exist; it needs no database, and the key below signs nothing.
RUN QUEUEADMIN_ENV=production ALLOWED_HOSTS=build DATABASE_URL=sqlite:////tmp/build.sqlite3 \
    SECRET_KEY=build-only-key-never-used-to-sign-anything-0123456789abcdef \
    python manage.py collectstatic --noinput -v0
RUN useradd --system --home /app queueadmin && mkdir -p /app/var && chown queueadmin /app/var
USER queueadmin
EXPOSE 8000
CMD ["uvicorn", "queueadmin.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
