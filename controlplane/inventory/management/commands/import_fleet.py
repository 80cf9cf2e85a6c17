"""``python manage.py import_fleet FILE``: declare nodes, devices and links from a fleet file."""

from django.core.management.base import BaseCommand, CommandError

from contracts.fleet_file import FleetFileError, load_fleet_file
from controlplane.inventory.services import fleet_import


class Command(BaseCommand):
    help = "Import a fleet file (YAML or JSON; see docs/fleet-file.md). Importing it again updates in place."

    def add_arguments(self, parser):
        parser.add_argument("file", help="path of the fleet file")

    def handle(self, *args, **options):
        try:
            fleet = load_fleet_file(options["file"])
        except FleetFileError as exc:
            raise CommandError(str(exc)) from None
        result = fleet_import(fleet=fleet)
        self.stdout.write(self.style.SUCCESS(str(result)))
