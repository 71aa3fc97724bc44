import django.db.models.deletion
from django.db import migrations, models
from django.db.models import OuterRef, Q, Subquery

# the unfinished statuses of a job (runs/choices.py JOB_UNFINISHED) as this migration was written
UNFINISHED = ("submitted", "provisioning", "pulling", "running", "terminating")


def holders_of_hosts_in_use(apps, schema_editor):
    """Each live host that a job still holds (an unfinished job on it, or one that keeps it for its
    group's restart) gets that job's project as its holder: what rows.held counted from the jobs
    before this column."""
    Instance, Job = apps.get_model("instances", "Instance"), apps.get_model("runs", "Job")
    holding = Job.objects.filter(Q(status__in=UNFINISHED) | Q(keep_host=True), instance=OuterRef("pk"))
    Instance.objects.exclude(status__in=("idle", "terminating", "terminated")).update(
        holder_id=Subquery(holding.order_by("-id").values("run__project_id")[:1]))


class Migration(migrations.Migration):

    dependencies = [
        ('instances', '0007_fleet_share'),
        ('projects', '0004_project_log_quota'),
        ('runs', '0026_job_writes_heap_only'),
    ]

    operations = [
        migrations.AddField(
            model_name='instance',
            name='holder',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='projects.project'),
        ),
        migrations.AddIndex(
            model_name='instance',
            index=models.Index(condition=models.Q(('holder__isnull', False)), fields=['fleet', 'holder', 'gpu_count'], name='instance_held'),
        ),
        migrations.RunPython(holders_of_hosts_in_use, migrations.RunPython.noop),
    ]
