from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("models_catalog", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="llmmodel",
            name="quality",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="Measured by profile_quality: perplexities and per-layer KL at int8/int4; empty if never.",
            ),
        ),
    ]
