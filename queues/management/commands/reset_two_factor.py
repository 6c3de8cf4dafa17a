from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from queues.management.arguments import text
from queues.permissions import two_factor_installed


class Command(BaseCommand):
    help = ("Turn two-factor login off for a user who lost their authenticator and recovery "
            "codes (audited); they sign in with their password and may set up a new one. For "
            "when no Admin can sign in to reset it from Django's admin site.")

    def add_arguments(self, parser):
        parser.add_argument("username", type=text)

    def handle(self, *args, username, **options):
        if not two_factor_installed():
            raise CommandError("django-otp is not installed in this project.")
        from queues.engine import two_factor

        user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: username}
                                               ).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if two_factor.authenticator(user) is None:
            raise CommandError(f"{username!r} has no authenticator")
        two_factor.remove(user, actor="command:reset_two_factor")
        self.stdout.write(f"two-factor login reset for {username!r}")
