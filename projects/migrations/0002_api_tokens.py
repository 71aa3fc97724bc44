"""Hashed API tokens. Tokens of rest_framework.authtoken (plaintext) are moved over, hashed, and
their plaintext rows deleted: clients keep working and the old table holds nothing usable."""

import hashlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def hash_plaintext_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("projects", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id FROM authtoken_token")
        rows = cursor.fetchall()
        for key, user_id in rows:
            # no expiry: they never had one, and cutting clients off is the operator's call (muster_token --revoke)
            ApiToken.objects.create(user_id=user_id, prefix=key[:12], digest=hashlib.sha256(key.encode()).hexdigest())
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):

    dependencies = [
        ('projects', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('prefix', models.CharField(max_length=12)),
                ('digest', models.CharField(max_length=64, unique=True)),
                ('created', models.DateTimeField(auto_now_add=True)),
                ('expires', models.DateTimeField(blank=True, help_text='empty: never', null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
            ],
        ),
        migrations.RunPython(hash_plaintext_tokens, migrations.RunPython.noop),
    ]
