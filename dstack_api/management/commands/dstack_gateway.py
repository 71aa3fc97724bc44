"""The SSH gateway for the dstack CLI (dstack_api/gateway/): `muster serve` runs it as a child,
docker-compose.yml as a service."""

from django.core.management.base import BaseCommand

from dstack_api.gateway import server


class Command(BaseCommand):
    help = "Serve the SSH gateway the dstack CLI follows logs and forwards ports through."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=None, help="host:port (default: MUSTER_DSTACK_SSH_BIND)")
        parser.add_argument("--known-hosts", default=None, metavar="HOST:PORT",
                            help="print the known_hosts line for the gateway as the CLI dials it, and exit")

    def handle(self, *args, bind=None, known_hosts=None, **options):
        from django.conf import settings

        if known_hosts:
            host, _, port = known_hosts.rpartition(":")
            self.stdout.write(server.known_hosts_line(host, int(port)))
            return
        server.serve(bind or settings.MUSTER["DSTACK_SSH_BIND"])
