# dstack's `priority` on the run, and the index the queue is read in order with (runs/queue.py)

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0017_run_serving_deployment'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='priority',
            field=models.SmallIntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('status__in', ['terminated', 'failed', 'done']), _negated=True), fields=['project', '-priority', 'submitted_at', 'id'], name='run_queue_order'),
        ),
    ]
