from tests.prometheus_fixtures import prometheus_factory  # noqa: F401 - the fixture
