"""Personas and API clients shared by every test.

alice: tenant A admin; bob: tenant A viewer; dave: tenant A deployer; erin: tenant A approver;
charlie: tenant B admin; root: platform admin.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.models import Membership
from fleet.tenancy import tokens
from rollouts import tasks
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from tests.fixtures import sent_tasks

pytest_plugins = [
    "tests.fixtures.triton",
    "tests.fixtures.celery_worker",
    "tests.fixtures.s3",
    "tests.fixtures.vllm",
    "tests.fixtures.prometheus",
    "tests.fixtures.route_nginx",
]

Role = Membership.Role

FAST_PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True, scope="session")
def fast_password_hashing():
    """Every test hashes passwords with MD5: the default PBKDF2 (a million rounds) costs about a
    quarter of a second per user made, and most tests make several. What is tested about
    passwords (logins, lockouts) is the same with any hasher; production keeps its own list."""
    from django.test.utils import override_settings

    with override_settings(PASSWORD_HASHERS=FAST_PASSWORD_HASHERS):
        yield


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """This process's PostgreSQL sessions commit without waiting for the WAL to reach the
    disk (``synchronous_commit=off``): a commit costs ~0.5 ms instead of ~4.5 ms on the CI
    machine, which the transactional tests, the live server's requests and the migrations
    at the session's start pay hundreds of times. What another session sees is the same (a
    commit is visible at once either way); only a crash of the PostgreSQL server could lose
    the last commits, of a test database dropped at the end anyway. Processes the tests
    start (workers, runners, benches) keep the server's setting."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.postgresql":
        options = database.setdefault("OPTIONS", {})
        options["options"] = f"{options.get('options', '')} -c synchronous_commit=off".strip()


@pytest.fixture(autouse=True, scope="session")
def flush_tables_by_delete():
    """On PostgreSQL, a transactional test (``transaction=True``, ``live_server``) ends with
    Django's flush, one ``TRUNCATE`` of every table (~50, each with its indexes and TOAST
    table given new files): measured at 1.0-1.9 s on the CI machine's 2 cores while other
    work shares them (under 0.5 s when it is quiet), where ``DELETE FROM`` on every table
    takes ~20 ms, as the tables of a test hold a few rows. After either, every table is empty; sequences are not reset by either (Django's
    flush only restarts them for ``reset_sequences=True``, which keeps the TRUNCATE here).
    The foreign keys Django makes are deferrable, so the deletes need no order: the checks
    run at the flush transaction's commit, when every table is empty."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences,
                            allow_cascade=allow_cascade)
        return ["SET CONSTRAINTS ALL DEFERRED;",
                *(f"DELETE FROM {self.quote_name(table)};" for table in tables)]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "sql_flush", sql_flush)
        yield


@pytest.fixture(autouse=True, scope="session")
def static_files_listed_once():
    """Django's test client builds the middleware afresh for every client made (most tests
    make one or more), and WhiteNoise's middleware, serving straight from the source folders
    outside production (``WHITENOISE_USE_FINDERS``), lists every static file each time (~220
    files, a stat, a media type and headers each): measured at ~80 ms a client, about a third
    of the time of a typical API test. The files do not change during a session, so the
    first listing's entries are kept and handed to every later middleware built with the same
    settings; each serves the same files with the same headers as before."""
    from django.conf import settings
    from whitenoise.middleware import WhiteNoiseMiddleware

    list_files = WhiteNoiseMiddleware.add_files_from_finders
    listed: dict[str, dict] = {}

    def add_files_from_finders(self):
        key = repr((self.static_prefix, self.max_age, self.allow_all_origins, self.charset,
                    self.add_headers_function, self.index_file,
                    getattr(settings, "WHITENOISE_MIMETYPES", None),
                    getattr(settings, "WHITENOISE_IMMUTABLE_FILE_TEST", None),
                    settings.STATICFILES_DIRS, settings.STATICFILES_FINDERS,
                    settings.INSTALLED_APPS))
        if key not in listed:
            before = dict(self.files)
            list_files(self)
            listed[key] = {url: found for url, found in self.files.items()
                           if before.get(url) is not found}
        self.files.update(listed[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WhiteNoiseMiddleware, "add_files_from_finders", add_files_from_finders)
        yield


@pytest.fixture
def tenant_a(db):
    return TenantFactory(slug="tenant-a", name="Tenant A")


@pytest.fixture
def tenant_b(db):
    return TenantFactory(slug="tenant-b", name="Tenant B")


def _member(username: str, tenant, role: str):
    user = UserFactory(username=username)
    MembershipFactory(user=user, tenant=tenant, role=role)
    return user


@pytest.fixture
def alice(tenant_a):
    return _member("alice", tenant_a, Role.ADMIN)


@pytest.fixture
def bob(tenant_a):
    return _member("bob", tenant_a, Role.VIEWER)


@pytest.fixture
def dave(tenant_a):
    return _member("dave", tenant_a, Role.DEPLOYER)


@pytest.fixture
def erin(tenant_a):
    return _member("erin", tenant_a, Role.APPROVER)


@pytest.fixture
def charlie(tenant_b):
    return _member("charlie", tenant_b, Role.ADMIN)


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_superuser=True, is_staff=True)


@pytest.fixture
def api():
    """An anonymous API client; call ``api.force_login(user)`` or use ``client_for``."""
    return APIClient()


@pytest.fixture
def client_for():
    def make(user) -> APIClient:
        client = APIClient()
        client.force_authenticate(user)
        return client

    return make


@pytest.fixture
def token_client(alice):
    """Build an API client that authenticates with a fresh tenant token."""

    def make(tenant, role: str = Role.DEPLOYER, **kwargs) -> APIClient:
        issued = tokens.issue(alice if tenant.slug == "tenant-a" else _admin_of(tenant), tenant,
                              f"ci-{role}-{tenant.slug}-{kwargs.pop('suffix', '')}", role, **kwargs)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
        client.issued = issued
        return client

    return make


def _admin_of(tenant):
    return _member(f"admin-of-{tenant.slug}", tenant, Role.ADMIN)


@pytest.fixture(autouse=True)
def enqueued_loads(monkeypatch):
    """Tests advance loads by calling the reconciler; what would go to the broker is kept here."""
    sent: list[int] = []
    sent_tasks.catch(monkeypatch, tasks.advance_load, sent.append)
    return sent


@pytest.fixture(autouse=True)
def drift_shards_in_process(monkeypatch):
    """The reconcile tick's drift shards run at once, in the test's process, as a worker
    would run them (tests/rollouts/loads/test_drift_shards.py checks what is sent)."""
    def run(args, kwargs=None, **_options):
        tasks.reconcile_drift_shard(*args, **(kwargs or {}))

    monkeypatch.setattr(tasks.reconcile_drift_shard, "apply_async", run)


@pytest.fixture(autouse=True)
def redis_prefix(settings):
    """Every test writes its Redis keys (latency windows, server loads) under its own prefix."""
    import uuid

    settings.SWITCHYARD_REDIS_PREFIX = f"switchyard-test-{uuid.uuid4().hex[:12]}"
    return settings.SWITCHYARD_REDIS_PREFIX
