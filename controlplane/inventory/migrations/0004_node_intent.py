"""Node intent apart from node status (ARCHITECTURE: "intent and observation are separate fields").

``status`` had four values, the operator's DRAINING beside the observed READY, SUSPECT and LOST, so a
draining node that fell silent became LOST and, on its next heartbeat, READY: the drain was
forgotten. ``intent`` (schedulable, cordoned, draining) now holds what the operator wants and
``status`` only what is seen. A DRAINING node becomes intent draining with status ready (liveness
turns it SUSPECT or LOST at its next check if its heartbeats stopped). Backwards, a cordoned or
draining node that is not lost becomes DRAINING again (the old model could not hold both).
"""

from django.db import migrations, models


def intent_from_status(apps, schema_editor):
    Node = apps.get_model("inventory", "Node")
    Node.objects.filter(status="draining").update(intent="draining", status="ready")


def status_from_intent(apps, schema_editor):
    Node = apps.get_model("inventory", "Node")
    Node.objects.exclude(intent="schedulable").exclude(status="lost").update(status="draining")


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0003_devicecalibration'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='intent',
            field=models.CharField(choices=[('schedulable', 'Schedulable'), ('cordoned', 'Cordoned'), ('draining', 'Draining')], default='schedulable', help_text="The operator's word: schedulable, cordoned (no new stages) or draining (emptied). Written only by the cordon, uncordon, drain and undrain actions.", max_length=16),
        ),
        migrations.RunPython(intent_from_status, status_from_intent),
        migrations.AlterField(
            model_name='node',
            name='status',
            field=models.CharField(choices=[('ready', 'Ready'), ('suspect', 'Suspect'), ('lost', 'Lost')], default='ready', help_text='Observed liveness (heartbeats): ready, suspect, lost. Written only by liveness.', max_length=16),
        ),
    ]
