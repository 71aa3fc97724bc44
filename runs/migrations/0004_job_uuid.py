import uuid

from django.db import migrations, models


def distinct_uuids(apps, schema_editor):
    # AddField with a callable default evaluates it once: every existing row would share one value.
    Job = apps.get_model("runs", "Job")
    for pk in Job.objects.values_list("pk", flat=True).iterator():
        Job.objects.filter(pk=pk).update(uuid=uuid.uuid4())


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0003_submission_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="uuid",
            field=models.UUIDField(null=True, editable=False),
        ),
        migrations.RunPython(distinct_uuids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="job",
            name="uuid",
            field=models.UUIDField(default=uuid.uuid4, unique=True, editable=False),
        ),
    ]
