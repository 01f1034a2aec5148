from tests.knowledge.conftest import _embedding_model_prepared, help_center  # noqa: F401
