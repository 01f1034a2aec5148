"""The account model: a customer or staff member, with the service tier they are served at."""

from django.contrib.auth.models import AbstractUser
from django.db import models

from scheduler.generation import Tier

# A customer's tier; batch is the tier of batch jobs, not of accounts.
ACCOUNT_TIERS = (Tier.NORMAL, Tier.VIP)
ACCOUNT_TIER_CHOICES = [(tier.value, tier.label) for tier in ACCOUNT_TIERS]


class User(AbstractUser):
    tier = models.CharField(max_length=16, choices=ACCOUNT_TIER_CHOICES, default=Tier.NORMAL)

    class Meta(AbstractUser.Meta):
        # The model began in the chat app; its table kept that app's name.
        db_table = "chat_user"

    @property
    def is_vip(self) -> bool:
        return self.tier == Tier.VIP
