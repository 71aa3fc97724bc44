"""What a web process loads before it serves, so that no client's request pays for it.

Left to the first request, each web process paid about 0.2 s on its first request (the URLconf and
every view module), 0.2 s more on its first plan (the configuration parser and its models) and
0.3-0.4 s on its first apply (Celery importing every task module before it could send job 0's
message), and a fleet's first plan the import of its backend (0.35 s for the TPU backend's Google
client): measured over HTTP, every gunicorn worker's first plan and first apply took 230-490 ms
against 17-30 ms after. A worker gunicorn replaces (a crash, a timeout) paid it again.

Nothing here touches the database or the broker: gunicorn runs this in its master with `--preload`
and forks the workers from it, and a connection opened before the fork would be shared by all of them.
"""

from __future__ import annotations


def warm_up() -> None:
    from django.urls import get_resolver

    from backends.registry import load_every_backend
    from muster.celery import app as celery_app

    # the URLconf imports every view module, and with them the services and the configuration's
    # parser they call; reverse() builds the lookup tables a resolve walks
    get_resolver().reverse_dict  # noqa: B018

    # what engine.messages would import on the first send (engine.tasks, the app's `imports`)
    celery_app.loader.import_default_modules()
    celery_app.finalize(auto=True)  # binds every task to the app, which the first send would do
    celery_app.amqp.router  # noqa: B018  (the queues and the router a send looks up)
    with celery_app.connection_for_write() as conn:
        conn.transport  # noqa: B018  (imports the broker's transport; connects nowhere yet)
    # every backend a fleet may name (the registry imports each on its first use)
    load_every_backend()
