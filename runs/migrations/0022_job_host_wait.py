# How long a job waited for a free host, written when it is placed, and the partial index /metrics
# reads the waits with (console/queue_metrics.py): only the jobs that waited, not every job

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0021_run_priority'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='host_wait',
            field=models.DurationField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('host_wait__isnull', False)), fields=['run', 'host_wait'], name='job_host_waits'),
        ),
    ]
