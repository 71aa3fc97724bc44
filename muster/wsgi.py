import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "muster.settings")
application = get_wsgi_application()

# before the first request, and with gunicorn's --preload once in its master for all its workers
from muster.warm import warm_up  # noqa: E402

warm_up()
