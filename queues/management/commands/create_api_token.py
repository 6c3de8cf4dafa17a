from django.core.management.base import BaseCommand, CommandError

from queues.engine import tokens
from queues.management.arguments import text
from queues.models import ApiToken


class Command(BaseCommand):
    help = ("Create a bearer token for the JSON API, scoped to queues; the secret is printed "
            "once and stored only as a digest. --revoke NAME revokes tokens by name instead.")

    def add_arguments(self, parser):
        parser.add_argument("name", type=text)
        parser.add_argument("--queue", action="append", default=[], dest="queues", type=text,
                            help="a queue key the token may use (repeat for several)")
        parser.add_argument("--all-queues", action="store_true",
                            help="let the token use every queue, including future ones")
        parser.add_argument("--scope", action="append", default=[], dest="scopes",
                            choices=tokens.SCOPES,
                            help="what the token may do (repeat for several; default enqueue): "
                                 "enqueue and read, operate (bulk retry, cancel, replay; "
                                 "pause), purge (delete failed items)")
        parser.add_argument("--revoke", action="store_true",
                            help="revoke the live tokens with this name")

    def handle(self, *args, name, queues, all_queues, scopes, revoke, **options):
        if revoke:
            revoked = [token for token in ApiToken.objects.filter(name=name, revoked_at=None)
                       if tokens.revoke(token, actor="command:create_api_token")]
            if not revoked:
                raise CommandError(f"no live token named {name!r}")
            self.stdout.write(f"revoked {len(revoked)} token(s) named {name!r}")
            return
        try:
            token, secret = tokens.create(name, queue_keys=queues, all_queues=all_queues,
                                          scopes=scopes or [tokens.ENQUEUE],
                                          actor="command:create_api_token")
        except tokens.TokenError as exc:
            raise CommandError(str(exc)) from None
        scope = "all queues" if all_queues else ", ".join(sorted(queues))
        self.stderr.write(f"token {token.pk} {token.name!r} for {scope}, may "
                          f"{', '.join(token.scopes)}; "
                          "store it now, it cannot be shown again:")
        self.stdout.write(secret)
