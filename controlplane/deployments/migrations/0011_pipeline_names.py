"""Names that say what they hold: a physical pipeline is a ``DeploymentPipeline``, a stage's pipeline
index is ``DeploymentStage.pipeline``, and the plan replica either serves is ``plan_replica`` (was
``DeploymentReplica``, ``DeploymentStage.replica`` and ``slot``). Renames only: every row keeps its data."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('deployments', '0010_stage_held'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='deploymentreplica',
            name='replica_unique_index',
        ),
        migrations.RenameModel(
            old_name='DeploymentReplica',
            new_name='DeploymentPipeline',
        ),
        migrations.RenameField(
            model_name='deploymentpipeline',
            old_name='slot',
            new_name='plan_replica',
        ),
        migrations.AlterField(
            model_name='deploymentpipeline',
            name='deployment',
            field=models.ForeignKey(on_delete=models.deletion.CASCADE, related_name='pipelines',
                                    to='deployments.deployment'),
        ),
        migrations.AddConstraint(
            model_name='deploymentpipeline',
            constraint=models.UniqueConstraint(fields=('deployment', 'index'), name='pipeline_unique_index'),
        ),
        migrations.RemoveConstraint(
            model_name='deploymentstage',
            name='stage_unique_wanted',
        ),
        migrations.RenameField(
            model_name='deploymentstage',
            old_name='replica',
            new_name='pipeline',
        ),
        migrations.RenameField(
            model_name='deploymentstage',
            old_name='slot',
            new_name='plan_replica',
        ),
        migrations.AddConstraint(
            model_name='deploymentstage',
            constraint=models.UniqueConstraint(condition=models.Q(('wanted', True)),
                                               fields=('deployment', 'pipeline', 'stage_index'),
                                               name='stage_unique_wanted'),
        ),
        migrations.AlterModelOptions(
            name='deploymentstage',
            options={'ordering': ['deployment', 'pipeline', 'stage_index', '-wanted']},
        ),
        migrations.AlterField(
            model_name='deployment',
            name='routing_strategy',
            field=models.CharField(
                choices=[('cost_aware', 'cost-aware'), ('least_outstanding_tokens', 'least-outstanding-tokens'),
                         ('round_robin', 'round-robin')],
                default='cost_aware',
                help_text='How the gateway chooses among the pipelines (docs/gateway.md).', max_length=32),
        ),
    ]
