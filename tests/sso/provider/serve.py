"""Run the test OpenID Connect provider: python -m tests.sso.provider.serve PORT DBFILE"""

import os
import sys


def main() -> None:
    port, database = int(sys.argv[1]), sys.argv[2]
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.sso.provider.settings"
    os.environ["PROVIDER_DB"] = database
    import django

    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import run
    from django.core.wsgi import get_wsgi_application

    call_command("migrate", verbosity=0)
    run("127.0.0.1", port, get_wsgi_application(), threading=True)


if __name__ == "__main__":
    main()
