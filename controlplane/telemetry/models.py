"""Stored telemetry: 10-second rollups of every GPU and stage, kept ``MOTLEY_TELEMETRY_RETENTION_HOURS``.

Raw per-second samples stay in memory only (``hub.TelemetryHub``, the last few minutes); an hour
of 1,000 GPUs at one row per 10 s is 360,000 small rows, which SQLite and PostgreSQL both handle.
"""

from django.db import models


class TelemetryRollup(models.Model):
    class Kind(models.TextChoices):
        DEVICE = "device", "Device"
        STAGE = "stage", "Stage"

    kind = models.CharField(max_length=8, choices=Kind.choices)
    key = models.CharField(max_length=200, help_text="Device name <node>/gpu<i>, or a stage key.")
    bucket_start = models.DateTimeField()
    seconds = models.PositiveSmallIntegerField()
    samples = models.PositiveIntegerField()
    mean = models.JSONField(help_text="Mean of each field over the bucket.")
    peak = models.JSONField(help_text="Largest value of each field over the bucket.")

    class Meta:
        ordering = ["kind", "key", "bucket_start"]
        constraints = [
            # Every server process's hub sees every heartbeat (service mode): the same bucket is
            # written once, whoever writes it first.
            models.UniqueConstraint(fields=["kind", "key", "bucket_start"], name="rollup_unique_bucket"),
        ]
        indexes = [models.Index(fields=["bucket_start"], name="rollup_bucket_start")]

    def __str__(self) -> str:
        return f"{self.kind} {self.key} @ {self.bucket_start:%H:%M:%S}"
