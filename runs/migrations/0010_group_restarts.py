from django.db import migrations, models
from django.db.models import F


def mark_superseded(apps, schema_editor):
    # before this, a run's current jobs were those of its latest submission
    Job = apps.get_model("runs", "Job")
    older = Job.objects.filter(submission_num__lt=F("run__submission_num")).values("pk")
    Job.objects.filter(pk__in=older).update(superseded=True)


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0009_job_readiness'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='keep_host',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='job',
            name='superseded',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='run',
            name='restarts',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(mark_superseded, migrations.RunPython.noop),
    ]
