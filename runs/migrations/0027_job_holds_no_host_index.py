from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0026_job_writes_heap_only'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='job',
            name='job_on_host',
        ),
    ]
