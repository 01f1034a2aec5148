"""The tier policies, stored here and mirrored into Redis where admission applies them."""

from django.core.validators import MinValueValidator
from django.db import models


class TierPolicy(models.Model):
    class Tier(models.TextChoices):
        VIP = "vip", "VIP"
        NORMAL = "normal", "Normal"
        BATCH = "batch", "Batch"

    tier = models.CharField(max_length=16, choices=Tier.choices, primary_key=True)
    bucket_capacity = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Burst one client may send."
    )
    refill_per_s = models.FloatField(
        validators=[MinValueValidator(0.001)], help_text="Messages per second a client regains."
    )
    tier_bucket_capacity = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Burst the whole tier may send."
    )
    tier_refill_per_s = models.FloatField(
        validators=[MinValueValidator(0.001)], help_text="Messages per second the tier regains."
    )
    max_concurrent_per_user = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Unfinished requests one client may have."
    )
    max_queued = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Longest the tier's queue may grow."
    )
    wait_slo_s = models.FloatField(
        validators=[MinValueValidator(0.1)], help_text="Longest predicted wait still admitted."
    )
    max_wait_s = models.FloatField(
        validators=[MinValueValidator(0.1)], help_text="A queued request older than this expires."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "tier policies"

    def __str__(self) -> str:
        return f"{self.tier} policy"
