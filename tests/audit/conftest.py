from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)
