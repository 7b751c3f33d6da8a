from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0026_load_tenant_server'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='auto_converge',
            field=models.BooleanField(default=False, help_text='When its servers disagree (a version missing from one, or run with another config), the reconcile tick converges it by itself: the missing version loaded, the version\'s config sent again (rollouts.deployments.consistency)'),
        ),
        migrations.AddField(
            model_name='deployment',
            name='converged_at',
            field=models.DateTimeField(blank=True, editable=False, help_text='When it was last asked to converge (by someone, or by the tick)', null=True),
        ),
    ]
