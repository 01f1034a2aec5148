"""`python manage.py seed_demo`: the demo accounts (normal, VIP, staff), created or reset."""

from django.core.management.base import BaseCommand

from chat.models import User
from scheduler.generation import Tier

DEMO_ACCOUNTS = [
    # username, password, tier, staff
    ("alice", "alice-demo-pass", Tier.NORMAL, False),
    ("victor", "victor-demo-pass", Tier.VIP, False),
    ("sam", "sam-demo-pass", Tier.NORMAL, True),
]


class Command(BaseCommand):
    help = "Create the demo accounts and print their credentials."

    def handle(self, *args, **options) -> None:
        self.stdout.write("Demo accounts (sign in at /accounts/login/):")
        for username, password, tier, staff in DEMO_ACCOUNTS:
            user, _ = User.objects.get_or_create(username=username)
            user.tier = tier
            user.is_staff = user.is_superuser = staff
            user.set_password(password)
            user.save()
            role = "staff (console)" if staff else f"{tier} tier"
            self.stdout.write(f"  {username:<8} / {password:<18} {role}")
