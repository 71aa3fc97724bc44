from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0016_run_updated_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="attachgrant",
            name="shell",
            field=models.BooleanField(default=False),
        ),
    ]
