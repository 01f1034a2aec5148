# The console's powers become permissions. Staff accounts that exist now keep every power they
# had (they join the group "Console administrators", which has them all); staff made from now
# on read the console and act only where they are given a permission.

from django.contrib.auth.management import create_permissions
from django.db import migrations

POWERS = ["manage_workers", "manage_limits", "manage_variants", "manage_api_keys", "manage_help_center"]
GROUP = "Console administrators"


def powers_grant(apps, schema_editor):
    # Permissions are made after migrations run; these are needed now.
    config = apps.get_app_config("admin_console")
    config.models_module = True
    create_permissions(config, apps=apps, verbosity=0)
    config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    User = apps.get_model("accounts", "User")
    group, _ = Group.objects.get_or_create(name=GROUP)
    group.permissions.add(
        *Permission.objects.filter(content_type__app_label="admin_console", codename__in=POWERS)
    )
    for user in User.objects.filter(is_staff=True, is_superuser=False):
        user.groups.add(group)


class Migration(migrations.Migration):

    dependencies = [
        ('admin_console', '0001_initial'),
        ('accounts', '0001_initial'),
        ('auth', '0012_alter_user_first_name_max_length'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='auditlog',
            options={'ordering': ['-created_at', '-id'], 'permissions': [('manage_workers', 'Can drain workers and set the warm pool'), ('manage_limits', "Can change the tiers' rate limits"), ('manage_variants', 'Can change variants, the canary and experiments'), ('manage_api_keys', 'Can issue, limit and revoke API keys'), ('manage_help_center', 'Can edit help articles and pinned answers')]},
        ),
        migrations.RunPython(powers_grant, migrations.RunPython.noop),
    ]
