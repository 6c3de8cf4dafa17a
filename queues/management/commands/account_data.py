import sys

from django.core.management.base import BaseCommand, CommandError

from queues.engine import accounts, audit


class Command(BaseCommand):
    help = ("One tenant account's data on every queue: its counts, --export (JSON lines to "
            "standard output) or --erase (items with their attempts, events and dead letters; "
            "running items are left to finish). Audited.")

    def add_arguments(self, parser):
        # Checked in handle(): a padded name an earlier release stored is taken while it holds
        # data (accounts.refusal), which needs the database.
        parser.add_argument("account")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--export", action="store_true")
        action.add_argument("--erase", action="store_true")
        parser.add_argument("--yes", action="store_true", help="erase without asking")

    def handle(self, *args, account, export, erase, yes, **options):
        if why := accounts.refusal(account):
            raise CommandError(f"account: {why}")
        footprint = accounts.footprint(account)
        if export:
            audit.record("command:account_data", "account.export", target=f"account {account}")
            for line in accounts.export_lines(account):
                sys.stdout.write(line)
            return
        for what, n in footprint.items():
            self.stderr.write(f"{what}: {n}")
        if not erase:
            return
        if not yes and input(f"Erase all of {account!r}? Type the account to confirm: ") != account:
            raise CommandError("not erased")
        erased = accounts.erase(account, actor="command:account_data")
        for what, n in erased.items():
            self.stdout.write(f"erased {what}: {n:,}")
