FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY queueadmin ./queueadmin
COPY queues ./queues
RUN pip install --no-cache-dir .
COPY . .
# collectstatic needs settings but no database or secrets of the real deployment.
RUN QUEUEADMIN_ENV=development DATABASE_URL=sqlite:////tmp/build.sqlite3 \
    python manage.py collectstatic --noinput -v0
RUN useradd --system --home /app queueadmin && mkdir -p /app/var && chown queueadmin /app/var
USER queueadmin
EXPOSE 8000
CMD ["uvicorn", "queueadmin.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
